"""egress-placer's queue and Karpenter's consolidation on a pool whose nodes a NodePool provisions (issue #25).

- A queued pool at zero nodes (`provisioning: {karpenter: {nodePool}}`, `queue: {runsPerNode: 2}`), a burst of 8:
  every run is queued, none is stuck (the queue counts one node while none is Ready or launching, then the
  NodeClaims Karpenter launches, then the Ready nodes: queue.core.provisioned_nodes), all Succeed on the
  NodePool's nodes, and at no sampled moment do more than runsPerNode x its Ready nodes run there. Before the
  change (runs at zero nodes neither queued nor gated) the burst went to the first node uncapped.
- Consolidation while a run goes: a big run brings up a 32-CPU node, a 1-CPU upload joins it, the big one
  ends; the node is underused (consolidation would replace it) but the upload, placed with
  `karpenter.sh/do-not-disrupt: "true"`, keeps it until it Succeeds. Then Karpenter takes the node away.
  Before the change (no annotation on placed pods) Karpenter evicted such a pod ~20 s after the big one went
  (`test_karpenter_smoke.test_do_not_disrupt_keeps_a_running_pod_through_consolidation`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from controller.core.model import TAINT_KEY
from controller.queue.core import QUEUE_ANNOTATION
from devcluster import karpenter
from devcluster.cluster import Cluster, KWOK_NODE_SELECTOR
from tests.coexist.test_karpenter_placement import DO_NOT_DISRUPT, NODEPOOLS, POOL, POOL_LABEL, _policy
from tests.coexist.test_karpenter_smoke import _karpenter_said, _ready
from tests.coexist.test_kueue_smoke import RUN_DURATION
from tests.e2e.harness import running_placer
from tests.e2e.tekton_runs import MATCHING_IMAGE, Runs, step, succeeded, taskrun
from tests.kube import Api, node
from tests.waiting import WaitTimeout, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.coexist]

NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
RUNS_PER_NODE = 2
BURST = 8
TAINT = {"key": TAINT_KEY, "value": POOL, "effect": "NoSchedule"}


@pytest.fixture
def node_pool(coexist_api: Api, coexist_namespace: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A NodePool at zero nodes for pool POOL (its labels and taint), consolidating after `request.param`."""
    name = f"{POOL}-{coexist_namespace}"
    coexist_api.create(NODEPOOLS, karpenter.node_pool(name, {POOL_LABEL: POOL}, kwok_selector=KWOK_NODE_SELECTOR, taints=[TAINT],
                                                      consolidate_after=request.param))
    try:
        yield name
    finally:
        coexist_api.delete(NODEPOOLS + f"/{name}")
        wait_for("Karpenter to take the NodePool's nodes away with it", lambda: not _nodes(coexist_api, name), timeout=120)


def _nodes(api: Api, node_pool: str) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in api.items(node(), labelSelector=f"{karpenter.NODEPOOL_LABEL}={node_pool}")}


def _run(name: str, seconds: int, cpu: str | None = None) -> dict[str, Any]:
    upload = step(MATCHING_IMAGE)
    if cpu:
        upload["computeResources"] = {"requests": {"cpu": cpu}}
    return taskrun(name, annotations={RUN_DURATION: f"{seconds}s"}, spec={"taskSpec": {"steps": [upload]}})


