"""The run guard's render (controller/core/run_guard.py): what it matches, whom it leaves out, which values
of `spec.status` it lets a tenant set, and the binding's rollout mode. Its behaviour in the API server is
tests/reliability/test_hostile_tenant_runs.py's (the CEL is evaluated there, by the real kube-apiserver)."""

from __future__ import annotations

from controller.core import run_guard
from controller.queue.core import CANCELLED, PENDING, QUEUE_ANNOTATION


def test_it_judges_run_updates_by_anyone_but_the_controller() -> None:
    spec = run_guard.validating_admission_policy("ns", "sa")["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["UPDATE"]  # DELETE is not judged: the owner can always delete its run
    assert sorted(rule["resources"]) == ["pipelineruns", "taskruns"]  # not their /status subresource
    assert [c["expression"] for c in spec["matchConditions"]] == ["request.userInfo.username != 'system:serviceaccount:ns:sa'"]


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
