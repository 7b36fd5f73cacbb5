"""Reliability, least privilege: the rights of egress-placer's ServiceAccount, read back from the API
server (SelfSubjectRulesReview with a kubeconfig minted for the ServiceAccount) in its own namespace,
in Tekton's, in kube-system and in a plain tenant namespace, equal the explicit lists below, no more and no less; and
the controller, running under exactly that identity, does its work on a read-only root filesystem
with only /tmp writable (a private mount namespace, as `readOnlyRootFilesystem` plus an emptyDir on
/tmp), its HOME and working directory unwritable: it becomes ready, leads, restores a pool taint,
places a run, and logs no write refused."""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable

import pytest
from burst import RetryingRuns
from cluster_view import POOL_TAINT, Placer, elapsed_until, pool_taints, remove_pool_taint
from conftest import Figures, TEAM_CDN, TEAM_OTHER
from kubernetes import client, config
from tekton_runs import MATCHING_IMAGE, POOL, POOL_NODES, decision_of, taskrun
from devcluster.cluster import Cluster
from devcluster.controller import NAMESPACE, service_account_user
from devcluster.faults import Component, kill_component, start_component

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

REPO = Path(__file__).resolve().parents[2]
TEKTON_NAMESPACE = "tekton-pipelines"
Rule = tuple[str, str, str, str]  # api group, resource, resource name ("*": any), verb


def rules(groups: Iterable[str], resources: Iterable[str], verbs: Iterable[str], names: Iterable[str] = ("*",)) -> set[Rule]:
    return set(itertools.product(groups, resources, names, verbs))


READ = ("get", "list", "watch")
# Granted to every authenticated user by Kubernetes' default ClusterRoles (system:basic-user and others).
EVERY_USER = (
    rules(["authorization.k8s.io"], ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], ["create"])
    | rules(["authentication.k8s.io"], ["selfsubjectreviews"], ["create"])
    | rules(["certificates.k8s.io"], ["clustertrustbundles"], READ)
)
# k8s/rbac-cluster.yaml: caches, the pool taint, evictions, Events, its own webhook's caBundle, the pool guard's binding.
CLUSTER_WIDE = (
    rules([""], ["nodes"], [*READ, "patch"])
    | rules([""], ["namespaces"], READ)
    | rules([""], ["pods"], [*READ, "delete"])
    | rules([""], ["pods/eviction"], ["create"])
    | rules(["apps"], ["daemonsets"], READ)
    | rules(["tekton.dev"], ["tasks", "stepactions", "pipelines", "taskruns", "pipelineruns"], READ)
    | rules(["events.k8s.io"], ["events"], ["create", "patch"])
    | rules(["admissionregistration.k8s.io"], ["mutatingwebhookconfigurations"], ["get", "update"], ["egress-placer"])
    | rules(["admissionregistration.k8s.io"], ["validatingadmissionpolicybindings"], ["get", "update"], ["egress-placer-pool-guard"])
)
# k8s/rbac-namespace.yaml: the leader Lease, the webhook's TLS Secret, the policy ConfigMap, the pool guard's params.
OWN_NAMESPACE = (
    rules(["coordination.k8s.io"], ["leases"], ["get", "update"], ["egress-placer-leader"])
    | rules(["coordination.k8s.io"], ["leases"], ["create"])
    | rules([""], ["secrets"], ["get", "patch"], ["egress-placer-webhook-tls"])
    | rules([""], ["secrets"], ["create"])
    | rules([""], ["configmaps"], READ, ["egress-placer-policy"])
    | rules([""], ["configmaps"], ["get", "update"], ["egress-placer-pool-guard"])
    | rules([""], ["configmaps"], ["create"])
)
# k8s/rbac-tekton.yaml: Tekton's feature flags (the affinity assistant's coschedule mode).
TEKTON = rules([""], ["configmaps"], READ, ["feature-flags"])
# k8s/rbac-agents.yaml: patch node agents' templates, where their owner opted in, in kube-system only.
AGENTS_NAMESPACE = "kube-system"
AGENTS = rules(["apps"], ["daemonsets"], ["patch"])
EXPECTED = {
    NAMESPACE: EVERY_USER | CLUSTER_WIDE | OWN_NAMESPACE,
    TEKTON_NAMESPACE: EVERY_USER | CLUSTER_WIDE | TEKTON,
    AGENTS_NAMESPACE: EVERY_USER | CLUSTER_WIDE | AGENTS,
    TEAM_OTHER: EVERY_USER | CLUSTER_WIDE,
}
# Non-resource URLs every authenticated user may GET (discovery, health, version, OIDC discovery).
NON_RESOURCE = {
    (url, "get")
    for url in [
        "/.well-known/openid-configuration", "/.well-known/openid-configuration/", "/openid/v1/jwks", "/openid/v1/jwks/",
        "/healthz", "/livez", "/readyz", "/version", "/version/", "/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*",
    ]
}