@pytest.mark.parametrize("node_pool", ["10m"], indirect=True)  # nodes stay through the test
def test_a_queued_pool_at_zero_nodes_is_not_stuck_and_caps_a_burst_from_the_first_node(
    karpenter_cluster: Cluster, coexist_api: Api, coexist_namespace: str, node_pool: str, tmp_path: Path
) -> None:
    api, tenant = coexist_api, coexist_namespace
    runs = Runs(api)
    policy = _policy(tmp_path / "policy.yaml", tenant, node_pool, f"    queue: {{runsPerNode: {RUNS_PER_NODE}}}\n")
    try:
        assert not _nodes(api, node_pool)
        with running_placer(karpenter_cluster, api, policy):
            names = [runs.name(f"burst-{i}") for i in range(BURST)]
            made = [runs.create(tenant, "taskruns", _run(n, 4)) for n in names]
            # Queued at zero nodes like anywhere else: the queue counts one node while none is Ready or launching,
            # so runsPerNode of them are released at once and their pods bring the first node up.
            assert [m["spec"].get("status") for m in made] == ["TaskRunPending"] * BURST
            assert all(QUEUE_ANNOTATION in m["metadata"]["annotations"] for m in made)
            over: list[tuple[int, int]] = []
            most = 0

            def done() -> bool:
                nonlocal most
                nodes = _nodes(api, node_pool)
                ready = [n for n, obj in nodes.items() if _ready(obj)]
                running = [p for p in runs.pods_by_taskrun(tenant).values()
                           if p["spec"].get("nodeName") in nodes and p.get("status", {}).get("phase") == "Running"]
                most = max(most, len(running))
                if len(running) > RUNS_PER_NODE * len(ready):
                    over.append((len(running), len(ready)))
                listed = runs.listed(tenant, "taskruns")
                return all(n in listed and succeeded(listed[n]) == "True" for n in names)

            wait_for(f"{BURST} runs queued at zero nodes to Succeed on the NodePool's nodes", done, timeout=300, interval=0.25)
            claims = [c["metadata"]["name"] for c in api.items(NODECLAIMS, labelSelector=f"{karpenter.NODEPOOL_LABEL}={node_pool}")]
            assert not over, f"(running, Ready nodes) over runsPerNode {RUNS_PER_NODE} per node: {over}; nodes {list(_nodes(api, node_pool))}, claims {claims}"
            assert most >= 1
            assert set(runs.nodes_of(tenant, names).values()) <= set(_nodes(api, node_pool))
            released = runs.events(tenant, "Released")
            assert len(released) == BURST, len(released)
    finally:
        runs.cleanup()


@pytest.mark.parametrize("node_pool", ["5s"], indirect=True)
def test_consolidation_waits_for_a_placed_run_and_takes_its_node_after(
    karpenter_cluster: Cluster, coexist_api: Api, coexist_namespace: str, node_pool: str, tmp_path: Path
) -> None:
    api, tenant = coexist_api, coexist_namespace
    runs = Runs(api)
    try:
        with running_placer(karpenter_cluster, api, _policy(tmp_path / "policy.yaml", tenant, node_pool)):
            big, upload = runs.name("big"), runs.name("upload")
            runs.create(tenant, "taskruns", _run(big, 10, cpu="30"))
            big_node = wait_for("the big run on a node Karpenter made for it",
                                lambda: runs.nodes_of(tenant, [big])[big] if runs.listed(tenant, "taskruns").get(big, {}).get("status", {})
                                .get("podName") else None, timeout=180)
            assert big_node in _nodes(api, node_pool)
            runs.create(tenant, "taskruns", _run(upload, 45, cpu="1"))
            pod = wait_for("the upload beside it", lambda: (p := runs.pods_by_taskrun(tenant).get(upload)) and p["spec"].get("nodeName") and p,
                           timeout=120)
            assert pod["spec"]["nodeName"] == big_node
            assert pod["metadata"]["annotations"].get(DO_NOT_DISRUPT) == "true"

            def upload_done() -> bool:
                """The upload keeps its node and is never evicted, until it Succeeds."""
                now = runs.pods_by_taskrun(tenant).get(upload) or {}
                assert now.get("metadata", {}).get("uid") == pod["metadata"]["uid"], "the upload's pod was replaced"
                assert not now["metadata"].get("deletionTimestamp"), f"the upload's pod is being deleted: {_karpenter_said(api, tenant)}"
                assert big_node in _nodes(api, node_pool), f"its node went while it ran: {_karpenter_said(api, tenant)}"
                return succeeded(runs.get(tenant, "taskruns", upload)) == "True"

            wait_for("the upload to Succeed on its underused node", upload_done, timeout=180, interval=0.5)
            assert succeeded(runs.get(tenant, "taskruns", big)) == "True"
            try:
                wait_for("Karpenter to take the node away once its runs ended", lambda: big_node not in _nodes(api, node_pool), timeout=180)
            except WaitTimeout as failure:
                raise AssertionError(f"{failure}; Karpenter said: {_karpenter_said(api, tenant)}") from failure
    finally:
        runs.cleanup()
