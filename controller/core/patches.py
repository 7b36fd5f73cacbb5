"""The placement written into a pod-spec-like object (a Tekton podTemplate or a Pod's spec), its
removal, and the RFC 6902 JSON patch an admission response carries.

`place` touches only `tolerations` and `affinity.nodeAffinity`, never `nodeSelector`: Tekton
replaces that map whole when it merges pod templates, so a key written there could wipe or be
wiped by the user's own. `unplace` does remove `nodeSelector` entries on pool label keys: a pod
that may not use a pool would otherwise wait forever for a node it may not have.

Shapes written (Kubernetes NodeSelectorTerm): the pool constraint is "all selector labels" OR
"metadata.name is one of the listed nodes". Label requirements go in `matchExpressions` as
`key In [value]`; node names go in `matchFields` as `metadata.name In [name]`, ONE name per term,
because the API server refuses a node field selector `In` with more than one value
(`validateNodeFieldSelectorRequirement`: "must be only one value ..."). Hence a pool is a list
of alternative terms (`pool_terms`).

`by_hostname`: the listed nodes as ONE requirement instead, `kubernetes.io/hostname In [names]`,
which the scheduler reads as the same nodes while every node's hostname label is its name (the
kubelet's default; `ClusterState.hostnames_are_names` says when, and admission passes it). A
ten-node list then costs the API server one requirement to apply and store, not ten terms (#24:
0.13 ms of every TaskRun's webhook call, measured with the Go floor answering each patch). Either
shape is recognised as the pool's when a template is stripped (`unplace`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import yaml

from controller.core.json_wire import is_object
from controller.core.model import DO_NOT_DISRUPT_ANNOTATION, HOSTNAME_LABEL, POOL_PREFERENCE_WEIGHT, PREFERRED_NODE_WEIGHT, Taint
from controller.core.policy import PlacementPolicy, Pool

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
NODE_NAME_FIELD = "metadata.name"
_KINDS = ("matchExpressions", "matchFields")

Term = dict[str, Any]  # a NodeSelectorTerm
Requirement = Mapping[str, Any]  # a NodeSelectorRequirement


def pool_terms(pool: Pool, by_hostname: bool = False) -> list[Term]:
    """The pool constraint as ORed node selector terms: one for the label selector (labels ANDed),
    then one per listed node name, or, `by_hostname`, one for all of them (`kubernetes.io/hostname In
    [names]`: see the module docstring). Empty when the pool names neither."""
    terms: list[Term] = []
    if pool.node_selector:
        terms.append(
            {
                "matchExpressions": [
                    {"key": k, "operator": "In", "values": [v]} for k, v in sorted(pool.node_selector.items())
                ]
            }
        )
    return terms + _listed_terms(pool, by_hostname)


def _listed_terms(pool: Pool, by_hostname: bool) -> list[Term]:
    """The terms of the pool's listed nodes (`pool_terms`): one per name, or one by hostname for all."""
    names = list(dict.fromkeys(pool.nodes))
    if by_hostname and names:
        return [{"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": names}]}]
    return [{"matchFields": [_node_name_requirement(name)]} for name in names]


def protection(pool: str | None) -> dict[str, str]:
    """The annotations a run's pod placed on `pool` gets (None: not placed, none): Karpenter's
    `karpenter.sh/do-not-disrupt: "true"`, so that consolidation does not evict an upload halfway.
    Every placed pod gets it, whether or not the pool is provisioned by Karpenter: pool nodes that
    Karpenter manages without provisioning for the pool are consolidated too, and without Karpenter
    the annotation is inert. A finished pod does not hold its node (Karpenter ignores terminal pods),
    so nothing is removed after the run. A tenant may write it on its own pods: that protects only
    their node, and nothing here reads it."""
    return {DO_NOT_DISRUPT_ANNOTATION: "true"} if pool else {}


def node_preference(node: str) -> dict[str, Any]:
    """The preferred-node term egress-placer writes for the node the pool's load index picked."""
    return {"weight": PREFERRED_NODE_WEIGHT, "preference": {"matchFields": [_node_name_requirement(node)]}}


