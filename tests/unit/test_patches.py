"""Checks the placement written into pod templates (controller/core/patches.py): `place` adds the
pool toleration and node affinity while keeping the user's constraints, `unplace` strips pool
tolerations and pool affinity, `json_patch` produces RFC 6902 ops rebased on a JSON pointer.
Properties: idempotence, user terms kept, one toleration, unplace(place(t)) == t, and the
scheduling meaning (a node fits the placed template iff it fit before and the pool claims it).
Over Tekton's default pod template (`over_default`): placing twice changes nothing, and what the
default gives survives Tekton's merge of the placed template with it."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.core.model import HOSTNAME_LABEL, POOL_PREFERENCE_WEIGHT, PREFERRED_NODE_WEIGHT, NodeState
from controller.core.patches import (
    PREFERRED,
    REQUIRED,
    InvalidDefault,
    default_pod_template,
    json_patch,
    node_preference,
    over_default,
    place,
    pool_terms,
    protection,
    unplace,
    with_default,
)
from controller.core.policy import load_policy

POLICY = load_policy(
    """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: fast
    nodeSelector: {egress: fast, net: 10g}
    nodes: [edge-1, edge-2]
  - name: lab
    nodes: [lab-1]
  - name: soft
    nodeSelector: {egress: soft}
    placement: preferred
    taint: {effect: NoExecute}
