"""The queue at admission (controller/admission/handlers.py) and the leader's release pass
(controller/queue/reconcile.py), on a REAL ClusterState and the real core, with a fake releaser."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from prometheus_client import generate_latest

from controller.core.model import DECISION_ANNOTATION, POOL_SLOT_GATE
from controller.core.policy import load_policy
from controller.queue.core import QUEUE_ANNOTATION, admitted_entry, entry_annotation, read_entry
from controller.queue.reconcile import QueueReconciler
from tests.unit.test_admission_handlers import DATA, EGRESS_TOLERATION, TEKTON_USER, Env, RecordingSink, decision_of, taskrun, tekton_pod

QUEUED_POLICY = (DATA / "policy.yaml").read_text().replace(
    '    namespaces: ["team-ci", "team-web"]\n',
    '    namespaces: ["team-ci", "team-web"]\n    placement: PLACEMENT\n    queue: {runsPerNode: 1, maxQueueSeconds: 60}\n',
)


def queued_env(placement: str = "required") -> Env:
    env = Env()
    env.state.set_policy(load_policy(QUEUED_POLICY.replace("PLACEMENT", placement)))
    env.admission.wall = lambda: env.now
    return env


def test_a_run_of_a_queued_pool_is_created_pending_with_its_placement_and_entry() -> None:
    env = queued_env()
    _, patched, _ = env.review(taskrun())
    assert patched["spec"]["status"] == "TaskRunPending"
    assert EGRESS_TOLERATION in patched["spec"]["podTemplate"]["tolerations"]  # placed as today
    mark = read_entry(patched["metadata"]["annotations"][QUEUE_ANNOTATION], "TaskRun")
    assert mark is not None and mark.pool == "egress" and mark.queued_at == env.now
    assert decision_of(patched)["pool"] == "egress"
    queued = [e for e in env.events.sent if e["reason"] == "Queued"]
    assert len(queued) == 1 and "queued for pool egress" in queued[0]["note"]
    assert env.state.load.ledger.assumed_on("egress-1") + env.state.load.ledger.assumed_on("egress-2") + env.state.load.ledger.assumed_on("egress-3") == 0


@pytest.mark.parametrize("status", ["TaskRunPending", "TaskRunCancelled"])
def test_a_run_the_user_set_pending_is_left_alone(status: str) -> None:
    env = queued_env()
    run = taskrun()
    run["spec"]["status"] = status
    _, patched, _ = env.review(run)
    assert patched["spec"]["status"] == status
    assert QUEUE_ANNOTATION not in patched["metadata"].get("annotations", {})


def test_pools_without_the_setting_behave_as_today() -> None:
    env = Env()  # the plain policy: no queue
    _, patched, _ = env.review(taskrun(annotations={QUEUE_ANNOTATION: entry_annotation("egress", "TaskRun", 1.0)}))
    assert "status" not in patched["spec"]
    assert QUEUE_ANNOTATION not in patched["metadata"]["annotations"]  # a copied entry is not kept


FORGED = [
    entry_annotation("made-up-pool", "TaskRun", 1.0),  # names a pool that does not exist
    entry_annotation("egress", "TaskRun", 1.0),  # an old time: first in line
    "not json",
    json.dumps({"pool": "egress", "kind": "Task", "time": "2020-01-01T00:00:00Z"}),
    "[" * 100_000,  # nested past the JSON reader's depth: no entry (it made admission fail open, and kept it)
]


@pytest.mark.parametrize("forged", FORGED)
@pytest.mark.parametrize("status", ["TaskRunPending", None], ids=["created-pending", "plain"])
def test_a_forged_entry_at_create_is_removed(forged: str, status: str | None) -> None:
    """Admission's own decision is the record: a run the tenant creates with an entry of its own (pending
    itself, or of no pool at all) carries none once admitted, whatever the entry said."""
    env = queued_env()
    run = taskrun("curl")  # of no pool: not queued
    run["metadata"]["annotations"] = {QUEUE_ANNOTATION: forged}
    if status:
        run["spec"]["status"] = status
    _, patched, _ = env.review(run)
    assert QUEUE_ANNOTATION not in patched["metadata"]["annotations"]
    run = taskrun()  # of the queued pool, created pending by its owner: not ours either
    run["metadata"]["annotations"] = {QUEUE_ANNOTATION: forged}
    run["spec"]["status"] = "TaskRunPending"
    _, patched, _ = env.review(run)
    assert QUEUE_ANNOTATION not in patched["metadata"]["annotations"]


def test_a_forged_entry_on_a_queued_run_is_replaced_by_admission_s_own() -> None:
    env = queued_env()
    run = taskrun()
    run["metadata"]["annotations"] = {QUEUE_ANNOTATION: entry_annotation("egress", "TaskRun", 1.0)}
    _, patched, _ = env.review(run)
    mark = read_entry(patched["metadata"]["annotations"][QUEUE_ANNOTATION], "TaskRun")
    assert mark is not None and mark.queued_at == env.now


def test_a_run_of_no_pool_is_not_queued() -> None:
    env = queued_env()
    run = taskrun("curl")
    _, patched, _ = env.review(run)
    assert "status" not in patched["spec"]


def test_consecutive_admissions_count_on_from_the_summary() -> None:
    env = queued_env()
    notes = []
    for i in range(5):
        env.review(taskrun(name=f"r{i}"))
        notes.append(env.events.sent[-1]["note"])
    assert notes[:3] == ["queued for pool egress: a slot is free, released shortly"] * 3  # 3 slots
    assert notes[3:] == ["queued for pool egress, position 4 of 4", "queued for pool egress, position 5 of 5"]


def test_the_queued_event_tells_the_position() -> None:
    env = queued_env()
    for i in range(5):  # three slots (one per egress node), all taken by released runs without pods yet
        obj = taskrun(name=f"r{i}")
        _, patched, _ = env.review(obj)
        env.state.apply("TaskRun", "ADDED", patched)
    for i in range(3):
        released = copy.deepcopy(patched)
        released["metadata"]["name"] = f"r{i}"
        del released["spec"]["status"]
        env.state.apply("TaskRun", "MODIFIED", released)
    env.now += 2  # past the summary's age: read again from the state
    env.review(taskrun(name="late"))
    assert env.events.sent[-1]["note"].startswith("queued for pool egress, position 3 of 3")


@pytest.mark.parametrize(("placement", "sent_elsewhere"), [("preferred", True), ("required", False)])
def test_a_pod_of_a_run_past_its_wait_follows_the_placement(placement: str, sent_elsewhere: bool) -> None:
    env = queued_env(placement)
    entry = entry_annotation("egress", "TaskRun", env.now - 61)
    _, patched, _ = env.review(tekton_pod(annotations={QUEUE_ANNOTATION: entry}))
    tolerations = patched["spec"].get("tolerations") or []
    assert (EGRESS_TOLERATION not in tolerations) is sent_elsewhere
    young = entry_annotation("egress", "TaskRun", env.now - 5)
    _, patched, _ = env.review(tekton_pod(name="p2", annotations={QUEUE_ANNOTATION: young}))
    assert EGRESS_TOLERATION in patched["spec"]["tolerations"]


# -- the release pass ----------------------------------------------------------------------------------


class FakeReleaser:
    def __init__(self, env: Env) -> None:
        self.env = env
        self.calls: list[tuple[str, str, str]] = []
        self.show = True  # apply the change to the state at once (the informers caught up)
        self.workloads: dict[str, dict[str, bool]] | None = {}  # Kueue's: namespace -> run uid -> admitted (None: unreadable)
        self.claims: list[dict[str, Any]] | None = []  # Karpenter's NodeClaims of the NodePool asked (None: unreadable)
        self.claims_asked: list[str] = []

    def kueue_workloads(self, namespace: str) -> dict[str, bool] | None:
        return self.workloads.get(namespace, {}) if self.workloads is not None else None

    def node_claims(self, node_pool: str) -> list[dict[str, Any]] | None:
        self.claims_asked.append(node_pool)
        return self.claims

    def release_run(self, kind: str, namespace: str, name: str, uid: str, pending: str) -> bool:
        self.calls.append((kind, namespace, name))
        entry = self.env.state.queue._queued[(kind, namespace, name)]  # noqa: SLF001
        if not entry.pending or entry.done:
            return False
        if self.show:
            self.env.state.apply(kind, "MODIFIED", run_obj(kind, namespace, name, entry_annotation(entry.pool, kind, entry.queued_at), ""))
        return True


def _decided(entry: str, kind: str) -> str:
    """Admission's decision record beside its entry (the queue reads an entry only with it)."""
    mark = read_entry(entry, kind)
    return json.dumps({"pool": mark.pool}) if mark else "{}"


