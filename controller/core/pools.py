"""Pools as a Kubernetes API: the cluster-scoped custom resources `EgressPool` (one object per pool)
and `EgressPlacerConfig` (the singleton `cluster`: exempt and agent namespaces), group
`egress-placer.io`, version `v1alpha1`. docs/pools-api.md explains the design.

- `custom_resource_definitions()`: their CRDs, rendered from the policy's own models (descriptions,
  types, patterns and CEL rules: controller/core/schema.py), plus the pool name's rules, `priority`,
  the status schema and the printer columns. `k8s/crds/` holds this render (a unit test checks it).
- `policy_from_objects(objects)`: the PlacementPolicy the objects make, through the policy loader's
  own validation (`validate_policy`): a node claimed by two pools belongs to the one of lower
  `spec.priority`, ties by name, as list order did in the file form. Errors name the object and the
  field (`EgressPool overseas: spec.images[0]: a glob must not be empty`). Objects of `v1beta1`
  are read too (core.conversion turns them into `v1alpha1` first; their problems name `v1beta1`'s
  fields: docs/pools-api.md, "v1beta1").
- `objects_from_policy(policy)`: the other way, for the migration of a policy file
  (`egress-placer migrate-policy`): priorities 10, 20, 30... in list order.
- `load_any_policy(text, source)`: a policy file in either form (a PlacementPolicy document, or the
  objects in one or many YAML documents); errors name the file and the line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError

from controller.core.policy import (
    API_VERSION,
    DNS1123_LABEL,
    KIND,
    RESERVED_POOL_NAMES,
    PlacementPolicy,
    PolicyError,
    Pool,
    field_path,
    load_policy,
    node_at,
    read_documents,
    validate_policy,
    whole,
)
from controller.core.schema import OpenAPI, PolicyModel, openapi_schema
from controller.core.conversion import V1ALPHA1, V1BETA1, ConversionError, path_in, to_version

GROUP = "egress-placer.io"
VERSION = "v1alpha1"
POOL_KIND = "EgressPool"
POOL_PLURAL = "egresspools"
CONFIG_KIND = "EgressPlacerConfig"
CONFIG_PLURAL = "egressplacerconfigs"
CONFIG_NAME = "cluster"  # the one EgressPlacerConfig there may be
KINDS = (POOL_KIND, CONFIG_KIND)
PLURALS = {POOL_KIND: POOL_PLURAL, CONFIG_KIND: CONFIG_PLURAL}
# The PlacementPolicy fields an EgressPlacerConfig holds (Python names); the rest are the pools'.
CONFIG_FIELDS = ("exempt_namespaces", "agent_namespaces", "patch_existing_agents")
MAX_PRIORITY = 1_000_000
MIGRATION_PRIORITY_STEP = 10  # gaps, so that a pool can go between two without renumbering
MOST_LOADED_NODES = 5  # the status lists this many nodes, not every one (an object stops at 1.5 MiB)
assert API_VERSION == f"{GROUP}/{VERSION}"


class PoolOrder(PolicyModel):
    """What an EgressPool's spec has beyond a pool of the file form: its order."""

    priority: Annotated[int, Field(ge=0, le=MAX_PRIORITY), OpenAPI(default=0)] = Field(
        default=0,
        description="Orders pools that claim the same node (it belongs to the pool of the lowest "
        "priority; ties by name) and pools whose images both match a run (the first of them the run's "
        f"namespace may use). 0 to {MAX_PRIORITY}, default 0.",
    )


# -- status (written by the leader; the schema is here so that the CRD and the writer agree) --------


class Condition(PolicyModel):
    """A Kubernetes condition (metav1.Condition)."""

    type: Annotated[str, OpenAPI(max_length=316)] = Field(description="Ready: the pool's nodes carry its taint and the pool places runs.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: Annotated[str, OpenAPI(patterns=(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",), max_length=1024)] = Field(
        description="Why, in one CamelCase word (e.g. NodesTainted, NoMembers)."
    )
    message: Annotated[str, OpenAPI(max_length=32768)] = Field(default="", description="Why, for a person.")
    last_transition_time: Annotated[str, OpenAPI(extra={"format": "date-time"})] = Field(
        description="When the status last changed."
    )
    observed_generation: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="The metadata.generation of the spec this condition describes."
    )


