"""Pools as a Kubernetes API (controller/core/pools.py): EgressPool and EgressPlacerConfig objects to
the PlacementPolicy and back. The objects go through the policy loader's own validation, errors name
the object and the field (and, read from a file, its line); priority orders the pools; a policy
turned into objects and back is the same policy (a property over random policies)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.model import NodeState
from controller.core.policy import PlacementPolicy, PolicyError, dump_policy, load_policy
from controller.core.pools import (
    CONFIG_KIND,
    POOL_KIND,
    dump_objects,
    load_any_policy,
    objects_from_policy,
    policy_from_objects,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "policy.example.yaml"
API = "egress-placer.io/v1alpha1"


def pool(pool_name: str, priority: int | None = None, **spec: Any) -> dict[str, Any]:
    spec = {"nodes": ["n1"], **spec}
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": API, "kind": POOL_KIND, "metadata": {"name": pool_name}, "spec": spec}


def config(name: str = "cluster", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": CONFIG_KIND, "metadata": {"name": name}, "spec": spec}


# -- objects -> policy ----------------------------------------------------------------------------


def test_no_object_is_the_empty_policy() -> None:
    assert policy_from_objects([]) == PlacementPolicy.empty()


def test_a_pool_object_is_the_pool_of_the_file_form() -> None:
    policy = policy_from_objects([pool("overseas", images=["*/cdn-*"], namespaces=["team-cdn"], capacity=3)])
    expected = load_policy(
        "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npools:\n"
        "  - {name: overseas, nodes: [n1], images: ['*/cdn-*'], namespaces: [team-cdn], capacity: 3}\n"
    )
    assert policy == expected


def test_metadata_other_than_the_name_and_the_status_are_ignored() -> None:
    obj = pool("overseas")
    obj["metadata"].update(uid="u", resourceVersion="7", generation=3, annotations={"a": "b"})
    obj["status"] = {"nodes": 3, "conditions": []}
    assert policy_from_objects([obj]) == policy_from_objects([pool("overseas")])


@pytest.mark.parametrize(
    ("objects", "order"),
    [
        ([pool("b", 10), pool("a", 20)], ["b", "a"]),
        ([pool("a", 20), pool("b", 10)], ["b", "a"]),
        ([pool("b", 5), pool("a", 5)], ["a", "b"]),  # ties by name
        ([pool("b"), pool("a")], ["a", "b"]),  # default 0
        ([pool("z", 0), pool("a", 1)], ["z", "a"]),
    ],
)
def test_pools_are_ordered_by_priority_then_name(objects: list[dict[str, Any]], order: list[str]) -> None:
    assert [p.name for p in policy_from_objects(objects).pools] == order


def test_a_node_claimed_by_two_pools_belongs_to_the_lower_priority() -> None:
    both = NodeState(name="n1")
    assert policy_from_objects([pool("late", 20), pool("early", 10)]).pool_of(both).name == "early"
    assert policy_from_objects([pool("late", 1), pool("early", 10)]).pool_of(both).name == "late"


def test_the_config_gives_the_policy_wide_fields_and_its_absence_the_defaults() -> None:
    policy = policy_from_objects([config(exemptNamespaces=["kube-system"], agentNamespaces=["monitoring"], patchExistingAgents=["monitoring"])])
    assert policy.exempt_namespaces == ("kube-system",)
    assert policy.agent_namespaces == ("monitoring",)
    assert policy.patch_existing_agents == ("monitoring",)
    defaults = policy_from_objects([pool("a")])
    assert defaults.exempt_namespaces == PlacementPolicy.empty().exempt_namespaces
    assert defaults.agent_namespaces is None and defaults.patch_existing_agents == ()


BAD_OBJECTS = [
    ([pool("auto")], "EgressPool auto: metadata.name: 'auto' is reserved"),
    ([pool("a.b")], "EgressPool a.b: metadata.name: 'a.b' is not a DNS-1123 label"),
    ([pool("a", images=[" "])], "EgressPool a: spec.images[0]: a glob must not be empty"),
    ([pool("a", nodes=["Node_1"])], "EgressPool a: spec.nodes[0]: 'Node_1' is not a valid node name"),
    ([{**pool("a"), "spec": {"images": ["x"]}}], "EgressPool a: spec: a pool needs nodeSelector or nodes"),
    ([pool("a", placement="sometimes")], "EgressPool a: spec.placement: Input should be 'required' or 'preferred'"),
    ([pool("a", imagez=["x"])], "EgressPool a: spec.imagez: Extra inputs are not permitted"),
    ([pool("a", **{"name": "b"})], "EgressPool a: spec.name: Extra inputs are not permitted (the pool's name is metadata.name)"),
    ([pool("a", -1)], "EgressPool a: spec.priority: Input should be greater than or equal to 0"),
    ([pool("a", namespaceSelector={})], "EgressPool a: spec.namespaceSelector: a selector needs matchLabels"),
    ([pool("a", taint={"key": "example.com/x"})], "EgressPool a: spec.taint.key: the taint key is fixed"),
    ([pool("a"), pool("a")], "EgressPool a: metadata.name: pool name 'a' is already used by EgressPool a"),
    ([config("other")], "EgressPlacerConfig other: metadata.name: there is one EgressPlacerConfig, named cluster"),
    ([config(), config()], "EgressPlacerConfig cluster: metadata.name: EgressPlacerConfig cluster is given twice"),
    ([config(pools=[])], "EgressPlacerConfig cluster: spec.pools: Extra inputs are not permitted"),
    ([config(patchExistingAgents=["monitoring"])], "EgressPlacerConfig cluster: spec.patchExistingAgents[0]: 'monitoring' is not an agent namespace"),
    ([{**pool("a"), "apiVersion": "v1"}], "EgressPool a: apiVersion: expected egress-placer.io/v1alpha1 or egress-placer.io/v1beta1, got 'v1'"),
    ([{**pool("a"), "kind": "PlacementPolicy"}], "PlacementPolicy a: kind: expected EgressPool or EgressPlacerConfig"),
    ([{**pool("a"), "metadata": {}}], "EgressPool (no name): metadata.name: Field required"),
    ([{**pool("a"), "spec": ["x"]}], "EgressPool a: spec: expected a mapping, got list"),
    (["text"], "object: (object): expected an object (a mapping), got str"),
]


@pytest.mark.parametrize(("objects", "message"), BAD_OBJECTS, ids=[m.split(":")[0] + " " + m.split(":")[1] for _, m in BAD_OBJECTS])
def test_a_bad_object_is_refused_naming_the_object_and_the_field(objects: list[Any], message: str) -> None:
    with pytest.raises(PolicyError) as refused:
        policy_from_objects(objects)
    assert message in str(refused.value)


def test_every_problem_of_every_object_is_named() -> None:
    with pytest.raises(PolicyError) as refused:
        policy_from_objects([pool("a", images=[" "], nodes=["X"]), pool("b", placement="x")])
    lines = str(refused.value).splitlines()
    assert len(lines) == 3
    assert {line.split(":")[0] for line in lines} == {"EgressPool a", "EgressPool b"}


# -- the file, in either form ----------------------------------------------------------------------

OBJECTS_FILE = """\
# two pools and the config
apiVersion: egress-placer.io/v1alpha1
kind: EgressPool
metadata:
  name: lab
