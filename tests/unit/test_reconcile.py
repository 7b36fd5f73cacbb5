"""The leader's reconcilers against a ClusterState and recording fakes (no cluster): what the taint
reconciler writes and does not write again; how the intruder reconciler tracks each intruder by uid
until it is gone: evicts it once with its own grace capped, deletes it with grace 0 when it is still
there after that grace, retries refused evictions and deletes an intruder its budget shields past the
budget grace, says which step removed it, or reports in report mode; and that the loop runs only as
leader, survives failures and comes back early for unfinished work."""

from __future__ import annotations

import threading
from typing import Any, Sequence

import pytest
from pydantic import ValidationError

from controller.core.model import Taint
from controller.core.policy import load_policy
from controller.metrics import Metrics
from controller.intruders.reconcile import IntruderReconciler
from controller.reconcile_loop import ReconcileLoop
from controller.taints.reconcile import TaintReconciler
from controller.runner import Runner
from controller.settings import Settings
from controller.state import ClusterState

POLICY = load_policy(
    """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress: "yes"}
    namespaces: ["team-*"]
"""
)
POOL_TAINT = Taint("egress-placer.io/pool", "overseas", "NoSchedule")
FOREIGN = Taint("example.com/dedicated", "gpu", "NoSchedule")


def node(name: str, rv: str, pool: bool, taints: Sequence[Taint] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": rv, "labels": {"egress": "yes"} if pool else {}},
        "spec": {"taints": [t.to_dict() for t in taints]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


class RecordingWriter:
    def __init__(self, fail: int = 0, evictable: bool = True) -> None:
        self.taint_writes: list[tuple[str, tuple[Taint, ...], str | None]] = []
        self.evictions: list[tuple[str, str, int | None]] = []
        self.deletions: list[tuple[str, str, int | None]] = []
        self.uids: list[str] = []
        self.fail = fail
        self.evictable = evictable

    def set_node_taints(self, node, taints, resource_version, *, rebase=None) -> None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("API down")
        self.taint_writes.append((node, tuple(taints), resource_version))

    def evict(self, namespace: str, name: str, uid: str = "", grace_seconds: int | None = None) -> bool:
        self.evictions.append((namespace, name, grace_seconds))
        self.uids.append(uid)
        return self.evictable

    def delete_pod(self, namespace: str, name: str, uid: str = "", grace_seconds: int | None = None) -> None:
        self.deletions.append((namespace, name, grace_seconds))
        self.uids.append(uid)


class RecordingEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def emit(self, regarding, type, reason, note, action="") -> None:
        self.events.append((regarding["name"], type, reason))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_state(*nodes: dict[str, Any]) -> ClusterState:
    state = ClusterState(POLICY, clock=lambda: 0.0)
    state.replace("Node", list(nodes))
    return state


@pytest.mark.parametrize(
    ("taints", "pool", "written"),
    [
        ((), True, (POOL_TAINT,)),
        ((FOREIGN,), True, (FOREIGN, POOL_TAINT)),
        ((POOL_TAINT,), True, None),
        ((POOL_TAINT, FOREIGN), False, (FOREIGN,)),
        ((Taint("egress-placer.io/pool", "other", "NoSchedule"),), True, (POOL_TAINT,)),
        ((FOREIGN,), False, None),
    ],
    ids=["joins", "joins-keeps-foreign", "in-place", "leaves-keeps-foreign", "wrong-value", "never-member"],
)
def test_taint_pass_writes_the_whole_list_against_the_cached_version(taints, pool, written):
    writer = RecordingWriter()
    TaintReconciler(make_state(node("n1", "7", pool, taints)), writer, Metrics())()
    assert writer.taint_writes == ([] if written is None else [("n1", written, "7")])


NO_POOLS = load_policy("apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\n")


def test_without_a_valid_policy_the_taints_stay_and_a_valid_policy_without_pools_removes_them():
    state = ClusterState(None, clock=lambda: 0.0)  # no policy loaded, none stored
    state.replace("Node", [node("n1", "7", True, [POOL_TAINT, FOREIGN]), node("n2", "3", False, [POOL_TAINT])])
    writer = RecordingWriter()
    reconcile = TaintReconciler(state, writer, Metrics()).reconcile  # one pass: the taint changes written
    assert reconcile() == [] and writer.taint_writes == []
    state.set_policy(NO_POOLS)  # valid, and no pool any more: its taints go, foreign ones stay
    reconcile()
    assert sorted(writer.taint_writes) == [("n1", (FOREIGN,), "7"), ("n2", (), "3")]


def test_taint_write_in_flight_is_not_repeated_until_the_cache_moves():
    clock = Clock()
    state = make_state(node("n1", "7", True))
    writer = RecordingWriter()
    reconcile = TaintReconciler(state, writer, Metrics(), clock=clock, in_flight_seconds=30)
    reconcile()
    reconcile()
    assert len(writer.taint_writes) == 1
    state.apply("Node", "MODIFIED", node("n1", "8", True, [POOL_TAINT]))  # the write arrived
    reconcile()
    state.apply("Node", "MODIFIED", node("n1", "9", True))  # removed by hand: write again
    reconcile()
    assert [w[2] for w in writer.taint_writes] == ["7", "9"]
    clock.now = 31  # the cache never caught up: trust it again
    reconcile()
    assert [w[2] for w in writer.taint_writes] == ["7", "9", "9"]


def test_a_failed_taint_write_is_retried_next_pass_and_counted_only_when_done():
    metrics = Metrics()
    writer = RecordingWriter(fail=1)
    reconcile = TaintReconciler(make_state(node("n1", "7", True)), writer, metrics).reconcile
    assert reconcile() == []
    assert len(reconcile()) == 1
    assert metrics.taint_changes.labels(pool="overseas", action="add")._value.get() == 1


def pod(
    ns: str, name: str, node_name: str, *, uid: str = "", grace: int | None = None, deleting: bool = False,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": ns, "name": name, "uid": uid or f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        meta["deletionGracePeriodSeconds"] = grace
    if owners:
        meta["ownerReferences"] = owners
    return {
        "metadata": meta,
        "spec": {"nodeName": node_name, "terminationGracePeriodSeconds": grace},
        "status": {"phase": "Running"},
    }


def intruder_state(grace: int | None = None) -> ClusterState:
    state = make_state(node("pool-1", "1", True), node("plain-1", "1", False))
    for obj in (pod("team-a", "allowed", "pool-1"), pod("intruders", "x", "pool-1", grace=grace), pod("intruders", "y", "plain-1")):
        state.apply("Pod", "ADDED", obj)
    return state


def reconciler(state: ClusterState, writer: RecordingWriter, events: RecordingEvents, metrics: Metrics, clock: Clock, **kw):
    return IntruderReconciler(state, writer, events, metrics, "evict", clock=clock, **kw)


def test_an_intruder_is_evicted_once_with_a_capped_grace_and_tracked_until_gone():
    clock, writer, events, metrics = Clock(), RecordingWriter(), RecordingEvents(), Metrics()
    state = intruder_state(grace=86400)
    reconcile = reconciler(state, writer, events, metrics, clock, eviction_grace=10)
    reconcile()
    clock.now = 5
    requeue_after = reconcile()  # within the grace: nothing more
    assert writer.evictions == [("intruders", "x", 10)]
    assert events.events == [("x", "Warning", "IntruderEvicted")]
    assert requeue_after == pytest.approx(6)  # when the grace (and a second) is over
    state.apply("Pod", "DELETED", pod("intruders", "x", "pool-1"))
    clock.now = 7
    requeue_after = reconcile()
    assert events.events[-1] == ("x", "Normal", "IntruderRemoved")
    assert metrics.intruders_removed.labels(pool="overseas", step="evicted")._value.get() == 1
    assert metrics.evictions.labels(pool="overseas", outcome="evicted")._value.get() == 1
    assert requeue_after is None


@pytest.mark.parametrize(("own", "cap", "given"), [(86400, 10, 10), (0, 10, 0), (3, 10, 3), (30, 0, 0)])
def test_the_eviction_gives_the_pods_own_grace_at_most_the_cap(own, cap, given):
    writer = RecordingWriter()
    reconciler(intruder_state(grace=own), writer, RecordingEvents(), Metrics(), Clock(), eviction_grace=cap)()
    assert writer.evictions == [("intruders", "x", given)]


def test_an_intruder_still_there_after_the_grace_is_deleted_with_grace_0_and_again_while_listed():
    clock, writer, events, metrics = Clock(), RecordingWriter(), RecordingEvents(), Metrics()
    state = intruder_state(grace=86400)
    reconcile = reconciler(state, writer, events, metrics, clock, eviction_grace=10, retry_seconds=5)
    reconcile()
    state.apply("Pod", "MODIFIED", pod("intruders", "x", "pool-1", deleting=True, grace=10))  # terminating: still tracked
    clock.now = 10.9
    reconcile()
    assert writer.deletions == []
    clock.now = 11
    reconcile()
    assert writer.deletions == [("intruders", "x", 0)]
    assert set(writer.uids) == {"uid-x"}  # the eviction and the deletes name this pod, not a later one of its name
    clock.now = 16
    reconcile()  # a node that never confirms: deleted again, counted and told once
    assert writer.deletions == [("intruders", "x", 0)] * 2
    assert [e[2] for e in events.events] == ["IntruderEvicted", "IntruderDeletedAfterGrace"]
    assert metrics.evictions.labels(pool="overseas", outcome="deleted-after-grace")._value.get() == 1
    state.apply("Pod", "DELETED", pod("intruders", "x", "pool-1"))
    reconcile()
    assert metrics.intruders_removed.labels(pool="overseas", step="deleted-after-grace")._value.get() == 1


def test_a_terminating_intruder_found_as_such_is_evicted_to_shorten_its_grace():
    writer = RecordingWriter()
    state = make_state(node("pool-1", "1", True))
    state.apply("Pod", "ADDED", pod("intruders", "x", "pool-1", deleting=True, grace=86400))  # the tenant's own delete
    reconciler(state, writer, RecordingEvents(), Metrics(), Clock(), eviction_grace=10)()
    assert writer.evictions == [("intruders", "x", 10)]


def test_a_replacement_pod_of_the_same_name_is_a_new_intruder_at_once():
    clock, writer = Clock(), RecordingWriter()
    state = intruder_state()
    reconcile = reconciler(state, writer, RecordingEvents(), Metrics(), clock)
    reconcile()
    state.apply("Pod", "DELETED", pod("intruders", "x", "pool-1"))
    state.apply("Pod", "ADDED", pod("intruders", "x", "pool-1", uid="uid-x-2"))  # a StatefulSet re-creates it
    clock.now = 0.5
    reconcile()
    assert writer.uids == ["uid-x", "uid-x-2"]


def test_an_eviction_a_disruption_budget_refuses_is_tried_again_next_pass():
    clock, writer, events = Clock(), RecordingWriter(evictable=False), RecordingEvents()
    reconcile = reconciler(intruder_state(), writer, events, Metrics(), clock)
    reconcile()
    reconcile()
    assert [e[:2] for e in writer.evictions] == [("intruders", "x")] * 2 and events.events == []
    assert writer.deletions == []


def test_an_intruder_whose_budget_refuses_eviction_for_the_whole_grace_is_deleted():
    clock, writer, events, metrics = Clock(), RecordingWriter(evictable=False), RecordingEvents(), Metrics()
    reconcile = reconciler(intruder_state(grace=86400), writer, events, metrics, clock, budget_grace=30, eviction_grace=10).reconcile
    for now in (0, 10, 29.9):
        clock.now = now
        assert reconcile() == []
    assert writer.deletions == [] and events.events == []
    clock.now = 30
    assert [i.name for i in reconcile()] == ["x"]
    assert writer.deletions == [("intruders", "x", 10)]  # the budget's delete gives the capped grace too
    assert set(writer.uids) == {"uid-x"}
    assert events.events == [("x", "Warning", "IntruderDeletedPastBudgetGrace")]
    assert metrics.evictions.labels(pool="overseas", outcome="deferred")._value.get() == 3
    assert metrics.evictions.labels(pool="overseas", outcome="deleted-past-budget-grace")._value.get() == 1
    clock.now = 41  # and it is still there after that grace: grace 0
    reconcile()
    assert writer.deletions == [("intruders", "x", 10), ("intruders", "x", 0)]


def test_the_grace_starts_again_for_an_intruder_that_left_and_came_back():
    clock, writer = Clock(), RecordingWriter(evictable=False)
    state = intruder_state()
    reconcile = reconciler(state, writer, RecordingEvents(), Metrics(), clock, budget_grace=30)
    reconcile()
    state.apply("Pod", "DELETED", pod("intruders", "x", "pool-1"))
    clock.now = 20
    reconcile()
    state.apply("Pod", "ADDED", pod("intruders", "x", "pool-1"))
    clock.now = 40  # 40 s after the first refusal, but only 0 s after this pod's first
    reconcile()
    assert writer.deletions == []
    clock.now = 70
    reconcile()
    assert [d[:2] for d in writer.deletions] == [("intruders", "x")]


def test_an_unresolved_agent_owner_gets_a_moment_for_the_daemonset_cache():
    clock, writer = Clock(), RecordingWriter()
    state = make_state(node("pool-1", "1", True))
    state.set_policy(POLICY.model_copy(update={"agent_namespaces": ("kube-agents",)}))
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "ds-1", "controller": True}
    state.apply("Pod", "ADDED", pod("kube-agents", "a", "pool-1", owners=[owner]))
    state.apply("Pod", "ADDED", pod("kube-agents", "b", "pool-1", owners=[{**owner, "uid": "made-up"}]))
    reconcile = reconciler(state, writer, RecordingEvents(), Metrics(), clock, owner_settle_seconds=5)
    reconcile()
    assert writer.evictions == []
    state.apply("DaemonSet", "ADDED", {"metadata": {"namespace": "kube-agents", "name": "agent", "uid": "ds-1"}})
    clock.now = 5
    reconcile()
    assert [e[1] for e in writer.evictions] == ["b"]  # a: a real node agent now; b: never resolved


def test_a_deferred_eviction_asks_for_an_early_pass_until_it_is_done():
    clock, writer = Clock(), RecordingWriter(evictable=False)
    state = intruder_state(grace=0)
    reconcile = reconciler(state, writer, RecordingEvents(), Metrics(), clock, retry_seconds=5)
    assert reconcile() == 5  # the pass returns its requeue-after
    writer.evictable = True
    assert reconcile() == pytest.approx(1)  # evicted with grace 0: look again a second later
    state.apply("Pod", "DELETED", pod("intruders", "x", "pool-1"))
    assert reconcile() is None


def test_the_loop_runs_again_within_what_a_reconciler_asks_without_any_event():
    passes = threading.Semaphore(0)

    def unfinished() -> float:
        passes.release()
        return 0.01  # its requeue-after

    loop, runner = ReconcileLoop(make_state(), [unfinished], lambda: True, resync_seconds=3600, debounce_seconds=0), Runner()
    runner.start("reconcile loop", loop.run, on_stop=loop.wake)
    try:
        assert all(passes.acquire(timeout=10) for _ in range(3))  # the resync alone would wait an hour
    finally:
        runner.stop()


def test_without_a_grace_budgets_are_honoured_for_ever():
    clock, writer = Clock(), RecordingWriter(evictable=False)
    reconcile = reconciler(intruder_state(), writer, RecordingEvents(), Metrics(), clock, budget_grace=None)
    for now in (0, 1_000, 1_000_000):
        clock.now = now
        reconcile()
    assert len(writer.evictions) == 3 and writer.deletions == []


def test_report_mode_reports_and_never_evicts():
    writer, events, metrics = RecordingWriter(), RecordingEvents(), Metrics()
    reconcile = IntruderReconciler(intruder_state(), writer, events, metrics, "report")
    reconcile()
    reconcile()
    assert writer.evictions == []
    assert events.events == [("x", "Warning", "IntruderFound")]
    assert metrics.intruders_reported.labels(pool="overseas")._value.get() == 1
    assert metrics.intruders.labels(pool="overseas")._value.get() == 1  # still there: reported, not removed
    assert not [s for f in metrics.evictions.collect() for s in f.samples]  # a report is no eviction step


@pytest.mark.parametrize(("leader", "passes"), [(True, 1), (False, 0)])
def test_loop_runs_reconcilers_only_as_leader_and_survives_failures(leader, passes):
    calls: list[str] = []

    def broken() -> None:
        calls.append("broken")
        raise RuntimeError("boom")

    loop = ReconcileLoop(make_state(), [broken, lambda: calls.append("next")], lambda: leader)
    loop.run_once()
    assert calls == (["broken", "next"] if leader else [])
    assert loop.passes == passes


@pytest.mark.parametrize(
    ("variable", "grace"), [(None, 30.0), ("12.5", 12.5), ("0", 0.0), ("never", None), ("NEVER", None), ("", None)]
)
def test_the_budget_grace_setting(monkeypatch, variable, grace):
    if variable is not None:
        monkeypatch.setenv("EGRESS_PLACER_INTRUDER_BUDGET_GRACE_SECONDS", variable)
    assert Settings().intruder_budget_grace_seconds == grace


@pytest.mark.parametrize(("variable", "grace"), [(None, 10), ("2", 2), ("0", 0)])
def test_the_eviction_grace_setting(monkeypatch, variable, grace):
    if variable is not None:
        monkeypatch.setenv("EGRESS_PLACER_INTRUDER_EVICTION_GRACE_SECONDS", variable)
    assert Settings().intruder_eviction_grace_seconds == grace


@pytest.mark.parametrize("variable", ["-1", "soon", "never"])
def test_a_wrong_eviction_grace_is_refused(monkeypatch, variable):
    monkeypatch.setenv("EGRESS_PLACER_INTRUDER_EVICTION_GRACE_SECONDS", variable)
    with pytest.raises(ValidationError, match="intruder_eviction_grace_seconds"):
        Settings()


@pytest.mark.parametrize("variable", ["-1", "soon"])
def test_a_wrong_budget_grace_is_refused(monkeypatch, variable):
    monkeypatch.setenv("EGRESS_PLACER_INTRUDER_BUDGET_GRACE_SECONDS", variable)
    with pytest.raises(ValidationError, match="intruder_budget_grace_seconds"):
        Settings()


def test_a_failed_pass_keeps_what_the_reconciler_asked_for_before():
    # A release or an eviction that raised is still pending: the next pass comes as soon as it asked, not at the resync.
    answers: list[float | Exception] = [0.5, RuntimeError("the API server refused")]

    def pending() -> float | None:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    loop = ReconcileLoop(make_state(), [pending, lambda: None], lambda: True)
    assert loop.run_once() == [0.5]
    assert loop.run_once() == [0.5]