"""
)
FAST, LAB, SOFT = POLICY.pool("fast"), POLICY.pool("lab"), POLICY.pool("soft")
FAST_TOL = {"key": "egress-placer.io/pool", "operator": "Equal", "value": "fast", "effect": "NoSchedule"}
FAST_LABELS = [
    {"key": "egress", "operator": "In", "values": ["fast"]},
    {"key": "net", "operator": "In", "values": ["10g"]},
]


def by_name(node: str) -> dict[str, Any]:
    return {"key": "metadata.name", "operator": "In", "values": [node]}


def expr(key: str, op: str = "In", *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)} if values else {"key": key, "operator": op}


def required(template: dict[str, Any]) -> list[dict[str, Any]]:
    return template["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]


def preferred(template: dict[str, Any]) -> list[dict[str, Any]]:
    return template["affinity"]["nodeAffinity"].get(PREFERRED, [])


def test_pool_terms_one_name_per_term():
    assert pool_terms(FAST) == [
        {"matchExpressions": FAST_LABELS},
        {"matchFields": [by_name("edge-1")]},
        {"matchFields": [by_name("edge-2")]},
    ]
    assert pool_terms(LAB) == [{"matchFields": [by_name("lab-1")]}]


def by_hostname(*nodes: str) -> dict[str, Any]:
    return {"key": HOSTNAME_LABEL, "operator": "In", "values": list(nodes)}


def test_pool_terms_by_hostname_one_requirement_for_every_listed_node():
    """`by_hostname`: the listed nodes in one requirement on the hostname label (the API server refuses
    a `metadata.name In` with more than one value, not a label's); a label selector stays its own term."""
    assert pool_terms(FAST, by_hostname=True) == [{"matchExpressions": FAST_LABELS}, {"matchExpressions": [by_hostname("edge-1", "edge-2")]}]
    assert pool_terms(LAB, by_hostname=True) == [{"matchExpressions": [by_hostname("lab-1")]}]
    assert pool_terms(SOFT, by_hostname=True) == pool_terms(SOFT)  # no nodes listed: nothing changes
    placed = place(None, FAST, "edge-2", by_hostname=True)
    assert required(placed) == pool_terms(FAST, by_hostname=True)
    assert preferred(placed) == [node_preference("edge-2")]  # the preferred node stays one name, by field


def test_unplace_strips_a_pools_nodes_by_hostname_and_keeps_the_kept_pools_in_either_shape():
    """A hostname requirement naming a pool's node is a pool requirement, as a `metadata.name` field is;
    the kept pool's own keeps both shapes (a pod placed before the shape changed keeps its pool)."""
    users = {"matchExpressions": [expr("zone", "In", "a"), by_hostname("lab-1", "n1")]}
    theirs = {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [users]}}}}
    assert required(unplace(theirs, POLICY)) == [{"matchExpressions": [expr("zone", "In", "a")]}]
    assert unplace({"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [by_hostname("n1")]}]}}}}, POLICY) == {
        "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [by_hostname("n1")]}]}}}
    }  # no pool's node: the user's own
    for shape in (False, True):
        placed = place(None, FAST, "edge-2", by_hostname=shape)
        assert required(unplace(placed, POLICY, keep_pool="fast")) == pool_terms(FAST, by_hostname=shape)
        assert unplace(placed, POLICY, keep_pool="lab") == {}


@pytest.mark.parametrize(
    ("template", "pool", "terms"),
    [
        (None, LAB, [{"matchFields": [by_name("lab-1")]}]),
        ({}, FAST, pool_terms(FAST)),
        (  # a user term is ANDed with each pool alternative
            {
                "affinity": {
                    "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [expr("zone", "In", "a")]}]}}
                }
            },
            FAST,
            [
                {"matchExpressions": [expr("zone", "In", "a"), *FAST_LABELS]},
                {"matchExpressions": [expr("zone", "In", "a")], "matchFields": [by_name("edge-1")]},
                {"matchExpressions": [expr("zone", "In", "a")], "matchFields": [by_name("edge-2")]},
            ],
        ),
        (  # two user terms (ORed), each constrained
            {
                "affinity": {
                    "nodeAffinity": {
                        REQUIRED: {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [expr("zone", "In", "a")]},
                                {"matchFields": [by_name("n9")]},
                            ]
                        }
                    }
                }
            },
            LAB,
            [
                {"matchExpressions": [expr("zone", "In", "a")], "matchFields": [by_name("lab-1")]},
                {"matchFields": [by_name("n9"), by_name("lab-1")]},
            ],
        ),
        (  # a term that already holds a pool alternative is kept as is (no expression repeated)
            {
                "affinity": {
                    "nodeAffinity": {
                        REQUIRED: {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [*reversed(FAST_LABELS), expr("zone", "Exists")]}
                            ]
                        }
                    }
                }
            },
            FAST,
            [{"matchExpressions": [*reversed(FAST_LABELS), expr("zone", "Exists")]}],
        ),
        (  # a term holding part of an alternative gets only the missing requirement
            {
                "affinity": {
                    "nodeAffinity": {
                        REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [expr("egress", "In", "fast")]}]}
                    }
                }
            },
            FAST,
            [
                {"matchExpressions": FAST_LABELS},
                {"matchExpressions": [expr("egress", "In", "fast")], "matchFields": [by_name("edge-1")]},
                {"matchExpressions": [expr("egress", "In", "fast")], "matchFields": [by_name("edge-2")]},
            ],
        ),
        (  # an empty term matches no node; it stays so
            {
                "affinity": {
                    "nodeAffinity": {
                        REQUIRED: {"nodeSelectorTerms": [{}, {"matchExpressions": [expr("zone", "Exists")]}]}
                    }
                }
            },
            LAB,
            [{}, {"matchExpressions": [expr("zone", "Exists")], "matchFields": [by_name("lab-1")]}],
        ),
    ],
)
def test_place_required(template, pool, terms):
    original = copy.deepcopy(template)
    placed = place(template, pool, None)
    assert required(placed) == terms
    assert placed["tolerations"] == [pool.toleration()]
    assert template == original  # the input is not modified


