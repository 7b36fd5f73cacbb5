"""The CRDs of EgressPool and EgressPlacerConfig, rendered from the policy's models
(controller/core/schema.py, controller/core/pools.py; tests/unit/test_generated.py checks that k8s/crds/
is the render): every field has a description (`kubectl explain`); the API server's patterns accept
exactly what the loader's checks accept (properties over random strings); the CEL rules, run by
cel-python, refuse exactly what the loader refuses (tables). tests/e2e/test_pools_api.py applies the
same CRDs on the real API server."""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from controller.core.egress import DURATION_PATTERN, PROMETHEUS_LABEL, format_duration, parse_duration
from controller.core.policy import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    LABEL_KEY_PATTERNS,
    NOT_BLANK,
    QUALIFIED_NAME,
    LabelSelector,
    LabelSelectorRequirement,
    PlacementPolicy,
    Pool,
    whole,
)
from controller.core.pools import CONFIG_FIELDS, config_spec_schema, custom_resource_definitions, pool_spec_schema
from controller.core.schema import OpenAPI, PolicyModel, SchemaError, openapi_schema

CRDS = custom_resource_definitions()
POOL_CRD, CONFIG_CRD = CRDS


def root_schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def test_both_are_cluster_scoped_v1alpha1_served_and_stored() -> None:
    for crd in CRDS:
        assert crd["spec"]["group"] == "egress-placer.io" and crd["spec"]["scope"] == "Cluster"
        (version,) = crd["spec"]["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert [c["spec"]["names"]["kind"] for c in CRDS] == ["EgressPool", "EgressPlacerConfig"]


def properties(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for name, sub in (schema.get("properties") or {}).items():
        yield f"{path}.{name}", sub
        yield from properties(sub, f"{path}.{name}")
        if "items" in sub:
            yield from properties(sub["items"], f"{path}.{name}[]")
        if isinstance(sub.get("additionalProperties"), dict):
            yield from properties(sub["additionalProperties"], f"{path}.{name}{{}}")


@pytest.mark.parametrize("crd", CRDS, ids=lambda c: c["spec"]["names"]["kind"])
def test_every_field_has_a_description_for_kubectl_explain(crd: dict[str, Any]) -> None:
    root = root_schema(crd)
    assert root["description"]
    undescribed = [p for p, s in properties(root) if p != ".metadata" and not p.startswith(".metadata.") and not s.get("description")]
    assert not undescribed


def test_the_pool_spec_has_priority_and_every_field_of_a_pool_but_its_name() -> None:
    spec = root_schema(POOL_CRD)["properties"]["spec"]
    fields = {Pool.model_fields[f].alias for f in Pool.model_fields} - {"name"}
    assert list(spec["properties"]) == ["priority", *(Pool.model_fields[f].alias for f in Pool.model_fields if f != "name")]
    assert set(spec["properties"]) == fields | {"priority"}
    assert spec["properties"]["priority"] == {**spec["properties"]["priority"], "type": "integer", "minimum": 0, "default": 0}
    assert root_schema(POOL_CRD)["required"] == ["spec"]


def test_the_config_spec_has_the_policy_wide_fields() -> None:
    spec = root_schema(CONFIG_CRD)["properties"]["spec"]
    assert list(spec["properties"]) == [PlacementPolicy.model_fields[f].alias for f in CONFIG_FIELDS]
    assert "status" not in root_schema(CONFIG_CRD)["properties"]


def test_the_pool_has_a_status_subresource_and_printer_columns() -> None:
    (version,) = POOL_CRD["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    status = root_schema(POOL_CRD)["properties"]["status"]["properties"]
    assert {"conditions", "nodes", "taintedNodes", "load", "runsPlacedLastHour", "lastError"} <= set(status)
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert set(status["conditions"]["items"]["properties"]) >= {"type", "status", "reason", "message", "observedGeneration"}
    assert status["load"]["properties"]["mostLoaded"]["maxItems"] == 5
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Placement": ".spec.placement",
        "Priority": ".spec.priority",
        "Nodes": ".status.nodes",
        "Tainted": ".status.taintedNodes",
        "Load": ".status.load.placed",
        "Capacity": ".status.load.capacity",
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
        "Reason": '.status.conditions[?(@.type=="Ready")].reason',
        "Queued": ".status.queue.waiting",
        "Last hour": ".status.runsPlacedLastHour",
        "Age": ".metadata.creationTimestamp",
    }
    wide = {c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")}
    assert wide == {"Reason", "Queued", "Last hour"}  # `kubectl get -o wide` only


def test_a_field_without_a_description_cannot_be_rendered() -> None:
    class Undocumented(PolicyModel):
        x: int = 0

    with pytest.raises(SchemaError, match="Undocumented.x has no description"):
        openapi_schema(Undocumented)


# -- the patterns agree with the loader's checks -----------------------------------------------------


def accepts(check: Callable[[str], Any], value: str) -> bool:
    try:
        check(value)
    except (ValueError, ValidationError):
        return False
    return True


def go_search(pattern: str, value: str) -> bool:
    """What Go's regexp (the API server) says. Python's re reads these patterns the same, but for `$`,
    which in Python also matches before a final line break: Go's `$` is Python's `\\Z`."""
    return re.search(pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern, value) is not None


def matches_all(patterns: tuple[str, ...], value: str, max_length: int | None = None) -> bool:
    return (max_length is None or len(value) <= max_length) and all(go_search(p, value) for p in patterns)


def pool_with(**fields: Any) -> dict[str, Any]:
    return {"name": "p", "nodes": ["n"], **fields}


LABELISH = st.text(alphabet="aZ9-_./", max_size=12) | st.text(alphabet="ab.-/", min_size=240, max_size=330)
STRINGS = st.text(max_size=10) | LABELISH


@settings(max_examples=400, deadline=None)
@given(LABELISH)
@example("\n")  # Go's `$` is not before a final line break
@example("a\n")
def test_label_key_patterns_accept_what_the_loader_accepts(key: str) -> None:
    loader = accepts(lambda k: Pool.model_validate(pool_with(nodeSelector={k: "v"})), key)
    assert matches_all(LABEL_KEY_PATTERNS, key, 317) is loader


@settings(max_examples=300, deadline=None)
@given(STRINGS)
@example("\n")  # Go's `$` is not before a final line break
@example("a\n")
def test_label_value_pattern_accepts_what_the_loader_accepts(value: str) -> None:
    loader = accepts(lambda v: Pool.model_validate(pool_with(nodeSelector={"k": v})), value)
    assert matches_all((whole(f"({QUALIFIED_NAME})?"),), value, 63) is loader


@settings(max_examples=300, deadline=None)
@given(STRINGS)
@example("\n")  # Go's `$` is not before a final line break
@example("a\n")
def test_node_name_pattern_accepts_what_the_loader_accepts(value: str) -> None:
    loader = accepts(lambda v: Pool.model_validate(pool_with(nodes=[v])), value)
    assert matches_all((whole(DNS1123_SUBDOMAIN),), value, 253) is loader


@settings(max_examples=300, deadline=None)
@given(STRINGS)
@example("\n")  # Go's `$` is not before a final line break
@example("a\n")
def test_namespace_name_pattern_accepts_what_the_loader_accepts(value: str) -> None:
    base = {"apiVersion": "egress-placer.io/v1alpha1", "kind": "PlacementPolicy"}
    loader = accepts(lambda v: PlacementPolicy.model_validate({**base, "agentNamespaces": [v]}), value)
    assert matches_all((whole(DNS1123_LABEL),), value, 63) is loader


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=" \t\n\r\f\v\x85\xa0a*", max_size=4))
def test_glob_pattern_accepts_what_the_loader_accepts(glob: str) -> None:
    loader = accepts(lambda g: Pool.model_validate(pool_with(images=[g])), glob)
    assert matches_all((NOT_BLANK,), glob) is loader


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="aZ_09-.:", max_size=6))
@example("\n")  # Go's `$` is not before a final line break
@example("a\n")
def test_prometheus_label_pattern_accepts_what_the_loader_accepts(label: str) -> None:
    loader = accepts(lambda v: Pool.model_validate(pool_with(egressLoad={"prometheus": {"url": "http://p", "nodeLabel": v}})), label)
    assert matches_all((f"^{PROMETHEUS_LABEL}$",), label) is loader


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789.mshx ", max_size=8))
def test_a_duration_the_pattern_accepts_the_loader_reads(text: str) -> None:
    if go_search(DURATION_PATTERN, text):
        assert parse_duration(text) >= 0


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=1e-9, max_value=1e12, allow_nan=False, allow_infinity=False))
def test_a_migrated_duration_matches_the_pattern_and_reads_back_the_same(seconds: float) -> None:
    text = format_duration(seconds)
    assert go_search(DURATION_PATTERN, text)
    assert parse_duration(text) == seconds