class NodeLoadStatus(PolicyModel):
    """One pool node's load."""

    node: str = Field(description="The node's name.")
    placed: Annotated[int, Field(ge=0)] = Field(description="Runs placed on the node, pending or running.")
    assumed: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Placements chosen at admission whose pods have not appeared yet."
    )
    capacity: Annotated[int, Field(ge=0)] = Field(description="Runs the node takes before it counts as full.")


class PoolLoadStatus(PolicyModel):
    """The pool's load over its ready nodes: totals, counts, and the most loaded nodes only."""

    placed: Annotated[int, Field(ge=0)] = Field(description="Runs placed on the pool's ready nodes, pending or running.")
    assumed: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Placements chosen at admission whose pods have not appeared yet."
    )
    capacity: Annotated[int, Field(ge=0)] = Field(description="The sum of the ready nodes' capacities.")
    busy_nodes: Annotated[int, Field(ge=0)] = Field(default=0, description="Ready nodes with at least one run.")
    full_nodes: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Ready nodes whose runs (placed and assumed) reach their capacity."
    )
    most_loaded: Annotated[tuple[NodeLoadStatus, ...], OpenAPI(max_items=MOST_LOADED_NODES)] = Field(
        default=(),
        description=f"The {MOST_LOADED_NODES} most loaded nodes with a run, most loaded first (not every node).",
    )


class LastError(PolicyModel):
    """The last thing that went wrong with the pool."""

    message: Annotated[str, OpenAPI(max_length=32768)] = Field(description="What went wrong.")
    time: Annotated[str, OpenAPI(extra={"format": "date-time"})] = Field(description="When.")


class QueueStatus(PolicyModel):
    """The pool's queue (only with its `queue` setting), as the leader last saw it."""

    waiting: Annotated[int, Field(ge=0)] = Field(description="Runs waiting, pending.")
    slots: Annotated[int, Field(ge=0)] = Field(description="runsPerNode on each Ready, tainted node.")
    occupied: Annotated[int, Field(ge=0)] = Field(
        description="Slots taken: pool pods, and released runs whose pod is not bound yet."
    )


MEASURED_SHOWN = 500  # groups of the measured set the status lists (largest p90 first); `groups` counts them all


class MeasuredGroupStatus(PolicyModel):
    """One Task (or Pipeline task) the pool takes by measured history."""

    namespace: str = Field(description="Its namespace: only runs of this namespace match.")
    kind: Literal["Task", "PipelineTask"] = Field(description="Task (tekton.dev/task), or PipelineTask (pipeline/pipelineTask).")
    name: str = Field(description="The Task's name, or pipeline/pipelineTask.")
    runs: Annotated[int, Field(ge=0)] = Field(description="Its runs in the window.")
    p90_bytes: Annotated[int, Field(ge=0)] = Field(description="The 90th percentile of bytes its runs sent.")
    median_bytes: Annotated[int, Field(ge=0)] = Field(default=0, description="The median of bytes its runs sent.")


class HistoryStatus(PolicyModel):
    """The pool's measured set (only with its `history` setting), as this replica last read it."""

    groups: Annotated[int, Field(ge=0)] = Field(description="Tasks and Pipeline tasks the pool takes by measured history.")
    read_at: str | None = Field(
        default=None, description="When the set was computed from Prometheus, RFC 3339 (none: not read yet)."
    )
    last_error: Annotated[str, OpenAPI(max_length=32768)] | None = Field(
        default=None, description="Why the last read failed (the set stays what the last good read gave)."
    )
    measured: Annotated[tuple[MeasuredGroupStatus, ...], OpenAPI(max_items=MEASURED_SHOWN)] = Field(
        default=(), description=f"The groups, largest p90 first ({MEASURED_SHOWN} at most; groups counts them all)."
    )


class PoolStatus(PolicyModel):
    """What egress-placer sees of the pool; written by the leader."""

    conditions: Annotated[
        tuple[Condition, ...],
        OpenAPI(max_items=8, extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}),
    ] = Field(default=(), description="Ready (with reason, message and observedGeneration).")
    nodes: Annotated[int, Field(ge=0)] = Field(default=0, description="Member nodes.")
    ready_nodes: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Member nodes that take runs: Ready and not cordoned."
    )
    tainted_nodes: Annotated[int, Field(ge=0)] = Field(default=0, description="Member nodes that carry the pool's taint.")
    load: PoolLoadStatus | None = Field(default=None, description="Runs against capacity: totals and the most loaded nodes.")
    runs_placed_last_hour: Annotated[int, Field(ge=0)] = Field(
        default=0,
        description="Pods of TaskRuns created in the last hour and bound to one of the pool's nodes, as the "
        "controller's informers saw them (a replica that restarts counts only those that still exist).",
    )
    last_error: LastError | None = Field(default=None, description="The last error about this pool (none: nothing went wrong).")
    queue: QueueStatus | None = Field(default=None, description="The queue, when the pool has the queue setting.")
    history: HistoryStatus | None = Field(default=None, description="The measured set, when the pool has the history setting.")


