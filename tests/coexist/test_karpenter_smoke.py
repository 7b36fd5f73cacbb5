"""Smoke test of the optional devcluster component `karpenter` (`up --with karpenter`): Karpenter's KWOK
provider makes a node for a pending pod from a NodePool, the node carries the NodePool's labels (the pool's
selector and what the cluster's KWOK selects on) and taints, the cluster's KWOK makes it Ready, the pod
runs there; deleting the NodePool takes its node away again. And consolidation: a pod annotated
`karpenter.sh/do-not-disrupt` keeps its underused node; once the annotation goes, Karpenter evicts it.
Nothing of egress-placer runs here."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster import karpenter
from devcluster.cluster import Cluster, KWOK_NODE_SELECTOR
from tests.kube import Api, node, pods
from tests.waiting import StoppedHolding, WaitTimeout, holds_for, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.coexist]

NODEPOOLS = "/apis/karpenter.sh/v1/nodepools"
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
SMOKE_LABEL = "devcluster.egress-placer.io/karpenter-smoke"


DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


def _pod(name: str, selector: dict[str, str], taint: dict[str, str], cpu: str, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeSelector": selector,
            "tolerations": [{**taint, "operator": "Equal"}],
            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
        },
    }


def _running_on(api: Api, ns: str, name: str) -> str | None:
    pod = api.get(pods(ns, name)) or {}
    return pod.get("spec", {}).get("nodeName") if pod.get("status", {}).get("phase") == "Running" else None


def _karpenter_said(api: Api, ns: str) -> list[str]:
    """What Karpenter's events say about disruption (node and NodeClaim events are in `default`), for a failure."""
    said = [f"{e.get('reason')}: {(e.get('involvedObject') or {}).get('name')}: {e.get('message')}"
            for where in ("default", ns) for e in api.items(f"/api/v1/namespaces/{where}/events")
            if "isrupt" in str(e.get("reason")) or e.get("reason") in ("Evicted", "Unconsolidatable")]
    return said[-12:]


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
        api.create(pods(ns), _pod("needs-a-node", {SMOKE_LABEL: ns}, taint, "1"))

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


def test_do_not_disrupt_keeps_a_running_pod_through_consolidation(
    karpenter_cluster: Cluster, coexist_api: Api, coexist_namespace: str
) -> None:
    """A 30-CPU pod brings up a 32-CPU node, a 1-CPU pod annotated do-not-disrupt joins it, the big one goes:
    the node is underused (consolidation after 5 s would replace it by a smaller one) but the small pod keeps
    it for 20 s; without the annotation Karpenter evicts the pod (the issue's "consolidation may evict a
    running upload": what egress-placer must prevent for the runs it places)."""
    api, ns = coexist_api, coexist_namespace
    pool = f"consolidate-{ns}"
    taint = {"key": SMOKE_LABEL, "value": ns, "effect": "NoSchedule"}
    api.create(NODEPOOLS, karpenter.node_pool(pool, {SMOKE_LABEL: ns}, kwok_selector=KWOK_NODE_SELECTOR, taints=[taint],
                                              consolidate_after="5s"))
    try:
        selector = {karpenter.NODEPOOL_LABEL: pool}
        api.create(pods(ns), _pod("big", selector, taint, "30"))
        big_node = wait_for("the big pod on a node of its own", lambda: _running_on(api, ns, "big"), timeout=120)
        api.create(pods(ns), _pod("upload", selector, taint, "1", **{DO_NOT_DISRUPT: "true"}))
        assert wait_for("the upload beside it", lambda: _running_on(api, ns, "upload"), timeout=60) == big_node
        api.delete(pods(ns, "big"), gracePeriodSeconds=0)

        try:
            holds_for("the upload on its underused node", lambda: _running_on(api, ns, "upload") == big_node, seconds=20)
            api.json_patch(pods(ns, "upload"), [{"op": "remove", "path": "/metadata/annotations/" + DO_NOT_DISRUPT.replace("/", "~1")}])
            wait_for("Karpenter to evict the upload once nothing protects it",
                     lambda: (api.get(pods(ns, "upload")) or {"metadata": {"deletionTimestamp": "gone"}})["metadata"].get("deletionTimestamp"),
                     timeout=180)
        except (StoppedHolding, WaitTimeout) as failure:
            raise AssertionError(f"{failure}; Karpenter said: {_karpenter_said(api, ns)}") from failure
    finally:
        api.delete(NODEPOOLS + f"/{pool}")