# -- the CEL rules refuse what the loader refuses --------------------------------------------------------

celpy = pytest.importorskip("celpy")
# Functions of the API server's CEL that cel-python lacks; rules with them are tried on the real API
# server only (tests/e2e/test_pools_api.py).
KUBERNETES_ONLY = ("isURL(", "url(", "duration(", "type(")


def rules(schema: dict[str, Any]) -> list[str]:
    return [r["rule"] for r in schema.get("x-kubernetes-validations") or []]


def cel_allows(expressions: list[str], value: Any) -> bool:
    env = celpy.Environment()
    for expression in expressions:
        assert not any(f in expression for f in KUBERNETES_ONLY), expression
        result = env.program(env.compile(expression)).evaluate({"self": celpy.json_to_cel(value)})
        assert isinstance(result, celpy.celtypes.BoolType), f"{expression}: {result!r}"
        if not result:
            return False
    return True


SPEC = pool_spec_schema()
SPEC_TABLE = [
    {"nodes": ["n"]},
    {"nodeSelector": {"a": "b"}},
    {"nodes": [], "nodeSelector": {}},
    {"images": ["x"]},
    {},
    {"nodes": ["n"], "nodeSelector": {"a": "b"}},
]
SELECTOR_TABLE = [{}, {"matchLabels": {}}, {"matchExpressions": []}, {"matchLabels": {"a": "b"}}, {"matchExpressions": [{"key": "a", "operator": "Exists"}]}]
REQUIREMENT_TABLE = [
    {"key": "a", "operator": op, **({"values": v} if v is not None else {})}
    for op in ("In", "NotIn", "Exists", "DoesNotExist")
    for v in (None, [], ["x"])
]
MAP_KEYS_TABLE = [{"a": "b"}, {"-a": "b"}, {"example.com/a": "b"}, {"/a": "b"}, {"a/b/c": "b"}, {"x" * 64: "b"}, {"a" * 254 + "/b": "c"}]
CONFIG_TABLE = [
    {},
    {"patchExistingAgents": ["kube-system"]},
    {"patchExistingAgents": ["monitoring"]},
    {"agentNamespaces": ["monitoring"], "patchExistingAgents": ["monitoring"]},
    {"agentNamespaces": [], "patchExistingAgents": ["kube-system"]},
    {"exemptNamespaces": ["infra"], "patchExistingAgents": ["infra"]},
    {"exemptNamespaces": ["infra"], "patchExistingAgents": ["kube-system"]},
    {"exemptNamespaces": ["infra"], "agentNamespaces": ["kube-system"], "patchExistingAgents": ["kube-system"]},
]


