"""The reconcilers' passes that look again only at the nodes that changed (controller/changes.py, #24).

A cursor gives every node on its first take, after a change that can move every node's answer, after
`full_every` seconds and when it has held more names than its bound; else the nodes marked since its
last take. Then the property that matters: after any sequence of changes to the state (nodes coming,
going, relabelled, tainted or not; pods placed, moved, finished; a namespace's labels; a DaemonSet;
the policy), the taint, intruder and agent reconcilers with a cursor give what a full pass gives.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.agents.reconcile import AgentReconciler, find_gaps
from controller.changes import NodeChanges
from controller.core.policy import load_policy
from controller.intruders.reconcile import IntruderReconciler
from controller.metrics import Metrics
from controller.state import ClusterState
from controller.taints.reconcile import TaintReconciler

POLICY = """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress: "yes"}
    namespaces: ["team-*"]
  - name: lab
    nodes: [n3]
    namespaces: ["lab"]
"""
OTHER_POLICY = POLICY.replace('namespaces: ["team-*"]', 'namespaces: ["team-a"]')
NODES = ["n0", "n1", "n2", "n3", "n4"]
NAMESPACES = ["team-a", "team-b", "lab", "kube-system"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the cursor -------------------------------------------------------------------------------


def test_a_cursor_gives_every_node_first_then_what_changed_since_its_last_take():
    changes = NodeChanges()
    cursor = changes.cursor()
    changes.nodes("n1")
    assert cursor.take() is None  # the first pass is a full one
    assert cursor.take() == set()
    changes.nodes("n1", None, "n2")
    changes.nodes("n1")
    assert cursor.take() == {"n1", "n2"}
    assert cursor.take() == set()


def test_a_change_to_everything_makes_every_cursors_next_pass_a_full_one():
    changes = NodeChanges()
    first, second = changes.cursor(), changes.cursor()
    first.take(), second.take()
    changes.nodes("n1")
    assert first.take() == {"n1"}
    changes.everything()
    changes.nodes("n2")
    assert first.take() is None and second.take() is None
    assert first.take() == set() and second.take() == set()


def test_a_cursor_not_taken_holds_a_bounded_set_then_asks_for_a_full_pass():
    changes = NodeChanges(most=3)
    cursor = changes.cursor()
    cursor.take()
    changes.nodes("a", "b", "c")
    assert cursor.take() == {"a", "b", "c"}
    changes.nodes("a", "b", "c", "d")  # a replica that does not lead: nobody takes
    assert cursor.take() is None


def test_a_full_pass_comes_every_full_every_seconds_on_the_injected_clock():
    clock = Clock()
    changes = NodeChanges(clock=clock, full_every=600)
    cursor = changes.cursor()
    assert cursor.take() is None
    clock.now = 599
    changes.nodes("n1")
    assert cursor.take() == {"n1"}
    clock.now = 600
    assert cursor.take() is None
    clock.now = 1199
    assert cursor.take() == set()


# -- a pass that looks again at what changed gives what a full pass gives ----------------------


def node(name: str, pool: bool, tainted: bool) -> dict[str, Any]:
    taints = [{"key": "egress-placer.io/pool", "value": "overseas", "effect": "NoSchedule"}] if tainted else []
    return {
        "metadata": {"name": name, "resourceVersion": "1", "labels": {"egress": "yes"} if pool else {}},
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(namespace: str, name: str, node_name: str, phase: str, agent: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": namespace, "name": name, "uid": f"uid-{namespace}-{name}"}
    if agent:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "ds-1", "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": node_name}, "status": {"phase": phase}}


def daemonset(tolerant: bool) -> dict[str, Any]:
    spec = {"tolerations": [{"key": "egress-placer.io/pool", "operator": "Exists"}]} if tolerant else {}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds-1", "resourceVersion": "1"},
            "spec": {"template": {"spec": spec}}}


def namespace(name: str, label: bool) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"extra": "yes"} if label else {}}}


NODE_STEP = st.tuples(st.just("node"), st.sampled_from(NODES), st.booleans(), st.booleans(), st.booleans())
POD_STEP = st.tuples(st.just("pod"), st.sampled_from(NAMESPACES), st.integers(0, 3), st.sampled_from(NODES),
                     st.sampled_from(["Running", "Succeeded", "gone"]), st.booleans())
OTHER_STEP = st.tuples(st.sampled_from(["namespace", "daemonset", "policy"]), st.sampled_from(NAMESPACES), st.booleans())
STEPS = st.lists(st.one_of(NODE_STEP, POD_STEP, OTHER_STEP), min_size=1, max_size=25)


def step(state: ClusterState, change: tuple[Any, ...]) -> None:
    kind = change[0]
    if kind == "node":
        _, name, pool, tainted, gone = change
        state.apply("Node", "DELETED" if gone else "MODIFIED", node(name, pool, tainted))
    elif kind == "pod":
        _, ns, index, node_name, phase, agent = change
        obj = pod(ns, f"p{index}", node_name, "Running" if phase == "gone" else phase, agent and ns == "kube-system")
        state.apply("Pod", "DELETED" if phase == "gone" else "MODIFIED", obj)
    elif kind == "namespace":
        state.apply("Namespace", "MODIFIED", namespace(change[1], change[2]))
    elif kind == "daemonset":
        state.apply("DaemonSet", "MODIFIED", daemonset(change[2]))
    else:
        state.set_policy(load_policy(OTHER_POLICY if change[2] else POLICY))


class Refusing:
    """A writer, evictor and Event sink that records what it is asked and refuses every write: a full
    pass and one with a cursor are then asked the same things in every pass."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    def set_node_taints(self, node: str, taints: Any, resource_version: Any, *, rebase: Any = None) -> None:
        self.asked.append((node, tuple(taints)))
        raise RuntimeError("refused")

    def emit(self, *args: Any, **kwargs: Any) -> None:
        pass


@settings(max_examples=150, deadline=None)
@given(STEPS, st.integers(1, 4))
def test_passes_over_what_changed_give_what_full_passes_give(steps: list[tuple[Any, ...]], every: int):
    state = ClusterState(load_policy(POLICY), clock=lambda: 0.0)
    state.replace("Node", [node(name, name in ("n0", "n1"), False) for name in NODES])
    state.replace("Namespace", [namespace(name, False) for name in NAMESPACES])
    full_writer, kept_writer = Refusing(), Refusing()
    full_taints = TaintReconciler(state, full_writer, Metrics())
    kept_taints = TaintReconciler(state, kept_writer, Metrics(), changes=state.changes.cursor())
    kept_intruders = IntruderReconciler(state, Refusing(), Refusing(), Metrics(), "report", changes=state.changes.cursor())
    full_intruders = IntruderReconciler(state, Refusing(), Refusing(), Metrics(), "report")
    kept_agents = AgentReconciler(state, Refusing(), Refusing(), Metrics(), changes=state.changes.cursor())
    for i, change in enumerate(steps):
        step(state, change)
        if i % every:
            continue  # several changes between two passes
        full_writer.asked.clear(), kept_writer.asked.clear()
        full_taints.reconcile(), kept_taints.reconcile()
        assert sorted(kept_writer.asked) == sorted(full_writer.asked)
        assert kept_intruders.find() == full_intruders.find()
        assert kept_agents.find() == find_gaps(state)
