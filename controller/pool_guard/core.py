"""The pool guard: a ValidatingAdmissionPolicy that keeps pods of namespaces without pool rights off the
pools inside the API server, so it holds while the webhook is down (fail-closed). Rendered here, from
the policy model; the CEL text lives in this module only.

Three objects (names in `GUARD_NAME`):

- the ValidatingAdmissionPolicy (`validating_admission_policy()`): the same for every policy; shipped
  in `k8s/pool-guard.yaml` and the chart, both written by `make generate` (devplacer/generate.py);
- its binding (`policy_binding(namespace)`): static, every namespace, params from the ConfigMap below;
  shipped with the policy. Nobody writes it after the install: the API server never applies admission
  policies to policy or binding objects, so a binding the controller could update would be a right no
  policy bounds (k8s/README.md, "What bounds each right");
- its params (`guard_params(policy, nodes)`): a ConfigMap the leader keeps current: the namespaces the
  guard leaves out (the exempt and agent ones, key `LeftOut`; the policy reads the request's namespace
  name from `namespaceObject`, which the API server fills), each pool's taint, its namespace rules
  (globs as RE2 regular expressions, the label selector, the annotation `egress-placer.io/pools`) and
  the pool node names.

What the policy refuses (`refused_pools` in tests/unit/test_guard.py says the same in Python; the unit
tests hold the CEL to it): a pod, of a namespace the binding matches, that newly reaches a pool its
namespace may not use. A pod reaches pool P when it tolerates P's taint (the Kubernetes toleration rule:
by key, or a key-less `Exists`) and is not pinned off P's nodes, or when its `spec.nodeName` is a node
of P. Pinned off: its `nodeName` is another node, or every required node-affinity term has a
`matchFields metadata.name In` naming no node of P (how the DaemonSet controller pins its pods).
"Newly": on UPDATE, a pool the old object already reached by toleration (or by `nodeName`) is not judged
again, so the garbage collector or a finalizer change on an existing pod is never refused. What the
tenant writes (tolerations, nodeName, affinity) only ever makes the guard stricter: the namespace (the
request's own, from `namespaceObject`, which the API server fills) and the params are the facts it
relies on.

Params missing: the binding's `parameterNotFoundAction: Allow` admits everything (no pod is harmed
by a missing object the leader recreates on its next pass). Params present but a pool's entries
missing: the lookups fail for the pods that reach that pool only, and `failurePolicy: Fail` refuses
them; pods that reach no pool never look a pool entry up.

Cost: every list the CEL walks is bounded: the pools (at most `MAX_POOLS`), a pod's tolerations and
required node-affinity terms, the selector's requirements. A pool node is found by a map lookup (the
node's name is a params key), not by walking the node list.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from typing import Any

from controller.core.admission_policy import admission_policy, param_ref, resource_rule, validation
from controller.core.admission_policy import policy_binding as binding
from controller.core.model import NAMESPACE_POOLS_ANNOTATION, NodeState
from controller.core.policy import LabelSelector, PlacementPolicy, agent_namespaces

GUARD_NAME = "egress-placer-pool-guard"  # the policy, its binding and its params ConfigMap
MAX_POOLS = 64  # the params list at most this many pools (bounds the CEL's cost)

# Params keys. Node names (DNS-1123 subdomains: lower case) are keys of their own, whose value is the
# node's pool; every other key starts with an upper-case letter, so none can be a node name.
POOLS_KEY = "Pools"  # the pool names, comma-separated, in policy order
LEFT_OUT_KEY = "LeftOut"  # the exempt and agent namespaces, comma-separated, sorted: never judged


def pool_key(pool: str, field: str) -> str:
    """The params key of one pool's `field` (TaintKey, TaintEffect, Namespaces, Selector, Annotation)."""
    return f"Pool.{pool}.{field}"


class GuardError(ValueError):
    """The policy cannot be expressed by the pool guard (e.g. too many pools)."""


# -- globs and the annotation as RE2 regular expressions ------------------------------------------------