@pytest.mark.parametrize("spec", SPEC_TABLE)
def test_the_membership_rule_refuses_what_the_loader_refuses(spec: dict[str, Any]) -> None:
    assert cel_allows(rules(SPEC), spec) is accepts(lambda s: Pool.model_validate({"name": "p", **s}), spec)


@pytest.mark.parametrize("selector", SELECTOR_TABLE)
def test_the_empty_selector_rule_refuses_what_the_loader_refuses(selector: dict[str, Any]) -> None:
    schema = SPEC["properties"]["namespaceSelector"]
    assert cel_allows(rules(schema), selector) is accepts(LabelSelector.model_validate, selector)


@pytest.mark.parametrize("requirement", REQUIREMENT_TABLE)
def test_the_operator_rules_refuse_what_the_loader_refuses(requirement: dict[str, Any]) -> None:
    schema = SPEC["properties"]["namespaceSelector"]["properties"]["matchExpressions"]["items"]
    assert cel_allows(rules(schema), requirement) is accepts(LabelSelectorRequirement.model_validate, requirement)


@pytest.mark.parametrize("labels", MAP_KEYS_TABLE)
def test_the_label_key_rule_of_a_map_refuses_what_the_loader_refuses(labels: dict[str, str]) -> None:
    for schema in (SPEC["properties"]["nodeSelector"], SPEC["properties"]["namespaceSelector"]["properties"]["matchLabels"]):
        assert cel_allows(rules(schema), labels) is accepts(lambda s: Pool.model_validate(pool_with(nodeSelector=s)), labels)


