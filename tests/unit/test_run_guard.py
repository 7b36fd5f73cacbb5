"""The run guard's render (controller/core/run_guard.py): what it matches, whom it leaves out, which values
of `spec.status` it lets a tenant set, and the binding's rollout mode. Its behaviour in the API server is
tests/reliability/test_hostile_tenant_runs.py's (the CEL is evaluated there, by the real kube-apiserver)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.core import run_guard
from controller.core.model import POOL_SLOT_GATE
from controller.queue.core import CANCELLED, PENDING, QUEUE_ANNOTATION


def test_it_judges_run_updates_by_anyone_but_the_controller() -> None:
    spec = run_guard.validating_admission_policy("ns", "sa")["spec"]
    assert spec["failurePolicy"] == "Fail"
    runs, pods = spec["matchConstraints"]["resourceRules"]
    assert runs["operations"] == pods["operations"] == ["UPDATE"]  # DELETE is not judged: the owner can always delete its run
    assert sorted(runs["resources"]) == ["pipelineruns", "taskruns"]  # not their /status subresource
    assert (pods["apiGroups"], pods["resources"]) == ([""], ["pods"])  # a gated pod's gate (test_a_gated_pod_keeps_our_gate)
    conditions = [c["expression"] for c in spec["matchConditions"]]
    assert conditions[0] == "request.userInfo.username != 'system:serviceaccount:ns:sa'"


def test_cancel_values_are_the_queue_s_own_and_never_pending_or_empty() -> None:
    values = {v for kind in run_guard.CANCEL_VALUES.values() for v in kind}
    assert values == set(CANCELLED)
    assert not values & set(PENDING.values()) and "" not in values
    text = str(run_guard.validating_admission_policy())
    for value in values:
        assert f"'{value}'" in text
    assert QUEUE_ANNOTATION in text


def test_the_binding_denies_or_only_warns() -> None:
    assert run_guard.policy_binding()["spec"]["validationActions"] == ["Deny"]
    assert run_guard.policy_binding(warn_only=True)["spec"]["validationActions"] == ["Warn", "Audit"]
    assert run_guard.policy_binding()["spec"]["policyName"] == run_guard.RUN_GUARD_NAME


# -- the CEL, run by cel-python (the API server runs it in tests/reliability/test_hostile_tenant_runs.py) --


def _judged(resource: str, old: dict[str, Any], new: dict[str, Any]) -> list[str] | None:
    """The run guard's refusals of a tenant's UPDATE; None: its match conditions leave it alone."""
    celpy = pytest.importorskip("celpy")
    from celpy import celtypes

    from tests.unit.test_rights import LazyVariables, program

    spec = run_guard.validating_admission_policy()["spec"]
    group = "" if resource == "pods" else "tekton.dev"
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel({"resource": {"group": group, "resource": resource}, "kind": {"kind": "TaskRun"},
                                      "userInfo": {"username": "system:serviceaccount:team-a:tenant"}}),
        "object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
    }
    if any(program(c["expression"]).evaluate(activation) != celtypes.BoolType(True) for c in spec["matchConditions"]):
        return None
    activation["variables"] = LazyVariables(activation, {v["name"]: program(v["expression"]) for v in spec["variables"]})
    return [v["message"] for v in spec["validations"] if program(v["expression"]).evaluate(activation) != celtypes.BoolType(True)]


def _pod(*gates: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "annotations": {QUEUE_ANNOTATION: "copied"}}, "spec": {"schedulingGates": [{"name": g} for g in gates]}}


@pytest.mark.parametrize(
    "old, new, outcome",
    [
        pytest.param(_pod(POOL_SLOT_GATE), _pod(), "refused", id="our-gate-removed"),
        pytest.param(_pod("kueue.x-k8s.io/admission", POOL_SLOT_GATE), _pod(POOL_SLOT_GATE), "admitted", id="another-gate-removed"),
        pytest.param(_pod(POOL_SLOT_GATE), _pod(POOL_SLOT_GATE), "admitted", id="kept"),
        pytest.param(_pod("kueue.x-k8s.io/admission"), _pod(), "not-judged", id="a-pod-without-our-gate"),
        pytest.param({"metadata": {"name": "p"}, "spec": {}}, {"metadata": {"name": "p"}, "spec": {}}, "not-judged", id="no-gates"),
    ],
)
def test_a_gated_pod_keeps_our_gate(old: dict[str, Any], new: dict[str, Any], outcome: str) -> None:
    refused = _judged("pods", old, new)
    if outcome == "not-judged":
        assert refused is None
    else:
        assert refused is not None and bool(refused) is (outcome == "refused"), refused
        assert all(POOL_SLOT_GATE in m for m in refused)


@pytest.mark.parametrize(("entry", "refused"), [(True, True), (False, False)], ids=["held", "no-entry-of-ours"])
def test_a_held_run_still_may_not_be_started_by_its_owner(entry: bool, refused: bool) -> None:
    annotations = {QUEUE_ANNOTATION: "e"} if entry else {}
    old = {"metadata": {"annotations": annotations}, "spec": {"status": PENDING["TaskRun"]}}
    new = {"metadata": {"annotations": annotations}, "spec": {}}
    assert bool(_judged("taskruns", old, new)) is refused


# -- egress budgets (docs/budgets.md): a pod's budget record is egress-placer's -------------------------

RECORD = '{"pool":"overseas","destinations":["dockerhub-pulls"],"node":"egress-1","time":1}'


def _recorded(value: str | None, *gates: str) -> dict[str, Any]:
    annotations = {"egress-placer.io/budgets": value} if value is not None else {}
    return {"metadata": {"name": "p", "annotations": annotations}, "spec": {"schedulingGates": [{"name": g} for g in gates]} if gates else {}}


@pytest.mark.parametrize(
    "old, new, outcome",
    [
        pytest.param(_recorded(RECORD), _recorded(None), "refused", id="record-removed: frees room"),
        pytest.param(_recorded(RECORD), _recorded(RECORD.replace("egress-1", "egress-9")), "refused", id="record-changed"),
        pytest.param(_recorded(RECORD), _recorded(RECORD), "admitted", id="record-kept"),
        pytest.param(_recorded(None), _recorded(RECORD), "not-judged", id="record-added: its own run touches a budget"),
        pytest.param(_recorded(RECORD, POOL_SLOT_GATE), _recorded(RECORD), "refused", id="gated-and-recorded: gate removed"),
    ],
)
def test_a_pods_budget_record_is_kept(old: dict[str, Any], new: dict[str, Any], outcome: str) -> None:
    refused = _judged("pods", old, new)
    if outcome == "not-judged":
        assert refused is None
    else:
        assert refused is not None and bool(refused) is (outcome == "refused"), refused