def test_place_keeps_everything_else():
    template = {
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "affinity": {
            "podAffinity": {"x": 1},
            "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [expr("zone", "In", "a")]}]}},
        },
        "securityContext": {"runAsUser": 1000},
    }
    placed = place(template, FAST, "edge-1")
    assert placed["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
    assert placed["tolerations"] == [{"key": "gpu", "operator": "Exists"}, FAST_TOL]
    assert placed["affinity"]["podAffinity"] == {"x": 1}
    assert placed["securityContext"] == {"runAsUser": 1000}


@pytest.mark.parametrize(
    "existing",
    [FAST_TOL, {"key": "egress-placer.io/pool", "value": "fast", "effect": "NoSchedule"}],  # operator defaults to Equal
)
def test_place_does_not_duplicate_the_toleration(existing):
    assert place({"tolerations": [existing]}, FAST, None)["tolerations"] == [existing]


def test_place_preferred_pool():
    placed = place({}, SOFT, None)
    assert REQUIRED not in placed["affinity"]["nodeAffinity"]
    assert preferred(placed) == [
        {"weight": POOL_PREFERENCE_WEIGHT, "preference": {"matchExpressions": [expr("egress", "In", "soft")]}}
    ]
    assert placed["tolerations"] == [
        {"key": "egress-placer.io/pool", "operator": "Equal", "value": "soft", "effect": "NoExecute"}
    ]


def test_place_node_preference_replaces_ours_and_keeps_the_users():
    users = [
        {"weight": 5, "preference": {"matchFields": [by_name("n7")]}},
        {"weight": 100, "preference": {"matchExpressions": [expr("zone", "In", "a")]}},
    ]
    first = place({"affinity": {"nodeAffinity": {PREFERRED: copy.deepcopy(users)}}}, FAST, "edge-1")
    assert preferred(first) == [*users, node_preference("edge-1")]
    assert node_preference("edge-1") == {
        "weight": PREFERRED_NODE_WEIGHT,
        "preference": {"matchFields": [by_name("edge-1")]},
    }
    assert preferred(place(first, FAST, "edge-2")) == [*users, node_preference("edge-2")]
    assert preferred(place(first, FAST, None)) == users


@pytest.mark.parametrize(
    ("tolerations", "keep_pool", "kept"),
    [
        ([FAST_TOL], None, []),
        ([FAST_TOL], "fast", [FAST_TOL]),
        ([FAST_TOL], "lab", []),
        ([{"key": "egress-placer.io/pool", "operator": "Exists"}], "fast", []),  # tolerates every pool
        ([{"key": "egress-placer.io/pool", "operator": "Equal", "value": "gone", "effect": "NoSchedule"}], None, []),
        ([{**FAST_TOL, "effect": "NoExecute"}], "fast", []),  # wrong effect: useless, stripped
        ([{"key": "egress-placer.io/pool", "operator": "Exists", "effect": "NoExecute"}], None, []),  # soft's effect
        ([{"key": "example.com/soft", "operator": "Exists"}], None, [{"key": "example.com/soft", "operator": "Exists"}]),  # foreign key
        ([{"operator": "Exists"}], None, []),  # tolerates everything, pools included
        ([{"operator": "Exists", "effect": "NoExecute"}], None, []),  # tolerates soft's taint
        # no pool's taint is PreferNoSchedule (refused by the policy): tolerating those tolerates no pool
        ([{"operator": "Exists", "effect": "PreferNoSchedule"}], None, [{"operator": "Exists", "effect": "PreferNoSchedule"}]),
        ([{"key": "gpu", "operator": "Exists"}, FAST_TOL], None, [{"key": "gpu", "operator": "Exists"}]),
    ],
)
def test_unplace_tolerations(tolerations, keep_pool, kept):
    stripped = unplace({"tolerations": tolerations}, POLICY, keep_pool=keep_pool)
    assert stripped.get("tolerations", []) == kept


def test_unplace_node_affinity():
    template = {
        "affinity": {
            "nodeAffinity": {
                REQUIRED: {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [expr("zone", "In", "a"), expr("egress", "In", "fast")]},
                        {"matchFields": [by_name("lab-1")]},  # only pool: dropped
                        {"matchExpressions": [expr("egress", "NotIn", "fast")], "matchFields": [by_name("n1")]},
                    ]
                },
                PREFERRED: [
                    {"weight": 80, "preference": {"matchExpressions": [expr("egress", "In", "soft")]}},
                    {"weight": 3, "preference": {"matchExpressions": [expr("disk", "In", "ssd")]}},
                    node_preference("n5"),
                ],
            },
            "podAntiAffinity": {"y": 2},
        }
    }
    assert unplace(template, POLICY)["affinity"] == {
        "nodeAffinity": {
            REQUIRED: {
                "nodeSelectorTerms": [
                    {"matchExpressions": [expr("zone", "In", "a")]},
                    {"matchFields": [by_name("n1")]},
                ]
            },
            PREFERRED: [{"weight": 3, "preference": {"matchExpressions": [expr("disk", "In", "ssd")]}}],
        },
        "podAntiAffinity": {"y": 2},
    }


