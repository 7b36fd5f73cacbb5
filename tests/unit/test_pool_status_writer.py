"""The leader's pool status writer (controller/pool_status/reconcile.py) against a ClusterState and a
recording writer (no cluster): it writes a pool's status when it differs from the stored one and not
again when it is the same; a pass within `min_interval` of the last is skipped and asks the loop back
in time; it removes keys it no longer writes; a failed write is tried next pass. The placement log
counts the runs' pods bound to pool nodes once, within the hour, from list and watch alike; a taint
write that fails becomes the pool's last error."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hypothesis import given
from hypothesis import strategies as st

from controller.core.images import TASKRUN_LABEL
from controller.core.model import DECISION_ANNOTATION, Taint
from controller.pool_status.core import PoolObject, status_patch
from controller.core.pools import policy_from_objects
from controller.metrics import Metrics
from controller.placement_log.core import rfc3339
from controller.placement_log.view import PlacementLog
from controller.pool_status.reconcile import PoolErrors, PoolStatusWriter
from controller.taints.reconcile import TaintReconciler
from controller.state import ClusterState

NOW = 1_800_000_000.0
POLICY = policy_from_objects(
    [{"apiVersion": "egress-placer.io/v1alpha1", "kind": "EgressPool", "metadata": {"name": "overseas"}, "spec": {"nodeSelector": {"egress": "yes"}, "capacity": 3}}]
)
TAINT = Taint("egress-placer.io/pool", "overseas", "NoSchedule")


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def node(name: str, pool: bool = True, taints: Sequence[Taint] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1", "labels": {"egress": "yes"} if pool else {}},
        "spec": {"taints": [t.to_dict() for t in taints]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def run_pod(name: str, node_name: str | None, created: float, *, taskrun: bool = True, owner: str | None = None) -> dict[str, Any]:
    """A pod labelled as a TaskRun's; `taskrun`: owned by it too, by uid (`owner`: the uid it claims)."""
    meta: dict[str, Any] = {"namespace": "team-cdn", "name": name, "uid": f"uid-{name}", "creationTimestamp": rfc3339(created),
                            "labels": {TASKRUN_LABEL: name}}
    if taskrun:
        meta["ownerReferences"] = [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": name, "uid": owner or f"run-uid-{name}",
                                    "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": node_name}, "status": {"phase": "Running"}}


def cached_taskrun(state: ClusterState, name: str, *, pod_name: str = "") -> None:
    """The TaskRun `name` as the informer has it: admitted with our decision (status.podName `pod_name`)."""
    state.apply("TaskRun", "ADDED", {"kind": "TaskRun", "metadata": {"namespace": "team-cdn", "name": name, "uid": f"run-uid-{name}",
                                                                    "annotations": {DECISION_ANNOTATION: "{}"}},
                                     "status": {"podName": pod_name} if pod_name else {}})


class Objects:
    """The policy source's view: the EgressPools as stored and the refusal."""

    def __init__(self, *pools: PoolObject, refusal: str | None = None) -> None:
        self.pools = list(pools)
        self.refusal = refusal
        self.config: PoolObject | None = None

    def pool_objects(self) -> tuple[list[PoolObject], str | None]:
        return list(self.pools), self.refusal

    def config_object(self) -> PoolObject | None:
        return self.config


class RecordingStatusWriter:
    def __init__(self, objects: Objects, fail: int = 0) -> None:
        self.objects = objects
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    def set_pool_status(self, name: str, patch: Mapping[str, Any]) -> None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("API down")
        self.writes.append((name, dict(patch)))
        # As the informer would show it a moment later: the merge patch applied, as the API server does.
        self.objects.pools = [PoolObject(p.name, p.generation, merged(p.status, patch)) if p.name == name else p for p in self.objects.pools]

    def set_config_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self.writes.append((name, dict(patch)))
        config = self.objects.config
        assert config is not None and config.name == name
        self.objects.config = PoolObject(name, config.generation, merged(config.status, patch))


