"""The conversion between the pools API's versions (controller/core/conversion.py): a table per
renamed or turned-over field, and properties over generated valid objects: lossless both ways, and
the objects of either version make the same policy."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.conversion import (
    MAX_PRIORITY,
    V1ALPHA1,
    V1BETA1,
    ConversionError,
    convert_review,
    to_version,
)
from controller.core.policy import PlacementPolicy, PolicyError
from controller.core.pools import load_any_policy, objects_from_policy, policy_from_objects
from tests.unit.test_pools import NAMES, policies


def alpha_pool(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": V1ALPHA1, "kind": "EgressPool", "metadata": {"name": "overseas"}, "spec": spec}


# -- a table per field ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alpha", "beta"),
    [
        ({"priority": 0, "nodes": ["n"]}, {"priority": MAX_PRIORITY, "nodes": ["n"]}),
        ({"priority": 10, "nodes": ["n"]}, {"priority": 999_990, "nodes": ["n"]}),
        ({"priority": MAX_PRIORITY, "nodes": ["n"]}, {"priority": 0, "nodes": ["n"]}),
        ({"priority": 5, "capacity": 4, "nodes": ["n"]}, {"priority": 999_995, "loadCapacityPerNode": 4, "nodes": ["n"]}),
        (
            {"priority": 5, "nodes": ["n"], "queue": {"runsPerNode": 2, "maxQueueSeconds": 60, "priorities": [{"namespaces": ["a"], "priority": 7}]}},
            {"priority": 999_995, "nodes": ["n"], "queue": {"maxRunsPerNode": 2, "maxQueueSeconds": 60, "priorities": [{"namespaces": ["a"], "priority": 7}]}},
        ),
        (
            {"priority": 1, "nodes": ["n"], "queue": {"runsPerNode": 1, "governedBy": "kueue"}},
            {"priority": 999_999, "nodes": ["n"], "queue": {"maxRunsPerNode": 1, "governedBy": "kueue"}},
        ),
        (
            {"priority": 1, "nodes": ["n"], "destinations": [{"name": "hub", "match": {"images": ["docker.io/*"]}, "maxConcurrentPerAddress": 2}],
             "egressAddress": {"label": "egress-placer.io/egress-address"}},
            {"priority": 999_999, "nodes": ["n"], "destinations": [{"name": "hub", "match": {"images": ["docker.io/*"]}, "maxConcurrentPerAddress": 2}],
             "egressAddress": {"label": "egress-placer.io/egress-address"}},
        ),
    ],
)
def test_each_field_of_the_spec_maps_both_ways(alpha: dict[str, Any], beta: dict[str, Any]) -> None:
    converted = to_version(alpha_pool(**alpha), V1BETA1)
    assert converted == {**alpha_pool(**beta), "apiVersion": V1BETA1}
    assert to_version(converted, V1ALPHA1) == alpha_pool(**alpha)


def test_the_status_load_figures_are_renamed_and_the_conditions_kept() -> None:
    status = {
        "conditions": [{"type": "Ready", "status": "True", "reason": "NodesTainted", "message": "m", "lastTransitionTime": "2026-07-01T12:00:00Z", "observedGeneration": 4}],
        "nodes": 3,
        "load": {"placed": 1, "capacity": 6, "mostLoaded": [{"node": "egress-1", "placed": 1, "capacity": 2}]},
        "queue": {"waiting": 0, "slots": 2, "occupied": 1},
    }
    alpha = {**alpha_pool(priority=3, nodes=["n"]), "status": status}
    beta = to_version(alpha, V1BETA1)
    assert beta["status"]["load"] == {"placed": 1, "loadCapacity": 6, "mostLoaded": [{"node": "egress-1", "placed": 1, "loadCapacity": 2}]}
    assert beta["status"]["conditions"] == status["conditions"]
    assert beta["status"]["queue"] == status["queue"]
    assert to_version(beta, V1ALPHA1) == alpha


def test_a_priority_left_out_is_its_version_s_default_turned_over() -> None:
    """0 in both versions, first in v1alpha1 and last in v1beta1: written out, turned over."""
    assert to_version(alpha_pool(nodes=["n"]), V1BETA1)["spec"]["priority"] == MAX_PRIORITY
    beta = {**alpha_pool(nodes=["n"]), "apiVersion": V1BETA1}
    assert to_version(beta, V1ALPHA1)["spec"]["priority"] == MAX_PRIORITY


def test_the_config_converts_unchanged_but_its_version() -> None:
    config = {"apiVersion": V1ALPHA1, "kind": "EgressPlacerConfig", "metadata": {"name": "cluster"}, "spec": {"exemptNamespaces": ["infra"]}}
    beta = to_version(config, V1BETA1)
    assert beta == {**config, "apiVersion": V1BETA1}
    assert to_version(beta, V1ALPHA1) == config


def test_metadata_and_fields_it_does_not_know_are_copied_not_shared() -> None:
    alpha = alpha_pool(priority=1, nodes=["n"])
    alpha["metadata"] = {"name": "overseas", "labels": {"a": "b"}, "resourceVersion": "7", "generation": 2}
    beta = to_version(alpha, V1BETA1)
    assert beta["metadata"] == alpha["metadata"]
    beta["metadata"]["labels"]["a"] = "c"
    assert alpha["metadata"]["labels"] == {"a": "b"}


@pytest.mark.parametrize(
    ("obj", "version", "message"),
    [
        (alpha_pool(priority="high", nodes=["n"]), V1BETA1, "spec.priority: expected an integer"),
        (alpha_pool(priority=True, nodes=["n"]), V1BETA1, "spec.priority: expected an integer"),
        ({**alpha_pool(), "kind": "Pod"}, V1BETA1, "cannot convert a 'Pod'"),
        ({**alpha_pool(), "apiVersion": "v1"}, V1BETA1, "cannot convert from 'v1'"),
        (alpha_pool(), "egress-placer.io/v2", "cannot convert to 'egress-placer.io/v2'"),
    ],
)
def test_what_cannot_be_converted_is_an_error_that_says_why(obj: dict[str, Any], version: str, message: str) -> None:
    with pytest.raises(ConversionError, match=message.replace(".", r"\.")):
        to_version(obj, version)


# -- properties over generated valid objects -----------------------------------------------------------

QUEUES = st.fixed_dictionaries(
    {"runsPerNode": st.integers(1, 50)},
    optional={
        "maxQueueSeconds": st.integers(1, 604_800),
        "priorities": st.lists(st.fixed_dictionaries({"namespaces": st.lists(NAMES, min_size=1, max_size=2), "priority": st.integers(-1000, 1000)}), max_size=2),
        "governedBy": st.sampled_from(["egress-placer", "kueue"]),
    },
)
STATUSES = st.fixed_dictionaries(
    {},
    optional={
        "nodes": st.integers(0, 100),
        "load": st.fixed_dictionaries(
            {"placed": st.integers(0, 100), "capacity": st.integers(0, 100)},
            optional={"mostLoaded": st.lists(st.fixed_dictionaries({"node": NAMES, "placed": st.integers(0, 9), "capacity": st.integers(0, 9)}), max_size=5)},
        ),
    },
)


@st.composite
def alpha_objects(draw: st.DrawFn) -> list[dict[str, Any]]:
    """The objects of a valid policy as the API server hands them over: priorities any in range (the
    API server's default written), some with a queue and a status."""
    objects = objects_from_policy(draw(policies()))
    for obj in objects:
        if obj["kind"] != "EgressPool":
            continue
        obj["spec"]["priority"] = draw(st.integers(0, MAX_PRIORITY))
        if draw(st.booleans()):
            obj["spec"]["queue"] = draw(QUEUES)
        if draw(st.booleans()):
            obj["status"] = draw(STATUSES)
    return objects


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(alpha_objects())
def test_v1alpha1_to_v1beta1_and_back_is_the_same_object(objects: list[dict[str, Any]]) -> None:
    before = copy.deepcopy(objects)
    for obj in objects:
        beta = to_version(obj, V1BETA1)
        assert beta["apiVersion"] == V1BETA1
        assert to_version(beta, V1ALPHA1) == obj
    assert objects == before  # nothing converted in place


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(alpha_objects())
def test_v1beta1_to_v1alpha1_and_back_is_the_same_object(objects: list[dict[str, Any]]) -> None:
    for beta in (to_version(o, V1BETA1) for o in objects):
        assert to_version(to_version(beta, V1ALPHA1), V1BETA1) == beta


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(alpha_objects())
def test_the_higher_v1beta1_priority_is_the_lower_v1alpha1_one(objects: list[dict[str, Any]]) -> None:
    """The order the policy's pools take (lower v1alpha1 priority first, ties by name) is the order of
    higher v1beta1 priority first, ties by name: the same meaning."""
    pools = [o for o in objects if o["kind"] == "EgressPool"]
    alpha_order = sorted(pools, key=lambda o: (o["spec"]["priority"], o["metadata"]["name"]))
    beta_order = sorted((to_version(o, V1BETA1) for o in pools), key=lambda o: (-o["spec"]["priority"], o["metadata"]["name"]))
    assert [o["metadata"]["name"] for o in alpha_order] == [o["metadata"]["name"] for o in beta_order]
    policy: PlacementPolicy = policy_from_objects([{k: v for k, v in o.items() if k != "status"} for o in objects])
    assert [p.name for p in policy.pools] == [o["metadata"]["name"] for o in alpha_order]


# -- the ConversionReview ---------------------------------------------------------------------------------


def review(desired: str, *objects: Any) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "705ab4f5", "desiredAPIVersion": desired, "objects": list(objects)}}