def run_obj(kind: str, namespace: str, name: str, entry: str, status: str, done: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}",
                     "annotations": {QUEUE_ANNOTATION: entry, DECISION_ANNOTATION: _decided(entry, kind)}},
        "spec": {"status": status} if status else {},
    }
    if done:
        obj["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    return obj


def queue_some(env: Env, namespace: str, count: int, start: float = 0.0) -> None:
    for i in range(count):
        entry = entry_annotation("egress", "TaskRun", env.now - 30 + start + i * 0.01)
        env.state.apply("TaskRun", "ADDED", run_obj("TaskRun", namespace, f"{namespace}-{i}", entry, "TaskRunPending"))


def test_the_leader_releases_up_to_the_slots_fairly_and_once() -> None:
    env = queued_env()
    releaser = FakeReleaser(env)
    sink = RecordingSink()
    reconciler = QueueReconciler(env.state, releaser, sink, env.metrics, clock=lambda: env.now)
    queue_some(env, "team-ci", 5)
    queue_some(env, "team-web", 2, start=1)
    reconciler()
    assert [c[2] for c in releaser.calls] == ["team-ci-0", "team-web-0", "team-ci-1"]  # 3 nodes x 1
    reconciler()  # nothing freed: nothing more
    assert len(releaser.calls) == 3
    assert [r for _, _, r in sink.sent] == ["Released"] * 3
    # A released run finishes: one slot frees. Both namespaces now run one (a tie of turns): the one
    # whose oldest waiting run came first goes (team-ci). Then team-web's run finishes: it runs fewer, its turn.
    entry = entry_annotation("egress", "TaskRun", env.now)
    env.state.apply("TaskRun", "MODIFIED", run_obj("TaskRun", "team-ci", "team-ci-0", entry, "", done=True))
    reconciler()
    assert releaser.calls[-1][2] == "team-ci-2"
    env.state.apply("TaskRun", "MODIFIED", run_obj("TaskRun", "team-web", "team-web-0", entry, "", done=True))
    reconciler()
    assert releaser.calls[-1][2] == "team-web-1"
    assert env.metrics.queue_length.labels(pool="egress")._value.get() == 2  # noqa: SLF001


def test_a_release_the_informers_have_not_shown_yet_keeps_its_slot() -> None:
    env = queued_env()
    releaser = FakeReleaser(env)
    releaser.show = False
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    queue_some(env, "team-ci", 5)
    reconciler()
    reconciler()
    assert len(releaser.calls) == 3  # the second pass did not release into the same slots


def test_cancelled_or_deleted_queued_runs_free_their_place() -> None:
    env = queued_env()
    releaser = FakeReleaser(env)
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    queue_some(env, "team-ci", 4)
    reconciler()
    assert len(releaser.calls) == 3
    entry = entry_annotation("egress", "TaskRun", env.now)
    # team-ci-0 was released and is running: cancel it; the waiting team-ci-3 takes its place.
    env.state.apply("TaskRun", "MODIFIED", run_obj("TaskRun", "team-ci", "team-ci-0", entry, "TaskRunCancelled"))
    reconciler()
    assert releaser.calls[-1][2] == "team-ci-3"
    env.state.apply("TaskRun", "DELETED", run_obj("TaskRun", "team-ci", "team-ci-3", entry, ""))
    assert ("TaskRun", "team-ci", "team-ci-3") not in env.state.queue._queued  # noqa: SLF001


def test_a_required_pool_warns_once_and_a_dropped_setting_releases_all() -> None:
    env = queued_env()
    releaser = FakeReleaser(env)
    sink = RecordingSink()
    reconciler = QueueReconciler(env.state, releaser, sink, env.metrics, clock=lambda: env.now)
    queue_some(env, "team-ci", 5)
    env.now += 100  # past maxQueueSeconds (60)
    reconciler()
    reconciler()
    assert [r for _, t, r in sink.sent if t == "Warning"] == ["QueueWaitExceeded"] * 2  # the two still waiting, once each
    env.state.set_policy(load_policy((DATA / "policy.yaml").read_text()))  # the setting is gone
    reconciler()
    assert len(releaser.calls) == 5
    assert env.metrics.queue_releases.labels(pool="egress", reason="unqueued")._value.get() == 2  # noqa: SLF001


def test_a_new_leader_rebuilds_the_queue_from_the_cluster() -> None:
    env = queued_env()
    releaser = FakeReleaser(env)
    queue_some(env, "team-ci", 4)
    QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)()
    assert len(releaser.calls) == 3
    # Another replica, with nothing in memory, sees the same cluster: it releases nothing more.
    QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)()
    assert len(releaser.calls) == 3


