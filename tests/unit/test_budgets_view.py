"""Egress budgets as the stores show them (controller/budgets/view.py): uses only from run pods' records,
counted on the node they are bound to, behind the node's own address; `status` lines."""

from __future__ import annotations

from typing import Any

from controller.budgets.core import BUDGETS_ANNOTATION, record_annotation, verdict
from controller.core.model import DECISION_ANNOTATION
from controller.core.policy import load_policy
from controller.state import ClusterState

NOW = 1_800_000_000.0
POLICY = """\
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodes: [egress-1, egress-2, egress-3]
    egressAddress: {label: egress-placer.io/egress-address}
    destinations:
      - name: dockerhub-pulls
        match: {images: ["docker.io/*"]}
        maxConcurrentPerAddress: 2
        maxStartsPerWindowPerAddress: 5
        windowSeconds: 60
"""


def node(name: str, address: str | None) -> dict[str, Any]:
    labels = {"egress-placer.io/egress-address": address} if address else {}
    return {"metadata": {"name": name, "labels": labels}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def state() -> ClusterState:
    s = ClusterState(load_policy(POLICY), clock=lambda: NOW)
    for name, address in (("egress-1", "203.0.113.7"), ("egress-2", "203.0.113.7"), ("egress-3", None)):
        s.apply("Node", "ADDED", node(name, address))
    return s


def run(s: ClusterState, name: str, decided: bool = True) -> None:
    annotations = {DECISION_ANNOTATION: "{}"} if decided else {}
    s.apply("TaskRun", "ADDED", {"metadata": {"namespace": "team-ci", "name": name, "uid": f"uid-{name}", "annotations": annotations}})


def pod(s: ClusterState, name: str, node_name: str | None, record: str | None, owner_uid: str | None = None, phase: str = "Running",
        claimed: str = "egress-3") -> None:
    meta: dict[str, Any] = {"namespace": "team-ci", "name": f"{name}-pod", "uid": f"pod-{name}", "annotations": {}}
    if record is not None:
        meta["annotations"][BUDGETS_ANNOTATION] = record
    meta["ownerReferences"] = [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": name, "uid": owner_uid or f"uid-{name}", "controller": True}]
    s.apply("Pod", "ADDED", {"metadata": meta, "spec": {"nodeName": node_name} if node_name else {}, "status": {"phase": phase}})


def rec(node_name: str = "egress-3", started: float = NOW - 10, names: tuple[str, ...] = ("dockerhub-pulls",), pool: str = "overseas") -> str:
    return record_annotation(pool, names, node_name, started)


def test_two_nodes_behind_one_address_share_it_the_third_is_its_own() -> None:
    s = state()
    pool = s.policy.pools[0]
    assert s.budgets.addresses(pool) == {"egress-1": "203.0.113.7", "egress-2": "203.0.113.7", "egress-3": "egress-3"}
    for name, where in (("a", "egress-1"), ("b", "egress-2")):
        run(s, name)
        pod(s, name, where, rec(where))
    budgets = s.budgets.pool_budgets(pool, NOW)
    assert budgets is not None and len(budgets.uses) == 2
    assert verdict(budgets, ["dockerhub-pulls"], NOW).nodes == ("egress-3",)


def test_only_a_runs_pod_counts_and_on_the_node_it_is_bound_to() -> None:
    """A tenant's bare pod with a forged record, a pod whose owner uid is made up, a pod of a run without
    our decision: none counts. A record naming egress-3 on a pod bound to egress-1 counts on egress-1."""
    s = state()
    pool = s.policy.pools[0]
    run(s, "real")
    pod(s, "real", "egress-1", rec("egress-3"))
    run(s, "forged")
    pod(s, "forged", "egress-1", rec("egress-1"), owner_uid="made-up")
    run(s, "undecided", decided=False)
    pod(s, "undecided", "egress-1", rec("egress-1"))
    run(s, "elsewhere")
    pod(s, "elsewhere", "egress-1", rec("egress-1", pool="other-pool"))
    budgets = s.budgets.pool_budgets(pool, NOW)
    assert budgets is not None
    assert [(u.key, u.node) for u in budgets.uses] == [("pod-real", "egress-1")]
    assert [(st.address, st.destination) for st in budgets.starts] == [("203.0.113.7", "dockerhub-pulls")]


def test_an_unbound_pod_counts_on_the_node_admission_chose() -> None:
    s = state()
    run(s, "a")
    pod(s, "a", None, rec("egress-2"), phase="Pending")
    budgets = s.budgets.pool_budgets(s.policy.pools[0], NOW)
    assert budgets is not None and [u.node for u in budgets.uses] == ["egress-2"]


def test_status_lines_show_each_budgets_use() -> None:
    s = state()
    for name, where in (("a", "egress-1"), ("b", "egress-2")):
        run(s, name)
        pod(s, name, where, rec(where))
    lines = s.budgets.status_lines(NOW)
    assert lines[0] == "pool overseas: 3 nodes behind 2 egress addresses"
    assert "  dockerhub-pulls on 203.0.113.7: 2 of 2 at once (full)" in lines
    assert "  dockerhub-pulls on 203.0.113.7: 2 of 5 in the last 1 min" in lines
    assert "  dockerhub-pulls on egress-3: 0 of 2 at once" in lines


def test_a_pool_without_destinations_has_no_budgets() -> None:
    s = ClusterState(load_policy(POLICY.split("    egressAddress")[0]), clock=lambda: NOW)
    assert s.budgets.pool_budgets(s.policy.pools[0], NOW) is None and s.budgets.status_lines(NOW) == []


def test_the_leaders_pass_sets_each_budgets_figures_with_labels_from_policy_and_nodes() -> None:
    from controller.budgets.reconcile import BudgetMetrics
    from controller.metrics import Metrics

    s, metrics = state(), Metrics()
    for name, where in (("a", "egress-1"), ("b", "egress-2")):
        run(s, name)
        pod(s, name, where, rec(where, names=("dockerhub-pulls", "made-up")))
    BudgetMetrics(s, metrics, clock=lambda: NOW)()
    in_use = {tuple(x.labels.values()): x.value for f in metrics.budget_in_use.collect() for x in f.samples}
    starts = {tuple(x.labels.values()): x.value for f in metrics.budget_window_starts.collect() for x in f.samples}
    assert in_use == {("overseas", "dockerhub-pulls", "203.0.113.7"): 2, ("overseas", "dockerhub-pulls", "egress-3"): 0}
    assert starts == {("overseas", "dockerhub-pulls", "203.0.113.7"): 2, ("overseas", "dockerhub-pulls", "egress-3"): 0}


def test_a_finished_pods_start_stays_in_the_window_even_if_its_run_was_deleted_first() -> None:
    """Counted while running (its TaskRun in the cache), its start outlives the pod and the TaskRun (a
    tenant deleting its run frees no window); a forged record on a pod never counted is not kept."""
    s = state()
    pool = s.policy.pools[0]
    run(s, "a")
    pod(s, "a", "egress-1", rec("egress-1"))
    assert s.budgets.pool_budgets(pool, NOW) is not None  # counted now: verified
    s.apply("TaskRun", "DELETED", {"metadata": {"namespace": "team-ci", "name": "a", "uid": "uid-a"}})
    pod(s, "a", "egress-1", rec("egress-1"), phase="Succeeded")
    pod(s, "forged", "egress-1", rec("egress-1"), owner_uid="made-up")
    pod(s, "forged", "egress-1", rec("egress-1"), owner_uid="made-up", phase="Succeeded")
    budgets = s.budgets.pool_budgets(pool, NOW)
    assert budgets is not None and budgets.uses == ()
    assert [(st.address, st.time) for st in budgets.starts] == [("203.0.113.7", NOW - 10)]
    assert s.budgets.pool_budgets(pool, NOW + 61).starts == ()  # out of the 60 s window


def test_a_relist_keeps_the_starts_of_the_finished_run_pods_the_api_server_lists() -> None:
    s = state()
    run(s, "a")
    finished = {"metadata": {"namespace": "team-ci", "name": "a-pod", "uid": "pod-a",
                             "annotations": {BUDGETS_ANNOTATION: rec("egress-3")},
                             "ownerReferences": [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": "a", "uid": "uid-a", "controller": True}]},
                "spec": {"nodeName": "egress-3"}, "status": {"phase": "Succeeded"}}
    s.replace("Pod", [finished])
    budgets = s.budgets.pool_budgets(s.policy.pools[0], NOW)
    assert budgets is not None and [(st.address, st.destination) for st in budgets.starts] == [("egress-3", "dockerhub-pulls")]


def test_an_egress_address_from_a_node_annotation_the_cache_keeps_alone() -> None:
    """`egressAddress.annotation`: the Node cache keeps that one annotation key (no other), and nodes with
    the same value share the address; a node without it is its own."""
    from controller.kube.informer import KEPT_ANNOTATIONS, keep_node_annotations, trim_node

    key = "example.com/nat-ip"
    before = KEPT_ANNOTATIONS["Node"]
    try:
        assert keep_node_annotations({key}) is True and keep_node_annotations({key}) is False
        s = ClusterState(load_policy(POLICY.replace("{label: egress-placer.io/egress-address}", "{annotation: " + key + "}")), clock=lambda: NOW)
        for name, address in (("egress-1", "203.0.113.7"), ("egress-2", " 203.0.113.7 "), ("egress-3", None)):
            raw = node(name, None)
            raw["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "x" * 10_000, "other": "y",
                                              **({key: address} if address else {})}
            trimmed = trim_node(raw)
            assert set(trimmed["metadata"].get("annotations", {})) <= {key}
            s.apply("Node", "ADDED", trimmed)
        assert s.budgets.addresses(s.policy.pools[0]) == {"egress-1": "203.0.113.7", "egress-2": "203.0.113.7", "egress-3": "egress-3"}
        assert keep_node_annotations(()) is False and "annotations" not in trim_node({"metadata": {"name": "n", "annotations": {key: "a"}}})["metadata"]
    finally:
        KEPT_ANNOTATIONS["Node"] = before


def test_a_start_counts_between_its_pod_leaving_the_cache_and_the_state_being_told() -> None:
    """The pod store publishes the snapshot without the finished pod first, then tells the state
    (`pod_ended`): a release pass in between must still count the start of a pod it counted before."""
    s = state()
    pool = s.policy.pools[0]
    run(s, "a")
    pod(s, "a", "egress-1", rec("egress-1"))
    assert len(s.budgets.pool_budgets(pool, NOW).starts) == 1  # counted once: verified
    s.stores["Pod"].apply({"metadata": {"namespace": "team-ci", "name": "a-pod", "uid": "pod-a"}}, True)  # the store alone
    assert [(st.address, st.time) for st in s.budgets.pool_budgets(pool, NOW).starts] == [("203.0.113.7", NOW - 10)]
    assert s.budgets.pool_budgets(pool, NOW + 61).starts == ()  # out of the window


def test_a_tenant_copying_a_run_pods_record_onto_its_own_pods_gains_nothing() -> None:
    """Records are kept parsed by their text: a tenant's bare pod (and a pod of a run without our decision)
    carrying the exact text of a real run pod's record shares its parsed form, never its standing: only
    the real run's pod counts, once."""
    s = state()
    pool = s.policy.pools[0]
    run(s, "real")
    text = rec("egress-1")
    pod(s, "real", "egress-1", text)
    pod(s, "copy", "egress-3", text, owner_uid="made-up")
    run(s, "undecided", decided=False)
    pod(s, "undecided", "egress-3", text)
    budgets = s.budgets.pool_budgets(pool, NOW)
    assert [(u.key, u.node) for u in budgets.uses] == [("pod-real", "egress-1")]
    assert [st.address for st in budgets.starts] == ["203.0.113.7"]


def test_a_pods_record_is_parsed_once_when_it_is_stored_not_per_pass(monkeypatch: Any) -> None:
    """The hot path (every Pod CREATE and release pass reads `pool_budgets`): a stored pod's record is
    parsed when the pod store indexes it, never again by the passes; a changed record is parsed anew."""
    import controller.budgets.view as view

    parsed: list[str] = []
    real = view.read_record

    def counting(text: Any) -> Any:
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(view, "read_record", counting)
    view._parsed.cache_clear()
    s = state()
    pool = s.policy.pools[0]
    for i in range(20):
        run(s, f"r{i}")
        pod(s, f"r{i}", "egress-3", rec("egress-3", NOW - i))
    assert len(parsed) == 20  # each once, when stored
    for _ in range(5):
        assert len(s.budgets.pool_budgets(pool, NOW).uses) == 20
    s.budgets.status_lines(NOW)
    assert len(parsed) == 20
    pod(s, "r0", "egress-3", rec("egress-3", NOW - 1.5))  # the pod's record changed (MODIFIED)
    assert len(parsed) == 21 and len(s.budgets.pool_budgets(pool, NOW).uses) == 20
