"""ClusterState: what informer events and relists leave in the cache, the readers admission and the
reconcilers use (pods per node, placed counts, node versions, runs without a decision), ledger
settlement when pods are bound, and which changes wake the reconcile loop."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loguru import logger

from controller.load.core import ledger_key
from controller.core.model import DECISION_ANNOTATION, AgentTemplate, DaemonSetState
from controller.agents.core import POOL_TOLERATIONS_ANNOTATION
from controller.kube.informer import trim_daemonset

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
from controller.core.policy import load_policy
from controller.state import POLICY, TEKTON_FLAGS, ClusterState

POLICY_TEXT = """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress: "yes"}
    namespaces: ["team-*"]
"""


def make_state() -> ClusterState:
    return ClusterState(load_policy(POLICY_TEXT), clock=lambda: 1000.0, assumption_ttl=60)


def node(name: str, rv: str = "1", pool: bool = False, **spec: Any) -> dict[str, Any]:
    labels = {"egress": "yes"} if pool else {}
    return {
        "metadata": {"name": name, "resourceVersion": rv, "labels": labels},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"pods": "10"}},
    }


def pod(ns: str, name: str, node_name: str | None = None, phase: str = "Running", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, **meta},
        "spec": {"nodeName": node_name} if node_name else {},
        "status": {"phase": phase},
    }


def run(kind: str, ns: str, name: str, decided: bool) -> dict[str, Any]:
    annotations = {DECISION_ANNOTATION: "{}"} if decided else {}
    return {"kind": kind, "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}", "annotations": annotations}}


OWNER = {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": "build", "uid": "uid-build", "controller": True}


@pytest.fixture
def state() -> ClusterState:
    s = make_state()
    s.replace("Node", [node("pool-1", "5", pool=True), node("plain-1", "7")])
    return s


@pytest.mark.parametrize(
    ("events", "on_pool", "on_plain"),
    [
        ([("ADDED", pod("team-a", "p", "pool-1"))], ["p"], []),
        ([("ADDED", pod("team-a", "p", "pool-1")), ("DELETED", pod("team-a", "p", "pool-1"))], [], []),
        ([("ADDED", pod("team-a", "p")), ("MODIFIED", pod("team-a", "p", "plain-1"))], [], ["p"]),
        ([("ADDED", pod("x", "p", "pool-1")), ("ADDED", pod("y", "p", "plain-1"))], ["p"], ["p"]),
    ],
    ids=["added", "deleted", "bound-later", "same-name-two-namespaces"],
)
def test_pod_events_index_pods_by_node(state, events, on_pool, on_plain):
    for event, obj in events:
        state.apply("Pod", event, obj)
    assert sorted(p.name for p in state.pods_on("pool-1")) == on_pool
    assert sorted(p.name for p in state.pods_on("plain-1")) == on_plain


@pytest.mark.parametrize(
    ("obj", "counted"),
    [
        (pod("team-a", "run", "pool-1"), 1),
        (pod("team-a", "done", "pool-1", phase="Succeeded"), 0),
        (pod("team-a", "going", "pool-1", deletionTimestamp="2026-01-01T00:00:00Z"), 0),
        (pod("kube-system", "ds", "pool-1", ownerReferences=[{"kind": "DaemonSet", "name": "x"}]), 0),
    ],
    ids=["running", "finished", "deleting", "daemonset"],
)
def test_placed_counts_count_active_non_daemonset_pods(state, obj, counted):
    state.apply("Pod", "ADDED", obj)
    assert state.load.placed_counts(["pool-1", "plain-1"]) == {"pool-1": counted, "plain-1": 0}


def test_node_resource_versions_follow_events_and_relists(state):
    assert state.node_resource_version("pool-1") == "5"
    state.apply("Node", "MODIFIED", node("pool-1", "9", pool=True))
    assert state.node_resource_version("pool-1") == "9"
    state.apply("Node", "DELETED", node("pool-1", "10", pool=True))
    assert state.node_resource_version("pool-1") is None
    state.replace("Node", [node("other", "3")])
    assert [n.name for n in state.node_list()] == ["other"]
    assert state.node_resource_version("plain-1") is None


def test_binding_a_pod_settles_its_pod_and_taskrun_assumptions(state):
    state.load.claims.assume(ledger_key("pod", "team-a", "p"), "overseas", "pool-1", 1000.0)
    state.load.claims.assume(ledger_key("taskrun", "team-a", "build"), "overseas", "pool-1", 1000.0)
    placed = {DECISION_ANNOTATION: '{"pool":"overseas","node":"pool-1"}'}
    state.apply("Pod", "ADDED", pod("team-a", "p", annotations=placed))  # not bound yet: still counted, once
    assert len(state.load.ledger) == 2 and state.load.ledger.assumed_on("pool-1") == 2
    state.apply("Pod", "ADDED", pod("team-a", "squat", "pool-1", labels={"tekton.dev/taskRun": "build"}))  # a label proves nothing
    assert ledger_key("taskrun", "team-a", "build") in state.load.ledger
    state.apply("TaskRun", "ADDED", {**run("TaskRun", "team-a", "build", True), "status": {"podName": "build-pod"}})
    state.load.claims.assume(ledger_key("taskrun", "team-a", "build"), "overseas", "pool-1", 1000.0)  # admitted again here
    state.apply("Pod", "ADDED", pod("team-a", "build-pod", "pool-1", labels={"tekton.dev/taskRun": "build"}, ownerReferences=[OWNER]))
    assert ledger_key("taskrun", "team-a", "build") not in state.load.ledger
    state.apply("Pod", "MODIFIED", pod("team-a", "p", "pool-1"))
    assert len(state.load.ledger) == 0


def test_finished_pods_leave_the_cache_and_settle_their_assumptions(state):
    """A finished pod holds no node and takes no place: not kept (memory does not grow with pods that ran),
    and a pod first seen finished still settles what was assumed for it."""
    state.load.ledger.assume(ledger_key("taskrun", "team-a", "quick"), "overseas", "pool-1", 1000.0)
    seen: list[str] = []
    state.subscribe(seen.append)
    state.apply("TaskRun", "ADDED", run("TaskRun", "team-a", "quick", True))
    state.load.ledger.assume(ledger_key("taskrun", "team-a", "quick"), "overseas", "pool-1", 1000.0)
    state.apply("Pod", "ADDED", pod("team-a", "quick-pod", "pool-1", "Succeeded", labels={"tekton.dev/taskRun": "quick"},
                                    ownerReferences=[{**OWNER, "name": "quick", "uid": "uid-quick"}]))
    assert len(state.load.ledger) == 0 and dict(state.pods) == {} and state.pods_on("pool-1") == []
    state.apply("Pod", "ADDED", pod("team-a", "p", "pool-1"))
    state.apply("Pod", "MODIFIED", pod("team-a", "p", "pool-1", "Failed"))
    assert dict(state.pods) == {} and state.pods_on("pool-1") == [] and seen == ["Pod", "Pod", "Pod"]
    state.replace("Pod", [pod("team-a", "done", "plain-1", "Succeeded"), pod("team-a", "run", "plain-1")])
    assert [p.name for p in state.pods_on("plain-1")] == ["run"]


def test_runs_without_decision(state):
    state.replace("TaskRun", [run("TaskRun", "a", "t1", True), run("TaskRun", "a", "t2", False)])
    state.apply("PipelineRun", "ADDED", run("PipelineRun", "b", "p1", False))
    assert state.missed_runs.runs_without_decision() == [("PipelineRun", "b", "p1"), ("TaskRun", "a", "t2")]
    state.apply("TaskRun", "MODIFIED", run("TaskRun", "a", "t2", True))
    state.replace("PipelineRun", [])
    assert state.missed_runs.runs_without_decision() == []


def test_tekton_objects_go_to_the_index(state):
    task = {"kind": "Task", "metadata": {"namespace": "a", "name": "t"}, "spec": {"steps": [{"image": "alpine"}]}}
    state.apply("Task", "ADDED", task)
    assert state.tekton.task("a", "t") is not None
    state.replace("Task", [])
    assert state.tekton.task("a", "t") is None


@pytest.mark.parametrize(
    ("change", "woken"),
    [
        (lambda s: s.apply("Node", "MODIFIED", node("plain-1", "8", pool=True)), ["Node"]),
        (lambda s: s.apply("Node", "MODIFIED", node("plain-1", "8", unschedulable=True)), ["Node"]),
        (lambda s: s.apply("Node", "MODIFIED", node("plain-1", "8")), []),  # a heartbeat: nothing kept changed
        (lambda s: s.apply("Node", "DELETED", node("plain-1", "8")), ["Node"]),
        (lambda s: s.apply("Namespace", "ADDED", {"metadata": {"name": "n"}}), ["Namespace"]),
        (lambda s: s.apply("Pod", "ADDED", pod("x", "p", "pool-1")), ["Pod"]),
        (lambda s: s.apply("Pod", "ADDED", pod("x", "p", "plain-1")), []),
        (lambda s: s.apply("Pod", "ADDED", pod("x", "p")), []),
        (lambda s: s.replace("Pod", []), ["Pod"]),
        (lambda s: s.apply("Task", "ADDED", {"kind": "Task", "metadata": {"name": "t"}, "spec": {}}), []),
        (lambda s: s.set_policy(load_policy(POLICY_TEXT)), [POLICY]),
        (lambda s: s.tekton.set_coschedule("disabled"), [TEKTON_FLAGS]),
    ],
    ids=[
        "node-labels",
        "node-cordoned",
        "node-heartbeat",
        "node-deleted",
        "namespace",
        "pod-on-pool-node",
        "pod-elsewhere",
        "pod-unbound",
        "pod-relist",
        "task",
        "policy",
        "flags",
    ],
)
def test_changes_that_wake_subscribers(state, change, woken):
    seen: list[str] = []
    state.subscribe(seen.append)
    change(state)
    assert seen == woken


DS = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"namespace": "kube-system", "name": "agent", "uid": "ds-1"}}


def test_daemonsets_are_kept_by_uid_and_wake_subscribers_only_when_they_come_or_go(state):
    seen: list[str] = []
    state.subscribe(seen.append)
    state.apply("DaemonSet", "ADDED", DS)
    state.apply("DaemonSet", "MODIFIED", {**DS, "status": {"numberReady": 3}})  # a status update: no pass
    assert state.daemonset_map() == {"ds-1": DaemonSetState("kube-system", "agent", "ds-1")}
    state.apply("DaemonSet", "DELETED", DS)
    assert state.daemonset_map() == {} and seen == ["DaemonSet", "DaemonSet"]
    state.replace("DaemonSet", [DS])
    assert list(state.daemonset_map()) == ["ds-1"] and seen[-1] == "DaemonSet"


def test_a_daemonsets_template_change_wakes_subscribers_and_its_trimmed_form_is_what_is_kept(state):
    """The informer keeps who the DaemonSet is, the annotation agents.core reads and where its template
    sends pods."""
    seen: list[str] = []
    state.subscribe(seen.append)
    full = {
        **DS,
        "metadata": {**DS["metadata"], "resourceVersion": "7", "annotations": {"a": "b", LAST_APPLIED: "{}", POOL_TOLERATIONS_ANNOTATION: "patch"}},
        "spec": {"template": {"spec": {
            "containers": [{"name": "c", "image": "agent:1"}],
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "nodeSelector": {"os": "linux"},
            "hostNetwork": True,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]},
                                          "preferredDuringSchedulingIgnoredDuringExecution": []}},
        }}},
        "status": {"numberReady": 1},
    }
    trimmed = trim_daemonset(full)
    assert "status" not in trimmed and "containers" not in trimmed["spec"]["template"]["spec"]
    state.apply("DaemonSet", "ADDED", trimmed)
    kept = state.daemonset_map()["ds-1"]
    assert kept.template == AgentTemplate(
        tolerations=({"key": "gpu", "operator": "Exists"},), node_selector={"os": "linux"}, required_terms=({},), host_network=True
    )
    assert kept.annotations == {POOL_TOLERATIONS_ANNOTATION: "patch"} and kept.resource_version == "7"
    state.apply("DaemonSet", "MODIFIED", {**trimmed, "metadata": {**trimmed["metadata"], "resourceVersion": "8"}})
    assert seen == ["DaemonSet"]  # a new version alone (a status update) is no pass
    changed = trim_daemonset({**full, "spec": {"template": {"spec": {"tolerations": []}}}})
    state.apply("DaemonSet", "MODIFIED", changed)
    assert seen == ["DaemonSet", "DaemonSet"] and state.daemonset_map()["ds-1"].template == AgentTemplate()


def test_a_pod_leaving_a_pool_node_wakes_subscribers(state):
    state.apply("Pod", "ADDED", pod("x", "p", "pool-1"))
    seen: list[str] = []
    state.subscribe(seen.append)
    state.apply("Pod", "DELETED", pod("x", "p", "pool-1"))
    assert seen == ["Pod"]


def test_a_failing_subscriber_does_not_break_the_informer(state):
    def broken(kind: str) -> None:
        raise RuntimeError("boom")

    seen: list[str] = []
    logged: list[str] = []
    state.subscribe(broken)
    state.subscribe(seen.append)
    sink = logger.add(lambda message: logged.append(str(message)), level="ERROR")
    try:
        state.apply("Node", "ADDED", node("n", "1"))
    finally:
        logger.remove(sink)
    assert seen == ["Node"] and "n" in state.nodes
    assert len(logged) == 1 and "state subscriber failed" in logged[0] and "boom" in logged[0]


def test_coschedule_change_notifies_only_when_it_changes(state):
    seen: list[str] = []
    state.subscribe(seen.append)
    state.tekton.set_coschedule("workspaces")
    state.tekton.set_coschedule("workspaces")
    assert state.tekton.coschedule == "workspaces" and seen == [TEKTON_FLAGS]


POD_EVENT = st.tuples(
    st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["p1", "p2", "p3"]),
    st.sampled_from([None, "pool-1", "plain-1"]),
    st.sampled_from(["Pending", "Running", "Succeeded"]),
)


@settings(max_examples=200, deadline=None)  # a shared machine: one example took 440 ms once
@given(st.lists(POD_EVENT, max_size=30))
def test_events_and_a_relist_of_the_result_agree(events):
    """Any sequence of pod events leaves the same picture as a relist of the surviving pods."""
    by_events = make_state()
    alive: dict[tuple[str, str], dict[str, Any]] = {}
    for event, ns, name, node_name, phase in events:
        obj = pod(ns, name, node_name, phase)
        by_events.apply("Pod", event, obj)
        if event == "DELETED":
            alive.pop((ns, name), None)
        else:
            alive[(ns, name)] = obj
    by_relist = make_state()
    by_relist.replace("Pod", alive.values())
    for n in ("pool-1", "plain-1"):
        assert sorted((p.namespace, p.name) for p in by_events.pods_on(n)) == sorted(
            (p.namespace, p.name) for p in by_relist.pods_on(n)
        )
    assert by_events.load.placed_counts(["pool-1", "plain-1"]) == by_relist.load.placed_counts(["pool-1", "plain-1"])


@pytest.mark.timeout(30)
def test_admission_s_views_never_wait_on_the_lock_an_informer_holds() -> None:
    """Choosing a node, assuming it and forgetting it take the load view's own lock, not the state's
    (which an informer holds for a swap): with the state's lock held by another thread they still answer."""
    state = make_state()
    state.replace("Node", [node("pool-1", pool=True), node("pool-2", pool=True)])
    held, done = threading.Event(), threading.Event()

    def informer() -> None:
        with state._lock:  # noqa: SLF001 - what a relist's swap holds
            held.set()
            done.wait()

    holder = threading.Thread(target=informer)
    holder.start()
    held.wait()
    try:
        pool = state.policy.pool("overseas")
        choice = state.load.choose_and_assume(pool, ledger_key("taskrun", "team-a", "r"), salt="r")
        assert choice.node in ("pool-1", "pool-2") and len(state.load.ledger) == 1
        state.load.hand_over(ledger_key("taskrun", "team-a", "r"))
        assert len(state.load.ledger) == 0 and state.missed_runs.runs_without_decision() == []
    finally:
        done.set()
        holder.join()