def granted(review: Any) -> tuple[set[Rule], set[tuple[str, str]]]:
    resource = set()
    for r in review.status.resource_rules:
        resource |= rules(r.api_groups or [""], r.resources or [], r.verbs, r.resource_names or ["*"])
    non_resource = {(u, v) for r in review.status.non_resource_rules for u in r.non_resource_urls or [] for v in r.verbs}
    return resource, non_resource


def test_the_service_account_has_exactly_the_listed_rights(devcluster: Cluster, placer: Placer, figures: Figures) -> None:
    figures.fault(
        "least privilege: the ServiceAccount's rights read back (SelfSubjectRulesReview)",
        f"namespaces {NAMESPACE}, {TEKTON_NAMESPACE}, {AGENTS_NAMESPACE} and {TEAM_OTHER}",
        "exactly the rules the test lists (k8s/rbac-*.yaml plus Kubernetes' defaults for authenticated users)",
    )
    api = config.new_client_from_config(config_file=str(devcluster.mint_kubeconfig(service_account_user())))
    try:
        authz = client.AuthorizationV1Api(api)
        reviews = {
            ns: authz.create_self_subject_rules_review(
                {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": ns}}
            )
            for ns in EXPECTED
        }
    finally:
        api.close()
    differences = {}
    for ns, review in reviews.items():
        resource, non_resource = granted(review)
        extra, missing = resource - EXPECTED[ns], EXPECTED[ns] - resource
        if extra or missing or non_resource != NON_RESOURCE or review.status.incomplete:
            differences[ns] = {"extra": sorted(extra), "missing": sorted(missing), "non-resource": sorted(non_resource ^ NON_RESOURCE)}
    figures.measured(
        "; ".join(f"{ns}: {len(granted(r)[0])} resource rules" for ns, r in reviews.items())
        + (f"; DIFFERENT: {differences}" if differences else ", all as listed"),
        0,
    )

    assert differences == {}


READ_ONLY_ROOT = 'mount --bind /tmp /tmp && mount -o remount,bind,ro / && cd "$0" && exec "$@"'


def read_only_root_available() -> bool:
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", READ_ONLY_ROOT, "/", "true"],
                           capture_output=True)
    return probe.returncode == 0


def test_the_controller_works_with_a_read_only_root_home_and_working_directory(
    devcluster: Cluster, kube: client.ApiClient, placer: Placer, runs: RetryingRuns, figures: Figures
) -> None:
    if not read_only_root_available():
        pytest.skip("needs `unshare --mount` (root or CAP_SYS_ADMIN) to give the controller a read-only root")
    figures.fault(
        "the controller on a read-only root filesystem (only /tmp writable), HOME and cwd unwritable",
        "the only replica, swapped for one in a private mount namespace; a pool taint removed; a matching TaskRun",
        "ready, leading, taint restored, run placed, no write refused in its log",
    )
    core = client.CoreV1Api(kube)
    replica = placer.replicas[0]
    normal = kill_component(devcluster, replica.name)
    argv = ("unshare", "--mount", "--propagation", "private", "sh", "-c", READ_ONLY_ROOT, str(REPO), *normal.argv)
    read_only = Component(normal.name, argv, {**normal.env, "HOME": "/root"}, normal.port, normal.health_url)
    log = devcluster.dir / "logs" / f"{replica.name}.log"
    offset = log.stat().st_size
    started = time.monotonic()
    start_component(devcluster, read_only)
    elapsed_until("the read-only replica ready", lambda: placer.ready(replica), timeout=60)
    ready = time.monotonic() - started
    mounts = Path(f"/proc/{placer.pid(replica)}/mounts").read_text().splitlines()
    root_options = next(line.split()[3] for line in mounts if line.split()[1] == "/")

    remove_pool_taint(kube, "egress-3")
    restored = elapsed_until("the pool taint back", lambda: pool_taints(core, "egress-3") == [POOL_TAINT], timeout=20)
    name = runs.name("read-only")
    runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name], timeout=90)
    node = runs.nodes_of(TEAM_CDN, [name])[name]
    leader = placer.metric(replica, "egress_placer_leader")
    with open(log, "rb") as f:
        f.seek(offset)
        written = f.read().decode(errors="replace")
    refused = [line for line in written.splitlines() if "Read-only file system" in line or "Errno 30" in line or "Permission denied" in line]
    figures.measured(
        f"root mounted {root_options.split(',')[0]}; ready in {ready:.1f} s, leader {leader:.0f}, taint restored in "
        f"{restored:.1f} s, run placed on {node}; {len(refused)} refused writes logged",
        0 if node in POOL_NODES else 1,
    )

    assert root_options.split(",")[0] == "ro"
    assert leader == 1
    assert node in POOL_NODES and decision_of(done[name])["pool"] == POOL
    assert refused == [], refused[:5]
