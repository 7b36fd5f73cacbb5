"""The queue beside Kueue with tekton-kueue (issue #25): a PipelineRun Kueue holds is never released by us
(`queue.core.held_by_kueue`), whatever a tenant writes on it; a pool `governedBy: kueue` creates no run
pending. On the real ClusterState and core, with a fake releaser whose Workloads are Kueue's."""

from __future__ import annotations

from typing import Any

import pytest

from controller.core.policy import load_policy
from controller.queue.core import (
    KUEUE_QUEUE_LABEL,
    QUEUE_ANNOTATION,
    PoolQueue,
    QueueEntry,
    QueueSetting,
    Release,
    ReleaseReason,
    entry_annotation,
    held_by_kueue,
    kueue_workload_missing,
    plan,
    workload_of,
)
from controller.queue.reconcile import KUEUE_LOOK_SECONDS, QueueReconciler
from controller.core.model import POOL_SLOT_GATE
from tests.unit.test_admission_handlers import RecordingSink, taskrun, tekton_pod
from tests.unit.test_queue_admission import QUEUED_POLICY, FakeReleaser, queue_some, queued_env, run_obj

NS = "team-ci"


def entry(name: str = "r", kind: str = "PipelineRun", *, pending: bool = True, done: bool = False, label: bool = False) -> QueueEntry:
    return QueueEntry(kind, NS, name, "egress", 1.0, pending, done, uid=f"uid-{name}", kueue_label=label)


@pytest.mark.parametrize(
    ("run", "workloads", "held"),
    [
        (entry(label=True), {}, True),  # labelled, the Workload not made yet
        (entry(), {}, False),  # no label, no Workload: not Kueue's
        (entry(), {"uid-r": False}, True),  # a tenant removed the label: the Workload still holds it
        (entry(label=True), {"uid-r": False}, True),
        (entry(label=True), {"uid-r": True}, False),  # admitted by Kueue: ours to release
        (entry(label=True), {"uid-other": False}, True),
        (entry(), None, True),  # Kueue's Workloads unreadable: never release on doubt
        (entry(kind="TaskRun", label=True), None, False),  # TEP-0164 holds no TaskRun
        (entry(label=True, pending=False), {"uid-r": False}, False),  # released already
        (entry(label=True, done=True), {"uid-r": False}, False),
    ],
)
def test_held_by_kueue(run: QueueEntry, workloads: dict[str, bool] | None, held: bool) -> None:
    assert held_by_kueue(run, workloads) is held


def _workload(owner_kind: str = "PipelineRun", api: str = "tekton.dev/v1", controller: bool = True, admitted: str = "False") -> dict[str, Any]:
    return {
        "metadata": {"name": "pipelinerun-r-1", "ownerReferences": [
            {"apiVersion": api, "kind": owner_kind, "name": "r", "uid": "uid-r", "controller": controller}]},
        "status": {"conditions": [{"type": "Admitted", "status": admitted}]},
    }


def test_workload_of_reads_the_owning_pipelinerun_and_admission() -> None:
    assert workload_of(_workload()) == ("uid-r", False)
    assert workload_of(_workload(admitted="True")) == ("uid-r", True)
    assert workload_of(_workload(owner_kind="Job", api="batch/v1")) is None
    assert workload_of(_workload(controller=False)) is None
    assert workload_of({"metadata": "junk", "status": []}) is None


def test_a_held_run_waits_in_no_line_and_takes_no_slot() -> None:
    setting = QueueSetting.model_validate({"runsPerNode": 1})
    queue = PoolQueue("egress", setting, "required", slots=1)
    held = QueueEntry("PipelineRun", NS, "held", "egress", 0.0, True, kueue_held=True)
    other = QueueEntry("TaskRun", NS, "other", "egress", 1.0, True)
    result = plan(queue, [held, other], now=2.0)
    assert [r.entry.name for r in result.releases] == ["other"] and result.occupied == 0
    assert [e.name for e in result.line] == []