def test_unplace_keeps_the_kept_pools_exact_terms():
    placed = place({"tolerations": [{"key": "egress-placer.io/pool", "operator": "Exists"}]}, FAST, "edge-2")
    assert unplace(placed, POLICY, keep_pool="fast") == {
        "tolerations": [FAST_TOL],
        "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": pool_terms(FAST)}}},
    }
    assert unplace(placed, POLICY) == {}
    assert unplace(placed, POLICY, keep_pool="lab") == {}


def test_json_patch_absent_is_one_add():
    assert json_patch(None, {"a": 1}, "/spec/podTemplate") == [
        {"op": "add", "path": "/spec/podTemplate", "value": {"a": 1}}
    ]


def test_json_patch_rejects_a_base_that_is_not_a_pointer():
    with pytest.raises(ValueError):
        json_patch({}, {}, "spec")


@pytest.mark.parametrize(
    ("base", "doc"),
    [
        ("/spec/podTemplate", {"spec": {"podTemplate": {"nodeSelector": {"a": "b"}}, "params": []}}),
        (
            "/spec/taskRunSpecs/1/podTemplate",
            {
                "spec": {
                    "taskRunSpecs": [
                        {"podTemplate": {}},
                        {"podTemplate": {"tolerations": [{"key": "x", "operator": "Exists"}]}},
                    ]
                }
            },
        ),
        (
            "/metadata/annotations/egress-placer.io~1x",
            {"metadata": {"annotations": {"egress-placer.io/x": {"k": [1, 2]}}}},
        ),
        ("", {"spec": {"nodeName": "n1"}}),
    ],
)
def test_json_patch_applies_at_base(base, doc):
    old = jsonpatch.JsonPointer(base).resolve(doc)
    new = unplace(place(old, FAST, "edge-1"), POLICY, keep_pool="fast") if base != "" else {"spec": {}, "x": [1]}
    patched = jsonpatch.apply_patch(doc, json_patch(old, new, base))
    assert jsonpatch.JsonPointer(base).resolve(patched) == new
    assert all(op["path"].startswith(base) for op in json_patch(old, new, base))


# Scalars Python finds equal that JSON does not (1, 1.0, true), so that `old == new` holds often.
_LOOSE_SCALARS = st.sampled_from([0, 1, 1.0, True, False, 0.0, None, "", "a"])
_JSON_DOCS = st.recursive(
    _LOOSE_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abcd"), inner, max_size=4),
    max_leaves=16,
)


def _rebased(ops, base):
    return [{**op, **{k: base + op[k] for k in ("path", "from") if k in op}} for op in ops]


def _exact(value):
    """JSON text that tells 1, 1.0 and true apart (== does not), keys sorted: equal texts, same JSON."""
    return json.dumps(value, sort_keys=True)


def _patched_both_ways(doc, base, new):
    """`doc` patched by `json_patch` and by jsonpatch's own diff of the value at `base` (the patch
    admission built before whole-member operations), each as exact JSON text."""
    old = jsonpatch.JsonPointer(base).resolve(doc) if base else doc
    ours = jsonpatch.apply_patch(doc, json_patch(old, new, base))
    theirs = jsonpatch.apply_patch(doc, _rebased(jsonpatch.make_patch(old, new).patch, base))
    return _exact(ours), _exact(theirs)


@given(old=_JSON_DOCS.filter(lambda doc: doc is not None), new=_JSON_DOCS)
def test_json_patch_patches_as_jsonpatchs_diff_does(old, new):
    """Whole-member operations make the same object as jsonpatch's minimal diff (types included: 1, 1.0
    and true differ), at the root and below it; nothing at all when nothing changes."""
    doc = {"spec": old, "kept": [1, {"a": 1.0}]}
    ours, theirs = _patched_both_ways(doc, "/spec", new)
    assert ours == theirs == _exact({"spec": new, "kept": [1, {"a": 1.0}]})
    assert json_patch(old, copy.deepcopy(old), "/spec") == []
    if isinstance(old, dict) and isinstance(new, dict):
        assert _patched_both_ways(old, "", new)[0] == _exact(new)