def _literal(c: str) -> str:
    """One character as RE2 reads it literally: letters, digits, '-' and '_' as themselves, any other
    character as `\\x{hex}` (never a metacharacter, never a POSIX class)."""
    if c.isascii() and (c.isalnum() or c in "-_"):
        return c
    return f"\\x{{{ord(c):x}}}"


def _python_class(body: str) -> str:
    """The RE2 form of one character class as `fnmatch.translate` writes it (`[...]`, `(?!)`, `.`)."""
    if body == "(?!)":  # an empty range: never matches
        return "[^\\x{0}-\\x{10ffff}]"
    if body == ".":  # a negated empty range: any character
        return "(?s:.)"
    if not (body.startswith("[") and body.endswith("]")):
        raise GuardError(f"cannot translate the glob class {body!r} (an fnmatch this module does not know)")
    stuff = body[1:-1]
    negated = stuff.startswith("^")
    if negated:
        stuff = stuff[1:]
    atoms: list[tuple[str, bool]] = []  # (character, is a range dash)
    i = 0
    while i < len(stuff):
        if stuff[i] == "\\":
            atoms.append((stuff[i + 1], False))
            i += 2
        else:
            atoms.append((stuff[i], stuff[i] == "-"))
            i += 1
    out, k = [], 0
    while k < len(atoms):
        c, _ = atoms[k]
        if k + 2 < len(atoms) and atoms[k + 1][1]:
            out.append(f"{_literal(c)}-{_literal(atoms[k + 2][0])}")
            k += 3
        else:
            out.append(_literal(c))
            k += 1
    return "[" + ("^" if negated else "") + "".join(out) + "]"


def _glob_re2(glob: str) -> str:
    """One fnmatch glob (Python's meaning, case-sensitive) as an RE2 expression (unanchored)."""
    out, i, n = [], 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            while i < n and glob[i] == "*":
                i += 1
            out.append("(?s:.*)")
        elif c == "?":
            out.append("(?s:.)")
        elif c == "[":
            j = i  # find the end of the class exactly as fnmatch.translate does
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:
                out.append(_literal("["))
            else:
                translated = fnmatch.translate(glob[i - 1 : j + 1])  # '(?s:' + class + ')\\Z'
                out.append(_python_class(translated[len("(?s:") : -len(")\\Z")]))
                i = j + 1
        else:
            out.append(_literal(c))
    return "".join(out)


def glob_regex(globs: Sequence[str]) -> str:
    """An RE2 expression that matches a whole name exactly when one of `globs` matches it the way the
    policy's own matcher does (fnmatch, case-sensitive); "" for no globs (matches nothing)."""
    if not globs:
        return ""
    return "^(?:" + "|".join(_glob_re2(g) for g in globs) + ")$"


def _character_class(codes: Iterable[int]) -> str:
    """An RE2 class of these code points, runs written as ranges."""
    runs: list[list[int]] = []
    for c in sorted(codes):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return "[" + "".join(f"\\x{{{a:x}}}" + (f"-\\x{{{b:x}}}" if b > a else "") for a, b in runs) + "]"


# Python's str.strip() removes exactly the characters for which str.isspace() is true (none above U+3000).
PYTHON_SPACE = tuple(c for c in range(0x3001) if chr(c).isspace())
_PYTHON_SPACE = _character_class(PYTHON_SPACE)


def annotation_regex(pool: str) -> str:
    """An RE2 expression that matches an `egress-placer.io/pools` value exactly when the policy reads
    it as naming `pool` (comma-separated names, surrounding spaces ignored)."""
    return f"(^|,){_PYTHON_SPACE}*{''.join(_literal(c) for c in pool)}{_PYTHON_SPACE}*(,|$)"


def selector_text(selector: LabelSelector | None) -> str:
    """A label selector as the CEL reads it: requirements `key|Operator|v1,v2` joined by ';' (none of
    the three separators can appear in a label key or value); "" for no selector (matches nothing)."""
    if selector is None:
        return ""
    requirements = [f"{k}|In|{v}" for k, v in selector.match_labels.items()]
    requirements += [f"{r.key}|{r.operator}|{','.join(r.values)}" for r in selector.match_expressions]
    return ";".join(requirements)


