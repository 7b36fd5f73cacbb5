"""Smoke test of the optional devcluster component `karpenter` (`up --with karpenter`): Karpenter's KWOK
provider makes a node for a pending pod from a NodePool, the node carries the NodePool's labels (the pool's
selector and what the cluster's KWOK selects on) and taints, the cluster's KWOK makes it Ready, the pod
runs there; deleting the NodePool takes its node away again. Nothing of egress-placer runs here."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster import karpenter
from devcluster.cluster import Cluster, KWOK_NODE_SELECTOR
from tests.kube import Api, node, pods
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.coexist]

NODEPOOLS = "/apis/karpenter.sh/v1/nodepools"
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
SMOKE_LABEL = "devcluster.egress-placer.io/karpenter-smoke"


def _ready(obj: dict[str, Any] | None) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def test_karpenter_makes_a_node_for_a_pending_pod_from_a_nodepool(
    karpenter_cluster: Cluster, coexist_api: Api, coexist_namespace: str
) -> None:
    api, ns = coexist_api, coexist_namespace
    pool = f"smoke-{ns}"
    taint = {"key": SMOKE_LABEL, "value": ns, "effect": "NoSchedule"}
    api.create(NODEPOOLS, karpenter.node_pool(pool, {SMOKE_LABEL: ns}, kwok_selector=KWOK_NODE_SELECTOR, taints=[taint]))
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "needs-a-node"},
            "spec": {
                "nodeSelector": {SMOKE_LABEL: ns},
                "tolerations": [{**taint, "operator": "Equal"}],
                "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}],
            },
        }
        api.create(pods(ns), pod)

        running = wait_for(
            "the pod Running on a node Karpenter made for it",
            lambda: (p := api.get(pods(ns, "needs-a-node"))) and p.get("status", {}).get("phase") == "Running" and p,
            timeout=120,
        )
        name = running["spec"]["nodeName"]
        made = api.get(node(name))
        assert made is not None and _ready(made)
        labels = made["metadata"]["labels"]
        assert labels[SMOKE_LABEL] == ns and labels[karpenter.NODEPOOL_LABEL] == pool
        assert labels["type"] == "kwok"  # KWOK's selector, from the NodePool's template: KWOK keeps it Ready
        assert made["spec"]["providerID"] == f"kwok://{name}"
        assert {(t["key"], t.get("value"), t["effect"]) for t in made["spec"].get("taints", [])} == {
            (SMOKE_LABEL, ns, "NoSchedule")  # the NodePool's taint; karpenter.sh/unregistered is gone
        }
        claims = [c for c in api.items(NODECLAIMS) if c.get("status", {}).get("nodeName") == name]
        assert len(claims) == 1 and claims[0]["metadata"]["labels"][karpenter.NODEPOOL_LABEL] == pool
    finally:
        api.delete(NODEPOOLS + f"/{pool}")
    wait_for(
        "Karpenter to take the NodePool's node away with the NodePool",
        lambda: not api.items("/api/v1/nodes", labelSelector=f"{karpenter.NODEPOOL_LABEL}={pool}"),
        timeout=120,
    )