def test_a_review_is_answered_with_every_object_converted_and_its_uid() -> None:
    answer = convert_review(review(V1BETA1, alpha_pool(priority=10, capacity=2, nodes=["n"])))
    assert answer["apiVersion"] == "apiextensions.k8s.io/v1" and answer["kind"] == "ConversionReview"
    response = answer["response"]
    assert response["uid"] == "705ab4f5" and response["result"] == {"status": "Success"}
    assert response["convertedObjects"] == [{**alpha_pool(priority=999_990, loadCapacityPerNode=2, nodes=["n"]), "apiVersion": V1BETA1}]


def test_a_review_with_an_object_that_cannot_be_converted_fails_naming_it() -> None:
    response = convert_review(review(V1BETA1, alpha_pool(priority=1, nodes=["n"]), alpha_pool(priority="x")))["response"]
    assert response["result"]["status"] == "Failure"
    assert response["result"]["message"] == "EgressPool overseas: spec.priority: expected an integer, got 'x'"
    assert response["convertedObjects"] == []


@pytest.mark.parametrize("body", [{}, {"request": None}, {"request": "x"}, []])
def test_what_is_not_a_review_is_an_error(body: Any) -> None:
    with pytest.raises(ConversionError, match="not a ConversionReview"):
        convert_review(body)