@given(shared=_JSON_DOCS, old=_JSON_DOCS, new=_JSON_DOCS)
def test_json_patch_leaves_out_unchanged_members(shared, old, new):
    """Members the two sides share unchanged, at any depth of objects, are in no operation; a changed
    array is replaced whole, never diffed."""
    a = {"same": shared, "inner": {"same": copy.deepcopy(shared), "changed": old, "gone": 1}}
    b = {"inner": {"changed": new, "same": copy.deepcopy(shared), "new": copy.deepcopy(old)}, "same": copy.deepcopy(shared)}
    ops = json_patch(a, b, "/spec")
    assert not any("/same" in op["path"] for op in ops)
    assert all(op["op"] != "replace" or not isinstance(op["value"], dict) or not isinstance(_at(a, op["path"]), dict) for op in ops)
    ours, theirs = _patched_both_ways({"spec": a}, "/spec", b)
    assert ours == theirs


def _at(doc, path):
    return jsonpatch.JsonPointer(path.removeprefix("/spec") or "").resolve(doc)


def test_json_patch_replaces_a_changed_member_whole_and_escapes_keys():
    old = {"tolerations": [{"key": "a"}, {"key": "b"}], "nodeSelector": {"x/y": "1", "z~": "2"}, "gone": {}}
    new = {"tolerations": [{"key": "a"}, {"key": "c"}], "nodeSelector": {"x/y": "2", "z~": "2"}}
    assert json_patch(old, new, "/spec") == [
        {"op": "remove", "path": "/spec/gone"},
        {"op": "replace", "path": "/spec/tolerations", "value": [{"key": "a"}, {"key": "c"}]},
        {"op": "replace", "path": "/spec/nodeSelector/x~1y", "value": "2"},
    ]


# --- properties -----------------------------------------------------------------------------------

USER_KEYS = ["zone", "disk", "kubernetes.io/arch"]  # no pool selects on these
NODE_NAMES = ["edge-1", "edge-2", "lab-1", "n1", "n2"]
LABEL_VALUES = ["a", "b", "fast", "10g", "soft"]

user_expressions = st.one_of(
    st.builds(
        lambda k, op, vs: expr(k, op, *vs),
        st.sampled_from(USER_KEYS),
        st.sampled_from(["In", "NotIn"]),
        st.lists(st.sampled_from(LABEL_VALUES), min_size=1, max_size=2, unique=True),
    ),
    st.builds(expr, st.sampled_from(USER_KEYS), st.sampled_from(["Exists", "DoesNotExist"])),
)
user_hostnames = st.builds(  # the user's own pin by hostname, on nodes no pool lists
    lambda op, n: {"key": HOSTNAME_LABEL, "operator": op, "values": [n]},
    st.sampled_from(["In", "NotIn"]),
    st.sampled_from(["n1", "n2"]),
)
user_fields = st.builds(
    lambda op, n: {"key": "metadata.name", "operator": op, "values": [n]},
    st.sampled_from(["In", "NotIn"]),
    st.sampled_from(["n1", "n2"]),
)


@st.composite
def user_terms(draw) -> dict[str, Any]:
    term = {}
    exprs = draw(st.lists(st.one_of(user_expressions, user_hostnames), max_size=2, unique_by=str))
    fields = draw(st.lists(user_fields, max_size=1))
    if exprs:
        term["matchExpressions"] = exprs
    if fields or not exprs:
        term["matchFields"] = fields or [draw(user_fields)]
    return term


@st.composite
def user_templates(draw) -> dict[str, Any]:
    """A podTemplate with only the user's own constraints (nothing about any pool)."""
    template: dict[str, Any] = {}
    if draw(st.booleans()):
        template["nodeSelector"] = {"kubernetes.io/os": "linux"}
    tolerations = draw(
        st.lists(st.builds(lambda k: {"key": k, "operator": "Exists"}, st.sampled_from(["gpu", "spot"])), max_size=2)
    )
    if tolerations:
        template["tolerations"] = tolerations
    node_affinity = {}
    terms = draw(st.lists(user_terms(), max_size=3, unique_by=str))
    if terms:
        node_affinity[REQUIRED] = {"nodeSelectorTerms": terms}
    prefs = draw(
        st.lists(st.builds(lambda w, t: {"weight": w, "preference": t}, st.integers(1, 50), user_terms()), max_size=2)
    )
    if prefs:
        node_affinity[PREFERRED] = prefs
    if node_affinity:
        template["affinity"] = {"nodeAffinity": node_affinity}
    return template


