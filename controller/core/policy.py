"""The placement policy: pools of well-connected nodes, who may use them, and which images go there.

`load_policy` turns YAML text into a validated, immutable `PlacementPolicy`. Every problem is
reported as `source:line: field.path: what was expected`, the line being the one of the offending
YAML node. The models are pydantic v2 (YAML names are camelCase aliases of the Python fields).
"""

from __future__ import annotations

import re
from fnmatch import translate
from typing import Annotated, Any, Literal, Mapping

import yaml
from pydantic import (
    AfterValidator,
    Field,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from controller.core.egress import EgressLoad
from controller.core.model import NAMESPACE_POOLS_ANNOTATION, TAINT_KEY, NamespaceState, NodeState, Taint
from controller.core.schema import PolicyModel

API_VERSION = "egress-placer.io/v1alpha1"
KIND = "PlacementPolicy"
DEFAULT_EXEMPT_NAMESPACES = ("kube-system", "kube-node-lease", "kube-public")
# Values of the run annotation `egress-placer.io/placement` that are not pool names.
RESERVED_POOL_NAMES = frozenset({"auto", "none"})
OWNED_TAINT_KEYS = frozenset({TAINT_KEY})

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class PolicyError(ValueError):
    """The policy cannot be used. The message names the source, the line and the field."""


class _FieldError(ValueError):
    """A validation error that knows which part of the checked value is wrong (for the line number)."""

    def __init__(self, message: str, loc: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.loc = loc


# -- field checks ---------------------------------------------------------------------------------


def _label_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        raise ValueError(f"{key!r} is not a valid label key: the prefix must be a DNS subdomain")
    if len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        raise ValueError(
            f"{key!r} is not a valid label key: the name must be at most 63 characters, "
            "alphanumeric, '-', '_' or '.', starting and ending with an alphanumeric"
        )
    return key


def _label_value(value: str) -> str:
    if value and (len(value) > 63 or not _QUALIFIED_NAME.fullmatch(value)):
        raise ValueError(f"{value!r} is not a valid label value")
    return value


def _dns_label(name: str) -> str:
    if len(name) > 63 or not _DNS1123_LABEL.fullmatch(name):
        raise ValueError(f"{name!r} is not a DNS-1123 label (lower-case alphanumerics and '-', at most 63)")
    return name


def _node_name(name: str) -> str:
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid node name (a DNS-1123 subdomain)")
    return name


def _glob(pattern: str) -> str:
    if not pattern.strip():
        raise ValueError("a glob must not be empty")
    return pattern


LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Glob = Annotated[str, AfterValidator(_glob)]
NodeName = Annotated[str, AfterValidator(_node_name)]
NamespaceName = Annotated[str, AfterValidator(_dns_label)]


def _glob_regex(globs: tuple[str, ...]) -> re.Pattern[str] | None:
    """One compiled regular expression matching any of the fnmatch-style globs (case-sensitive)."""
    if not globs:
        return None
    return re.compile("|".join(f"(?:{translate(g)})" for g in globs))


# -- label selectors ------------------------------------------------------------------------------


class LabelSelectorRequirement(PolicyModel):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[LabelValue, ...] = ()

    @model_validator(mode="after")
    def _values_fit_operator(self) -> "LabelSelectorRequirement":
        if self.operator in ("In", "NotIn") and not self.values:
            raise _FieldError(f"operator {self.operator} needs at least one value", ("values",))
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise _FieldError(f"operator {self.operator} takes no values", ("values",))
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator == "In":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # NotIn


class LabelSelector(PolicyModel):
    """A Kubernetes LabelSelector. An empty selector matches nothing here (never "everything")."""

    match_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()

    @model_validator(mode="after")
    def _not_empty(self) -> "LabelSelector":
        if not self.match_labels and not self.match_expressions:
            raise ValueError("a selector needs matchLabels or matchExpressions (an empty one would match everything)")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )


# -- pools ----------------------------------------------------------------------------------------


class PoolTaint(PolicyModel):
    """The taint egress-placer keeps on every node of the pool; its value is always the pool name.
    The key is fixed (`TAINT_KEY`): `key` may be written only with that value (policies that
    spelled out the default still load)."""

    key: str = TAINT_KEY
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @field_validator("key")
    @classmethod
    def _fixed_key(cls, key: str) -> str:
        if key != TAINT_KEY:
            raise ValueError(
                f"the taint key is fixed to {TAINT_KEY} (custom keys were dropped; leave `key` out). "
                f"Taints a former key left on nodes are not egress-placer's to remove: remove them by hand"
            )
        return key


class Pool(PolicyModel):
    name: str
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    nodes: tuple[NodeName, ...] = ()
    images: tuple[Glob, ...] = ()
    namespaces: tuple[Glob, ...] = ()
    namespace_selector: LabelSelector | None = None
    placement: Literal["required", "preferred"] = "required"
    capacity: PositiveInt | None = None
    taint: PoolTaint = Field(default_factory=PoolTaint)
    # Optional: measured outbound throughput per node from Prometheus (docs/egress-load.md).
    egress_load: EgressLoad | None = None

    _image_regex: re.Pattern[str] | None = PrivateAttr(default=None)
    _namespace_regex: re.Pattern[str] | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name_is_usable(cls, name: str) -> str:
        _dns_label(name)
        if name in RESERVED_POOL_NAMES:
            raise ValueError(f"{name!r} is reserved (egress-placer.io/placement: {name} has its own meaning)")
        return name

    @model_validator(mode="after")
    def _has_members(self) -> "Pool":
        if not self.node_selector and not self.nodes:
            raise ValueError("a pool needs nodeSelector or nodes (or both) to have members")
        return self

    def model_post_init(self, context: Any) -> None:
        self._image_regex = _glob_regex(self.images)
        self._namespace_regex = _glob_regex(self.namespaces)

    def claims(self, node: NodeState) -> bool:
        """The node is listed by name, or has every label of the node selector."""
        if node.name in self.nodes:
            return True
        return bool(self.node_selector) and all(node.labels.get(k) == v for k, v in self.node_selector.items())

    def allows(self, ns: NamespaceState) -> bool:
        """Runs of this namespace may use the pool (name glob, label selector or the Namespace annotation)."""
        if self._namespace_regex is not None and self._namespace_regex.fullmatch(str(ns.name)):
            return True
        if self.namespace_selector is not None and self.namespace_selector.matches(ns.labels):
            return True
        listed = str(ns.annotations.get(NAMESPACE_POOLS_ANNOTATION) or "")
        return self.name in {p.strip() for p in listed.split(",")}

    def matches_image(self, image: str) -> bool:
        return self._image_regex is not None and self._image_regex.fullmatch(image) is not None

    def taint_for(self) -> Taint:
        return Taint(key=self.taint.key, value=self.name, effect=self.taint.effect)

    def toleration(self) -> dict[str, str]:
        return {"key": self.taint.key, "operator": "Equal", "value": self.name, "effect": self.taint.effect}


class PlacementPolicy(PolicyModel):
    api_version: Literal["egress-placer.io/v1alpha1"]
    kind: Literal["PlacementPolicy"]
    exempt_namespaces: tuple[str, ...] = DEFAULT_EXEMPT_NAMESPACES
    # Namespaces whose node agents (DaemonSets) may run on pool nodes; None: the exempt namespaces.
    agent_namespaces: tuple[NamespaceName, ...] | None = None
    # Agent namespaces whose EXISTING DaemonSets the leader may change to add the pool tolerations
    # (which restarts their pods); elsewhere it only reports them (core.agents).
    patch_existing_agents: tuple[NamespaceName, ...] = ()
    pools: tuple[Pool, ...] = ()

    @field_validator("pools")
    @classmethod
    def _unique_names(cls, pools: tuple[Pool, ...]) -> tuple[Pool, ...]:
        first: dict[str, int] = {}
        for i, pool in enumerate(pools):
            if pool.name in first:
                raise _FieldError(f"pool name {pool.name!r} is already used by pools[{first[pool.name]}]", (i, "name"))
            first[pool.name] = i
        return pools

    @model_validator(mode="after")
    def _patched_agents_are_agents(self) -> "PlacementPolicy":
        agents = agent_namespaces(self)
        for i, namespace in enumerate(self.patch_existing_agents):
            if namespace not in agents:
                raise _FieldError(
                    f"{namespace!r} is not an agent namespace (agentNamespaces, by default the exemptNamespaces: "
                    f"{', '.join(agents) or 'none'})",
                    ("patchExistingAgents", i),
                )
        return self

    @classmethod
    def empty(cls) -> "PlacementPolicy":
        """No pools: what is in force before the first policy is loaded (nothing is placed)."""
        return cls(apiVersion="egress-placer.io/v1alpha1", kind="PlacementPolicy")

    def pool(self, name: str) -> Pool | None:
        return next((p for p in self.pools if p.name == name), None)

    def pool_of(self, node: NodeState) -> Pool | None:
        """The pool the node belongs to: the first, in file order, that claims it."""
        return next((p for p in self.pools if p.claims(node)), None)

    def owned_taint_keys(self) -> frozenset[str]:
        """The taint keys egress-placer owns: the one fixed key, with or without pools (so a valid
        policy that drops a pool also drops its taints)."""
        return OWNED_TAINT_KEYS


def agent_namespaces(policy: PlacementPolicy) -> tuple[str, ...]:
    """Where node agents (DaemonSets) may run on pool nodes: `agentNamespaces`, or by default the
    exempt namespaces."""
    return policy.exempt_namespaces if policy.agent_namespaces is None else policy.agent_namespaces


def is_agent_namespace(policy: PlacementPolicy, namespace: str) -> bool:
    """May node agents (DaemonSets) of `namespace` run on pool nodes? The namespace is the request's
    (or the cached pod's) own, which the tenant cannot choose for a pod of another namespace."""
    return namespace in agent_namespaces(policy)


# -- loading --------------------------------------------------------------------------------------


class _PolicyLoader(yaml.SafeLoader):
    """SafeLoader whose value errors (e.g. an integer of more than 4300 digits) name their node's line."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError) as e:
            raise yaml.constructor.ConstructorError(None, None, str(e), node.start_mark) from None


def load_policy(text: str, source: str = "<policy>") -> PlacementPolicy:
    """Parse and validate a policy document; raise PolicyError naming source, line and field."""
    try:
        loader = _PolicyLoader(text)
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (control characters, surrogates)
        raise PolicyError(f"{source}:{text.count(chr(10), 0, e.position) + 1}: invalid YAML: {e.reason}") from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise PolicyError(f"{source}: the policy is empty; expected a {KIND} mapping")
        if not isinstance(root, yaml.MappingNode):
            raise PolicyError(f"{source}:{_line(root)}: expected a {KIND} mapping, got {_node_kind(root)}")
        _refuse_duplicate_keys(root, source)
        data = loader.construct_document(root)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}" if mark else f"{source}:{loader.line + 1}"
        raise PolicyError(f"{where}: invalid YAML: {yaml_problem(e)}") from None
    except RecursionError:
        raise PolicyError(f"{source}:{loader.line + 1}: invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()
    try:
        return PlacementPolicy.model_validate(data)
    except ValidationError as e:
        raise PolicyError("\n".join(_describe(err, root, source) for err in e.errors())) from None
    except RecursionError:
        raise PolicyError(f"{source}:{_line(root)}: the policy is nested too deeply") from None


def _describe(err: Any, root: yaml.Node, source: str) -> str:
    loc = tuple(err["loc"])
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, _FieldError):
        loc += cause.loc
    message = str(cause) if cause is not None else err["msg"]
    node = _node_at(root, loc)
    path = _path(loc) or "(top level)"
    return f"{source}:{_line(node)}: {path}: {message}"


def _node_at(root: yaml.Node, loc: tuple[str | int, ...]) -> yaml.Node:
    """The YAML node to blame for `loc`: the key of the deepest field found, or the list item.

    A missing field is blamed on the mapping that lacks it."""
    node, blamed = root, root
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == part), None)
            if match is None:
                break
            blamed, node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            blamed = node = node.value[part]
        elif part != "[key]":
            break
    return blamed


def _path(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "[key]":
            text = str(part) if str(part).isprintable() else repr(str(part))  # a key with a line break stays on its line
            out += f".{text}" if out else text
    return out


def _refuse_duplicate_keys(
    node: yaml.Node, source: str, visited: set[int] | None = None, path: set[int] | None = None
) -> None:
    """Refuse duplicate keys, keys that are not scalars, and aliases that refer to themselves. A node
    reached again through an alias is checked once (nine aliases of nine aliases... stay cheap)."""
    visited = set() if visited is None else visited
    path = set() if path is None else path
    if id(node) in path:
        raise PolicyError(f"{source}:{_line(node)}: an alias refers to itself")
    if id(node) in visited:
        return
    visited.add(id(node))
    path.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                raise PolicyError(f"{source}:{_line(key)}: a key must be a plain value, not {_node_kind(key)}")
            if key.value in seen:
                raise PolicyError(f"{source}:{_line(key)}: duplicate key {key.value!r}")
            seen.add(key.value)
            _refuse_duplicate_keys(value, source, visited, path)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(item, source, visited, path)
    path.discard(id(node))


def yaml_problem(error: yaml.MarkedYAMLError) -> str:
    """What is wrong, in one line (PyYAML splits it in a context, with its own line, and a problem)."""
    context = error.context or ""
    if context and error.context_mark and error.problem_mark and error.context_mark.line != error.problem_mark.line:
        context += f" (line {error.context_mark.line + 1})"
    return " ".join(part for part in (context, error.problem) if part)


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _node_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    return "a list" if isinstance(node, yaml.SequenceNode) else f"the scalar {node.value!r}"