def test_a_pool_kueue_governs_lets_its_old_line_go_but_not_what_kueue_holds() -> None:
    setting = QueueSetting.model_validate({"runsPerNode": 1, "governedBy": "kueue"})
    queue = PoolQueue("egress", setting, "required", slots=0)
    held = QueueEntry("PipelineRun", NS, "held", "egress", 0.0, True, kueue_held=True)
    old = QueueEntry("TaskRun", NS, "old", "egress", 1.0, True)
    result = plan(queue, [held, old], now=2.0)
    assert [(r.entry.name, r.reason) for r in result.releases] == [("old", ReleaseReason.UNQUEUED)]


# -- the release pass ----------------------------------------------------------------------------------


def pipelinerun(env: Any, name: str, *, label: bool, queued_at: float) -> dict[str, Any]:
    obj = run_obj("PipelineRun", NS, name, entry_annotation("egress", "PipelineRun", queued_at), "PipelineRunPending")
    if label:
        obj["metadata"]["labels"] = {KUEUE_QUEUE_LABEL: "pipelines-queue"}
    env.state.apply("PipelineRun", "ADDED", obj)
    return obj


def test_a_tenant_labelling_its_run_kueue_held_gains_no_slot_and_freezes_nothing() -> None:
    """The label alone (no Kueue, or a namespace Kueue does not hold) only keeps that run waiting: the runs
    behind it are released into every slot, and it counts in none."""
    env = queued_env()
    releaser = FakeReleaser(env)
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    pipelinerun(env, "labelled", label=True, queued_at=env.now - 100)  # first in line
    queue_some(env, NS, 4)
    requeue = reconciler()
    assert [c[2] for c in releaser.calls] == [f"{NS}-0", f"{NS}-1", f"{NS}-2"]  # 3 slots, none for it
    assert requeue is not None and requeue <= KUEUE_LOOK_SECONDS  # it looks again for Kueue's admission
    assert reconciler.plans["egress"].occupied == 0 and len(reconciler.plans["egress"].line) == 1


def test_a_run_kueue_holds_is_never_released_even_without_its_label() -> None:
    env = queued_env()
    releaser = FakeReleaser(env)
    releaser.workloads = {NS: {"uid-held": False}}
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    pipelinerun(env, "held", label=False, queued_at=env.now - 100)  # the tenant removed tekton-kueue's label
    reconciler()
    assert releaser.calls == []
    releaser.workloads = {NS: {"uid-held": True}}  # Kueue admits it: a free slot of ours releases it
    reconciler()
    assert [c[2] for c in releaser.calls] == ["held"]


def test_unreadable_workloads_release_no_pipelinerun_but_taskruns_still_go() -> None:
    env = queued_env()
    releaser = FakeReleaser(env)
    releaser.workloads = None
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    pipelinerun(env, "unknown", label=False, queued_at=env.now - 100)
    queue_some(env, NS, 1)
    reconciler()
    assert [c[2] for c in releaser.calls] == [f"{NS}-0"]


def test_every_release_path_asks_kueue() -> None:
    """`_release` is where every release goes (a pass's plan, a pool that no longer queues, another
    reconciler's): handed a held run directly, it releases nothing."""
    env = queued_env()
    releaser = FakeReleaser(env)
    releaser.workloads = {NS: {"uid-held": False}}
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    pipelinerun(env, "held", label=False, queued_at=env.now - 100)
    (held,) = env.state.queue.queue_entries()
    reconciler._release(Release(held, ReleaseReason.UNQUEUED), env.now, None)  # noqa: SLF001
    assert releaser.calls == []


# -- admission on a pool Kueue governs -----------------------------------------------------------------


def governed_env() -> Any:
    env = queued_env()
    env.state.set_policy(load_policy(QUEUED_POLICY.replace("PLACEMENT", "required").replace(
        "queue: {runsPerNode: 1, maxQueueSeconds: 60}", "queue: {runsPerNode: 1, governedBy: kueue}")))
    return env


def test_a_pool_kueue_governs_creates_no_run_pending_but_its_pods_still_wait_for_a_slot() -> None:
    env = governed_env()
    _, patched, _ = env.review(taskrun())
    assert "status" not in patched["spec"] and QUEUE_ANNOTATION not in patched["metadata"]["annotations"]
    assert patched["spec"]["podTemplate"]["tolerations"]  # placed as usual
    _, pod, _ = env.review(tekton_pod())
    assert {"name": POOL_SLOT_GATE} in pod["spec"]["schedulingGates"]  # the pool's cap stays the backstop