pools = st.sampled_from([FAST, LAB, SOFT])
chosen = st.one_of(st.none(), st.sampled_from(NODE_NAMES))
nodes = st.builds(
    lambda name, labels: NodeState(name=name, labels={**labels, HOSTNAME_LABEL: name}),  # the kubelet's hostname label
    name=st.sampled_from(NODE_NAMES),
    labels=st.fixed_dictionaries(
        {}, optional={k: st.sampled_from(LABEL_VALUES) for k in ["egress", "net", *USER_KEYS]}
    ),
)
shapes = st.booleans()  # by_hostname


def _requirement_holds(r: dict[str, Any], value: str | None) -> bool:
    op, values = r["operator"], r.get("values", [])
    return {
        "In": value is not None and value in values,
        "NotIn": value is None or value not in values,
        "Exists": value is not None,
        "DoesNotExist": value is None,
    }[op]


def schedulable(template: dict[str, Any], node: NodeState) -> bool:
    """The scheduler's reading of required node affinity: terms ORed, requirements ANDed, an empty term
    matches nothing."""
    selector = ((template.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED)
    if selector is None:
        return True
    return any(
        (term.get("matchExpressions") or term.get("matchFields"))
        and all(_requirement_holds(r, node.labels.get(r["key"])) for r in term.get("matchExpressions", []))
        and all(_requirement_holds(r, node.name) for r in term.get("matchFields", []))
        for term in selector["nodeSelectorTerms"]
    )


@given(template=user_templates(), pool=pools, node=chosen, shape=shapes)
def test_place_is_idempotent(template, pool, node, shape):
    once = place(template, pool, node, shape)
    twice = place(once, pool, node, shape)
    assert twice == once
    assert json_patch(once, twice, "/spec/podTemplate") == []


@given(template=user_templates(), pool=pools, node=chosen)
def test_place_keeps_user_terms_and_tolerates_once(template, pool, node):
    placed = place(template, pool, node)
    assert placed.get("nodeSelector") == template.get("nodeSelector")
    assert placed["tolerations"].count(pool.toleration()) == 1
    before = ((template.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED, {}).get("nodeSelectorTerms", [])
    after = ((placed.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED, {}).get("nodeSelectorTerms", [])
    for term in before:
        assert any(
            all(r in t.get(kind, []) for kind in ("matchExpressions", "matchFields") for r in term.get(kind, []))
            for t in after
        )


@given(template=user_templates(), pool=pools, node=chosen, candidate=nodes, shape=shapes)
def test_place_means_the_pool_and_what_the_user_asked(template, pool, node, candidate, shape):
    placed = place(template, pool, node, shape)
    expected = schedulable(template, candidate) and (pool.placement == "preferred" or pool.claims(candidate))
    assert schedulable(placed, candidate) == expected


@given(template=user_templates(), pool=pools, node=chosen, other=pools, shape=shapes, then=shapes)
def test_unplace_undoes_place(template, pool, node, other, shape, then):
    assert unplace(place(template, pool, node, shape), POLICY) == template
    # moving to another pool: nothing of the first pool is left, whichever shape either was written in
    moved = place(unplace(place(template, pool, node, shape), POLICY, keep_pool=other.name), other, node, then)
    if other is not pool or shape == then:
        assert moved == place(template, other, node, then)


@given(template=user_templates(), pool=pools, node=chosen, candidate=nodes, shape=shapes, then=shapes)
def test_placed_again_in_the_other_shape_means_the_same_nodes(template, pool, node, candidate, shape, then):
    """A run placed in one shape whose pod is placed in the other (a node with another hostname joined or
    left in between): `unplace` keeps both shapes of the kept pool's requirements, and `place` writes its own
    shape only, as if the run had been placed in it (ANDed, both could match no node while a hostname differs:
    `candidate`'s may)."""
    again = place(unplace(place(template, pool, node, shape), POLICY, keep_pool=pool.name), pool, node, then)
    assert again == place(template, pool, node, then)  # the other shape's requirements gone: this shape's only
    assert schedulable(again, candidate) == schedulable(place(template, pool, node, then), candidate)


@given(template=user_templates(), pool=pools, node=chosen)
def test_json_patch_turns_old_into_new(template, pool, node):
    run = {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "spec": {"podTemplate": template}}
    new = place(template, pool, node)
    patched = jsonpatch.apply_patch(run, json_patch(template, new, "/spec/podTemplate"))
    assert patched["spec"]["podTemplate"] == new
    assert run["spec"]["podTemplate"] == template


@pytest.mark.parametrize(
    ("node_selector", "keep_pool", "kept"),
    [
        # A pool key copied into nodeSelector is stripped: the pod would otherwise wait forever.
        ({"egress": "fast"}, None, None),
        ({"egress": "fast", "disk": "ssd"}, None, {"disk": "ssd"}),
        ({"net": "10g"}, None, None),
        # The kept pool's own selector stays; another pool's value of the same key does not.
        ({"egress": "fast", "net": "10g"}, "fast", {"egress": "fast", "net": "10g"}),
        ({"egress": "soft"}, "fast", None),
        # Keys no pool selects on are the user's own.
        ({"disk": "ssd"}, None, {"disk": "ssd"}),
    ],
)
def test_unplace_node_selector(node_selector, keep_pool, kept):
    out = unplace({"nodeSelector": node_selector, "tolerations": [FAST_TOL]}, POLICY, keep_pool=keep_pool)
    assert out.get("nodeSelector") == kept


# --- over Tekton's default pod template -------------------------------------------------------------

GPU = {"key": "gpu", "operator": "Exists"}
SPOT = {"key": "spot", "operator": "Exists"}
ZONE_A = {"nodeSelectorTerms": [{"matchExpressions": [expr("zone", "In", "a")]}]}
ANTI = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]}}


