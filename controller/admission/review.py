"""The AdmissionReview v1 envelope and the JSON patches the handlers answer with, shared by every
admitted kind: `parse_review` checks a request's shape (MalformedReview: HTTP 400), `review_response`
allows the object with its patch, `ops_at` and `annotation_ops` build RFC 6902 operations that add
missing parents. `decode` and `encode` are the JSON of the wire (controller.core.json_wire)."""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controller.core.json_wire import decode, encode, is_object
from controller.core.model import OwnerRef, owner_refs
from controller.core.patches import json_patch

ADMISSION_API_VERSION = "admission.k8s.io/v1"


class MalformedReview(ValueError):
    """The body is not an AdmissionReview v1 request this webhook can answer (HTTP 400)."""


Patch = list[dict[str, Any]]


class _once:
    """A property computed at its first read and then kept in the instance's __dict__ (which later reads
    find first): functools.cached_property without the lock it takes on every first read in Python 3.11."""

    def __init__(self, compute: Callable[[Any], Any]) -> None:
        self.compute, self.name = compute, compute.__name__

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


class Request:
    """The parts of an AdmissionReview request the handlers use, checked for shape (`parse_review`). What
    is read from the object is read once (the object is never changed). A plain class: built once per
    review on the cold path (#24), where a frozen dataclass's `object.__setattr__` per field showed."""

    __slots__ = ("uid", "group", "version", "kind", "operation", "namespace", "object", "dry_run", "old_object", "user",
                 "later", "metadata", "__dict__")

    def __init__(self, uid: str, group: str, version: str, kind: str, operation: str, namespace: str,
                 object: Mapping[str, Any], dry_run: bool, old_object: Mapping[str, Any] | None = None, user: str = "") -> None:  # noqa: A002
        self.uid = uid
        self.group = group
        self.version = version
        self.kind = kind
        self.operation = operation
        self.namespace = namespace
        self.object = object
        meta = object.get("metadata")
        self.metadata: Mapping[str, Any] = meta if is_object(meta) else {}
        self.dry_run = dry_run
        self.old_object = {} if old_object is None else old_object  # an UPDATE's object before it ({} otherwise)
        self.user = user  # request.userInfo.username: set by the API server from the credential (no tenant writes it)
        # What the review leaves for after its answer is sent (its metrics and Events: `Admission.review_deferred`).
        self.later: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"Request({self.kind} {self.operation} {self.namespace}/{self.name} uid={self.uid})"

    @_once
    def name(self) -> str:
        """The object's name, or its generateName when the API server has not named it yet."""
        return text(self.metadata.get("name")) or text(self.metadata.get("generateName"))

    @_once
    def named(self) -> bool:
        return bool(text(self.metadata.get("name")))

    @_once
    def key_name(self) -> str:
        """The name for load-ledger keys: the name, or generateName plus the request uid, so that
        objects sharing a generateName are counted apart (their pods cannot settle them by name;
        their assumptions expire)."""
        return self.name if self.named else f"{self.name}{self.uid}"

    @_once
    def owners(self) -> tuple[OwnerRef, ...]:
        """The object's ownerReferences as written (the tenant's: they prove nothing until resolved)."""
        return owner_refs(self.metadata)

    @_once
    def labels(self) -> Mapping[str, str]:
        return text_map(self.metadata.get("labels"))

    @_once
    def annotations(self) -> Mapping[str, str]:
        return text_map(self.metadata.get("annotations"))

    def regarding(self) -> dict[str, Any]:
        """The Event's `regarding`, as far as admission knows it: no uid yet, and no name before the API
        server generates one (CreationEvents adds both once the object exists)."""
        api_version = text(self.object.get("apiVersion")) or "/".join(p for p in (self.group, self.version) if p)
        name = self.name if self.named else ""
        return {"apiVersion": api_version, "kind": self.kind, "namespace": self.namespace, "name": name}