def test_the_entry_annotation_is_compact_json() -> None:
    value = entry_annotation("egress", "TaskRun", 0.0)
    assert json.loads(value) == {"pool": "egress", "kind": "TaskRun", "time": "1970-01-01T00:00:00.000Z"}


def test_status_lists_each_queue_in_release_order() -> None:
    from controller.cli.status import queue_lines

    env = queued_env()
    queue_some(env, "team-ci", 5)
    queue_some(env, "team-web", 1, start=1)
    lines = queue_lines(env.state, env.now, shown=4)
    assert lines[0] == "pool egress: 0/3 slots taken, 6 waiting (runsPerNode 1, maxQueueSeconds 60)"
    assert [line.split(". ")[1].split(",")[0] for line in lines[1:5]] == [
        "TaskRun team-ci/team-ci-0", "TaskRun team-web/team-web-0", "TaskRun team-ci/team-ci-1", "TaskRun team-ci/team-ci-2",
    ]
    assert lines[-1] == "  ... and 2 more"


def test_the_pool_status_carries_the_queue() -> None:
    from controller.pool_status.core import PoolObject, pool_status
    from controller.core.pools import QueueStatus

    env = queued_env()
    queue_some(env, "team-ci", 4)
    assert env.state.queue.queue_counts(env.state.policy.pools[0], env.now) == (4, 3, 0)
    assert env.state.queue.queue_counts(env.state.policy.pools[1], env.now) is None  # lab does not queue
    obj = PoolObject("egress", 1, {})
    status = pool_status(obj, env.state.policy, [], {}, [], None, [], env.now, QueueStatus(waiting=4, slots=3, occupied=0))
    assert status["queue"] == {"waiting": 4, "slots": 3, "occupied": 0}


