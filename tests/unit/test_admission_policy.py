"""The one ValidatingAdmissionPolicy skeleton (controller/core/admission_policy.py) the pool guard, the run
guard and the controller's rights share: the generated manifests are byte-identical to what each module
wrote on its own (tests/unit/test_generated.py), so the key order is part of the contract."""

from __future__ import annotations

from controller.core import rights, run_guard
from controller.pool_guard import core as guard
from controller.core.admission_policy import DENY, WARN_ONLY, admission_policy, param_ref, policy_binding, resource_rule, validation


def test_a_policy_has_the_keys_it_is_given_in_the_manifests_order() -> None:
    bare = admission_policy("p", [resource_rule(["tekton.dev"], ["UPDATE"], ["taskruns"])], [("c", "true")], [validation("true", "m")])
    assert list(bare["spec"]) == ["failurePolicy", "matchConstraints", "matchConditions", "validations"]
    full = admission_policy("p", [], [], [validation("true", message_expression="'m'")], variables=[("v", "1")], param_kind="ConfigMap")
    assert list(full["spec"]) == ["failurePolicy", "paramKind", "matchConstraints", "matchConditions", "variables", "validations"]
    assert full["spec"]["failurePolicy"] == "Fail" and full["spec"]["validations"] == [
        {"expression": "true", "messageExpression": "'m'", "reason": "Forbidden"}]


def test_a_binding_denies_or_only_warns_and_takes_params() -> None:
    assert policy_binding("p")["spec"] == {"policyName": "p", "validationActions": ["Deny"], "matchResources": {}}
    warned = policy_binding("p", WARN_ONLY, param_ref("cm", "ns", "Allow"))["spec"]
    assert list(warned) == ["policyName", "validationActions", "paramRef", "matchResources"]
    assert warned["validationActions"] == ["Warn", "Audit"] and warned["paramRef"]["parameterNotFoundAction"] == "Allow"


def test_every_policy_of_ours_is_built_by_it() -> None:
    policies = [guard.validating_admission_policy(), run_guard.validating_admission_policy(), rights.rights_policy(), rights.pod_deletes_policy()]
    bindings = [guard.policy_binding("ns"), run_guard.policy_binding(), *rights.rights_bindings()]
    assert all(p["spec"]["failurePolicy"] == "Fail" and all(v["reason"] == "Forbidden" for v in p["spec"]["validations"]) for p in policies)
    assert all(b["spec"]["validationActions"] == list(DENY) and b["spec"]["policyName"] == b["metadata"]["name"] for b in bindings)
