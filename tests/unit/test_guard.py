"""The pool guard (ValidatingAdmissionPolicy) rendered from the policy model: the namespace globs and the
annotation as RE2 expressions mean exactly what the policy's own matcher means (properties, with RE2
itself); the rendered CEL, run by cel-python, refuses exactly the pools `refused_pools` names (tables of
the issue's cases and generated pods); `refused_pools` agrees with the core's own answers; the params
and the binding; `k8s/pool-guard.yaml` holds them for the shipped policy (tests/unit/test_generated.py
checks that it is the render)."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import re2
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.pool_guard.core import (
    GUARD_NAME,
    MAX_POOLS,
    PYTHON_SPACE,
    VALIDATION_MESSAGE,
    VARIABLES,
    GuardError,
    annotation_regex,
    glob_regex,
    guard_params,
    left_out,
    policy_binding,
    validating_admission_policy,
)
from controller.core.model import NAMESPACE_POOLS_ANNOTATION, TAINT_KEY, NamespaceState, NodeState, Taint
from controller.core.patches import tolerates
from controller.core.policy import PlacementPolicy, Pool, load_policy

celpy = pytest.importorskip("celpy")
from celpy import celtypes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NOTHING = "[^\\x{0}-\\x{10ffff}]"

POLICY = load_policy(
    """\
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
agentNamespaces: [kube-system, monitoring]
pools:
  - name: overseas
    nodeSelector: {egress-placer.io/pool: overseas}
    nodes: [egress-9]
    namespaces: [team-cdn, "release-*"]
    namespaceSelector:
      matchLabels: {egress: allowed}
      matchExpressions: [{key: tier, operator: NotIn, values: [sandbox]}]
  - name: lab
    nodes: [lab-1]
    namespaces: [team-lab]
    taint: {effect: NoExecute}