def placed_over(template, default, pool=FAST, node="edge-1"):
    return over_default(template, default, lambda t: place(unplace(t, POLICY, keep_pool=pool.name), pool, node))


def unplaced_over(template, default):
    return over_default(template, default, lambda t: unplace(t, POLICY))


@pytest.mark.parametrize(
    ("template", "default", "tolerations"),
    [
        pytest.param(None, {"tolerations": [GPU]}, [GPU, FAST_TOL], id="the-defaults-kept-and-the-pools-added"),
        pytest.param({"tolerations": [SPOT]}, {"tolerations": [GPU]}, [SPOT, FAST_TOL], id="the-runs-own-replace-the-defaults"),
        pytest.param({"tolerations": []}, {"tolerations": [GPU]}, [FAST_TOL], id="the-run-said-none"),
        pytest.param({"tolerations": None}, {"tolerations": [GPU]}, [GPU, FAST_TOL], id="null-is-unset"),
        pytest.param({}, {"tolerations": [GPU, {"operator": "Exists"}]}, [GPU, FAST_TOL], id="tolerate-all-stripped"),
        pytest.param({}, None, [FAST_TOL], id="no-default"),
    ],
)
def test_placed_over_default_tolerations(template, default, tolerations):
    placed = placed_over(copy.deepcopy(template), default)
    assert placed["tolerations"] == tolerations
    assert with_default(placed, default)["tolerations"] == tolerations  # what Tekton's merge gives the pod


def test_placed_over_default_affinity_is_the_defaults_and_the_pools():
    default = {"affinity": {**ANTI, "nodeAffinity": {REQUIRED: ZONE_A}}}
    placed = placed_over({}, default, LAB, "lab-1")
    assert placed["affinity"]["podAntiAffinity"] == ANTI["podAntiAffinity"]
    assert required(placed) == [{"matchExpressions": [expr("zone", "In", "a")], "matchFields": [by_name("lab-1")]}]
    assert preferred(placed) == [node_preference("lab-1")]


@pytest.mark.parametrize(
    ("default", "written"),
    [
        pytest.param({"nodeSelector": {"disk": "ssd"}}, None, id="left-to-tekton"),
        pytest.param({"nodeSelector": {"egress": "soft"}}, {}, id="a-pool-key-stripped-and-kept-out"),
        pytest.param({"nodeSelector": {"egress": "soft", "disk": "ssd"}}, {"disk": "ssd"}, id="a-pool-key-stripped"),
    ],
)
def test_placed_over_default_node_selector(default, written):
    placed = placed_over({}, default)
    assert placed.get("nodeSelector") == written
    assert with_default(placed, default)["nodeSelector"] == (default["nodeSelector"] if written is None else written)