def test_a_coscheduled_pipelinerun_is_queued_whole_and_its_taskruns_are_not() -> None:
    from tests.unit.test_admission_handlers import kaniko_pipelinerun

    env = queued_env()
    _, patched, _ = env.review(kaniko_pipelinerun())
    assert patched["spec"]["status"] == "PipelineRunPending"
    entry = patched["metadata"]["annotations"][QUEUE_ANNOTATION]
    assert read_entry(entry, "PipelineRun") is not None
    # Its TaskRuns, which Tekton's controller makes, carry the assistant's annotation and the PipelineRun's
    # entry (Tekton copies it): not queued; they keep the pool their PipelineRun was moved to.
    stored = {**patched, "metadata": {**patched["metadata"], "uid": "uid-kaniko-run"}}
    env.state.apply("PipelineRun", "ADDED", stored)
    child = taskrun(annotations={QUEUE_ANNOTATION: entry, "pipeline.tekton.dev/affinity-assistant": "aa-1"},
                    pod_template=patched["spec"]["taskRunTemplate"]["podTemplate"])
    child["metadata"]["ownerReferences"] = [{"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "name": patched["metadata"]["name"],
                                             "uid": "uid-kaniko-run", "controller": True}]
    _, child_patched, _ = env.review(child, user=TEKTON_USER)
    assert "status" not in child_patched["spec"]
    assert EGRESS_TOLERATION in child_patched["spec"]["podTemplate"]["tolerations"]
    assert child_patched["metadata"]["annotations"][QUEUE_ANNOTATION] == entry  # not theirs, not removed