"""
)
NODES = {
    n.name: n
    for n in (
        NodeState("egress-1", {TAINT_KEY: "overseas"}),
        NodeState("egress-2", {TAINT_KEY: "overseas"}),
        NodeState("lab-1"),
        NodeState("node-1"),
        NodeState("node-2"),
    )
}


# -- globs and the annotation ------------------------------------------------------------------------


def core_glob_match(globs: list[str], name: str) -> bool:
    pool = Pool(name="p", nodes=("n",), namespaces=tuple(globs))
    return pool.allows(NamespaceState(name=name))


def guard_glob_match(globs: list[str], name: str) -> bool:
    pattern = glob_regex(globs)
    return pattern != "" and re2.search(pattern, name) is not None


GLOB_CASES = [
    (["team-cdn"], "team-cdn", True),
    (["team-cdn"], "team-cdn-evil", False),
    (["team-cdn"], "xteam-cdn", False),
    (["release-*"], "release-", True),
    (["release-*"], "release-2\n", True),  # `*` matches a line break too (fnmatch's (?s))
    (["team.cdn"], "team-cdn", False),  # '.' is literal
    (["t?am"], "team", True),
    (["[!a]"], "b", True),
    (["[!a]"], "a", False),
    (["[!]"], "[!]", True),  # no closing bracket after '!]': literal
    (["[z-a]x"], "zx", False),  # an empty range matches nothing
    (["[a-]"], "-", True),
    (["[[:alpha:]]"], "a]", True),  # not a POSIX class: a class of '[', ':', 'a', ... then ']'
    (["[[:alpha:]]"], "b]", False),
    (["a|b"], "a", False),  # '|' is literal
    (["(x)"], "(x)", True),
    ([r"\d"], "5", False),  # '\' is literal
    ([r"\d"], r"\d", True),
    (["*"], "", True),
    ([], "anything", False),
]


@pytest.mark.parametrize(("globs", "name", "expected"), GLOB_CASES)
def test_glob_regex_table(globs: list[str], name: str, expected: bool) -> None:
    assert core_glob_match(globs, name) is expected
    assert guard_glob_match(globs, name) is expected


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
GLOB_TEXT = st.text(alphabet=st.sampled_from("ab-.*?[]!^\\|()$:z\n é"), min_size=1, max_size=10).filter(str.strip)
NAME_TEXT = st.text(alphabet=st.sampled_from("ab-.*?[]!^\\|()$:z\n é"), max_size=10)


@settings(max_examples=400, deadline=None)
@given(globs=st.lists(GLOB_TEXT, max_size=3), name=st.one_of(NAME_TEXT, TEXT))
def test_glob_regex_agrees_with_the_policys_matcher(globs: list[str], name: str) -> None:
    assert guard_glob_match(globs, name) is core_glob_match(globs, name)


def test_the_space_class_is_pythons_whitespace() -> None:
    assert PYTHON_SPACE == tuple(c for c in range(0x110000) if unicodedata.category(chr(c)) != "Cs" and chr(c).isspace())


POOL_NAMES = st.sampled_from(["overseas", "lab", "a", "a-b"])
ANNOTATION_TEXT = st.lists(
    st.one_of(POOL_NAMES, st.text(alphabet=st.sampled_from("ab-, \t\u00a0\u2003\x1cxo"), max_size=6)), max_size=4
).map(",".join)


@settings(max_examples=400, deadline=None)
@given(pool=POOL_NAMES, value=st.one_of(ANNOTATION_TEXT, TEXT))
def test_annotation_regex_agrees_with_the_policys_reading(pool: str, value: str) -> None:
    allows = Pool(name=pool, nodes=("n",)).allows(NamespaceState(name="x", annotations={NAMESPACE_POOLS_ANNOTATION: value}))
    assert (re2.search(annotation_regex(pool), value) is not None) is allows


# -- the same rule in Python (the oracle the rendered CEL is held to) -------------------------------------


def _pool_of_name(policy: PlacementPolicy, nodes: Mapping[str, NodeState], name: str) -> str | None:
    pool = policy.pool_of(nodes.get(name) or NodeState(name=name))
    return pool.name if pool is not None else None


def _tolerated(policy: PlacementPolicy, pod: Mapping[str, Any] | None) -> set[str]:
    spec = (pod or {}).get("spec") or {}
    return {
        p.name
        for p in policy.pools
        if any(tolerates(t, Taint(p.taint.key, p.name, p.taint.effect)) for t in spec.get("tolerations") or [])
    }


def _pinned_off(policy: PlacementPolicy, nodes: Mapping[str, NodeState], pod: Mapping[str, Any], pool: str) -> bool:
    spec = pod.get("spec") or {}
    if spec.get("nodeName") and _pool_of_name(policy, nodes, spec["nodeName"]) != pool:
        return True
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = (required or {}).get("nodeSelectorTerms") or []
    return bool(terms) and all(
        any(
            f.get("key") == "metadata.name"
            and f.get("operator") == "In"
            and f.get("values")
            and all(_pool_of_name(policy, nodes, v) != pool for v in f["values"])
            for f in term.get("matchFields") or []
        )
        for term in terms
    )


def refused_pools(
    policy: PlacementPolicy,
    nodes: Mapping[str, NodeState],
    namespace: NamespaceState,
    pod: Mapping[str, Any],
    old: Mapping[str, Any] | None = None,
) -> list[str]:
    """The pools, in policy order, that the guard refuses `pod` (of `namespace`; `old` on UPDATE) for."""
    if namespace.name in left_out(policy):  # the exempt and agent namespaces: never judged
        return []
    new_node = (pod.get("spec") or {}).get("nodeName")
    old_node = ((old or {}).get("spec") or {}).get("nodeName")
    node_pool = _pool_of_name(policy, nodes, new_node) if new_node else None
    old_node_pool = _pool_of_name(policy, nodes, old_node) if old_node else None
    tolerated, old_tolerated = _tolerated(policy, pod), _tolerated(policy, old)
    reached = [
        p.name
        for p in policy.pools
        if (p.name in tolerated and p.name not in old_tolerated and not _pinned_off(policy, nodes, pod, p.name))
        or (node_pool == p.name and old_node_pool != p.name)
    ]
    return [name for name in reached if not policy.pool(name).allows(namespace)]  # type: ignore[union-attr]


# -- the CEL, run by cel-python ----------------------------------------------------------------------


def _split(text: Any, separator: Any) -> Any:
    return celtypes.ListType([celtypes.StringType(part) for part in str(text).split(str(separator))])


def _join(items: Any, separator: Any) -> Any:
    return celtypes.StringType(str(separator).join(str(i) for i in items))


# Kubernetes' CEL has the strings extension (split, join); cel-python does not, so the test supplies them.
FUNCTIONS = {"split": _split, "join": _join}
ENV = celpy.Environment()
PROGRAMS = [(name, ENV.program(ENV.compile(expression), functions=FUNCTIONS)) for name, expression in VARIABLES]
(VALIDATION,) = validating_admission_policy()["spec"]["validations"]
CHECK = ENV.program(ENV.compile(VALIDATION["expression"]), functions=FUNCTIONS)
MESSAGE = ENV.program(ENV.compile(VALIDATION_MESSAGE), functions=FUNCTIONS)


def namespace_object(ns: NamespaceState) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": ns.name}
    if ns.labels:
        meta["labels"] = dict(ns.labels)
    if ns.annotations:
        meta["annotations"] = dict(ns.annotations)
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def guard(
    policy: PlacementPolicy, nodes: dict[str, NodeState], ns: NamespaceState, pod: dict[str, Any], old: dict[str, Any] | None = None
) -> tuple[bool, list[str], str]:
    """(admitted, refused pools, message) as the rendered policy says, variables in order as the API server."""
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(pod),
        "oldObject": celpy.json_to_cel(old),
        "params": celpy.json_to_cel({"apiVersion": "v1", "kind": "ConfigMap", "data": guard_params(policy, nodes.values())}),
        "namespaceObject": celpy.json_to_cel(namespace_object(ns)),
    }
    variables: dict[Any, Any] = {}
    for name, program in PROGRAMS:
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(name)] = program.evaluate(activation)
    activation["variables"] = celtypes.MapType(variables)
    admitted = CHECK.evaluate(activation)
    assert isinstance(admitted, celtypes.BoolType), admitted
    refused = [str(p) for p in variables["refused"]]
    return bool(admitted), refused, "" if admitted else str(MESSAGE.evaluate(activation))


def pod(
    tolerations: list[dict[str, str]] | None = None,
    node: str | None = None,
    pinned: list[list[str]] | None = None,
    finalizers: list[str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if node is not None:
        spec["nodeName"] = node
    if pinned is not None:  # how the DaemonSet controller pins its pods: one term per list of node names
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": names}]} for names in pinned
                    ]
                }
            }
        }
    meta: dict[str, Any] = {"name": "p", "namespace": "x"}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


POOL_TOL = {"key": TAINT_KEY, "operator": "Equal", "value": "overseas", "effect": "NoSchedule"}
KEY_EXISTS = {"key": TAINT_KEY, "operator": "Exists"}
KEYLESS = {"operator": "Exists"}
DEFAULT_TOLS = [  # what the API server adds to every pod (DefaultTolerationSeconds)
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": "300"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": "300"},
]
DENIED = NamespaceState("team-other")
ALLOWED = NamespaceState("team-cdn")

CASES = [
    # (case, namespace, pod, old pod, refused pools)
    ("plain pod", DENIED, pod(DEFAULT_TOLS), None, []),
    ("pool toleration", DENIED, pod([POOL_TOL]), None, ["overseas"]),
    ("pool key Exists", DENIED, pod([KEY_EXISTS]), None, ["overseas", "lab"]),  # one key: every pool
    ("other pool's value", DENIED, pod([{**POOL_TOL, "value": "lab"}]), None, []),
    ("key-less Exists reaches every pool", DENIED, pod([KEYLESS]), None, ["overseas", "lab"]),
    ("key-less Exists, NoExecute only", DENIED, pod([{**KEYLESS, "effect": "NoExecute"}]), None, ["lab"]),
    ("pool key Exists, NoExecute: lab's effect only", DENIED, pod([{**KEY_EXISTS, "effect": "NoExecute"}]), None, ["lab"]),
    ("pool toleration, wrong effect", DENIED, pod([{**POOL_TOL, "effect": "NoExecute"}]), None, []),
    ("key-less without Exists", DENIED, pod([{"effect": "NoSchedule"}]), None, []),
    ("allowed namespace", ALLOWED, pod([POOL_TOL]), None, []),
    ("allowed by glob", NamespaceState("release-7"), pod([POOL_TOL]), None, []),
    ("glob does not reach a longer name", NamespaceState("team-cdn-evil"), pod([POOL_TOL]), None, ["overseas"]),
    ("allowed by labels", NamespaceState("x", labels={"egress": "allowed"}), pod([POOL_TOL]), None, []),
    ("labels, NotIn refuses", NamespaceState("x", labels={"egress": "allowed", "tier": "sandbox"}), pod([POOL_TOL]), None, ["overseas"]),
    ("allowed by annotation", NamespaceState("x", annotations={NAMESPACE_POOLS_ANNOTATION: "lab , overseas"}), pod([KEYLESS]), None, []),
    ("annotation names another pool", NamespaceState("x", annotations={NAMESPACE_POOLS_ANNOTATION: "lab"}), pod([KEYLESS]), None, ["overseas"]),
    ("allowed on one pool only", NamespaceState("team-lab"), pod([KEYLESS]), None, ["overseas"]),
    ("nodeName of a pool node", DENIED, pod(node="egress-1"), None, ["overseas"]),
    ("nodeName of a node listed by name, not yet seen", DENIED, pod(node="egress-9"), None, ["overseas"]),
    ("nodeName of an ordinary node, key-less Exists", DENIED, pod([KEYLESS], node="node-1"), None, []),
    ("nodeName of a pool node, allowed namespace", ALLOWED, pod([POOL_TOL], node="egress-1"), None, []),
    ("DaemonSet pod pinned to an ordinary node", DENIED, pod([KEYLESS], pinned=[["node-1"]]), None, []),
    ("DaemonSet pod pinned to a pool node", DENIED, pod([KEYLESS], pinned=[["egress-2"]]), None, ["overseas"]),
    ("pinned to a lab node: overseas is off", DENIED, pod([KEYLESS], pinned=[["lab-1"]]), None, ["lab"]),
    ("one term of two reaches the pool", DENIED, pod([KEYLESS], pinned=[["node-1"], ["egress-1"]]), None, ["overseas"]),
    ("UPDATE adding the pool toleration", DENIED, pod([*DEFAULT_TOLS, POOL_TOL]), pod(DEFAULT_TOLS), ["overseas"]),
    ("UPDATE keeping it (finalizer change)", DENIED, pod([POOL_TOL], finalizers=["x/y"]), pod([POOL_TOL]), []),
    ("UPDATE of a pod on a pool node (garbage collector)", DENIED, pod([KEYLESS], node="egress-1"), pod([KEYLESS], node="egress-1"), []),
    ("UPDATE adding a key-less Exists", DENIED, pod([POOL_TOL, KEYLESS]), pod([POOL_TOL]), ["lab"]),
]


@pytest.mark.parametrize(("case", "ns", "obj", "old", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_rendered_rules_refuse_what_the_issue_says(
    case: str, ns: NamespaceState, obj: dict[str, Any], old: dict[str, Any] | None, expected: list[str]
) -> None:
    admitted, refused, message = guard(POLICY, NODES, ns, obj, old)
    assert refused_pools(POLICY, NODES, ns, obj, old) == expected
    assert refused == expected
    assert admitted is (expected == [])
    if expected:
        assert message.startswith(f"namespace {ns.name} may not use pool {', '.join(expected)}: ")


def test_without_params_nothing_is_refused() -> None:
    activation = {
        "object": celpy.json_to_cel(pod([KEYLESS], node="egress-1")),
        "oldObject": celpy.json_to_cel(None),
        "params": celpy.json_to_cel(None),
        "namespaceObject": celpy.json_to_cel(namespace_object(DENIED)),
    }
    variables: dict[Any, Any] = {}
    for name, program in PROGRAMS:
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(name)] = program.evaluate(activation)
    activation["variables"] = celtypes.MapType(variables)
    assert CHECK.evaluate(activation) == celtypes.BoolType(True)


def test_a_pod_that_reaches_no_pool_never_reads_a_pool_entry() -> None:
    """Params with the pool list but no pool entries: a plain pod is still admitted."""
    data = {"Pools": "overseas"}
    activation = {
        "object": celpy.json_to_cel(pod(DEFAULT_TOLS[:0])),
        "oldObject": celpy.json_to_cel(None),
        "params": celpy.json_to_cel({"data": data}),
        "namespaceObject": celpy.json_to_cel(namespace_object(DENIED)),
    }
    variables: dict[Any, Any] = {}
    for name, program in PROGRAMS:
        if name in ("refused", "reached"):
            continue  # evaluated lazily by the API server; only through the validation below
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(name)] = program.evaluate(activation)
    assert list(variables[celtypes.StringType("tolerated")]) == []


# Generated pods: tolerations, node names and pins drawn from what matters to the pools above.
TOLERATION = st.fixed_dictionaries(
    {},
    optional={
        "key": st.sampled_from([TAINT_KEY, "example.com/lab", "", "other"]),
        "operator": st.sampled_from(["Exists", "Equal", ""]),
        "value": st.sampled_from(["overseas", "lab", "", "x"]),
        "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule", ""]),
    },
)
NODE_NAMES = st.sampled_from([*NODES, "egress-9", "unknown"])
PODS = st.builds(
    pod,
    tolerations=st.one_of(st.none(), st.lists(TOLERATION, max_size=3)),
    node=st.one_of(st.none(), NODE_NAMES),
    pinned=st.one_of(st.none(), st.lists(st.lists(NODE_NAMES, min_size=1, max_size=2), min_size=1, max_size=2)),
)
NAMESPACES = st.builds(
    NamespaceState,
    name=st.sampled_from(["team-cdn", "team-other", "release-1", "team-lab", "team-cdn-evil"]),
    labels=st.dictionaries(st.sampled_from(["egress", "tier"]), st.sampled_from(["allowed", "sandbox", ""]), max_size=2),
    annotations=st.one_of(st.just({}), st.builds(lambda v: {NAMESPACE_POOLS_ANNOTATION: v}, ANNOTATION_TEXT)),
)


@settings(max_examples=300, deadline=None)
@given(ns=NAMESPACES, obj=PODS, old=st.one_of(st.none(), PODS))
def test_the_rendered_rules_agree_with_refused_pools(ns: NamespaceState, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    admitted, refused, _ = guard(POLICY, NODES, ns, obj, old)
    assert refused == refused_pools(POLICY, NODES, ns, obj, old)
    assert admitted is (refused == [])


@settings(max_examples=300, deadline=None)
@given(ns=NAMESPACES, obj=PODS)
def test_refused_pools_agree_with_the_core(ns: NamespaceState, obj: dict[str, Any]) -> None:
    """A pool refused is one the namespace may not use; an unpinned pod the core sees tolerating a pool it
    may not use, or on a node of it (an intruder), is refused."""
    from controller.core.patches import tolerates

    refused = refused_pools(POLICY, NODES, ns, obj)
    assert all(not POLICY.pool(p).allows(ns) for p in refused)  # type: ignore[union-attr]
    spec = obj["spec"]
    node = spec.get("nodeName")
    if node:
        pool = POLICY.pool_of(NODES.get(node) or NodeState(node))
        if pool is not None and not pool.allows(ns):
            assert pool.name in refused
    if not node and "affinity" not in spec:
        for p in POLICY.pools:
            if not p.allows(ns) and any(tolerates(t, p.taint_for()) for t in spec.get("tolerations") or []):
                assert p.name in refused


# -- params, binding, manifests -----------------------------------------------------------------------


def test_params_name_each_pool_node_and_the_pool_rules() -> None:
    data = guard_params(POLICY, NODES.values())
    assert data["Pools"] == "overseas,lab"
    assert {k: v for k, v in data.items() if not k[0].isupper()} == {
        "egress-1": "overseas", "egress-2": "overseas", "egress-9": "overseas", "lab-1": "lab",
    }
    assert data["Pool.lab.TaintKey"] == TAINT_KEY and data["Pool.lab.TaintEffect"] == "NoExecute"
    assert data["Pool.overseas.Namespaces"] == "^(?:team-cdn|release-(?s:.*))$"
    assert data["Pool.overseas.Selector"] == "egress|In|allowed;tier|NotIn|sandbox"
    assert data["Pool.lab.Selector"] == ""
    assert data["LeftOut"] == "kube-node-lease,kube-public,kube-system,monitoring"
    assert guard_params(PlacementPolicy.empty(), NODES.values()) == {"Pools": "", "LeftOut": "kube-node-lease,kube-public,kube-system"}


def test_too_many_pools_are_refused_by_the_render() -> None:
    policy = PlacementPolicy.model_validate(
        {"apiVersion": "egress-placer.io/v1alpha1", "kind": "PlacementPolicy",
         "pools": [{"name": f"p{i}", "nodes": [f"n{i}"]} for i in range(MAX_POOLS + 1)]}
    )
    with pytest.raises(GuardError, match=f"at most {MAX_POOLS} pools"):
        guard_params(policy, [])


def test_the_binding_is_static_and_the_params_leave_out_exempt_and_agent_namespaces() -> None:
    binding = policy_binding("egress-placer")
    assert binding["spec"] == {
        "policyName": GUARD_NAME,
        "validationActions": ["Deny"],
        "paramRef": {"name": GUARD_NAME, "namespace": "egress-placer", "parameterNotFoundAction": "Allow"},
        "matchResources": {},
    }
    none_left_out = load_policy("apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\nexemptNamespaces: []\n")
    assert guard_params(none_left_out, [])["LeftOut"] == ""


@pytest.mark.parametrize("name", ["kube-system", "monitoring", "kube-public"])
def test_a_left_out_namespace_is_never_judged(name: str) -> None:
    everything = [{"operator": "Exists"}]
    assert guard(POLICY, NODES, NamespaceState(name=name), pod(everything, node="egress-1"))[:2] == (True, [])
    assert guard(POLICY, NODES, NamespaceState(name="monitoring-x"), pod(everything, node="egress-1"))[0] is False


@pytest.mark.parametrize(
    ("groups", "judged"),
    [
        (["system:nodes", "system:authenticated"], False),  # a kubelet (mirror pods)
        (["system:authenticated"], True),
        (["system:serviceaccounts", "system:serviceaccounts:team-other", "system:authenticated"], True),
        ([], True),
        (None, True),
    ],
)
def test_only_kubelets_requests_are_not_judged(groups: list[str] | None, judged: bool) -> None:
    (condition,) = validating_admission_policy()["spec"]["matchConditions"]
    program = ENV.program(ENV.compile(condition["expression"]))
    user: dict[str, Any] = {"username": "u"} if groups is None else {"username": "u", "groups": groups}
    result = program.evaluate({"request": celpy.json_to_cel({"userInfo": user})})
    assert result == celtypes.BoolType(judged)


def test_the_policy_fails_closed_on_creates_and_updates_of_pods() -> None:
    spec = validating_admission_policy()["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}
    ]


def test_k8s_ships_the_render_for_the_default_policy_wide_fields() -> None:
    text = (ROOT / "k8s" / "pool-guard.yaml").read_text()  # the render itself: tests/unit/test_generated.py
    shipped = list(yaml.safe_load_all(text))
    assert shipped == [validating_admission_policy(), policy_binding("egress-placer")]
