"""The skeleton of egress-placer's ValidatingAdmissionPolicies and their bindings, shared by the pool guard
(pool_guard.core), the run guard (core.run_guard) and the controller's own rights (core.rights): each of those
says what it matches and checks; this module says how a policy and a binding are written. Pure: dicts in
the key order the generated manifests keep (devplacer/generate.py dumps them unsorted).

Every policy is fail-closed (`failurePolicy: Fail`: a CEL error refuses). A binding's `validationActions`
are `DENY`, or `WARN_ONLY` for the rollout: the API server answers with a warning and an audit annotation
instead of refusing, so a cluster can watch a policy before enforcing it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

API_VERSION = "admissionregistration.k8s.io/v1"
DENY = ("Deny",)
WARN_ONLY = ("Warn", "Audit")


def service_account_user(namespace: str, service_account: str) -> str:
    """The user name the API server's authenticator gives a ServiceAccount's token (`request.userInfo.username`)."""
    return f"system:serviceaccount:{namespace}:{service_account}"


def resource_rule(
    groups: Iterable[str], operations: Iterable[str], resources: Iterable[str], versions: Iterable[str] = ("*",)
) -> dict[str, Any]:
    """One of `matchConstraints.resourceRules`."""
    return {"apiGroups": list(groups), "apiVersions": list(versions), "operations": list(operations), "resources": list(resources)}


def named(expressions: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    """(name, CEL expression) pairs as `matchConditions` or `variables` entries."""
    return [{"name": name, "expression": expression} for name, expression in expressions]


def validation(expression: str, message: str = "", *, message_expression: str = "") -> dict[str, str]:
    """One `validations` entry, refused as Forbidden with `message` (or `message_expression`, CEL)."""
    said = {"messageExpression": message_expression} if message_expression else {"message": message}
    return {"expression": expression, **said, "reason": "Forbidden"}


def admission_policy(
    name: str,
    rules: Iterable[Mapping[str, Any]],
    match_conditions: Iterable[tuple[str, str]],
    validations: Iterable[Mapping[str, str]],
    *,
    variables: Iterable[tuple[str, str]] = (),
    param_kind: str = "",
) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy: fail-closed, matching `rules` (resource rules) where every match
    condition holds, with `variables` (none: no such key) and params of kind `param_kind` (a core/v1
    kind; "": no params)."""
    spec: dict[str, Any] = {"failurePolicy": "Fail"}
    if param_kind:
        spec["paramKind"] = {"apiVersion": "v1", "kind": param_kind}
    spec["matchConstraints"] = {"resourceRules": [dict(rule) for rule in rules]}
    spec["matchConditions"] = named(match_conditions)
    variables = named(variables)
    if variables:
        spec["variables"] = variables
    spec["validations"] = [dict(v) for v in validations]
    return {"apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name}, "spec": spec}


def param_ref(name: str, namespace: str, not_found: str) -> dict[str, str]:
    """A binding's params: the object `name` in `namespace`; `not_found` is `Allow` or `Deny` (what a
    request gets while the params are missing)."""
    return {"name": name, "namespace": namespace, "parameterNotFoundAction": not_found}


def policy_binding(name: str, actions: Iterable[str] = DENY, params: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The binding of policy `name` (of the same name), every namespace (the policy picks its requests),
    with `actions` (`DENY`, or `WARN_ONLY` for the rollout) and `params` (a `param_ref`, or none)."""
    spec: dict[str, Any] = {"policyName": name, "validationActions": list(actions)}
    if params is not None:
        spec["paramRef"] = dict(params)
    spec["matchResources"] = {}
    return {"apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name}, "spec": spec}