def test_a_pipelines_child_taskrun_is_queued_like_any() -> None:
    env = queued_env()
    child = taskrun(annotations={"tekton.dev/pipelineRun": "p-1"})
    child["metadata"]["labels"] = {"tekton.dev/pipelineRun": "p-1"}
    _, patched, _ = env.review(child)
    assert patched["spec"]["status"] == "TaskRunPending"


def test_a_pipelinerun_whose_timeout_a_queued_task_may_eat_gets_a_warning() -> None:
    env = queued_env()
    run = {
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {"name": "p-1", "namespace": "team-ci"},
        "spec": {"timeouts": {"pipeline": "30s"},
                 "pipelineSpec": {"tasks": [{"name": "push", "taskRef": {"name": "kaniko"}, "params": [{"name": "IMAGE", "value": "r.example.com/a"}]}]}},
    }
    response, patched, _ = env.review(run)
    assert "status" not in patched["spec"]  # not coscheduled: its tasks are queued one by one
    assert any("pipeline timeout (30s)" in w for w in response.get("warnings", [])), response.get("warnings")


# -- the queue reads admission's own record only (issue 23, g) ------------------------------------------


@pytest.mark.parametrize(
    ("entry_pool", "decision", "admitted"),
    [
        pytest.param("egress", '{"pool":"egress","node":"egress-1"}', True, id="admission's-own"),
        pytest.param("egress", None, False, id="no-decision:-the-webhook-was-unreachable-or-skipped"),
        pytest.param("made-up", '{"pool":"egress"}', False, id="another-pool-than-decided"),
        pytest.param("egress", '{"pool":null}', False, id="decided-no-pool"),
        pytest.param("egress", "not json", False, id="not-a-record"),
        pytest.param("egress", "", False, id="kept-empty"),
    ],
)
def test_an_entry_counts_only_beside_admissions_decision_for_its_pool(entry_pool: str, decision: str | None, admitted: bool) -> None:
    mark = read_entry(entry_annotation(entry_pool, "TaskRun", 1.0), "TaskRun")
    assert admitted_entry(mark, decision) is admitted


def test_a_forged_entry_without_our_decision_is_never_released_and_adds_no_series() -> None:
    env = queued_env()
    releaser = FakeReleaser(env)
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    forged = run_obj("TaskRun", "team-ci", "forged", entry_annotation("made-up-ghost", "TaskRun", 1.0), "TaskRunPending")
    del forged["metadata"]["annotations"][DECISION_ANNOTATION]  # stored while the webhook was unreachable
    env.state.apply("TaskRun", "ADDED", forged)
    assert env.state.queue.queue_entries() == []
    reconciler()
    assert releaser.calls == []
    assert "made-up-ghost" not in generate_latest(env.metrics.registry).decode()