def left_out(policy: PlacementPolicy) -> list[str]:
    """The namespaces the guard never judges: the exempt and the agent ones (sorted)."""
    return sorted({*policy.exempt_namespaces, *agent_namespaces(policy)})


# -- the params ---------------------------------------------------------------------------------------


def guard_params(policy: PlacementPolicy, nodes: Iterable[NodeState]) -> dict[str, str]:
    """The params ConfigMap's data for `policy` and the cluster's `nodes`.

    A node is a pool node as `policy.pool_of` says; a node a pool lists by name that is not (yet) in
    `nodes` counts as that bare name would (so it is guarded from the moment it joins)."""
    if len(policy.pools) > MAX_POOLS:
        raise GuardError(f"the pool guard takes at most {MAX_POOLS} pools; the policy has {len(policy.pools)}")
    data = {POOLS_KEY: ",".join(p.name for p in policy.pools), LEFT_OUT_KEY: ",".join(left_out(policy))}
    for pool in policy.pools:
        data[pool_key(pool.name, "TaintKey")] = pool.taint.key
        data[pool_key(pool.name, "TaintEffect")] = pool.taint.effect
        data[pool_key(pool.name, "Namespaces")] = glob_regex(pool.namespaces)
        data[pool_key(pool.name, "Selector")] = selector_text(pool.namespace_selector)
        data[pool_key(pool.name, "Annotation")] = annotation_regex(pool.name)
    known = {node.name: node for node in nodes}
    for name in sorted({*known, *(n for p in policy.pools for n in p.nodes)}):
        pool = policy.pool_of(known.get(name) or NodeState(name=name))
        if pool is not None:
            data[name] = pool.name
    return data


# -- the policy and its binding -------------------------------------------------------------------------

_TOLERATES = """(!has(t.effect) || t.effect == '' || t.effect == variables.data['Pool.' + p + '.TaintEffect'])
  && ((!has(t.key) || t.key == '')
    ? (has(t.operator) && t.operator == 'Exists')
    : (t.key == variables.data['Pool.' + p + '.TaintKey']
      && ((has(t.operator) && t.operator == 'Exists') || (has(t.value) ? t.value : '') == p)))"""

_REQUIRED_TERMS = "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"

_PINNED_OFF = f"""(has(object.spec.nodeName) && object.spec.nodeName != '' && variables.nodePool != p)
  || (variables.pinnedByName && {_REQUIRED_TERMS}.all(term,
    term.matchFields.exists(f, f.key == 'metadata.name' && f.operator == 'In' && has(f.values)
      && f.values.all(v, !(v in variables.data) || variables.data[v] != p))))"""

_REQUIREMENT = """r.split('|')[1] == 'Exists' ? r.split('|')[0] in variables.labels
  : r.split('|')[1] == 'DoesNotExist' ? !(r.split('|')[0] in variables.labels)
  : r.split('|')[1] == 'In'
    ? (r.split('|')[0] in variables.labels && variables.labels[r.split('|')[0]] in r.split('|')[2].split(','))
    : (!(r.split('|')[0] in variables.labels) || !(variables.labels[r.split('|')[0]] in r.split('|')[2].split(',')))"""

_ALLOWED = f"""(variables.data['Pool.' + p + '.Namespaces'] != ''
    && namespaceObject.metadata.name.matches(variables.data['Pool.' + p + '.Namespaces']))
  || variables.poolsAnnotation.matches(variables.data['Pool.' + p + '.Annotation'])
  || (variables.data['Pool.' + p + '.Selector'] != ''
    && variables.data['Pool.' + p + '.Selector'].split(';').all(r, {_REQUIREMENT}))"""