@pytest.mark.parametrize(
    ("default", "written"),
    [
        pytest.param({"tolerations": [GPU], "affinity": ANTI, "nodeSelector": {"disk": "ssd"}}, {}, id="nothing-to-change"),
        pytest.param({"tolerations": [GPU, FAST_TOL]}, {"tolerations": [GPU]}, id="a-pool-toleration-stripped"),
        pytest.param({"tolerations": [FAST_TOL]}, {"tolerations": []}, id="emptied-and-kept-empty"),
        pytest.param({"tolerations": []}, {}, id="empty-default"),
    ],
)
def test_unplaced_over_default(default, written):
    assert unplaced_over(None, default) == written


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (None, None),
        ("", None),
        ("# nothing\n", None),
        ("tolerations: [{key: gpu, operator: Exists}]\nsecurityContext: {runAsNonRoot: true}\n", {"tolerations": [GPU]}),
        ("nodeSelector: {disk: ssd}\naffinity: {nodeAffinity: {}}\n", {"nodeSelector": {"disk": "ssd"}, "affinity": {"nodeAffinity": {}}}),
        ("tolerations: null\n", {}),
    ],
)
def test_default_pod_template(text, parsed):
    assert default_pod_template(text) == parsed


@pytest.mark.parametrize(
    "text",
    [
        "tolerations: [",
        "- a list",
        "tolerations: gpu",
        "tolerations: [gpu]",
        "nodeSelector: {disk: 1}",
        "affinity: [x]",
        "affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [x]}}}",
        "affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchFields: [{values: x}]}]}}}",
        "affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{preference: [x]}]}}",
    ],
)
def test_default_pod_template_refused(text):
    with pytest.raises(InvalidDefault):
        default_pod_template(text)


def _required_terms(template):
    return ((template.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED, {}).get("nodeSelectorTerms", [])


def _holds_term(terms, term):
    return any(all(r in t.get(k, []) for k in ("matchExpressions", "matchFields") for r in term.get(k, [])) for t in terms)


@st.composite
def run_templates(draw) -> dict[str, Any] | None:
    """None (no podTemplate), or the user's own, some fields set explicitly empty or null."""
    if draw(st.booleans()):
        return None
    template = draw(user_templates())
    for name, empty in (("tolerations", []), ("nodeSelector", {}), ("affinity", {})):
        template.setdefault(name, draw(st.sampled_from([empty, None, "absent"])))
        if template[name] == "absent":
            del template[name]
    return template


defaults = st.one_of(st.none(), user_templates())


@given(template=run_templates(), default=defaults, pool=pools, node=chosen)
def test_placing_over_the_default_twice_changes_nothing(template, default, pool, node):
    once = placed_over(template, default, pool, node)
    assert placed_over(once, default, pool, node) == once
    assert unplaced_over(unplaced_over(template, default), default) == unplaced_over(template, default)


@given(template=run_templates(), default=defaults, pool=pools, node=chosen, candidate=nodes)
def test_the_defaults_entries_survive_placement(template, default, pool, node, candidate):
    placed = placed_over(copy.deepcopy(template), default, pool, node)
    before, after = with_default(template, default), with_default(placed, default)  # as Tekton merges them
    assert after["tolerations"].count(pool.toleration()) == 1
    assert all(t in after["tolerations"] for t in before.get("tolerations") or [])
    assert after.get("nodeSelector") == before.get("nodeSelector")
    assert all(_holds_term(_required_terms(after), term) for term in _required_terms(before))
    prefs = ((after.get("affinity") or {}).get("nodeAffinity") or {}).get(PREFERRED, [])
    assert all(p in prefs for p in ((before.get("affinity") or {}).get("nodeAffinity") or {}).get(PREFERRED, []))
    expected = schedulable(before, candidate) and (pool.placement == "preferred" or pool.claims(candidate))
    assert schedulable(after, candidate) == expected


@pytest.mark.parametrize(("pool", "expected"), [("egress", {"karpenter.sh/do-not-disrupt": "true"}), (None, {}), ("", {})])
def test_protection_of_a_placed_pod(pool: str | None, expected: dict) -> None:
    assert protection(pool) == expected
