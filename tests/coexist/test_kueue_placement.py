"""egress-placer beside Kueue with tekton-kueue (issue #25): a ClusterQueue admitting 2 PipelineRuns at a time,
6 submitted whose task needs pool `overseas` (the cluster's egress-1..3, runsPerNode 1: 3 slots).

- `governedBy: egress-placer` (our queue, runs coscheduled, so that we queue each PipelineRun whole, on the
  same `spec.status` tekton-kueue holds it by; run guard on): egress-placer releases a run only once Kueue
  admitted it (`queue.core.held_by_kueue`); every Released Event of ours comes after its Workload's Admitted.
  Before the change our pass released 3 at once into its 3 free slots and tekton-kueue stopped the ones Kueue
  had not admitted (`test_kueue_smoke.test_a_run_released_behind_kueues_back_is_stopped`).
- `governedBy: kueue`: egress slots are a ClusterQueue resource (`egress-overseas: 2`), requested through
  tekton-kueue's CEL `resource("egress-overseas", 1)`; egress-placer creates no run pending and releases none.

Both: never more than 2 runs admitted at once, every run's TaskRun pod on the pool, all 6 Succeed."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import pytest

from controller.queue.core import QUEUE_ANNOTATION
from devcluster import kueue
from devcluster.cluster import Cluster
from tests.coexist.test_kueue_smoke import KUEUE, RUN_DURATION, _queues
from tests.e2e.harness import running_placer
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL_NODES, Runs, step, succeeded
from tests.e2e.test_placement import tekton_coschedule
from tests.kube import Api, namespaced
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.coexist]

POOL = "overseas"
SLOT_RESOURCE = f"egress-{POOL}"  # tekton-kueue writes kueue.konflux-ci.dev/requests-egress-overseas
RUNS = 6
ADMITTED_AT_ONCE = 2
CONFIGMAP = f"/api/v1/namespaces/{kueue.TEKTON_KUEUE_NAMESPACE}/configmaps/{kueue.TEKTON_KUEUE_CONFIGMAP}"


def _policy(path: Path, tenant: str, governed_by: str) -> Path:
    path.write_text(
        "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npools:\n"
        f"  - name: {POOL}\n    nodeSelector: {{egress-placer.io/pool: {POOL}}}\n    images: ['*/cdn-*']\n"
        f"    namespaces: [{tenant}]\n    placement: required\n"
        f"    queue: {{runsPerNode: 1, governedBy: {governed_by}}}\n"
    )
    return path


def _upload(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": name, "annotations": {RUN_DURATION: "3s"}},
        "spec": {"pipelineSpec": {"tasks": [{"name": "upload", "taskSpec": {"steps": [step(MATCHING_IMAGE)]}}]}},
    }


def _admitted_at(workload: dict[str, Any]) -> float | None:
    for c in (workload.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Admitted" and c.get("status") == "True":
            return datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00")).timestamp()
    return None


@pytest.fixture
def slots_as_kueue_resource(coexist_api: Api) -> Iterator[None]:
    """tekton-kueue's CEL asks `resource("egress-overseas", 1)` of every new PipelineRun; restored afterwards."""
    config = kueue.tekton_kueue_config(cel=[f'resource("{SLOT_RESOURCE}", 1)'])
    coexist_api.merge_patch(CONFIGMAP, {"data": config["data"]})
    try:
        yield
    finally:
        coexist_api.merge_patch(CONFIGMAP, {"data": kueue.tekton_kueue_config()["data"]})


@pytest.mark.parametrize("governed_by", ["egress-placer", "kueue"])
def test_kueue_admits_two_at_a_time_and_egress_placer_places_them_on_the_pool(
    kueue_cluster: Cluster, coexist_api: Api, coexist_namespace: str, tmp_path: Path, governed_by: str, request: pytest.FixtureRequest
) -> None:
    api, ns = coexist_api, coexist_namespace
    if governed_by == "kueue":  # the egress slots are Kueue's resource
        request.getfixturevalue("slots_as_kueue_resource")
        cluster_queue = _queues(api, ns, 100, **{SLOT_RESOURCE: ADMITTED_AT_ONCE})
    else:
        cluster_queue = _queues(api, ns, ADMITTED_AT_ONCE)
    runs = Runs(api)
    workloads = namespaced(ns, "workloads", group=KUEUE)
    try:
        with running_placer(kueue_cluster, api, _policy(tmp_path / "policy.yaml", ns, governed_by), run_guard=True), \
                tekton_coschedule(api, "pipelineruns"):
            probe = _upload(runs.name("probe"))

            def configured() -> bool:
                made = runs.create(ns, "pipelineruns", probe, dry_run=True)
                annotations = made["metadata"].get("annotations") or {}
                coscheduled = "coscheduled" in str(annotations.get("egress-placer.io/decision"))
                cel = governed_by != "kueue" or f"kueue.konflux-ci.dev/requests-{SLOT_RESOURCE}" in annotations
                return coscheduled and cel

            wait_for("egress-placer to see coschedule=pipelineruns (and tekton-kueue its CEL)", configured, timeout=30)
            names = [runs.name(f"upload-{i}") for i in range(RUNS)]
            for name in names:
                made = runs.create(ns, "pipelineruns", _upload(name))
                assert made["spec"].get("status") == "PipelineRunPending"
                assert (QUEUE_ANNOTATION in made["metadata"]["annotations"]) is (governed_by == "egress-placer")

            most = 0

            def done() -> bool:
                nonlocal most
                listed = runs.listed(ns, "pipelineruns")
                admitted = [w for w in api.items(workloads) if _admitted_at(w) is not None
                            and not any(c.get("type") == "Finished" and c.get("status") == "True" for c in w["status"].get("conditions") or [])]
                running = [r for r in listed.values() if r["spec"].get("status") != "PipelineRunPending" and succeeded(r) is None]
                most = max(most, len(admitted), len(running))
                failed = [n for n, r in listed.items() if succeeded(r) == "False"]
                assert not failed, {n: listed[n]["status"]["conditions"] for n in failed}
                return all(n in listed and succeeded(listed[n]) == "True" for n in names)

            wait_for(f"{RUNS} PipelineRuns to Succeed, {ADMITTED_AT_ONCE} admitted at a time", done, timeout=300, interval=0.25)
            assert 0 < most <= ADMITTED_AT_ONCE, most
            nodes = runs.nodes_of(ns, [f"{n}-upload" for n in names])
            assert all(node in POOL_NODES for node in nodes.values()), nodes

            admitted = {(w["metadata"].get("ownerReferences") or [{}])[0].get("name"): _admitted_at(w) for w in api.items(workloads)}
            released = runs.events(ns, "Released")
            if governed_by == "kueue":
                assert not released  # our queue stepped aside
            else:
                # Each Released Event of ours (one per run: it is ours to release once Kueue admits it, as our
                # run guard refuses tekton-kueue's clearing) comes after that run's Workload was admitted.
                late = []
                for event in released:
                    run = (event.get("regarding") or {}).get("name")
                    at = datetime.fromisoformat(str(event.get("eventTime")).replace("Z", "+00:00")).timestamp()
                    if admitted.get(run) is None or at + 1.0 < admitted[run]:  # lastTransitionTime: seconds
                        late.append((run, at, admitted.get(run)))
                assert not late, late
                assert sorted((e.get("regarding") or {}).get("name") for e in released) == sorted(names)
            assert all(admitted.get(n) for n in names), admitted
    finally:
        runs.cleanup()
        api.delete(f"{KUEUE}/clusterqueues/{cluster_queue}")