spec:
  priority: 20
  nodes: [lab-1]
---
apiVersion: egress-placer.io/v1alpha1
kind: EgressPool
metadata:
  name: overseas
spec:
  priority: 10
  nodeSelector: {egress-placer.io/pool: overseas}
  images: ["*/cdn-*"]
---
apiVersion: egress-placer.io/v1alpha1
kind: EgressPlacerConfig
metadata: {name: cluster}
spec:
  agentNamespaces: [monitoring]
"""


def test_a_file_of_objects_loads_in_priority_order() -> None:
    policy = load_any_policy(OBJECTS_FILE, "pools.yaml")
    assert [p.name for p in policy.pools] == ["overseas", "lab"]
    assert policy.agent_namespaces == ("monitoring",)


def test_a_list_of_objects_loads_as_kubectl_get_writes_it() -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [pool("a", 2), pool("b", 1)]}
    assert [p.name for p in load_any_policy(yaml.safe_dump(listed), "list.yaml").pools] == ["b", "a"]


def test_the_document_form_loads_as_before() -> None:
    text = EXAMPLE.read_text()
    assert load_any_policy(text, "example.yaml") == load_policy(text, "example.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (OBJECTS_FILE.replace("nodes: [lab-1]", "nodes: [Lab-1]"), "pools.yaml:8: EgressPool lab: spec.nodes[0]: 'Lab-1' is not a valid node name"),
        (OBJECTS_FILE.replace("name: overseas", "name: auto"), "pools.yaml:13: EgressPool auto: metadata.name: 'auto' is reserved"),
        (OBJECTS_FILE.replace("priority: 10", "priority: ten"), "pools.yaml:15: EgressPool overseas: spec.priority: Input should be a valid integer"),
        (OBJECTS_FILE.replace("[monitoring]", "[Monitoring]"), "pools.yaml:23: EgressPlacerConfig cluster: spec.agentNamespaces[0]: 'Monitoring' is not a DNS-1123 label"),
        (OBJECTS_FILE + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "pools.yaml:26: ConfigMap x: kind: expected EgressPool or EgressPlacerConfig"),
        (OBJECTS_FILE.replace("  priority: 20\n", "  priority: 20\n  priority: 30\n"), "pools.yaml:8: duplicate key 'priority'"),
    ],
)
def test_a_file_of_objects_names_the_line_of_the_field(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as refused:
        load_any_policy(text, "pools.yaml")
    assert message in str(refused.value)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npools: [{name: a}]\n",
        "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\n  bad: indent: here\n",
        "a: 1\n---\nb: 2\n",
    ],
)
def test_a_bad_document_is_refused_with_the_loaders_own_message(text: str) -> None:
    with pytest.raises(PolicyError) as by_any:
        load_any_policy(text, "p.yaml")
    with pytest.raises(PolicyError) as by_loader:
        load_policy(text, "p.yaml")
    assert str(by_any.value) == str(by_loader.value)


# -- policy -> objects -----------------------------------------------------------------------------


def test_the_example_policy_migrates_to_objects_and_back() -> None:
    policy = load_policy(EXAMPLE.read_text(), str(EXAMPLE))
    objects = objects_from_policy(policy)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        (CONFIG_KIND, "cluster"),
        (POOL_KIND, "overseas"),
        (POOL_KIND, "lab"),
    ]
    assert [o["spec"].get("priority") for o in objects] == [None, 10, 20]
    assert objects[1]["spec"]["egressLoad"]["prometheus"]["url"] == "http://prometheus.monitoring:9090/"
    assert load_any_policy(dump_objects(objects), "migrated.yaml") == policy


def test_a_policy_of_defaults_needs_no_config_object() -> None:
    policy = load_policy("apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npools: [{name: a, nodes: [n]}]\n")
    assert [o["kind"] for o in objects_from_policy(policy)] == [POOL_KIND]


def test_durations_migrate_as_strings_the_api_server_reads() -> None:
    policy = load_policy(
        "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npools:\n  - name: a\n    nodes: [n]\n"
        "    egressLoad:\n      prometheus: {url: 'http://p:9090', interval: 0.5, timeout: 250ms, maxAge: 90}\n"
    )
    (obj,) = objects_from_policy(policy)
    assert obj["spec"]["egressLoad"]["prometheus"] | {"url": None} == {"url": None, "interval": "0.5s", "timeout": "0.25s", "maxAge": "90s"}


# -- the property: policy -> objects -> policy is the same policy ----------------------------------

NAMES = st.from_regex(r"[a-z]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True).filter(lambda n: n not in ("auto", "none"))
LABEL_KEYS = st.from_regex(r"([a-z]{1,5}\.io/)?[A-Za-z][A-Za-z0-9_.-]{0,6}[a-z]", fullmatch=True)
LABEL_VALUES = st.from_regex(r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,6}[A-Za-z0-9])?)?", fullmatch=True)
GLOBS = st.text(alphabet="abc-/*?[]:.", min_size=1, max_size=8).filter(lambda g: g.strip())
SECONDS = st.one_of(st.integers(1, 3600), st.floats(0.001, 3600, allow_nan=False, allow_infinity=False))
SELECTOR = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": st.dictionaries(LABEL_KEYS, LABEL_VALUES, min_size=1, max_size=3),
        "matchExpressions": st.lists(
            st.one_of(
                st.fixed_dictionaries({"key": LABEL_KEYS, "operator": st.sampled_from(["In", "NotIn"]), "values": st.lists(LABEL_VALUES, min_size=1, max_size=2)}),
                st.fixed_dictionaries({"key": LABEL_KEYS, "operator": st.sampled_from(["Exists", "DoesNotExist"])}),
            ),
            min_size=1,
            max_size=2,
        ),
    },
).filter(bool)


@st.composite
def egress_loads(draw: st.DrawFn) -> dict[str, Any]:
    interval = draw(SECONDS)
    prometheus = {"url": draw(st.sampled_from(["http://p:9090", "https://prom.example.com/x"])), "interval": interval,
                  "maxAge": interval + draw(SECONDS), "timeout": draw(SECONDS), "nodeLabel": draw(st.sampled_from(["instance", "node", "_n1"]))}
    return {
        "prometheus": prometheus,
        "bandwidthBytesPerSecond": draw(st.floats(1, 1e12)),
        "nodeBandwidth": draw(st.dictionaries(NAMES, st.one_of(st.integers(1, 10**10), st.floats(0.5, 1e12)), max_size=2)),
    }


POOLS = st.fixed_dictionaries(
    {"nodes": st.lists(NAMES, min_size=1, max_size=3)},
    optional={
        "nodeSelector": st.dictionaries(LABEL_KEYS, LABEL_VALUES, max_size=2),
        "images": st.lists(GLOBS, max_size=3),
        "namespaces": st.lists(GLOBS, max_size=3),
        "namespaceSelector": SELECTOR,
        "placement": st.sampled_from(["required", "preferred"]),
        "capacity": st.integers(1, 1000),
        "taint": st.fixed_dictionaries({}, optional={"effect": st.sampled_from(["NoSchedule", "NoExecute"])}),
        "egressLoad": egress_loads(),
    },
)


@st.composite
def policies(draw: st.DrawFn) -> PlacementPolicy:
    names = draw(st.lists(NAMES, unique=True, max_size=4))
    data: dict[str, Any] = {
        "apiVersion": API,
        "kind": "PlacementPolicy",
        "pools": [{"name": n, **draw(POOLS)} for n in names],
    }
    namespaces = st.lists(NAMES, max_size=3)
    if draw(st.booleans()):
        data["exemptNamespaces"] = draw(namespaces)
    if draw(st.booleans()):
        data["agentNamespaces"] = draw(namespaces)
    agents = data.get("agentNamespaces", data.get("exemptNamespaces", ["kube-system", "kube-node-lease", "kube-public"]))
    if agents and draw(st.booleans()):
        data["patchExistingAgents"] = draw(st.lists(st.sampled_from(agents), max_size=2))
    return PlacementPolicy.model_validate(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies())
def test_a_policy_made_objects_and_back_is_the_same_policy(policy: PlacementPolicy) -> None:
    objects = objects_from_policy(policy)
    assert policy_from_objects(objects) == policy
    if objects:  # no object at all is an empty file, which is refused (as an empty policy document)
        assert load_any_policy(dump_objects(objects), "dumped.yaml") == policy
    assert load_policy(dump_policy(policy)) == policy  # the controller stores the last good one so


def test_the_two_examples_are_the_same_policy_and_the_demo_s_pool_loads() -> None:
    """config/pools.example.yaml (the default form) and config/policy.example.yaml (the ConfigMap form)
    show the same fields with the same values; the demo's EgressPool is valid."""
    objects = load_any_policy((ROOT / "config" / "pools.example.yaml").read_text(), "config/pools.example.yaml")
    assert objects == load_policy((ROOT / "config" / "policy.example.yaml").read_text(), "config/policy.example.yaml")
    demo = load_any_policy((ROOT / "devplacer" / "demo" / "pools.yaml").read_text(), "devplacer/demo/pools.yaml")
    assert [p.name for p in demo.pools] == ["overseas"]
