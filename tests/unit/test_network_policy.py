"""The webhook's NetworkPolicy (k8s/network-policy/, the chart's `networkPolicy` values), checked as rendered:
the local cluster has no network plugin, so nothing enforces a NetworkPolicy there and what it lets through
cannot be tried on it. What is checked: the kustomize component renders one NetworkPolicy that selects the
controller's pods, limits the webhook port to its sources and leaves the health and metrics port open; the
chart renders the same for the same source; the chart refuses to enable it without a source and refuses a
malformed one; and the API server accepts both renders (`kubectl apply --dry-run=server`, on the cluster).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster import Cluster, ClusterError
from devplacer.chart import template
from tests.unit.test_chart import compare, helm, kubectl  # noqa: F401 - the fixtures: the helm and kubectl built
from devplacer.local_placer import kustomize

COMPONENT = "network-policy"
PLACEHOLDER = "192.0.2.0/24"  # the component's documentation range, to be replaced (k8s/network-policy/)
KONNECTIVITY = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}}}


def policies(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "NetworkPolicy"]


def the_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "egress-placer")


def test_the_component_limits_the_webhook_port_and_leaves_health_open(kubectl: Path) -> None:
    docs = kustomize(kubectl, (COMPONENT,))
    [policy] = policies(docs)
    deployment = the_deployment(docs)
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert spec["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert spec["policyTypes"] == ["Ingress"]
    webhook, health = spec["ingress"]
    ports = {p["name"]: p["containerPort"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert [p["port"] for p in webhook["ports"]] == ["webhook"] and ports["webhook"] == 8443
    assert webhook["from"] == [{"ipBlock": {"cidr": PLACEHOLDER}}]
    assert [p["port"] for p in health["ports"]] == ["health"] and "from" not in health  # any source
    assert policies(kustomize(kubectl)) == []  # opt-in: the base has none


def test_the_chart_renders_the_component_for_the_same_source(helm: Path, kubectl: Path) -> None:
    assert policies(template(helm)) == []
    charted = template(helm, {"networkPolicy": {"enabled": True, "ipBlocks": [PLACEHOLDER]}})
    assert compare(kustomize(kubectl, (COMPONENT,)), charted) == []


def test_the_chart_takes_cidrs_and_peers(helm: Path) -> None:
    [policy] = policies(template(helm, {"networkPolicy": {"enabled": True, "ipBlocks": ["10.0.0.0/28", "fd00::/64"],
                                                          "from": [KONNECTIVITY]}}))
    assert policy["spec"]["ingress"][0]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/28"}}, {"ipBlock": {"cidr": "fd00::/64"}}, KONNECTIVITY]


@pytest.mark.parametrize(
    "values, named",
    [
        ({"enabled": True}, "networkPolicy.enabled needs networkPolicy.ipBlocks or networkPolicy.from"),
        ({"enabled": True, "ipBlocks": ["10.0.0.1"]}, "'/networkPolicy/ipBlocks/0'"),
        ({"enabled": True, "from": [{}]}, "'/networkPolicy/from/0'"),
        ({"enabled": True, "ipblocks": ["10.0.0.0/28"]}, "'ipblocks' not allowed"),
    ],
    ids=["no-source", "not-a-cidr", "empty-peer", "misspelt"],
)
def test_the_chart_refuses_a_policy_that_lets_nothing_or_anything_through(helm: Path, values: dict[str, Any], named: str) -> None:
    with pytest.raises(ClusterError) as refused:
        template(helm, {"networkPolicy": values})
    assert named in str(refused.value)


@pytest.mark.cluster
def test_the_api_server_accepts_both_renders(devcluster: Cluster, helm: Path, kubectl: Path, namespace: str) -> None:
    """A server-side dry run of each render's NetworkPolicy (in a fresh namespace: the controller's may not exist).
    Accepted is all the local cluster can say: it has no network plugin, nothing enforces the policy."""
    renders = {
        "component": policies(kustomize(kubectl, (COMPONENT,))),
        "chart": policies(template(helm, {"networkPolicy": {"enabled": True, "ipBlocks": ["10.0.0.0/28"], "from": [KONNECTIVITY]}})),
    }
    for name, [policy] in renders.items():
        policy["metadata"]["namespace"] = namespace
        out = subprocess.run([str(kubectl), f"--kubeconfig={devcluster.kubeconfig}", "apply", "--dry-run=server", "-o", "yaml", "-f", "-"],
                             input=yaml.safe_dump(policy), capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, (name, out.stderr)
        assert yaml.safe_load(out.stdout)["spec"]["ingress"] == policy["spec"]["ingress"], name