@pytest.mark.parametrize("objects", ["x", [1]])
def test_a_review_whose_objects_are_not_objects_fails(objects: Any) -> None:
    body = review(V1BETA1)
    body["request"]["objects"] = objects
    assert convert_review(body)["response"]["result"]["status"] == "Failure"


# -- the objects of either version make the same policy; each names its own fields -------------------------


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(alpha_objects())
def test_the_v1beta1_objects_make_the_policy_of_the_v1alpha1_ones(objects: list[dict[str, Any]]) -> None:
    beta = [to_version(o, V1BETA1) for o in objects]
    assert policy_from_objects(beta) == policy_from_objects(objects)
    mixed = [o if i % 2 else b for i, (o, b) in enumerate(zip(objects, beta))]  # mid-migration: some of each
    assert policy_from_objects(mixed) == policy_from_objects(objects)


@pytest.mark.parametrize(
    ("alpha", "beta", "alpha_message", "beta_message"),
    [
        ({"capacity": 0}, {"loadCapacityPerNode": 0}, "spec.capacity: Input should be greater than 0",
         "spec.loadCapacityPerNode: Input should be greater than 0"),
        ({"queue": {"runsPerNode": 0}}, {"queue": {"maxRunsPerNode": 0}}, "spec.queue.runsPerNode: Input should be greater than 0",
         "spec.queue.maxRunsPerNode: Input should be greater than 0"),
        ({"priority": -1}, {"priority": -1}, "spec.priority: Input should be greater than or equal to 0",
         "spec.priority: Input should be greater than or equal to 0"),
        ({"priority": MAX_PRIORITY + 1}, {"priority": MAX_PRIORITY + 1}, "spec.priority: Input should be less than or equal to 1000000",
         "spec.priority: Input should be less than or equal to 1000000"),
        ({"namespaces": ["a"] * 257}, {"namespaces": ["a"] * 257}, "spec.namespaces: Tuple should have at most 256 items",
         "spec.namespaces: Tuple should have at most 256 items"),
    ],
)
def test_both_versions_refuse_by_the_same_rules_each_naming_its_own_field(
    alpha: dict[str, Any], beta: dict[str, Any], alpha_message: str, beta_message: str
) -> None:
    with pytest.raises(PolicyError) as refused:
        policy_from_objects([alpha_pool(nodes=["n"], **alpha)])
    assert f"EgressPool overseas: {alpha_message}" in str(refused.value)
    with pytest.raises(PolicyError) as refused:
        policy_from_objects([{**alpha_pool(nodes=["n"], **beta), "apiVersion": V1BETA1}])
    assert f"EgressPool overseas: {beta_message}" in str(refused.value)


def test_a_v1beta1_file_is_read_with_its_lines_and_its_own_fields() -> None:
    text = """apiVersion: egress-placer.io/v1beta1
kind: EgressPool
metadata: {name: overseas}
spec:
  priority: 5
  nodes: [egress-1]
  loadCapacityPerNode: 0
"""
    with pytest.raises(PolicyError, match=r"^pools\.yaml:7: EgressPool overseas: spec\.loadCapacityPerNode: Input should be greater than 0$"):
        load_any_policy(text, "pools.yaml")
    (pool,) = load_any_policy(text.replace("0\n", "3\n"), "pools.yaml").pools
    assert pool.capacity == 3


def test_the_higher_v1beta1_priority_takes_the_node_two_pools_claim() -> None:
    def beta_pool(name: str, priority: int) -> dict[str, Any]:
        return {"apiVersion": V1BETA1, "kind": "EgressPool", "metadata": {"name": name}, "spec": {"priority": priority, "nodes": ["n"]}}

    policy = policy_from_objects([beta_pool("low", 1), beta_pool("high", 2)])
    assert [p.name for p in policy.pools] == ["high", "low"]