# (name, expression): evaluated lazily, in this order; each may use the ones before it.
VARIABLES: tuple[tuple[str, str], ...] = (
    ("data", "params == null || !has(params.data) ? {} : params.data"),
    (
        "leftOut",
        f"'{LEFT_OUT_KEY}' in variables.data && variables.data['{LEFT_OUT_KEY}'] != ''"
        f" && namespaceObject.metadata.name in variables.data['{LEFT_OUT_KEY}'].split(',')",
    ),
    ("pools", f"!variables.leftOut && '{POOLS_KEY}' in variables.data && variables.data['{POOLS_KEY}'] != '' ? variables.data['{POOLS_KEY}'].split(',') : []"),
    ("labels", "has(namespaceObject.metadata.labels) ? namespaceObject.metadata.labels : {}"),
    (
        "poolsAnnotation",
        f"has(namespaceObject.metadata.annotations) && '{NAMESPACE_POOLS_ANNOTATION}' in namespaceObject.metadata.annotations"
        f" ? namespaceObject.metadata.annotations['{NAMESPACE_POOLS_ANNOTATION}'] : ''",
    ),
    (
        "tolerated",
        f"has(object.spec.tolerations) ? variables.pools.filter(p, object.spec.tolerations.exists(t, {_TOLERATES})) : []",
    ),
    (
        "oldTolerated",
        "oldObject == null || !has(oldObject.spec.tolerations) ? []"
        f" : variables.pools.filter(p, oldObject.spec.tolerations.exists(t, {_TOLERATES}))",
    ),
    (
        "nodePool",
        "has(object.spec.nodeName) && object.spec.nodeName in variables.data ? variables.data[object.spec.nodeName] : ''",
    ),
    (
        "oldNodePool",
        "oldObject == null || !has(oldObject.spec.nodeName) || !(oldObject.spec.nodeName in variables.data) ? ''"
        " : variables.data[oldObject.spec.nodeName]",
    ),
    (
        "pinnedByName",
        "has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity)"
        " && has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution)"
        f" && size({_REQUIRED_TERMS}) > 0 && {_REQUIRED_TERMS}.all(term, has(term.matchFields))",
    ),
    (
        "reached",
        f"""variables.pools.filter(p,
  (p in variables.tolerated && !(p in variables.oldTolerated) && !({_PINNED_OFF}))
  || (variables.nodePool == p && variables.oldNodePool != p))""",
    ),
    ("refused", f"variables.reached.filter(p, !({_ALLOWED}))"),
)

# Kubelets' own requests (mirror pods of static pods, which the core never counts as intruders) are not
# judged: the API server's authenticator puts a kubelet in group system:nodes, no tenant can be there,
# and NodeRestriction lets a kubelet make only mirror pods bound to its own node.
MATCH_CONDITIONS: tuple[tuple[str, str], ...] = (
    ("not-a-kubelet", "!has(request.userInfo.groups) || !('system:nodes' in request.userInfo.groups)"),
)

VALIDATION_MESSAGE = (
    "'namespace ' + namespaceObject.metadata.name + ' may not use pool ' + variables.refused.join(', ')"
    " + ': its pods may neither tolerate the pool taint nor name a pool node (egress-placer pool guard)'"
)


def validating_admission_policy() -> dict[str, Any]:
    """The ValidatingAdmissionPolicy (the same for every policy: what differs lives in the params)."""
    return admission_policy(
        GUARD_NAME,
        [resource_rule([""], ["CREATE", "UPDATE"], ["pods"], versions=["v1"])],
        MATCH_CONDITIONS,
        [validation("size(variables.refused) == 0", message_expression=VALIDATION_MESSAGE)],
        variables=VARIABLES,
        param_kind="ConfigMap",
    )


def policy_binding(namespace: str) -> dict[str, Any]:
    """The binding (static): params from ConfigMap `GUARD_NAME` in `namespace` (the controller's), every
    namespace; the ones the params leave out (`LEFT_OUT_KEY`) are never judged."""
    return binding(GUARD_NAME, params=param_ref(GUARD_NAME, namespace, "Allow"))