def place(template: Mapping[str, Any] | None, pool: Pool, node: str | None, by_hostname: bool = False) -> dict[str, Any]:
    """A new template that sends the pod to `pool` (and prefers `node`), keeping the user's own
    constraints. Idempotent: placing a placed template changes nothing.

    - the pool's toleration is appended unless an identical one is there;
    - `required`: every existing required term (terms are ORed) is ANDed with each pool
      alternative; a term that already holds a whole alternative is left as is, and so is an
      empty term (it matches no node, with or without the pool); no terms: one per alternative;
    - `preferred`: one preference of weight POOL_PREFERENCE_WEIGHT per alternative, unless present
      (a node both labelled and listed by name gets both weights);
    - the preferred-node term egress-placer wrote before (weight PREFERRED_NODE_WEIGHT and exactly
      one `metadata.name In [x]` field, nothing else) is dropped and, when `node` is given, replaced.

    The pool's listed nodes in the other shape than `by_hostname` says (a run placed before the shape
    changed: `unplace` keeps both) are taken out first, so the result has this shape only: while a
    hostname label differs from its node's name the two are not the same nodes, and both ANDed could
    match none.

    Constraints of OTHER pools are not removed here: call `unplace(t, policy, keep_pool=pool.name)` first.
    """
    new: dict[str, Any] = copy_json(dict(template or {}))
    _add_toleration(new, pool.toleration())

    affinity = dict(new.get("affinity") or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    alternatives = pool_terms(pool, by_hostname)
    other = _identities(_listed_terms(pool, not by_hostname))

    if pool.placement == "required" and alternatives:
        selector = dict(node_affinity.get(REQUIRED) or {})
        stripped = [_without(term, other) for term in selector.get("nodeSelectorTerms") or []]
        terms = _constrain([t for t in stripped if t is not None], alternatives)
        if None in stripped:  # a term that was only one of the pool's nodes (no term of the user's): the alternatives
            terms += [a for a in alternatives if a not in terms]
        selector["nodeSelectorTerms"] = terms
        node_affinity[REQUIRED] = selector

    preferences = [
        p for p in node_affinity.get(PREFERRED) or []
        if not _is_node_preference(p)
        and not (p.get("weight") == POOL_PREFERENCE_WEIGHT and _without(p.get("preference") or {}, other) is None)
    ]
    if pool.placement == "preferred":
        for alternative in alternatives:
            entry = {"weight": POOL_PREFERENCE_WEIGHT, "preference": alternative}
            if not any(_same_preference(entry, p) for p in preferences):
                preferences.append(entry)
    if node is not None:
        preferences.append(node_preference(node))
    if preferences:
        node_affinity[PREFERRED] = preferences
    elif node_affinity.get(PREFERRED):  # it held only our old preferred-node term
        del node_affinity[PREFERRED]

    if node_affinity or "nodeAffinity" in affinity:
        affinity["nodeAffinity"] = node_affinity
    if affinity or "affinity" in new:
        new["affinity"] = affinity
    return new


def unplace(
    template: Mapping[str, Any] | None, policy: PlacementPolicy, keep_pool: str | None = None
) -> dict[str, Any]:
    """A new template without what would let the pod onto a pool, except pool `keep_pool`.

    Tolerations removed:
    - any toleration with an owned taint key (any operator, any value), except the `Equal`
      toleration of `keep_pool`'s own taint;
    - a toleration with no key and operator Exists (it tolerates every taint) when it tolerates
      the taint of any pool other than `keep_pool`. The pod then also loses the foreign taints it
      covered: a pod must not reach a pool without admission, and no toleration can say
      "everything but the pools".
    `nodeSelector` entries on a label key any pool selects on, except those `keep_pool` itself selects.
    Node affinity requirements removed (required terms and preferences):
    - expressions on a label key any pool selects on (the user's `zone NotIn` on a pool key too),
    - `metadata.name` fields naming a node a pool lists, and `kubernetes.io/hostname` expressions naming
      one (either shape of a pool's list, `pool_terms`),
    - egress-placer's preferred-node term (recognised by weight and shape),
    except the exact requirements `place` writes for `keep_pool`, in either shape (a run placed before
    the shape changed keeps its pool; `place` then writes its own shape instead). A term or preference
    emptied by this is dropped (an emptied term would match nothing, a dropped one leaves the others),
    and so are containers it empties. Nodes a pool claims only by label cannot be recognised by name.
    An unknown `keep_pool` keeps nothing.
    """
    new: dict[str, Any] = copy_json(dict(template or {}))
    keep = policy.pool(keep_pool) if keep_pool else None
    targets = _PoolTargets(policy, keep)
    if new.get("tolerations"):
        _set_or_drop(new, "tolerations", [t for t in new["tolerations"] if not _strips_toleration(t, policy, keep)])
    if new.get("nodeSelector"):
        _set_or_drop(new, "nodeSelector", targets.kept_node_selector(new["nodeSelector"], keep))
    affinity: dict[str, Any] = new.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity:
        _strip_node_affinity(node_affinity, targets)
        _set_or_drop(affinity, "nodeAffinity", node_affinity)
        _set_or_drop(new, "affinity", affinity)
    return new


def _set_or_drop(container: dict[str, Any], key: str, value: Any) -> None:
    """`container[key] = value`, or no `key` at all when `value` is empty."""
    if value:
        container[key] = value
    else:
        container.pop(key, None)


def _strip_node_affinity(node_affinity: dict[str, Any], targets: "_PoolTargets") -> None:
    """Pool requirements out of the required terms and the preferences (see `unplace`), in place."""
    selector = node_affinity.get(REQUIRED)
    if selector and selector.get("nodeSelectorTerms"):
        terms: list[Term] = []
        for term in selector["nodeSelectorTerms"]:
            stripped, changed = targets.strip(term)
            if (_has_requirements(stripped) or not changed) and stripped not in terms:
                terms.append(stripped)
        if terms:
            selector["nodeSelectorTerms"] = terms
        else:
            del node_affinity[REQUIRED]
    if node_affinity.get(PREFERRED):
        kept_preferences = []
        for entry in node_affinity[PREFERRED]:
            if _is_node_preference(entry):
                continue
            stripped, changed = targets.strip(entry.get("preference") or {})
            if _has_requirements(stripped) or not changed:
                kept_preferences.append({**entry, "preference": stripped})
        _set_or_drop(node_affinity, PREFERRED, kept_preferences)


def json_patch(old: Any, new: Any, base: str) -> list[dict[str, Any]]:
    """RFC 6902 operations turning the value at JSON pointer `base` of the admitted object from
    `old` into `new`. `base` is an escaped JSON pointer ("" for the whole object, else "/a/b").

    Whole members: where both sides are objects, a member only one side has is removed or added, and a
    member both have that differs is compared the same way; any other value that differs (an array, a
    scalar, an object against anything else) is replaced whole. No diff inside arrays: the patch is a
    little larger than a minimal diff and costs a fraction of one (a placed pod's spec differs in its
    preferred node only), and the patched object is the same (tests/unit/test_patches.py).

    `old` None means absent: one `add` of the whole `new` at `base`; every parent of `base` must
    exist already (the caller adds missing parents first, e.g. `{"op": "add", "path": "/spec/podTemplate"}`).

    The operations' values are `new`'s own members, not copies (#24: a copy of a placed template was a
    seventh of a review): a patch is serialized (`review_response`), never changed in place, and `new`
    may be shared (a memoised template).
    """
    if base and not base.startswith("/"):
        raise ValueError(f"not a JSON pointer: {base!r}")
    if old is None:
        return [{"op": "add", "path": base, "value": new}]
    if _same_json(old, new):  # the common answer (a run's pod keeps its node): one comparison in C
        return []
    ops: list[dict[str, Any]] = []
    _member_ops(old, new, base, ops)
    return ops


def _member_ops(old: Any, new: Any, path: str, ops: list[dict[str, Any]]) -> None:
    """Append to `ops` what turns `old` into `new` at `path` (see `json_patch`)."""
    if type(old) is not dict or type(new) is not dict:
        if not _same_json(old, new):
            ops.append({"op": "replace", "path": path, "value": new})
        return
    for key in old:
        if key not in new:
            ops.append({"op": "remove", "path": f"{path}/{_escaped(key)}"})
    for key, value in new.items():
        if key not in old:
            ops.append({"op": "add", "path": f"{path}/{_escaped(key)}", "value": value})
        elif not _same_json(old[key], value):
            _member_ops(old[key], value, f"{path}/{_escaped(key)}", ops)


def _escaped(key: str) -> str:
    """One reference token of a JSON pointer (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1") if "~" in key or "/" in key else key


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value (dicts, lists, scalars) at a third of `copy.deepcopy`'s cost; anything
    else is copied by `copy.deepcopy`."""
    kind = type(value)
    if kind is dict:
        return {k: copy_json(v) for k, v in value.items()}
    if kind is list:
        return [copy_json(v) for v in value]
    if kind in _SCALARS:
        return value
    return copy.deepcopy(value)


def _same_json(a: Any, b: Any) -> bool:
    """Are `a` and `b` the same JSON (no patch between them)? Unlike `==`, 1, 1.0 and true differ, as
    they do for JSON; anything but dicts, lists and scalars counts as changed (False). `==` first (in
    C: values it finds different are), then their JSON texts, keys sorted (in C too)."""
    kind = type(a)
    if kind is not type(b):
        return False
    if kind in _SCALARS:
        return a == b
    if (kind is not dict and kind is not list) or a != b:
        return False
    try:
        return orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(b, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # not plain JSON inside (or integers beyond 64 bits): member by member
        return _same_members(a, b)


def _same_members(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same_members(v, b[k]) for k, v in a.items())
    if type(a) is list:
        return len(a) == len(b) and all(map(_same_members, a, b))
    return type(a) in _SCALARS and a == b


_SCALARS = (str, int, float, bool, type(None))


# --- tolerations -------------------------------------------------------------------------


def _toleration_identity(t: Mapping[str, Any]) -> tuple[str, str, str, str, Any]:
    return (
        t.get("key") or "",
        t.get("operator") or "Equal",
        t.get("value") or "",
        t.get("effect") or "",
        t.get("tolerationSeconds"),
    )


def _add_toleration(spec: dict[str, Any], toleration: Mapping[str, Any]) -> None:
    tolerations = list(spec.get("tolerations") or [])
    if not any(_toleration_identity(t) == _toleration_identity(toleration) for t in tolerations):
        tolerations.append(dict(toleration))
    spec["tolerations"] = tolerations


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """The Kubernetes rule: does `toleration` tolerate `taint`?"""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.key:
        return False
    return operator == "Exists" or (toleration.get("value") or "") == (taint.value or "")


def _strips_toleration(toleration: Mapping[str, Any], policy: PlacementPolicy, keep: Pool | None) -> bool:
    key = toleration.get("key") or ""
    if key in policy.owned_taint_keys():
        return not (
            keep is not None
            and (toleration.get("operator") or "Equal") == "Equal"
            and tolerates(toleration, keep.taint_for())
        )
    if not key:
        return any(tolerates(toleration, p.taint_for()) for p in policy.pools if keep is None or p.name != keep.name)
    return False


# --- node selector terms ------------------------------------------------------------------


def _identities(terms: list[Term]) -> frozenset[tuple[str, str, tuple[str, ...]]]:
    """The identities of every requirement of `terms`."""
    return frozenset(_requirement_identity(r) for term in terms for kind in _KINDS for r in term.get(kind) or ())


def _without(term: Mapping[str, Any], identities: frozenset[tuple[str, str, tuple[str, ...]]]) -> Term | None:
    """`term` without the requirements of these identities (`term` itself when it has none of them); None
    when that leaves nothing of a term that had some (dropped: an empty term matches no node)."""
    if not identities:
        return term  # type: ignore[return-value]
    out, changed = _term_without(term, lambda kind, r: _requirement_identity(r) in identities)
    if not changed:
        return term  # type: ignore[return-value]
    return out if _has_requirements(out) else None


def _term_without(term: Mapping[str, Any], drop: Callable[[str, Requirement], bool]) -> tuple[Term, bool]:
    """`term` without the requirements `drop(kind, requirement)` says, and whether it removed any."""
    out: Term = dict(term)
    changed = False
    for kind in _KINDS:
        requirements = term.get(kind)
        if not requirements:
            continue
        kept = [r for r in requirements if not drop(kind, r)]
        if len(kept) != len(requirements):
            changed = True
            if kept:
                out[kind] = kept
            else:
                del out[kind]
    return out, changed


def _node_name_requirement(node: str) -> dict[str, Any]:
    return {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}


def _requirement_identity(r: Requirement) -> tuple[str, str, tuple[str, ...]]:
    return (r.get("key") or "", r.get("operator") or "", tuple(sorted(r.get("values") or ())))


def _has_requirements(term: Mapping[str, Any]) -> bool:
    return any(term.get(kind) for kind in _KINDS)


def _includes(term: Mapping[str, Any], part: Mapping[str, Any]) -> bool:
    """Does `term` already require everything `part` requires?"""
    for kind in _KINDS:
        present = {_requirement_identity(r) for r in term.get(kind) or ()}
        if any(_requirement_identity(r) not in present for r in part.get(kind) or ()):
            return False
    return True


def _conjoin(term: Mapping[str, Any], part: Mapping[str, Any]) -> Term:
    """`term` AND `part`, without repeating a requirement `term` already has."""
    out: Term = copy_json(dict(term))
    for kind in _KINDS:
        for requirement in part.get(kind) or ():
            present = {_requirement_identity(r) for r in out.get(kind) or ()}
            if _requirement_identity(requirement) not in present:
                out[kind] = [*(out.get(kind) or []), copy_json(dict(requirement))]
    return out


def _constrain(terms: list[Term], alternatives: list[Term]) -> list[Term]:
    """(t1 OR t2 ...) AND (a1 OR a2 ...), distributed, without duplicate terms."""
    if not terms:
        return copy_json(alternatives)
    out: list[Term] = []
    for term in terms:
        if not _has_requirements(term) or any(_includes(term, a) for a in alternatives):
            candidates = [term]
        else:
            candidates = [_conjoin(term, a) for a in alternatives]
        out.extend(c for c in candidates if c not in out)
    return out


def _same_preference(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    pa, pb = a.get("preference") or {}, b.get("preference") or {}
    return a.get("weight") == b.get("weight") and _includes(pa, pb) and _includes(pb, pa)


def _is_node_preference(entry: Mapping[str, Any]) -> bool:
    """Is this the preferred-node term egress-placer writes (weight and shape)?"""
    preference = entry.get("preference") or {}
    fields = preference.get("matchFields") or []
    return (
        entry.get("weight") == PREFERRED_NODE_WEIGHT
        and not preference.get("matchExpressions")
        and set(preference) <= set(_KINDS)
        and len(fields) == 1
        and fields[0].get("key") == NODE_NAME_FIELD
        and fields[0].get("operator") == "In"
        and len(fields[0].get("values") or ()) == 1
    )


class _PoolTargets:
    """Which node selector requirements are about pool membership, and which belong to the kept pool."""

    def __init__(self, policy: PlacementPolicy, keep: Pool | None) -> None:
        self.label_keys = {k for p in policy.pools for k in p.node_selector}
        self.node_names = {n for p in policy.pools for n in p.nodes}
        self.kept = _identities([*pool_terms(keep), *_listed_terms(keep, by_hostname=True)]) if keep else frozenset()

    def kept_node_selector(self, node_selector: Mapping[str, str], keep: Pool | None) -> dict[str, str]:
        """The entries on no pool's label key, and those the kept pool itself selects on."""
        return {
            k: v
            for k, v in node_selector.items()
            if k not in self.label_keys or (keep is not None and keep.node_selector.get(k) == v)
        }

    def targets_pool(self, kind: str, r: Requirement) -> bool:
        if _requirement_identity(r) in self.kept:
            return False
        key = r.get("key")
        if kind == "matchExpressions" and key in self.label_keys:
            return True
        # A node name, in either shape of a pool's list: a field, or the hostname label (`pool_terms`).
        by_name = key == (HOSTNAME_LABEL if kind == "matchExpressions" else NODE_NAME_FIELD)
        return by_name and bool(self.node_names.intersection(r.get("values") or ()))

    def strip(self, term: Mapping[str, Any]) -> tuple[Term, bool]:
        """`term` without pool requirements, and whether anything was removed."""
        return _term_without(term, self.targets_pool)


# --- Tekton's default pod template -----------------------------------------------------------------

# The fields placement reads and writes. Tekton merges the `default-pod-template` of its config-defaults
# ConfigMap under a run's own podTemplate field by field (`pod.MergePodTemplateWithDefault`, v1.15.0):
# a field the run sets (even to an empty list or map) replaces the default's whole, a field it leaves
# unset (absent or null) is the default's. Only `env` and `volumes` merge by name; placement touches neither.
DEFAULTED_FIELDS = ("nodeSelector", "tolerations", "affinity")
_EMPTY: dict[str, Any] = {"nodeSelector": {}, "tolerations": [], "affinity": {}}


def with_default(template: Mapping[str, Any] | None, default: Mapping[str, Any] | None) -> dict[str, Any]:
    """`template` as Tekton reads it for the fields placement touches: each field the run leaves
    unset is the default's (a copy). No default: a copy of `template`."""
    new: dict[str, Any] = copy_json(dict(template or {}))
    for name in DEFAULTED_FIELDS:
        if new.get(name) is None and (default or {}).get(name) is not None:
            new[name] = copy_json(default[name])  # type: ignore[index]
    return new


def left_to_default(
    new: Mapping[str, Any], template: Mapping[str, Any] | None, default: Mapping[str, Any] | None
) -> dict[str, Any]:
    """`new`, computed from `with_default(template, default)`, as the run's own template again.

    A field the run did not set and placement left as the default has it is dropped again (Tekton
    fills it in, and a later change of the default still reaches the run); one placement changed is
    written whole (the default's entries plus the pool's: Tekton would otherwise drop the default's);
    one placement emptied is written empty, so Tekton does not bring the default's back.
    """
    out = dict(new)
    for name in DEFAULTED_FIELDS:
        default_value = (default or {}).get(name)
        if (template or {}).get(name) is not None or default_value is None:
            continue
        if out.get(name) is None:
            if default_value:
                out[name] = copy_json(_EMPTY[name])
            else:
                out.pop(name, None)
        elif out[name] == default_value:
            del out[name]
    return out


def over_default(
    template: Mapping[str, Any] | None,
    default: Mapping[str, Any] | None,
    change: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """`change` (e.g. place or unplace) applied to the template as Tekton will read it, written back
    as the run's own template: what the default gives is kept, the run's own fields too."""
    return left_to_default(change(with_default(template, default)), template, default)


def placement_fields(template: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `template` that `place`, `unplace` and `over_default` read and write (DEFAULTED_FIELDS,
    those present): what a placed template is computed from (`with_placement`)."""
    return {name: template[name] for name in DEFAULTED_FIELDS if name in template}


def _preferences(template: Any) -> tuple[Any, Any, Any]:
    """(affinity, nodeAffinity, its preferred terms) of `template`, each None where it is not there (or not
    the shape it should have)."""
    affinity = template.get("affinity") if is_object(template) else None
    node_affinity = affinity.get("nodeAffinity") if is_object(affinity) else None
    preferences = node_affinity.get(PREFERRED) if is_object(node_affinity) else None
    return affinity, node_affinity, preferences if isinstance(preferences, list) else None


def preferred_node(template: Any) -> str | None:
    """The node egress-placer's preferred-node term in `template` names (a Tekton pod carries its TaskRun's:
    the node admission gave the run), None when there is none. Anyone can write such a term: it is a hint
    among equally loaded nodes, never a reason to place."""
    for entry in _preferences(template)[2] or ():
        preference = entry.get("preference") if is_object(entry) else None
        fields = preference.get("matchFields") if is_object(preference) else None
        if not (isinstance(fields, list) and len(fields) == 1 and is_object(fields[0])):
            continue
        values = fields[0].get("values")
        if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str) and values[0] and _is_node_preference(entry):
            return values[0]
    return None


def placement_key(template: Mapping[str, Any]) -> dict[str, Any]:
    """`placement_fields(template)` with the node of egress-placer's preferred-node term left out (its one
    value made ""): `place` and `unplace` drop that term by its shape, whatever node it names, so what they
    give is the same. A Tekton pod carries its TaskRun's term (the node admission preferred for the run), and
    the pods of a burst are then keyed alike, whichever node each TaskRun got. Copies only along that path."""
    fields = placement_fields(template)
    affinity, node_affinity, preferences = _preferences(fields)
    if preferences is None or not any(is_object(p) and _is_node_preference(p) for p in preferences):
        return fields
    assert is_object(affinity) and is_object(node_affinity)
    blank = [node_preference("") if is_object(p) and _is_node_preference(p) else p for p in preferences]
    return {**fields, "affinity": {**affinity, "nodeAffinity": {**node_affinity, PREFERRED: blank}}}


def with_placement(template: Mapping[str, Any], placed: Mapping[str, Any]) -> dict[str, Any]:
    """`template` with the placement fields of `placed`, computed from `placement_fields(template)` alone
    (e.g. by `over_default`): the same template, in the same order, as that computation over the whole
    template gives, since it changes nothing else. A pod's spec (containers, volumes, each run's own) is
    then not copied, and what is computed depends on the placement fields only."""
    out = {name: value for name, value in template.items() if name not in DEFAULTED_FIELDS or name in placed}
    for name, value in placed.items():
        out[name] = value
    return out


class InvalidDefault(ValueError):
    """The default pod template cannot be read (the message says where)."""


def default_pod_template(text: str | None) -> dict[str, Any] | None:
    """The placement fields of Tekton's `default-pod-template` (YAML text), checked for shape; None
    when there is none. Raises InvalidDefault on YAML that is not a pod template of that shape (Tekton
    itself refuses such a ConfigMap)."""
    if text is None or not text.strip():
        return None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidDefault(f"not YAML: {e}") from e
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise InvalidDefault("not a mapping")
    out = {name: doc[name] for name in DEFAULTED_FIELDS if doc.get(name) is not None}
    node_selector = out.get("nodeSelector")
    if node_selector is not None and not (
        isinstance(node_selector, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in node_selector.items())
    ):
        raise InvalidDefault("nodeSelector: not a map of strings")
    _check_list_of_maps(out.get("tolerations"), "tolerations")
    affinity = out.get("affinity")
    if affinity is not None:
        _check_map(affinity, "affinity")
        node_affinity = affinity.get("nodeAffinity")
        if node_affinity is not None:
            _check_map(node_affinity, "affinity.nodeAffinity")
            required = node_affinity.get(REQUIRED)
            if required is not None:
                _check_map(required, f"affinity.nodeAffinity.{REQUIRED}")
                _check_terms(required.get("nodeSelectorTerms"), f"{REQUIRED}.nodeSelectorTerms")
            preferences = node_affinity.get(PREFERRED)
            _check_list_of_maps(preferences, PREFERRED)
            for i, entry in enumerate(preferences or ()):
                _check_terms([entry.get("preference") or {}], f"{PREFERRED}[{i}].preference")
    return out


def _check_map(value: Any, where: str) -> None:
    if not isinstance(value, Mapping):
        raise InvalidDefault(f"{where}: not a map")


def _check_list_of_maps(value: Any, where: str) -> None:
    if value is not None and not (isinstance(value, list) and all(isinstance(v, Mapping) for v in value)):
        raise InvalidDefault(f"{where}: not a list of maps")


def _check_terms(terms: Any, where: str) -> None:
    _check_list_of_maps(terms, where)
    for i, term in enumerate(terms or ()):
        for kind in _KINDS:
            _check_list_of_maps(term.get(kind), f"{where}[{i}].{kind}")
            for r in term.get(kind) or ():
                if not isinstance(r.get("values") or [], list):
                    raise InvalidDefault(f"{where}[{i}].{kind}: values is not a list")