def parse_review(body: Any) -> Request:
    """Check the AdmissionReview envelope; raise MalformedReview with a short reason."""
    if not is_object(body):
        raise MalformedReview("the body is not a JSON object")
    get = body.get
    if get("apiVersion") != ADMISSION_API_VERSION or get("kind") != "AdmissionReview":
        raise MalformedReview(f"expected apiVersion {ADMISSION_API_VERSION} and kind AdmissionReview")
    request = get("request")
    if not is_object(request):
        raise MalformedReview("request is missing or not an object")
    get = request.get
    uid = get("uid")
    if type(uid) is not str or not uid:
        raise MalformedReview("request.uid is missing or not a string")
    kind = get("kind")
    if not is_object(kind):
        raise MalformedReview("request.kind is missing or not a group/version/kind object")
    group, version, kind_name = kind.get("group", ""), kind.get("version", ""), kind.get("kind", "")
    if type(group) is not str or type(version) is not str or type(kind_name) is not str:
        raise MalformedReview("request.kind is missing or not a group/version/kind object")
    operation = get("operation")
    if type(operation) is not str:
        raise MalformedReview("request.operation is missing or not a string")
    obj = get("object")
    if not is_object(obj):
        if operation == "CREATE":
            raise MalformedReview("request.object of a CREATE is missing or not an object")
        obj = {}
    meta = obj.get("metadata")
    if meta is not None and not is_object(meta):
        raise MalformedReview("request.object.metadata is not an object")
    namespace = get("namespace")
    if namespace is not None and type(namespace) is not str:
        raise MalformedReview("request.namespace is not a string")
    old = get("oldObject")
    user = get("userInfo")
    return Request(
        uid,
        group or "",
        version or "",
        kind_name or "",
        operation,
        namespace or text((meta or {}).get("namespace")) or "default",
        obj,
        get("dryRun") is True,
        old if is_object(old) else None,
        text(user.get("username")) if is_object(user) else "",
    )


def review_response(uid: str, patch: Patch, warnings: Sequence[str] = ()) -> dict[str, Any]:
    """An AdmissionReview v1 response that allows the object, with its JSON patch when there is one."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(encode(patch)).decode()
    if warnings:
        response["warnings"] = list(warnings)
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


def text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def text_map(value: Any) -> dict[str, str]:
    if not is_object(value):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def value_at(obj: Any, path: Sequence[str]) -> Any:
    """The value at `path` in nested mappings, or None."""
    for part in path:
        if not is_object(obj):
            return None
        obj = obj.get(part)
    return obj


def with_namespace(request: Request) -> Mapping[str, Any]:
    """The object with `metadata.namespace` set (a CREATE may leave it to the request URL)."""
    if request.metadata.get("namespace") == request.namespace:
        return request.object
    return {**request.object, "metadata": {**request.metadata, "namespace": request.namespace}}


def pointer(path: Sequence[str]) -> str:
    return _pointer(path) if type(path) is tuple else _pointer(tuple(path))


@functools.lru_cache(maxsize=1024)  # the same few paths in every review
def _pointer(path: tuple[str, ...]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def ops_at(obj: Mapping[str, Any], path: Sequence[str], new: Any) -> Patch:
    """JSON patch making the value at `path` equal to `new`, adding missing parents (nothing when
    `new` is empty and the path is absent). Its values are `new`'s own (`json_patch`: never changed in place)."""
    node: Any = obj
    for i, part in enumerate(path):
        if not is_object(node):
            raise TypeError(f"{pointer(path[:i]) or 'the object'} is not a JSON object")
        if node.get(part) is None:
            if not new:
                return []
            value = new
            for inner in reversed(path[i + 1 :]):
                value = {inner: value}
            return [{"op": "add", "path": pointer(path[: i + 1]), "value": value}]
        node = node[part]
    return json_patch(node, new, pointer(path))


def annotation_ops(obj: Mapping[str, Any], annotations: Mapping[str, str]) -> Patch:
    """Set these annotations (replacing values the object came with: Tekton copies a run's
    annotations to its TaskRuns and pods, and the tenant writes any)."""
    if not is_object(value_at(obj, ("metadata", "annotations"))):
        return ops_at(obj, ("metadata", "annotations"), dict(annotations))
    return [{"op": "add", "path": pointer(("metadata", "annotations", k)), "value": v} for k, v in annotations.items()]