def merged(stored: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386: `patch` merged into `stored` (null deletes, objects merge, the rest replaces)."""
    out = dict(stored)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            out[key] = merged(out.get(key) if isinstance(out.get(key), Mapping) else {}, value)
        else:
            out[key] = value
    return out


def test_a_nested_key_no_longer_written_is_nulled_so_the_merge_patch_deletes_it() -> None:
    """Found by the cluster test against a Prometheus that requires auth: `history.lastError` stayed after
    a read succeeded, for a merge patch that leaves a nested key out keeps it."""
    stored = {"history": {"groups": 0, "lastError": "HTTP 401"}, "load": {"a": 1}, "nodes": 1, "gone": True}
    desired = {"history": {"groups": 0, "readAt": "2027-01-15T08:00:00Z"}, "load": {"a": 2}, "nodes": 1}
    patch = status_patch(stored, desired)
    assert patch["history"] == {"groups": 0, "readAt": "2027-01-15T08:00:00Z", "lastError": None}
    assert patch["gone"] is None
    assert merged(stored, patch) == desired
    assert merged(stored, {**desired, "gone": None}) != desired  # without the nested nulls the old error stays


_KEYS = st.sampled_from(["a", "b", "c", "history", "lastError"])
_STATUS = st.recursive(st.integers(0, 3) | st.text(max_size=3) | st.lists(st.integers(0, 3), max_size=2),
                       lambda inner: st.dictionaries(_KEYS, inner, max_size=4), max_leaves=12)


@given(st.dictionaries(_KEYS, _STATUS, max_size=4), st.dictionaries(_KEYS, _STATUS, max_size=4))
def test_the_patch_merged_into_any_stored_status_gives_the_desired_one(stored: dict[str, Any], desired: dict[str, Any]) -> None:
    assert merged(stored, status_patch(stored, desired)) == desired


def setup(*pools: PoolObject, nodes: Sequence[dict[str, Any]] = (), fail: int = 0, refusal: str | None = None):
    clock = Clock()
    state = ClusterState(POLICY, clock=clock)
    state.replace("Node", list(nodes))
    objects = Objects(*pools, refusal=refusal)
    writer = RecordingStatusWriter(objects, fail=fail)
    placements = PlacementLog(state, clock=clock)
    errors = PoolErrors(clock)
    # The last: one pass, which returns the pools whose status it wrote.
    return clock, state, writer, placements, errors, PoolStatusWriter(state, objects, writer, placements, errors, clock=clock).reconcile


def as_the_loop_calls(reconcile: Any, writer: RecordingStatusWriter) -> tuple[list[str], float | None]:
    """One pass as the reconcile loop makes it: the pools whose status it wrote, and its requeue-after."""
    before = len(writer.writes)
    requeue_after = reconcile.__self__()
    return [name for name, _ in writer.writes[before:]], requeue_after


def test_it_writes_a_changed_status_once_and_again_only_after_a_change():
    clock, state, writer, _, _, reconcile = setup(PoolObject("overseas", 1, {}), nodes=[node("e1", taints=[TAINT])])
    assert reconcile() == ["overseas"]
    name, status = writer.writes[0]
    assert (status["nodes"], status["taintedNodes"], status["load"]["loadCapacity"]) == (1, 1, 3)  # v1beta1's names
    assert None not in status.values()  # nothing stored to remove
    assert status["conditions"][0]["status"] == "True"
    clock.now += 10
    assert reconcile() == []  # the same: nothing written
    state.apply("Node", "ADDED", node("e2"))
    clock.now += 10
    assert reconcile() == ["overseas"]
    assert (writer.writes[-1][1]["nodes"], writer.writes[-1][1]["conditions"][0]["reason"]) == (2, "TaintsPending")


def test_a_pass_within_the_interval_is_skipped_and_asks_the_loop_back_in_time():
    clock, state, writer, _, _, reconcile = setup(PoolObject("overseas", 1, {}), nodes=[node("e1")])
    assert as_the_loop_calls(reconcile, writer) == (["overseas"], None)
    state.apply("Node", "ADDED", node("e2"))
    clock.now += 2
    assert as_the_loop_calls(reconcile, writer) == ([], 3.0)  # 2 s after the last: skipped
    clock.now += 3
    assert as_the_loop_calls(reconcile, writer) == (["overseas"], None)
    assert writer.writes[-1][1]["nodes"] == 2


def test_keys_it_no_longer_writes_are_removed_and_a_failed_write_is_tried_next_pass():
    stored = {"nodes": 9, "load": {"placed": 0, "capacity": 0}, "somethingOld": 1}
    clock, _, writer, _, _, reconcile = setup(PoolObject("overseas", 2, stored), nodes=[node("e1")], fail=1)
    assert reconcile() == []  # failed
    clock.now += 5
    assert reconcile() == ["overseas"]
    assert writer.writes[0][1]["somethingOld"] is None


def test_no_pool_object_no_write():
    _, _, writer, _, _, reconcile = setup(nodes=[node("e1")])
    assert reconcile() == [] and writer.writes == []


def test_a_refused_set_shows_in_every_pool():
    refusal = "EgressPool overseas: spec.egressLoad.prometheus.url: invalid port"
    _, _, writer, _, _, reconcile = setup(PoolObject("overseas", 4, {}), PoolObject("other", 1, {}), nodes=[node("e1")], refusal=refusal)
    assert reconcile() == ["overseas", "other"]
    by_name = {w[0]: w[1] for w in writer.writes}
    assert by_name["overseas"]["conditions"][0]["reason"] == "SpecRefused"
    assert by_name["overseas"]["lastError"]["message"] == refusal
    assert by_name["other"]["conditions"][0]["reason"] == "PolicyRefused" and "lastError" not in by_name["other"]


def test_the_runs_placed_are_counted_once_from_list_and_watch():
    clock, state, writer, placements, _, reconcile = setup(PoolObject("overseas", 1, {}), nodes=[node("e1"), node("plain", pool=False)])
    for name in ("a", "old", "b", "c", "d", "forged", "squat"):
        cached_taskrun(state, name, pod_name="the-real-pod" if name == "squat" else "")
    placements.replace("Pod", [run_pod("a", "e1", NOW - 100), run_pod("old", "e1", NOW - 4000)])
    placements.apply("Pod", "ADDED", run_pod("b", None, NOW - 5))  # not bound yet
    placements.apply("Pod", "MODIFIED", run_pod("b", "e1", NOW - 5))
    placements.apply("Pod", "MODIFIED", run_pod("b", "e1", NOW - 5))  # seen again: once
    placements.apply("Pod", "ADDED", run_pod("c", "plain", NOW - 5))  # not a pool node
    placements.apply("Pod", "ADDED", run_pod("d", "e1", NOW - 5, taskrun=False))  # labelled, owned by nothing: not a run's
    placements.apply("Pod", "ADDED", run_pod("forged", "e1", NOW - 5, owner="made-up"))  # a made-up owner uid: not a run's
    placements.apply("Pod", "ADDED", run_pod("squat", "e1", NOW - 5))  # its run's status names another pod: not its
    placements.apply("Pod", "ADDED", run_pod("unknown", "e1", NOW - 5))  # no such TaskRun: not a run's
    placements.apply("Pod", "DELETED", run_pod("a", "e1", NOW - 100))  # deleted: it was placed all the same
    reconcile()
    assert writer.writes[-1][1]["runsPlacedLastHour"] == 2
    clock.now += 3550  # "a" is now more than an hour old
    reconcile()
    assert writer.writes[-1][1]["runsPlacedLastHour"] == 1
    assert len(placements.placed()) == 1  # and forgotten


def test_a_taint_write_that_fails_is_the_pools_last_error():
    clock, state, writer, _, errors, reconcile = setup(PoolObject("overseas", 1, {}), nodes=[node("e1")])

    class Refusing:
        def set_node_taints(self, node, taints, resource_version, *, rebase=None) -> None:
            raise RuntimeError("nodes is forbidden")

    TaintReconciler(state, Refusing(), Metrics(), errors=errors)()
    reconcile()
    assert writer.writes[-1][1]["lastError"] == {
        "message": "the taint of node e1 could not be written: nodes is forbidden",
        "time": rfc3339(NOW),
    }


def test_the_config_gets_a_status_once_and_again_only_after_a_change():
    clock, state, writer, _, _, reconcile = setup(PoolObject("overseas", 1, {}), nodes=[node("e1", taints=[TAINT])])
    writer.objects.config = PoolObject("cluster", 2, {})
    assert reconcile() == ["cluster", "overseas"]
    name, status = writer.writes[0]
    assert name == "cluster" and status["poolsInForce"] == len(state.policy.pools)
    assert [(c["type"], c["status"], c["reason"], c["observedGeneration"]) for c in status["conditions"]] == [
        ("Ready", "True", "PolicyInForce", 2), ("PolicyAccepted", "True", "InForce", 2)
    ]
    clock.now += 10
    assert reconcile() == []


def test_a_refused_config_says_why_and_that_the_last_good_policy_stays():
    refusal = "EgressPlacerConfig cluster: spec.exemptNamespaces[0]: not a namespace name"
    clock, state, writer, _, _, reconcile = setup(refusal=refusal)
    writer.objects.config = PoolObject("cluster", 1, {})
    assert reconcile() == ["cluster"]
    _, status = writer.writes[0]
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {"Ready": ("False", "LastGoodPolicy"), "PolicyAccepted": ("False", "SpecRefused")}
    assert status["lastError"]["message"] == refusal