def test_a_release_from_a_pool_gone_from_the_policy_is_labelled_without_its_name() -> None:
    """Label values only from configured pools: an entry of a removed pool is released under pool ""."""
    env = queued_env()
    releaser = FakeReleaser(env)
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    env.state.apply("TaskRun", "ADDED", run_obj("TaskRun", "team-ci", "old", entry_annotation("retired", "TaskRun", 1.0), "TaskRunPending"))
    reconciler()
    assert len(releaser.calls) == 1
    assert env.metrics.queue_releases.labels(pool="", reason="unqueued")._value.get() == 1  # noqa: SLF001
    assert "retired" not in generate_latest(env.metrics.registry).decode()


# -- a run not ours on a queued pool: its pod waits for a slot (schedulingGates) ------------------------


def test_a_pod_of_a_run_not_queued_by_us_is_gated_on_a_queued_pool() -> None:
    env = queued_env()
    _, patched, _ = env.review(tekton_pod())  # its TaskRun carries no entry: its owner created it pending
    assert patched["spec"]["schedulingGates"] == [{"name": POOL_SLOT_GATE}]
    assert EGRESS_TOLERATION in patched["spec"]["tolerations"]  # placed as ever: it waits for a slot there
    entry = entry_annotation("egress", "TaskRun", env.now - 5)
    env.state.apply("TaskRun", "ADDED", run_obj("TaskRun", "team-ci", "build-2", entry, ""))  # ours, released
    _, patched, _ = env.review(tekton_pod(name="p2", taskrun_name="build-2"))
    assert "schedulingGates" not in patched["spec"]  # its slot was counted when we released it
    _, patched, _ = Env().review(tekton_pod())  # a pool that does not queue
    assert "schedulingGates" not in patched["spec"]


