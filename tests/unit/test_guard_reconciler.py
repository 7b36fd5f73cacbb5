"""The pool guard reconciler against a ClusterState and a recording fake (no cluster): it creates the
params when missing, writes them again only when the policy or the pool nodes change, puts back what
someone else changed once the verify period has passed, keeps the left-out namespaces in the params,
never writes the binding (static: the controller has no right on it), and survives failures."""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

from controller.pool_guard.core import GUARD_NAME, guard_params
from controller.core.model import NodeState
from controller.core.policy import load_policy
from controller.pool_guard.reconcile import PARAMS_LABELS, PoolGuardReconciler
from controller.state import ClusterState

NAMESPACE = "egress-placer"
POLICY_TEXT = """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress: "yes"}
    namespaces: ["team-*"]
"""
POLICY = load_policy(POLICY_TEXT)


def node(name: str, pool: bool) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1", "labels": {"egress": "yes"} if pool else {}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


class FakeApi:
    """The params ConfigMap as the API server would keep it; it has no binding methods: the reconciler
    never writes the binding."""

    def __init__(self, fail: int = 0) -> None:
        self.configmap: dict[str, Any] | None = None
        self.writes: list[str] = []
        self.fail = fail

    def _maybe_fail(self) -> None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("API down")

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._maybe_fail()
        assert (namespace, name) == (NAMESPACE, GUARD_NAME)
        return copy.deepcopy(self.configmap)

    def create_configmap(self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str]) -> None:
        assert self.configmap is None
        self.configmap = {"metadata": {"name": name, "namespace": namespace, "labels": dict(labels), "resourceVersion": "1"}, "data": dict(data)}
        self.writes.append("create-params")

    def replace_configmap(self, configmap: Mapping[str, Any]) -> None:
        assert self.configmap is not None and configmap["metadata"]["resourceVersion"] == self.configmap["metadata"]["resourceVersion"]
        self.configmap = copy.deepcopy(dict(configmap))
        self.writes.append("replace-params")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def setup(api: FakeApi, *nodes: dict[str, Any]) -> tuple[ClusterState, Callable[[], list[str]], Clock]:
    state = ClusterState(POLICY, clock=lambda: 0.0)
    state.replace("Node", list(nodes))
    clock = Clock()
    return state, PoolGuardReconciler(state, api, NAMESPACE, clock=clock, verify_seconds=30).reconcile, clock  # a pass: what it wrote


def test_missing_params_are_created() -> None:
    api = FakeApi()
    _, reconcile, _ = setup(api, node("egress-1", True), node("node-1", False))
    assert reconcile() == ["params"]
    assert api.configmap is not None
    assert api.configmap["data"] == guard_params(POLICY, [NodeState("egress-1", {"egress": "yes"}), NodeState("node-1")])
    assert api.configmap["data"]["egress-1"] == "overseas" and "node-1" not in api.configmap["data"]
    assert api.configmap["metadata"]["labels"] == PARAMS_LABELS
    assert api.configmap["data"]["LeftOut"] == "kube-node-lease,kube-public,kube-system"


def test_nothing_is_written_again_until_something_changes() -> None:
    api = FakeApi()
    state, reconcile, clock = setup(api, node("egress-1", True))
    reconcile()
    api.writes.clear()
    clock.now = 10
    assert reconcile() == [] and api.writes == []
    state.replace("Node", [node("egress-1", True), node("egress-2", True)])
    assert reconcile() == ["params"]
    assert api.configmap["data"]["egress-2"] == "overseas"  # type: ignore[index]


def test_a_deleted_or_edited_params_object_is_put_back_after_the_verify_period() -> None:
    api = FakeApi()
    _, reconcile, clock = setup(api, node("egress-1", True))
    reconcile()
    api.configmap = None
    clock.now = 10
    assert reconcile() == []  # within the verify period, from what it wrote last
    clock.now = 31
    assert reconcile() == ["params"]
    api.configmap["data"]["egress-1"] = "nothing"  # type: ignore[index]
    clock.now = 62
    assert reconcile() == ["params"] and api.configmap["data"]["egress-1"] == "overseas"  # type: ignore[index]


def test_a_failed_pass_is_tried_again_at_once() -> None:
    api = FakeApi(fail=1)
    _, reconcile, _ = setup(api, node("egress-1", True))
    assert reconcile() == []
    assert reconcile() == ["params"]


def test_a_policy_change_moves_the_left_out_namespaces_in_the_params() -> None:
    api = FakeApi()
    state, reconcile, _ = setup(api, node("egress-1", True))
    reconcile()
    state.set_policy(load_policy(POLICY_TEXT.replace("pools:", "agentNamespaces: [monitoring]\npools:")))
    assert reconcile() == ["params"]
    assert api.configmap["data"]["LeftOut"] == "kube-node-lease,kube-public,kube-system,monitoring"  # type: ignore[index]


def test_with_no_valid_policy_in_force_the_guard_is_left_as_it_was() -> None:
    api = FakeApi()
    state = ClusterState(None, clock=lambda: 0.0)  # none loaded, none stored: the empty stand-in
    state.replace("Node", [node("egress-1", True)])
    reconcile = PoolGuardReconciler(state, api, NAMESPACE, verify_seconds=30).reconcile
    assert reconcile() == [] and api.writes == []
    state.set_policy(POLICY)
    assert reconcile() == ["params"]