# -- the CRDs -----------------------------------------------------------------------------------------


def _name_rules(kind: str) -> list[dict[str, str]]:
    """CEL on metadata.name (the API server already makes it a DNS subdomain; a CRD cannot name
    metadata in a rule's fieldPath, so the message does)."""
    if kind == CONFIG_KIND:
        return [
            {
                "rule": f"self.metadata.name == '{CONFIG_NAME}'",
                "message": f"metadata.name: there is one {CONFIG_KIND}, named {CONFIG_NAME}",
                }
        ]
    reserved = sorted(RESERVED_POOL_NAMES)
    return [
        {
            "rule": f"!(self.metadata.name in {reserved!r})",
            "message": f"metadata.name: {' and '.join(reserved)} are reserved (values of the run annotation "
            "egress-placer.io/placement)",
        },
    ]


def _describe(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, **schema}


def pool_spec_schema() -> dict[str, Any]:
    """An EgressPool's spec: `priority`, then every field of a pool of the file form but its name."""
    pool = openapi_schema(Pool, exclude=frozenset({"name"}))
    order = openapi_schema(PoolOrder)
    pool["properties"] = {**order["properties"], **pool["properties"]}
    return pool


def config_spec_schema() -> dict[str, Any]:
    return openapi_schema(PlacementPolicy, only=CONFIG_FIELDS)


def _crd(kind: str, plural: str, description: str, spec: dict[str, Any], status: dict[str, Any] | None, columns: list[dict[str, Any]]) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string", "description": "APIVersion: egress-placer.io/v1alpha1."},
        "kind": {"type": "string", "description": f"Kind: {kind}."},
        # A CRD may only bound metadata.name (and generateName); a pool's name is a DNS-1123 label.
        "metadata": {"type": "object"}
        if kind != POOL_KIND
        else {"type": "object", "properties": {"name": {"type": "string", "maxLength": 63, "pattern": whole(DNS1123_LABEL)}}},
        "spec": spec,
    }
    if status is not None:
        properties["status"] = status
    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {
                "description": description,
                "type": "object",
                "properties": properties,
                "x-kubernetes-validations": _name_rules(kind),
                **({"required": ["spec"]} if kind == POOL_KIND else {}),
            }
        },
        "additionalPrinterColumns": columns,
    }
    if status is not None:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "categories": ["egress-placer"],
            },
            "versions": [version],
        },
    }


AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def custom_resource_definitions() -> list[dict[str, Any]]:
    """The CRDs of EgressPool and EgressPlacerConfig (what k8s/crds/ holds)."""
    pool = _crd(
        POOL_KIND,
        POOL_PLURAL,
        "A pool of nodes with good internet egress: which nodes are in it (nodeSelector, nodes), which "
        "runs go there (images), who may use it (namespaces, namespaceSelector), how (placement, "
        "capacity, taint, egressLoad). metadata.name is the pool's name. egress-placer keeps the taint "
        "egress-placer.io/pool=<name> on its nodes.",
        _describe("The pool: the same fields, with the same meaning, as a pool of the PlacementPolicy file form.", pool_spec_schema()),
        _describe("What egress-placer sees of the pool; written by its leader.", openapi_schema(PoolStatus)),
        [
            {"name": "Placement", "type": "string", "jsonPath": ".spec.placement"},
            {"name": "Priority", "type": "integer", "jsonPath": ".spec.priority"},
            {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes"},
            {"name": "Tainted", "type": "integer", "jsonPath": ".status.taintedNodes"},
            {"name": "Load", "type": "integer", "description": "Runs pending or running on the pool's ready nodes.", "jsonPath": ".status.load.placed"},
            {"name": "Capacity", "type": "integer", "description": "Runs the pool's ready nodes take.", "jsonPath": ".status.load.capacity"},
            {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
            {"name": "Reason", "type": "string", "priority": 1, "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
            {"name": "Queued", "type": "integer", "priority": 1, "description": "Runs waiting in the pool's queue.", "jsonPath": ".status.queue.waiting"},
            {"name": "Last hour", "type": "integer", "priority": 1, "description": "Runs placed on the pool in the last hour.", "jsonPath": ".status.runsPlacedLastHour"},
            AGE_COLUMN,
        ],
    )
    config = _crd(
        CONFIG_KIND,
        CONFIG_PLURAL,
        f"What egress-placer applies to every pool: exempt and agent namespaces. One object, named "
        f"{CONFIG_NAME}; without it, the defaults.",
        _describe("The policy-wide settings; each left out keeps its default.", config_spec_schema()),
        None,
        [AGE_COLUMN],
    )
    return [pool, config]


# -- objects -> policy ----------------------------------------------------------------------------

# Where an object's field is, for messages: (index of the object, path in it) -> "file:line: " or "".
Locate = Callable[[int, tuple[str | int, ...]], str]


def _nowhere(index: int, loc: tuple[str | int, ...]) -> str:
    return ""


def _title(obj: Any) -> str:
    if not isinstance(obj, Mapping):
        return "object"
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return f"{obj.get('kind') or 'object'} {name}" if isinstance(name, str) and name else f"{obj.get('kind') or 'object'} (no name)"


def policy_from_objects(objects: Sequence[Any], locate: Locate = _nowhere) -> PlacementPolicy:
    """The PlacementPolicy of EgressPool objects and at most one EgressPlacerConfig (only their
    apiVersion, kind, metadata.name and spec are read); PolicyError naming each problem's object and
    field. No object: the empty policy (no pools; the defaults)."""
    problems: list[str] = []
    versions: dict[int, str] = {}  # the objects given as v1beta1 (converted to v1alpha1 here): paths named in theirs

    def own(index: int, loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
        obj = objects[index]
        return path_in(str(obj.get("kind")), versions[index], loc) if index in versions and isinstance(obj, Mapping) else loc

    def problem(index: int, loc: tuple[str | int, ...], message: str) -> None:
        loc = own(index, loc)
        problems.append(f"{locate(index, loc)}{_title(objects[index])}: {field_path(loc) or '(object)'}: {message}")

    pools: list[tuple[int, str, int, dict[str, Any]]] = []  # priority, name, index, the pool's data
    config: tuple[int, dict[str, Any]] | None = None
    names: dict[str, int] = {}
    config_keys = {PlacementPolicy.model_fields[f].alias: f for f in CONFIG_FIELDS}
    for index, obj in enumerate(objects):
        if not isinstance(obj, Mapping):
            problem(index, (), f"expected an object (a mapping), got {type(obj).__name__}")
            continue
        if obj.get("kind") not in KINDS:
            problem(index, ("kind",), f"expected {POOL_KIND} or {CONFIG_KIND}, got {obj.get('kind')!r}")
            continue
        if obj.get("apiVersion") not in (V1ALPHA1, V1BETA1):
            problem(index, ("apiVersion",), f"expected {V1ALPHA1} or {V1BETA1}, got {obj.get('apiVersion')!r}")
            continue
        if obj["apiVersion"] == V1BETA1:
            given = obj.get("spec")
            priority = given.get("priority", 0) if isinstance(given, Mapping) and obj["kind"] == POOL_KIND else 0
            try:  # checked in v1beta1's terms before it is turned over (v1beta1 -1 is not v1alpha1 1,000,001)
                PoolOrder.model_validate({"priority": priority})
                obj = to_version(obj, V1ALPHA1)
            except (ValidationError, ConversionError) as e:
                problem(index, ("spec", "priority"), e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e))
                continue
            versions[index] = V1BETA1
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            problem(index, ("metadata", "name"), "Field required")
            continue
        spec = obj.get("spec")
        spec = {} if spec is None else spec
        if not isinstance(spec, Mapping):
            problem(index, ("spec",), f"expected a mapping, got {type(spec).__name__}")
            continue
        if obj["kind"] == CONFIG_KIND:
            if name != CONFIG_NAME:
                problem(index, ("metadata", "name"), f"there is one {CONFIG_KIND}, named {CONFIG_NAME}")
            elif config is not None:
                problem(index, ("metadata", "name"), f"{CONFIG_KIND} {CONFIG_NAME} is given twice")
            else:
                for key in spec:
                    if key not in config_keys:
                        problem(index, ("spec", key), "Extra inputs are not permitted")
                config = (index, dict(spec))
            continue
        if name in names:
            problem(index, ("metadata", "name"), f"pool name {name!r} is already used by {_title(objects[names[name]])}")
            continue
        names[name] = index
        data = dict(spec)
        if "name" in data:
            problem(index, ("spec", "name"), "Extra inputs are not permitted (the pool's name is metadata.name)")
            continue
        try:
            priority = PoolOrder.model_validate({"priority": data.pop("priority", 0)}).priority
        except ValidationError as e:
            for err in e.errors():
                problem(index, ("spec", "priority"), err["msg"])
            continue
        pools.append((priority, name, index, {"name": name, **data}))
    if problems:
        raise PolicyError("\n".join(problems))

    pools.sort(key=lambda p: (p[0], p[1]))
    data = {"apiVersion": API_VERSION, "kind": KIND, **(config[1] if config else {}), "pools": [p[3] for p in pools]}

    def where(loc: tuple[str | int, ...]) -> str:
        if len(loc) >= 2 and loc[0] == "pools" and isinstance(loc[1], int) and loc[1] < len(pools):
            index, rest = pools[loc[1]][2], loc[2:]
            inner: tuple[str | int, ...] = ("metadata", "name") if rest[:1] == ("name",) else ("spec", *rest)
        elif config is not None:
            index, inner = config[0], ("spec", *loc)
        else:
            return f"{KIND} (top level): {field_path(loc)}"
        inner = own(index, inner)
        return f"{locate(index, inner)}{_title(objects[index])}: {field_path(inner)}"

    return validate_policy(data, where)


def load_any_policy(text: str, source: str = "<policy>") -> PlacementPolicy:
    """A policy file in either form: one PlacementPolicy document (`load_policy`, its messages as
    they are), or EgressPool and EgressPlacerConfig objects in one or many YAML documents (also in
    `kind: List`). Errors name the file and the line."""
    documents = read_documents(text, source)  # invalid YAML: the message load_policy would give too
    objects: list[Any] = []
    nodes: list[yaml.Node] = []
    for node, value in documents:
        for item_node, item in _spread(node, value):
            nodes.append(item_node)
            objects.append(item)
    if not any(isinstance(o, Mapping) and o.get("kind") in KINDS for o in objects):
        return load_policy(text, source)

    def locate(index: int, loc: tuple[str | int, ...]) -> str:
        return f"{source}:{node_at(nodes[index], loc).start_mark.line + 1}: "

    return policy_from_objects(objects, locate)


def _spread(node: yaml.Node, value: Any) -> Iterator[tuple[yaml.Node, Any]]:
    """A document, or each item of a `kind: List` document (what `kubectl get -o yaml` writes)."""
    if isinstance(value, Mapping) and value.get("kind") == "List" and isinstance(value.get("items"), list):
        item_nodes: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            item_nodes = next((v.value for k, v in node.value if k.value == "items" and isinstance(v, yaml.SequenceNode)), [])
        for i, item in enumerate(value["items"]):
            yield (item_nodes[i] if i < len(item_nodes) else node), item
        return
    yield node, value


# -- policy -> objects ----------------------------------------------------------------------------


def objects_from_policy(policy: PlacementPolicy) -> list[dict[str, Any]]:
    """The objects that make `policy` (`policy_from_objects` gives it back, equal): the
    EgressPlacerConfig when a policy-wide field is not its default, then one EgressPool per pool,
    priorities 10, 20, 30... in list order. Defaults are left out."""
    out: list[dict[str, Any]] = []
    settings = policy.model_dump(mode="json", by_alias=True, exclude_defaults=True, include=set(CONFIG_FIELDS))
    if settings:
        out.append({"apiVersion": API_VERSION, "kind": CONFIG_KIND, "metadata": {"name": CONFIG_NAME}, "spec": settings})
    for i, pool in enumerate(policy.pools):
        spec = pool.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude={"name"})
        out.append(
            {
                "apiVersion": API_VERSION,
                "kind": POOL_KIND,
                "metadata": {"name": pool.name},
                "spec": {"priority": (i + 1) * MIGRATION_PRIORITY_STEP, **spec},
            }
        )
    return out


def dump_objects(objects: Sequence[Mapping[str, Any]]) -> str:
    """Objects as a multi-document YAML text (keys in the order given)."""
    return yaml.safe_dump_all([dict(o) for o in objects], sort_keys=False, default_flow_style=False, width=120)