def test_a_gate_of_its_own_is_kept_beside_ours() -> None:
    env = queued_env()
    _, patched, _ = env.review(tekton_pod(spec_extra={"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}))
    assert patched["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}, {"name": POOL_SLOT_GATE}]


class FakeGates(FakeReleaser):
    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.ungated: list[str] = []

    def ungate_pod(self, namespace: str, name: str, uid: str, gates: tuple[str, ...], gate: str) -> bool:
        assert gate in gates
        self.ungated.append(name)
        return True


def run_pod(env: Env, name: str, *, node: str | None = None, gated_at: str = "", event: str = "ADDED") -> None:
    """A run's pod (its TaskRun in the cache, decided): bound to `node`, or gated since `gated_at`."""
    env.add_taskrun("team-ci", f"tr-{name}", f"uid-tr-{name}")
    spec: dict[str, Any] = {"tolerations": [EGRESS_TOLERATION]}
    if node:
        spec["nodeName"] = node
    if gated_at:
        spec["schedulingGates"] = [{"name": POOL_SLOT_GATE}]
    env.state.apply("Pod", event, {
        "metadata": {"namespace": "team-ci", "name": name, "uid": f"uid-{name}", "creationTimestamp": gated_at or "2026-01-01T00:00:00Z",
                     "ownerReferences": [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": f"tr-{name}",
                                          "uid": f"uid-tr-{name}", "controller": True}]},
        "spec": spec,
        "status": {"phase": "Pending" if gated_at else "Running"},
    })


def test_gated_pods_are_let_in_oldest_first_as_slots_free() -> None:
    env = queued_env()
    gates = FakeGates(env)
    reconciler = QueueReconciler(env.state, gates, RecordingSink(), env.metrics, clock=lambda: env.now)
    run_pod(env, "a", node="egress-1")
    run_pod(env, "b", node="egress-2")
    for name, at in [("late", "2026-01-01T00:00:09Z"), ("first", "2026-01-01T00:00:01Z"), ("second", "2026-01-01T00:00:02Z")]:
        run_pod(env, name, gated_at=at)
    reconciler()
    assert gates.ungated == ["first"]  # 3 slots, 2 taken: a gated pod takes none
    reconciler()
    assert gates.ungated == ["first"]  # let in, not bound yet: its slot is counted
    run_pod(env, "first", node="egress-3", event="MODIFIED")  # bound (the gate is gone)
    reconciler()
    assert gates.ungated == ["first"]
    env.state.apply("Pod", "DELETED", {"metadata": {"namespace": "team-ci", "name": "a"}, "spec": {"nodeName": "egress-1"}})
    reconciler()
    assert gates.ungated == ["first", "second"]


def test_our_waiting_runs_and_gated_pods_share_the_free_slots() -> None:
    env = queued_env()
    gates = FakeGates(env)
    reconciler = QueueReconciler(env.state, gates, RecordingSink(), env.metrics, clock=lambda: env.now)
    queue_some(env, "team-ci", 2)
    run_pod(env, "own", gated_at="2026-01-01T00:00:01Z")
    run_pod(env, "own-2", gated_at="2026-01-01T00:00:02Z")
    reconciler()
    assert len(gates.calls) == 2 and gates.ungated == ["own"]  # 3 slots: never more let in


def test_a_gated_pod_of_no_run_is_left_alone() -> None:
    """Anyone may create a pod with our gate: only a run's pod (admission gated it) is let in."""
    env = queued_env()
    gates = FakeGates(env)
    env.state.apply("Pod", "ADDED", {"metadata": {"namespace": "team-ci", "name": "own-gate", "uid": "u"},
                                      "spec": {"schedulingGates": [{"name": POOL_SLOT_GATE}]}, "status": {"phase": "Pending"}})
    QueueReconciler(env.state, gates, RecordingSink(), env.metrics, clock=lambda: env.now)()
    assert gates.ungated == []


def test_run_pods_over_a_pools_cap_are_reported_once_each() -> None:
    """The fail-open window (#23): while the webhook does not answer, the pod of a run its owner released is
    not gated, and its TaskRun's pod template already tolerates the pool: it starts on a full pool. The
    leader sees the pool's run pods beyond its slots: a Warning Event on each (once), and a gauge."""
    env = queued_env()
    sink = RecordingSink()
    reconciler = QueueReconciler(env.state, FakeGates(env), sink, env.metrics, clock=lambda: env.now)
    for i, node in enumerate(["egress-1", "egress-2", "egress-3"]):
        run_pod(env, f"slot-{i}", node=node)
    reconciler()
    assert [s for s in sink.sent if s[2] == "QueueOverCap"] == []
    env.state.apply("Pod", "ADDED", {
        "metadata": {"namespace": "team-ci", "name": "escaped", "uid": "uid-escaped", "creationTimestamp": "2026-01-01T00:01:00Z",
                     "ownerReferences": [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": "tr-escaped",
                                          "uid": "uid-tr-escaped", "controller": True}]},
        "spec": {"nodeName": "egress-1"}, "status": {"phase": "Running"}})
    reconciler()  # its TaskRun not cached yet: no run's pod (the next pass sees it)
    env.add_taskrun("team-ci", "tr-escaped", "uid-tr-escaped")
    reconciler()
    reconciler()
    over = [(s[0]["kind"], s[0]["name"]) for s in sink.sent if s[2] == "QueueOverCap"]
    assert over == [("Pod", "escaped")]
    text = generate_latest(env.metrics.registry).decode()
    assert 'egress_placer_queue_over_cap_pods{pool="egress"} 1.0' in text
    env.state.apply("Pod", "DELETED", {"metadata": {"namespace": "team-ci", "name": "escaped"}, "spec": {"nodeName": "egress-1"}})
    reconciler()
    assert 'egress_placer_queue_over_cap_pods{pool="egress"} 0.0' in generate_latest(env.metrics.registry).decode()