@pytest.mark.parametrize("spec", CONFIG_TABLE)
def test_the_agent_namespaces_rule_refuses_what_the_loader_refuses(spec: dict[str, Any]) -> None:
    base = {"apiVersion": "egress-placer.io/v1alpha1", "kind": "PlacementPolicy"}
    assert cel_allows(rules(config_spec_schema()), spec) is accepts(lambda s: PlacementPolicy.model_validate({**base, **s}), spec)


@pytest.mark.parametrize("taint", [{}, {"effect": "NoSchedule"}, {"effect": "NoExecute"}, {"effect": "PreferNoSchedule"}])
def test_the_taint_effect_rule_refuses_what_the_loader_refuses(taint: dict[str, Any]) -> None:
    """PreferNoSchedule does not keep pods off the pool's nodes: refused by both (docs/pools-api.md, "Taint effect")."""
    schema = SPEC["properties"]["taint"]
    assert cel_allows(rules(schema), taint) is accepts(lambda t: Pool.model_validate(pool_with(taint=t)), taint)
    # in the enum, so that the API server gets to the CEL rule (it skips them once the enum refuses a value)
    assert schema["properties"]["effect"]["enum"] == ["NoSchedule", "PreferNoSchedule", "NoExecute"]


def test_the_name_rules_refuse_the_reserved_names() -> None:
    pool_rules = rules(root_schema(POOL_CRD))
    assert [cel_allows(pool_rules, {"metadata": {"name": n}}) for n in ("auto", "none", "overseas")] == [False, False, True]
    config_rules = rules(root_schema(CONFIG_CRD))
    assert [cel_allows(config_rules, {"metadata": {"name": n}}) for n in ("cluster", "other")] == [True, False]


def test_marks_on_a_model_apply_only_where_its_fields_are_rendered() -> None:
    assert rules(openapi_schema(PlacementPolicy, only=("exempt_namespaces",))) == []
    assert OpenAPI().rules == ()


# -- egress budgets (docs/budgets.md) -------------------------------------------------------------------

DESTINATION_TABLE = [
    {"name": "d", "match": {"images": ["x"]}, "maxConcurrentPerAddress": 1},
    {"name": "d", "match": {}, "maxConcurrentPerAddress": 1},
    {"name": "d", "match": {"images": [], "tasks": [], "urlParams": []}, "maxConcurrentPerAddress": 1},
    {"name": "d", "match": {"tasks": ["t"]}},
    {"name": "d", "match": {"tasks": ["t"]}, "maxStartsPerWindowPerAddress": 5},
    {"name": "d", "match": {"tasks": ["t"]}, "windowSeconds": 5},
    {"name": "d", "match": {"tasks": ["t"]}, "maxStartsPerWindowPerAddress": 5, "windowSeconds": 60},
    {"name": "d", "match": {"urlParams": [{"param": "u", "hosts": ["h"]}]}, "maxConcurrentPerPool": 3, "mode": "ReportOnly"},
]


@pytest.mark.parametrize("destination", DESTINATION_TABLE)
def test_the_destination_rules_refuse_what_the_loader_refuses(destination: dict[str, Any]) -> None:
    schema = SPEC["properties"]["destinations"]["items"]
    allowed = cel_allows(rules(schema), destination) and cel_allows(rules(schema["properties"]["match"]), destination["match"])
    assert allowed is accepts(lambda d: Pool.model_validate(pool_with(destinations=[d])), destination)


@pytest.mark.parametrize("address", [{}, {"label": "a"}, {"annotation": "a"}, {"label": "a", "annotation": "b"}])
def test_the_egress_address_rule_refuses_what_the_loader_refuses(address: dict[str, Any]) -> None:
    schema = SPEC["properties"]["egressAddress"]
    assert cel_allows(rules(schema), address) is accepts(lambda a: Pool.model_validate(pool_with(egressAddress=a)), address)


@pytest.mark.parametrize("names", [["a"], ["a", "b"], ["a", "a"], ["a", "b", "a"]])
def test_the_unique_destination_rule_refuses_what_the_loader_refuses(names: list[str]) -> None:
    spec = {"nodes": ["n"], "destinations": [{"name": n, "match": {"tasks": ["t"]}, "maxConcurrentPerPool": 1} for n in names]}
    assert cel_allows(rules(SPEC), spec) is accepts(lambda s: Pool.model_validate({"name": "p", **s}), spec)