def test_a_labelled_run_is_no_place_in_the_line_a_new_run_is_told() -> None:
    """Admission's line summary counts a run carrying tekton-kueue's label as Kueue's (no Workload is read there)."""
    env = queued_env()
    pipelinerun(env, "labelled", label=True, queued_at=env.now - 100)
    assert env.state.queue.queue_counts(env.state.policy.pool("egress"), env.now)[0] == 0


def test_a_labelled_run_kueue_admitted_is_released_into_a_free_slot() -> None:
    env = queued_env()
    releaser = FakeReleaser(env)
    releaser.workloads = {NS: {"uid-admitted": True}}
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    pipelinerun(env, "admitted", label=True, queued_at=env.now - 100)
    assert reconciler() is None  # nothing held, nothing waits
    assert [c[2] for c in releaser.calls] == ["admitted"]


# -- a labelled run whose Workload never comes -----------------------------------------------------------


@pytest.mark.parametrize(
    ("run", "workloads", "now", "missing"),
    [
        (entry(label=True), {}, 61.0, True),  # queued at 1.0, 60 s later still no Workload
        (entry(label=True), {}, 60.9, False),  # not yet
        (entry(label=True), {"uid-r": False}, 500.0, False),  # Kueue has it (held, as it should be)
        (entry(label=True), None, 500.0, False),  # the look failed: nothing is known
        (entry(), {}, 500.0, False),  # no label: not held, ours
        (entry(kind="TaskRun", label=True), {}, 500.0, False),
        (entry(label=True, pending=False), {}, 500.0, False),
    ],
)
def test_kueue_workload_missing(run: QueueEntry, workloads: dict[str, bool] | None, now: float, missing: bool) -> None:
    assert kueue_workload_missing(run, workloads, now, wait=60.0) is missing


def test_a_labelled_run_without_a_workload_gets_one_warning_after_the_wait_and_is_still_not_released() -> None:
    env = queued_env()
    releaser = FakeReleaser(env)
    sink = RecordingSink()
    reconciler = QueueReconciler(env.state, releaser, sink, env.metrics, clock=lambda: env.now, kueue_wait=30.0)
    pipelinerun(env, "orphan", label=True, queued_at=env.now)
    reconciler()
    assert not [s for s in sink.sent if s[2] == "KueueWorkloadMissing"]
    env.now += 30.0
    releaser.workloads = None  # one failed look: no Warning, nothing forgotten
    reconciler()
    assert not [s for s in sink.sent if s[2] == "KueueWorkloadMissing"]
    releaser.workloads = {}
    for _ in range(3):
        env.now += 1.0
        assert reconciler() is not None  # it keeps looking
    warned = [s for s in sink.sent if s[2] == "KueueWorkloadMissing"]
    assert [(r["name"], t) for r, t, _ in warned] == [("orphan", "Warning")]  # once
    assert releaser.calls == []
    releaser.workloads = None
    reconciler()
    releaser.workloads = {}
    reconciler()
    assert len([s for s in sink.sent if s[2] == "KueueWorkloadMissing"]) == 1


def test_status_lists_the_runs_held_for_kueue_and_says_where_to_look_when_long() -> None:
    from controller.cli.status import queue_lines

    env = queued_env()
    pipelinerun(env, "orphan", label=True, queued_at=env.now - 90)
    pipelinerun(env, "fresh", label=True, queued_at=env.now - 5)
    lines = queue_lines(env.state, env.now)
    assert lines[0].startswith("pool egress: 0/3 slots taken, 0 waiting")
    assert lines[1] == f"  held for Kueue ({KUEUE_QUEUE_LABEL}), not released by egress-placer: 2"
    assert lines[2].startswith(f"      PipelineRun {NS}/orphan, held 90s (over 60s: see its Workload, kubectl get workloads -n {NS}")
    assert lines[3] == f"      PipelineRun {NS}/fresh, held 5s"
