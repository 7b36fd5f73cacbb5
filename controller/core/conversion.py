"""Conversion between the pools API's versions, `v1alpha1` and `v1beta1` (docs/pools-api.md, "v1beta1").

Pure: an object (a mapping, as the API server sends it in a ConversionReview) in, the same object in
the other version out; nothing read, nothing remembered. Lossless both ways: `to_version(to_version(o,
v1beta1), v1alpha1) == o` for every object the API server hands over (its defaults applied, so an
EgressPool's `spec.priority` is there), and the other way round.

What changes (each a table below, so that the mapping, its inverse and the docs' table stay one):
- an EgressPool's `spec.priority` turns over: `v1alpha1` is lower-first, `v1beta1` higher-first, as
  `queue.priorities[].priority` is in both: `v1beta1 = MAX_PRIORITY - v1alpha1`, its own inverse;
- renamed fields: `spec.capacity` -> `spec.loadCapacityPerNode`, `spec.queue.runsPerNode` ->
  `spec.queue.maxRunsPerNode`, and in the status `load.capacity` -> `load.loadCapacity`,
  `load.mostLoaded[].capacity` -> `load.mostLoaded[].loadCapacity`.
Everything else is copied as it is. `convert_review` answers a ConversionReview (apiextensions.k8s.io/v1)
with the converted objects, or with a Failure naming the object that could not be converted.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

GROUP = "egress-placer.io"
V1ALPHA1 = f"{GROUP}/v1alpha1"
V1BETA1 = f"{GROUP}/v1beta1"
VERSIONS = (V1ALPHA1, V1BETA1)
POOL_KIND = "EgressPool"
CONFIG_KIND = "EgressPlacerConfig"
# The range of an EgressPool's spec.priority in both versions; the flip maps it onto itself.
MAX_PRIORITY = 1_000_000

# (path in v1alpha1, path in v1beta1), per kind; a "[]" step is every item of a list.
Path = tuple[str, ...]
RENAMES: dict[str, tuple[tuple[Path, Path], ...]] = {
    POOL_KIND: (
        (("spec", "capacity"), ("spec", "loadCapacityPerNode")),
        (("spec", "queue", "runsPerNode"), ("spec", "queue", "maxRunsPerNode")),
        (("status", "load", "capacity"), ("status", "load", "loadCapacity")),
        (("status", "load", "mostLoaded", "[]", "capacity"), ("status", "load", "mostLoaded", "[]", "loadCapacity")),
    ),
    CONFIG_KIND: (),
}
# Fields whose direction turns over between the versions: v1beta1 = MAX_PRIORITY - v1alpha1 (and back).
FLIPPED: dict[str, tuple[Path, ...]] = {POOL_KIND: (("spec", "priority"),), CONFIG_KIND: ()}
# What a flipped field is when it is left out, in either version (the API server's default).
FLIPPED_DEFAULT = 0


class ConversionError(ValueError):
    """The object cannot be converted (not one of the API's kinds or versions, or a field of the wrong type)."""


def to_version(obj: Mapping[str, Any], version: str) -> dict[str, Any]:
    """`obj` (an EgressPool or EgressPlacerConfig of either version) as an object of `version`
    (`egress-placer.io/v1alpha1` or `/v1beta1`). The same version: a copy."""
    if version not in VERSIONS:
        raise ConversionError(f"cannot convert to {version!r}: the versions are {', '.join(VERSIONS)}")
    kind, source = obj.get("kind"), obj.get("apiVersion")
    if kind not in RENAMES:
        raise ConversionError(f"cannot convert a {kind!r}: the kinds are {POOL_KIND}, {CONFIG_KIND}")
    if source not in VERSIONS:
        raise ConversionError(f"cannot convert from {source!r}: the versions are {', '.join(VERSIONS)}")
    out = copy.deepcopy(dict(obj))
    out["apiVersion"] = version
    if source == version:
        return out
    forward = version == V1BETA1
    for path in FLIPPED[kind]:
        _flip(out, path)
    for alpha, beta in RENAMES[kind]:
        old, new = (alpha, beta) if forward else (beta, alpha)
        _rename(out, old, new)
    return out


def _flip(obj: dict[str, Any], path: Path) -> None:
    """MAX_PRIORITY - value at `path`. A value left out is the source version's default (0 in both:
    first in v1alpha1, last in v1beta1), which is not the other's: it is written, turned over."""
    *parents, leaf = path
    parent = _walk(obj, tuple(parents), create=True)
    if parent is None:
        return
    if leaf not in parent:
        parent[leaf] = FLIPPED_DEFAULT
    value = parent[leaf]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConversionError(f"{'.'.join(path)}: expected an integer, got {value!r}")
    parent[leaf] = MAX_PRIORITY - value


def _walk(obj: dict[str, Any], path: Path, create: bool = False) -> dict[str, Any] | None:
    """The mapping at `path` (no "[]" step), or None when some step is missing (created when asked)."""
    node: Any = obj
    for step in path:
        if not isinstance(node, dict):
            return None
        if step not in node and create:
            node[step] = {}
        node = node.get(step)
    return node if isinstance(node, dict) else None


def _rename(node: Any, old: Path, new: Path) -> None:
    """Move the value at `old` to `new` (the same parents; "[]" walks every item of a list)."""
    if old[:-1] != new[:-1]:
        raise ConversionError(f"a rename moves a field within its parent only: {old} -> {new}")
    *parents, leaf = old
    for parent in _parents(node, tuple(parents)):
        if leaf in parent:
            parent[new[-1]] = parent.pop(leaf)


def _parents(node: Any, path: Path) -> list[dict[str, Any]]:
    if not path:
        return [node] if isinstance(node, dict) else []
    step, rest = path[0], path[1:]
    if step == "[]":
        return [p for item in node for p in _parents(item, rest)] if isinstance(node, list) else []
    return _parents(node.get(step), rest) if isinstance(node, dict) else []


def convert_review(review: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to a ConversionReview (apiextensions.k8s.io/v1): every object of the request in
    `desiredAPIVersion`, or a Failure naming the first object that could not be (then none is
    converted, as the API server expects)."""
    request = review.get("request") if isinstance(review, Mapping) else None
    if not isinstance(request, Mapping):
        raise ConversionError("not a ConversionReview: no request")
    uid = request.get("uid", "")
    desired = request.get("desiredAPIVersion")
    objects = request.get("objects") or []
    response: dict[str, Any] = {"uid": uid}
    try:
        if not isinstance(objects, list):
            raise ConversionError("request.objects: expected a list")
        converted = []
        for i, obj in enumerate(objects):
            if not isinstance(obj, Mapping):
                raise ConversionError(f"request.objects[{i}]: expected an object")
            try:
                converted.append(to_version(obj, str(desired)))
            except ConversionError as e:
                name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), Mapping) else None
                raise ConversionError(f"{obj.get('kind')} {name or '(no name)'}: {e}") from None
        response["convertedObjects"] = converted
        response["result"] = {"status": "Success"}
    except ConversionError as e:
        response["convertedObjects"] = []
        response["result"] = {"status": "Failure", "message": str(e)}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "response": response}


def path_in(kind: str, version: str, loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """`loc`, a field's place in the v1alpha1 object, as its place in an object of `version` (a list
    index matches a "[]" step): what a message names, so that each version names its own field."""
    if version != V1BETA1:
        return loc
    out = list(loc)
    for alpha, beta in RENAMES.get(kind, ()):
        if len(out) >= len(alpha) and all(s == "[]" and isinstance(p, int) or s == p for s, p in zip(alpha, out)):
            out[len(alpha) - 1] = beta[-1]
    return tuple(out)


def status_in(kind: str, version: str, status: Mapping[str, Any]) -> dict[str, Any]:
    """A `v1alpha1` status (what controller/pool_status computes) as the status of an object of `version`."""
    return to_version({"apiVersion": V1ALPHA1, "kind": kind, "status": dict(status)}, version)["status"]
