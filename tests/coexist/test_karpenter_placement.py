"""egress-placer beside Karpenter (issue #25): a pool with `provisioning: {karpenter: {nodePool}}` and a
NodePool at zero nodes that declares the pool's labels and taint. Eligible TaskRuns are still placed on
the pool (no node named), their pods wait Pending, Karpenter brings nodes up, every run Succeeds there, and
at no sampled moment does a pod of another namespace sit on a new node (the NodePool's taint is on each node
from its creation). Each placed pod carries `karpenter.sh/do-not-disrupt: "true"`.

Before the change (`Admission._place`: "has no ready node") the runs went to ordinary nodes and no
NodeClaim appeared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.core.model import TAINT_KEY
from devcluster import karpenter
from devcluster.cluster import Cluster, KWOK_NODE_SELECTOR
from tests.e2e.harness import running_placer
from tests.e2e.tekton_runs import MATCHING_IMAGE, Runs, succeeded, taskrun
from tests.kube import Api, node, pods
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.coexist]

NODEPOOLS = "/apis/karpenter.sh/v1/nodepools"
POOL = "uploads"
POOL_LABEL = "coexist.egress-placer.io/pool"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
RUNS = 10


def _policy(path: Path, tenant: str, node_pool: str, more: str = "") -> Path:
    """Pool POOL of the NodePool's nodes for `tenant`'s runs; `more`: further lines of the pool (e.g. its queue)."""
    path.write_text(
        "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npools:\n"
        f"  - name: {POOL}\n    nodeSelector: {{{POOL_LABEL}: {POOL}}}\n    images: ['*/cdn-*']\n"
        f"    namespaces: [{tenant}]\n    provisioning: {{karpenter: {{nodePool: {node_pool}}}}}\n{more}"
    )
    return path


def _strangers(api: Api, node_pool: str, tenant: str) -> list[str]:
    """Pods of another namespace bound to a node of the NodePool, now."""
    out = []
    for made in api.items(node(), labelSelector=f"{karpenter.NODEPOOL_LABEL}={node_pool}"):
        name = made["metadata"]["name"]
        out += [f"{p['metadata']['namespace']}/{p['metadata']['name']} on {name}"
                for p in api.items("/api/v1/pods", fieldSelector=f"spec.nodeName={name}")
                if p["metadata"]["namespace"] != tenant]
    return out


def test_runs_of_a_pool_at_zero_nodes_bring_karpenter_nodes_up_and_keep_them_to_themselves(
    karpenter_cluster: Cluster, coexist_api: Api, coexist_namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    api, tenant, other = coexist_api, coexist_namespace, other_namespace
    node_pool = f"{POOL}-{tenant}"
    taint = {"key": TAINT_KEY, "value": POOL, "effect": "NoSchedule"}
    api.create(NODEPOOLS, karpenter.node_pool(node_pool, {POOL_LABEL: POOL}, kwok_selector=KWOK_NODE_SELECTOR, taints=[taint]))
    runs = Runs(api)
    try:
        assert not api.items(node(), labelSelector=f"{karpenter.NODEPOOL_LABEL}={node_pool}")  # at zero
        with running_placer(karpenter_cluster, api, _policy(tmp_path / "policy.yaml", tenant, node_pool)):
            names = [runs.name(f"upload-{i}") for i in range(RUNS)]
            strays = [runs.name(f"stray-{i}") for i in range(3)]
            runs.create_all([(tenant, "taskruns", taskrun(n, MATCHING_IMAGE)) for n in names]
                            + [(other, "taskruns", taskrun(n, MATCHING_IMAGE)) for n in strays])
            # A pod of the other namespace that tolerates everything: the webhook strips what lets it onto a pool.
            runs.create_pod(other, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "blanket"}, "spec": {
                "tolerations": [{"operator": "Exists"}], "containers": [{"name": "main", "image": "busybox"}]}})

            seen: list[str] = []

            def done() -> bool:
                seen.extend(_strangers(api, node_pool, tenant))  # sampled at every poll
                listed = runs.listed(tenant, "taskruns")
                return all(n in listed and succeeded(listed[n]) == "True" for n in names)

            wait_for(f"{RUNS} runs of pool {POOL} to Succeed on nodes Karpenter brings up", done, timeout=240, interval=0.5)
            assert not seen, f"pods of other namespaces on the NodePool's nodes: {sorted(set(seen))}"
            runs.wait_succeeded(other, "taskruns", strays, timeout=120)

            made = {n["metadata"]["name"]: n for n in api.items(node(), labelSelector=f"{karpenter.NODEPOOL_LABEL}={node_pool}")}
            assert made, "Karpenter made no node"
            for name, obj in made.items():
                owned = [t for t in obj["spec"].get("taints") or [] if t["key"] == TAINT_KEY]
                assert [{k: t.get(k) for k in ("key", "value", "effect")} for t in owned] == [taint], name
            placed: dict[str, Any] = runs.pods_by_taskrun(tenant)
            assert {n: placed[n]["spec"].get("nodeName") in made for n in names} == {n: True for n in names}
            assert all(placed[n]["metadata"]["annotations"].get(DO_NOT_DISRUPT) == "true" for n in names)
            elsewhere = runs.pods_by_taskrun(other)
            assert not {n: p["spec"].get("nodeName") for n, p in elsewhere.items() if p["spec"].get("nodeName") in made}
            blanket = api.get(pods(other, "blanket")) or {}
            assert blanket.get("spec", {}).get("nodeName") not in made
    finally:
        runs.cleanup()
        api.delete(NODEPOOLS + f"/{node_pool}")
    wait_for(
        "Karpenter to take the NodePool's nodes away with the NodePool",
        lambda: not api.items(node(), labelSelector=f"{karpenter.NODEPOOL_LABEL}={node_pool}"),
        timeout=120,
    )
