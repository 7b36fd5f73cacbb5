"""End to end, installation: the `k8s/` kustomize base is accepted by the real API server
(`kubectl apply --dry-run=server -k k8s/`, admin credentials), and its Deployment, applied for real,
puts its two replicas on two nodes (the scheduler honours its spread; the local cluster's nodes are
KWOK's, so no container runs).

A server-side dry run creates nothing, so the namespaced objects need their namespace to exist:
the test applies `k8s/namespace.yaml` for real first (the first step of an install) and deletes it
again if it made it. It runs without the controller fixture, where the devcluster's local form of
the webhook configuration (a `url` instead of the Service) is not installed: applying the Service
form over it client-side would set both and be refused, which says nothing about the manifests. For
the same reason the CRDs' conversion webhook is switched to k8s/'s form first (`adopt_conversion_form`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from devcluster.cluster import Cluster
from devplacer.local_placer import NAMESPACE, adopt_conversion_form, kubectl, render_manifests
from tests.kube import Api, namespace, namespaced, namespaces_left, pods
from tests.waiting import wait_for, wait_gone

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

K8S = Path(__file__).resolve().parents[2] / "k8s"


@pytest.fixture
def controller_namespace(devcluster: Cluster, api: Api) -> Iterator[str]:
    """The controller's namespace, applied from `k8s/namespace.yaml`; deleted (and gone) after if it was new."""
    existed = api.get(namespace(NAMESPACE)) is not None
    kubectl(devcluster, "apply", "-f", str(K8S / "namespace.yaml"))  # raises with kubectl's stderr on failure
    # An earlier module's local controller left the CRDs calling their conversion webhook by `url`: an apply of
    # k8s/'s `service` form over it would keep both, which the API server refuses (found by CI).
    adopt_conversion_form(devcluster, [d for d in render_manifests(devcluster) if d.get("kind") == "CustomResourceDefinition"])
    yield NAMESPACE
    if not existed:
        api.delete(namespace(NAMESPACE))
        wait_gone(f"namespace {NAMESPACE} to be gone", lambda: namespaces_left(api, NAMESPACE), timeout=180)


def test_the_k8s_base_passes_a_server_side_dry_run(devcluster: Cluster, controller_namespace: str) -> None:
    out = kubectl(devcluster, "apply", "--dry-run=server", "-k", str(K8S))  # raises with kubectl's stderr on failure

    applied = [line for line in out.splitlines() if line.endswith("(server dry run)")]
    kinds = {line.split("/", 1)[0] for line in applied}
    assert {
        "deployment.apps",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io",
        "validatingwebhookconfiguration.admissionregistration.k8s.io",  # the pools API's
        "customresourcedefinition.apiextensions.k8s.io",
        "validatingadmissionpolicy.admissionregistration.k8s.io",  # its CEL compiled by the API server
        "validatingadmissionpolicybinding.admissionregistration.k8s.io",
    } <= kinds, out


def test_the_two_replicas_of_the_deployment_run_on_two_nodes(devcluster: Cluster, api: Api, controller_namespace: str) -> None:
    docs = render_manifests(devcluster)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    replicas = deployment["spec"]["replicas"]
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    kubectl(devcluster, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [account, deployment]}))
    try:
        def scheduled() -> dict[str, str] | None:
            bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in api.items(pods(NAMESPACE), labelSelector=selector)}
            return bound if len(bound) == replicas and all(bound.values()) else None

        bound = wait_for(f"{replicas} replicas scheduled", scheduled, timeout=60)
        assert replicas == 2 and len(set(bound.values())) == replicas, bound
    finally:
        api.delete(namespaced(NAMESPACE, "deployments", deployment["metadata"]["name"], group="/apis/apps/v1"))
        wait_for("the replicas to be gone", lambda: not api.items(pods(NAMESPACE), labelSelector=selector), timeout=60)
