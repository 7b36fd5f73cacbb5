"""The PlacementPolicy: loading and validation (errors name source, line and field), pool membership,
namespace access, image globs, taints and tolerations."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.model import NamespaceState, NodeState, Taint
from controller.core.policy import (
    LabelSelector,
    PlacementPolicy,
    PolicyError,
    Pool,
    agent_namespaces,
    is_agent_namespace,
    load_policy,
)

EXAMPLE = Path(__file__).parents[2] / "config" / "policy.example.yaml"

HEADER = "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\n"
GOOD = HEADER + """\
pools:
  - name: overseas
    nodeSelector:
      egress-placer.io/pool: overseas
    nodes: [node-7]
    images: ["*/cdn-*", "ghcr.io/acme/uploader:*"]
    namespaces: ["team-cdn", "release-*"]
    namespaceSelector:
      matchLabels: {egress: allowed}
    placement: required
    capacity: 10
"""


def policy_of(*pools: dict) -> PlacementPolicy:
    return PlacementPolicy.model_validate({"apiVersion": "egress-placer.io/v1alpha1", "kind": "PlacementPolicy", "pools": pools})


def test_the_example_policy_is_valid_and_uses_every_field() -> None:
    policy = load_policy(EXAMPLE.read_text(), str(EXAMPLE))
    overseas = policy.pools[0]
    assert [p.name for p in policy.pools] == ["overseas", "lab"]
    assert overseas.node_selector == {"egress-placer.io/pool": "overseas"}
    assert overseas.nodes == ("node-7",)
    assert overseas.capacity == 10 and overseas.placement == "required"
    assert overseas.namespace_selector is not None and overseas.namespace_selector.match_expressions[0].operator == "NotIn"
    assert policy.pools[1].placement == "preferred" and policy.pools[1].images == ()
    assert policy.exempt_namespaces == ("kube-system", "kube-node-lease", "kube-public")
    assert policy.agent_namespaces == ("kube-system", "monitoring")


def test_defaults() -> None:
    policy = load_policy(HEADER + "pools:\n  - name: a\n    nodes: [n1]\n")
    pool = policy.pools[0]
    assert (pool.placement, pool.capacity, pool.taint.key, pool.taint.effect) == (
        "required", None, "egress-placer.io/pool", "NoSchedule",
    )
    assert policy.exempt_namespaces == ("kube-system", "kube-node-lease", "kube-public")
    assert load_policy(HEADER).pools == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("placement: required", "placement: maybe"),
         "policy.yaml:12: pools[0].placement: Input should be 'required' or 'preferred'"),
        (GOOD.replace("capacity: 10", "capacity: 0"), "policy.yaml:13: pools[0].capacity: Input should be greater than 0"),
        (GOOD + "    colour: blue\n", "policy.yaml:14: pools[0].colour: Extra inputs are not permitted"),
        (GOOD + "extra: 1\n", "policy.yaml:14: extra: Extra inputs are not permitted"),
        (GOOD + "  - name: overseas\n    nodes: [n]\n", "policy.yaml:14: pools[1].name: pool name 'overseas' is already used by pools[0]"),
        (GOOD.replace("name: overseas", "name: Overseas"), "policy.yaml:4: pools[0].name: 'Overseas' is not a DNS-1123 label"),
        (GOOD.replace("name: overseas", "name: none"), "policy.yaml:4: pools[0].name: 'none' is reserved"),
        (GOOD.replace("name: overseas", "name: auto"), "policy.yaml:4: pools[0].name: 'auto' is reserved"),
        (GOOD.replace('"*/cdn-*"', '""'), "policy.yaml:8: pools[0].images[0]: a glob must not be empty"),
        (GOOD.replace('"release-*"', '"  "'), "policy.yaml:9: pools[0].namespaces[1]: a glob must not be empty"),
        (GOOD.replace("egress-placer.io/pool: overseas", "-bad-: x"), "policy.yaml:6: pools[0].nodeSelector.-bad-: '-bad-' is not a valid label key"),
        (GOOD.replace("egress-placer.io/pool: overseas", "a/b/c: x"), "policy.yaml:6: pools[0].nodeSelector.a/b/c: 'a/b/c' is not a valid label key"),
        (GOOD.replace("{egress: allowed}", "{egress: 'not ok!'}"), "policy.yaml:11: pools[0].namespaceSelector.matchLabels.egress: 'not ok!' is not a valid label value"),
        (GOOD.replace("{egress: allowed}", "{}"), "policy.yaml:10: pools[0].namespaceSelector: a selector needs matchLabels or matchExpressions"),
        (GOOD.replace("matchLabels: {egress: allowed}", "matchExpressions: [{key: a, operator: In}]"),
         "policy.yaml:11: pools[0].namespaceSelector.matchExpressions[0].values: operator In needs at least one value"),
        (GOOD.replace("matchLabels: {egress: allowed}", "matchExpressions: [{key: a, operator: Exists, values: [x]}]"),
         "policy.yaml:11: pools[0].namespaceSelector.matchExpressions[0].values: operator Exists takes no values"),
        (GOOD.replace("matchLabels: {egress: allowed}", "matchExpressions: [{key: a, operator: Gt, values: ['1']}]"),
         "policy.yaml:11: pools[0].namespaceSelector.matchExpressions[0].operator: Input should be 'In', 'NotIn', 'Exists' or 'DoesNotExist'"),
        (GOOD.replace("    nodeSelector:\n      egress-placer.io/pool: overseas\n    nodes: [node-7]\n", ""),
         "policy.yaml:4: pools[0]: a pool needs nodeSelector or nodes"),
        (GOOD.replace("nodes: [node-7]", "nodes: [Node_7]"), "policy.yaml:7: pools[0].nodes[0]: 'Node_7' is not a valid node name"),
        (GOOD + "    taint: {key: egress-placer.io/pool, effect: Sometimes}\n",
         "policy.yaml:14: pools[0].taint.effect: Input should be 'NoSchedule' or 'NoExecute'"),
        (GOOD + "    taint: {effect: PreferNoSchedule}\n",
         "policy.yaml:14: pools[0].taint.effect: taint effect PreferNoSchedule is refused: the scheduler may still put "
         "any pod on the pool's nodes"),
        (GOOD + "    taint: {key: egress-placer.io/pool, value: v}\n", "policy.yaml:14: pools[0].taint.value: Extra inputs are not permitted"),
        (GOOD + "    taint: {key: example.com/lab}\n",
         "policy.yaml:14: pools[0].taint.key: the taint key is fixed to egress-placer.io/pool"),
        (GOOD.replace("egress: allowed", "egress: 1"), "policy.yaml:11: pools[0].namespaceSelector.matchLabels.egress: Input should be a valid string"),
        (GOOD + "agentNamespaces: [Monitoring]\n", "policy.yaml:14: agentNamespaces[0]: 'Monitoring' is not a DNS-1123 label"),
        (GOOD + "agentNamespaces: monitoring\n", "policy.yaml:14: agentNamespaces: Input should be a valid tuple"),
        (GOOD.replace("kind: PlacementPolicy", "kind: Policy"), "policy.yaml:2: kind: Input should be 'PlacementPolicy'"),
        (GOOD.replace("apiVersion: egress-placer.io/v1alpha1\n", ""), "policy.yaml:1: apiVersion: Field required"),
        (GOOD.replace("  - name: overseas\n", "  - placement: preferred\n", 1).replace("    placement: required\n", ""), "policy.yaml:4: pools[0].name: Field required"),
        (GOOD + "    placement: preferred\n", "policy.yaml:14: duplicate key 'placement'"),
        (GOOD + "  - [\n", "policy.yaml:15: invalid YAML"),
        (GOOD + "---\nkind: x\n", "policy.yaml:14: invalid YAML: expected a single document in the stream"),
        ("", "policy.yaml: the policy is empty"),
        ("# only a comment\n", "policy.yaml: the policy is empty"),
        ("- a\n- b\n", "policy.yaml:1: expected a PlacementPolicy mapping, got a list"),
        ("just text\n", "policy.yaml:1: expected a PlacementPolicy mapping, got the scalar 'just text'"),
    ],
)
def test_invalid_policies_are_refused_with_source_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(PolicyError) as refused:
        load_policy(text, "policy.yaml")
    assert expected in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_every_error_is_reported_on_its_own_line() -> None:
    text = GOOD.replace("placement: required", "placement: maybe").replace("capacity: 10", "capacity: -1")
    with pytest.raises(PolicyError) as refused:
        load_policy(text, "p.yaml")
    assert str(refused.value).splitlines() == [
        "p.yaml:12: pools[0].placement: Input should be 'required' or 'preferred'",
        "p.yaml:13: pools[0].capacity: Input should be greater than 0",
    ]


OVERSEAS = load_policy(GOOD).pools[0]


@pytest.mark.parametrize(
    ("node", "claimed"),
    [
        (NodeState("node-7"), True),
        (NodeState("node-8"), False),
        (NodeState("node-8", labels={"egress-placer.io/pool": "overseas"}), True),
        (NodeState("node-8", labels={"egress-placer.io/pool": "overseas", "other": "x"}), True),
        (NodeState("node-8", labels={"egress-placer.io/pool": "lab"}), False),
        (NodeState("node-8", labels={"pool": "overseas"}), False),
    ],
)
def test_pool_claims_nodes_by_name_or_selector(node: NodeState, claimed: bool) -> None:
    assert OVERSEAS.claims(node) is claimed


def test_a_pool_of_named_nodes_claims_no_other_node() -> None:
    pool = Pool(name="lab", nodes=("lab-1",))
    assert pool.claims(NodeState("lab-1")) and not pool.claims(NodeState("lab-2", labels={"any": "thing"}))


def test_a_node_belongs_to_the_first_pool_that_claims_it() -> None:
    policy = policy_of(
        {"name": "first", "nodeSelector": {"zone": "a"}},
        {"name": "second", "nodes": ["n1", "n2"]},
    )
    assert policy.pool_of(NodeState("n1", labels={"zone": "a"})).name == "first"
    assert policy.pool_of(NodeState("n2")).name == "second"
    assert policy.pool_of(NodeState("n3", labels={"zone": "b"})) is None


@pytest.mark.parametrize(
    ("namespace", "allowed"),
    [
        (NamespaceState("team-cdn"), True),
        (NamespaceState("release-2024"), True),
        (NamespaceState("release"), False),
        (NamespaceState("team-cdn-2"), False),
        (NamespaceState("other", labels={"egress": "allowed"}), True),
        (NamespaceState("other", labels={"egress": "denied"}), False),
        (NamespaceState("other", annotations={"egress-placer.io/pools": "overseas"}), True),
        (NamespaceState("other", annotations={"egress-placer.io/pools": "lab, overseas ,x"}), True),
        (NamespaceState("other", annotations={"egress-placer.io/pools": "lab,overseas-2"}), False),
        (NamespaceState("other", annotations={"egress-placer.io/pools": ""}), False),
        (NamespaceState("other", labels={"egress-placer.io/pools": "overseas"}), False),
        (NamespaceState("Team-CDN"), False),
    ],
)
def test_pool_allows_namespaces_by_glob_selector_or_annotation(namespace: NamespaceState, allowed: bool) -> None:
    assert OVERSEAS.allows(namespace) is allowed


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"b": "1"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": "1"}, False),
        ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"}, False),
    ],
)
def test_label_selector(selector: dict, labels: dict, matches: bool) -> None:
    assert LabelSelector.model_validate(selector).matches(labels) is matches


@pytest.mark.parametrize(
    ("image", "matches"),
    [
        ("registry.example.com/cdn-uploader:1.2", True),
        ("registry.example.com/team/cdn-x", True),  # `*` crosses `/`
        ("cdn-uploader:1.2", False),
        ("ghcr.io/acme/uploader:v1", True),
        ("ghcr.io/acme/uploader", False),
        ("GHCR.IO/acme/uploader:v1", False),  # case-sensitive
        ("ghcr.io/acme/uploader:v1@sha256:abc", True),
    ],
)
def test_pool_matches_images_with_globs_on_the_whole_reference(image: str, matches: bool) -> None:
    assert OVERSEAS.matches_image(image) is matches


def test_a_pool_without_image_globs_matches_no_image() -> None:
    assert not Pool(name="lab", nodes=("n",)).matches_image("anything")


@settings(deadline=None)
@given(
    globs=st.lists(st.text(alphabet="ab*?/[]:.", min_size=1, max_size=6).filter(str.strip), min_size=1, max_size=3),
    image=st.text(alphabet="ab/:.[]", max_size=10),
)
def test_image_matching_agrees_with_fnmatchcase(globs: list[str], image: str) -> None:
    pool = Pool(name="p", nodes=("n",), images=tuple(globs))
    assert pool.matches_image(image) == any(fnmatchcase(image, g) for g in globs)


def test_taint_toleration_and_lookups() -> None:
    policy = policy_of(
        {"name": "overseas", "nodes": ["n"]},
        {"name": "lab", "nodes": ["m"], "taint": {"key": "egress-placer.io/pool", "effect": "NoExecute"}},
    )
    overseas, lab = policy.pools
    assert overseas.taint_for() == Taint(key="egress-placer.io/pool", value="overseas", effect="NoSchedule")
    assert lab.taint_for() == Taint(key="egress-placer.io/pool", value="lab", effect="NoExecute")
    assert lab.toleration() == {"key": "egress-placer.io/pool", "operator": "Equal", "value": "lab", "effect": "NoExecute"}
    assert policy.owned_taint_keys() == frozenset({"egress-placer.io/pool"})
    assert PlacementPolicy.empty().owned_taint_keys() == frozenset({"egress-placer.io/pool"})  # with no pools too
    assert policy.pool("lab") is lab and policy.pool("nope") is None


def test_policies_are_immutable() -> None:
    with pytest.raises(Exception):
        OVERSEAS.name = "other"  # type: ignore[misc]


# -- agent namespaces (where node agents may run on pools) ------------------------------------------------
@pytest.mark.parametrize(
    ("document", "namespace", "agent"),
    [
        ("", "kube-system", True),  # default: the exempt namespaces
        ("", "kube-public", True),
        ("", "monitoring", False),
        ("exemptNamespaces: [ops]\n", "ops", True),  # the default follows the exempt namespaces
        ("exemptNamespaces: [ops]\n", "kube-system", False),
        ("agentNamespaces: [monitoring]\n", "monitoring", True),
        ("agentNamespaces: [monitoring]\n", "kube-system", False),  # set: replaces the default
        ("agentNamespaces: []\n", "kube-system", False),  # no namespace may run agents on pools
        ("agentNamespaces: [monitoring]\n", "monitoring-evil", False),  # exact names, not globs
    ],
)
def test_agent_namespaces_default_to_the_exempt_namespaces(document: str, namespace: str, agent: bool) -> None:
    policy = load_policy(HEADER + document)
    assert is_agent_namespace(policy, namespace) is agent
    assert (namespace in agent_namespaces(policy)) is agent
