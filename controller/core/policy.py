"""The placement policy: pools of well-connected nodes, who may use them, and which images go there.

`load_policy` turns YAML text into a validated, immutable `PlacementPolicy`. Every problem is
reported as `source:line: field.path: what was expected`, the line being the one of the offending
YAML node. The models are pydantic v2 (YAML names are camelCase aliases of the Python fields).
"""

from __future__ import annotations

import re
from fnmatch import translate
from contextlib import contextmanager
from typing import Annotated, Any, Callable, Iterator, Literal, Mapping

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

from controller.core.egress import EgressLoad, MeasuredHistory
from controller.queue.core import QueueSetting
from controller.budgets.core import MAX_DESTINATIONS, Destination, EgressAddress, unique_destinations
from controller.core.model import NAMESPACE_POOLS_ANNOTATION, TAINT_KEY, NamespaceState, NodeState, Taint
from controller.core.schema import NOT_BLANK, OpenAPI, PolicyModel, Rule

API_VERSION = "egress-placer.io/v1alpha1"
KIND = "PlacementPolicy"
DEFAULT_EXEMPT_NAMESPACES = ("kube-system", "kube-node-lease", "kube-public")
# Values of the run annotation `egress-placer.io/placement` that are not pool names.
RESERVED_POOL_NAMES = frozenset({"auto", "none"})
# Bounds the API server needs to cost its CEL rules (a selector's labels, a list of namespaces); far
# above any real policy.
MAX_SELECTOR_LABELS = 64
MAX_NAMESPACES = 256
OWNED_TAINT_KEYS = frozenset({TAINT_KEY})

# The regular expressions of the checks below, shared with the API server's schema (Go's regexp reads
# them the same: classes, groups and repetition only). Matched whole.
DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*"
QUALIFIED_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_DNS1123_LABEL = re.compile(DNS1123_LABEL)
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN)
_QUALIFIED_NAME = re.compile(QUALIFIED_NAME)
_NOT_BLANK = re.compile(NOT_BLANK)


def whole(pattern: str) -> str:
    """`pattern` anchored at both ends, as the API server's `pattern` needs it."""
    return f"^({pattern})$"


class PolicyError(ValueError):
    """The policy cannot be used. The message names the source, the line and the field."""


class _FieldError(ValueError):
    """A validation error that knows which part of the checked value is wrong (for the line number)."""

    def __init__(self, message: str, loc: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.loc = loc


# -- field checks ---------------------------------------------------------------------------------


def _label_key(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
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
    if not _NOT_BLANK.search(pattern):
        raise ValueError("a glob must not be empty")
    return pattern


# What the API server checks of the same values (controller/core/schema.py; the unit tests hold each
# pattern to its check): a label key is a qualified name with an optional DNS-subdomain prefix, the
# prefix at most 253 characters and the name at most 63.
LABEL_KEY_PATTERNS = (whole(rf"({DNS1123_SUBDOMAIN}/)?{QUALIFIED_NAME}"), r"^([^/]{1,253}/)?[^/]{1,63}$")
LabelKey = Annotated[
    str,
    AfterValidator(_label_key),
    OpenAPI(
        patterns=LABEL_KEY_PATTERNS,
        max_length=317,
        message="every key must be a label key: an optional DNS subdomain and '/', then at most 63 "
        "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
    ),
]
LabelValue = Annotated[str, AfterValidator(_label_value), OpenAPI(patterns=(whole(f"({QUALIFIED_NAME})?"),), max_length=63)]
Glob = Annotated[str, AfterValidator(_glob), OpenAPI(patterns=(NOT_BLANK,))]
NodeName = Annotated[str, AfterValidator(_node_name), OpenAPI(patterns=(whole(DNS1123_SUBDOMAIN),), max_length=253)]
NamespaceName = Annotated[str, AfterValidator(_dns_label), OpenAPI(patterns=(whole(DNS1123_LABEL),), max_length=63)]


def _glob_regex(globs: tuple[str, ...]) -> re.Pattern[str] | None:
    """One compiled regular expression matching any of the fnmatch-style globs (case-sensitive)."""
    if not globs:
        return None
    return re.compile("|".join(f"(?:{translate(g)})" for g in globs))


# -- label selectors ------------------------------------------------------------------------------


class LabelSelectorRequirement(PolicyModel):
    key: LabelKey = Field(
        description="The label key the requirement reads (e.g. team or example.com/tier)."
    )
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In and NotIn compare the label's value with `values`; Exists and DoesNotExist only look for the key."
    )
    values: tuple[LabelValue, ...] = Field(
        default=(),
        description="The values for In and NotIn (at least one); none for Exists and DoesNotExist.",
    )

    openapi = OpenAPI(
        rules=(
            Rule(
                "self.operator in ['Exists', 'DoesNotExist'] || (has(self.values) && size(self.values) > 0)",
                "operator In and NotIn need at least one value",
                field_path=".values",
                reason="FieldValueRequired",
            ),
            Rule(
                "self.operator in ['In', 'NotIn'] || !has(self.values) || size(self.values) == 0",
                "operator Exists and DoesNotExist take no values",
                field_path=".values",
                reason="FieldValueForbidden",
            ),
        )
    )

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

    match_labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=MAX_SELECTOR_LABELS, description="Labels the namespace must all have, with these values."
    )
    match_expressions: tuple[LabelSelectorRequirement, ...] = Field(
        default=(), description="Requirements on the namespace's labels, all of which must hold."
    )

    openapi = OpenAPI(
        rules=(
            Rule(
                "(has(self.matchLabels) && size(self.matchLabels) > 0) || "
                "(has(self.matchExpressions) && size(self.matchExpressions) > 0)",
                "a selector needs matchLabels or matchExpressions (an empty one would match everything)",
            ),
        )
    )

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


PREFER_NO_SCHEDULE_REFUSED = (
    "taint effect PreferNoSchedule is refused: the scheduler may still put any pod on the pool's nodes, so "
    "it does not keep them for the pool; use NoSchedule (the default) or NoExecute (docs/pools-api.md, "
    "\"Taint effect\")"
)


class PoolTaint(PolicyModel):
    """The taint egress-placer keeps on every node of the pool; its value is always the pool name.
    The key is fixed (`TAINT_KEY`): `key` may be written only with that value (policies that
    spelled out the default still load)."""

    key: Annotated[str, OpenAPI(extra={"enum": [TAINT_KEY]})] = Field(
        default=TAINT_KEY,
        description=f"Always {TAINT_KEY} (the only value allowed; leave it out). Taints with any other key are never touched.",
    )
    # The schema's enum keeps Kubernetes' three effects: when an enum refuses a value the API server
    # skips the CEL rules, and the rule below says why PreferNoSchedule is refused.
    effect: Annotated[
        Literal["NoSchedule", "NoExecute"], OpenAPI(extra={"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]})
    ] = Field(
        default="NoSchedule",
        description="The taint's effect: NoSchedule (the default) or NoExecute (also evicts running pods that "
        "do not tolerate it). PreferNoSchedule is refused: it does not keep pods off the pool's nodes.",
    )

    openapi = OpenAPI(
        rules=(
            Rule(
                "!has(self.effect) || self.effect != 'PreferNoSchedule'",
                PREFER_NO_SCHEDULE_REFUSED,
                field_path=".effect",
                reason="FieldValueForbidden",
            ),
        )
    )

    @field_validator("effect", mode="before")
    @classmethod
    def _keeps_pods_off(cls, effect: Any) -> Any:
        if effect == "PreferNoSchedule":
            raise ValueError(PREFER_NO_SCHEDULE_REFUSED)
        return effect

    @field_validator("key")
    @classmethod
    def _fixed_key(cls, key: str) -> str:
        if key != TAINT_KEY:
            raise ValueError(
                f"the taint key is fixed to {TAINT_KEY} (custom keys were dropped; leave `key` out). "
                f"Taints a former key left on nodes are not egress-placer's to remove: remove them by hand"
            )
        return key


PROVISIONING_NEEDS_SELECTOR = (
    "provisioning needs a pool chosen by nodeSelector alone: no node can be provisioned into a list of "
    "node names (nodes); drop nodes and give those nodes the pool's labels instead"
)


class KarpenterProvisioning(PolicyModel):
    """The Karpenter NodePool that brings up the pool's nodes."""

    node_pool: NodeName = Field(
        description="The NodePool's name. Its template must carry the pool's nodeSelector labels and the "
        "pool's taint (egress-placer.io/pool=<pool>) in template.spec.taints (docs/coexistence.md, Karpenter)."
    )


class Provisioning(PolicyModel):
    """Who brings up the pool's nodes on demand."""

    karpenter: KarpenterProvisioning = Field(description="Karpenter, through one of its NodePools.")


class Pool(PolicyModel):
    name: str = Field(
        description="The pool's name: a DNS-1123 label, unique; auto and none are reserved (values of the "
        "run annotation egress-placer.io/placement)."
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_SELECTOR_LABELS,
        description="Membership: a node with ALL these labels is in the pool. At least one of nodeSelector "
        "and nodes is required.",
    )
    nodes: tuple[NodeName, ...] = Field(
        default=(), description="Membership: these nodes, by name, are in the pool (whatever their labels)."
    )
    images: tuple[Glob, ...] = Field(
        default=(),
        description="A run using an image that matches one of these globs goes to the pool (fnmatch: * ? "
        "[abc]; * also matches /; case-sensitive; the whole reference as written in the run after params "
        "are substituted, not normalised: ubuntu is not docker.io/library/ubuntu:latest). Empty: only "
        "runs that opt in (egress-placer.io/placement: <pool>) come here.",
    )
    namespaces: tuple[Glob, ...] = Field(
        default=(),
        max_length=MAX_NAMESPACES,
        description="Who may use the pool: namespaces whose name matches one of these globs (also: "
        "namespaceSelector, or the Namespace annotation egress-placer.io/pools naming the pool).",
    )
    namespace_selector: LabelSelector | None = Field(
        default=None,
        description="Who may use the pool: namespaces whose labels match this selector (it must not be "
        "empty: an empty selector would match every namespace).",
    )
    placement: Annotated[Literal["required", "preferred"], OpenAPI(default="required")] = Field(
        default="required",
        description="required: runs may only be scheduled on pool nodes (a required node affinity). "
        "preferred: runs prefer pool nodes but may run elsewhere when the pool is full or down.",
    )
    capacity: PositiveInt | None = Field(
        default=None,
        description="Runs per node before the node counts as full (at least 1). Default: the node's "
        "allocatable pods.",
    )
    taint: PoolTaint = Field(
        default_factory=PoolTaint,
        description=f"The taint kept on every node of the pool: key {TAINT_KEY}, value the pool's name; "
        "admitted runs get the matching toleration.",
    )
    egress_load: EgressLoad | None = Field(
        default=None,
        description="Optional: each node's measured outbound throughput from Prometheus, weighed with its "
        "run count when a node is chosen (docs/egress-load.md).",
    )
    history: MeasuredHistory | None = Field(
        default=None,
        description="Optional, opt-in: the pool also takes runs by measured history: the Tasks (and Pipeline "
        "tasks) of a namespace the pool allows whose past runs sent at least p90BytesAtLeast (90th percentile) "
        "over the window, read from Prometheus in the background; after the image globs (docs/suggest.md).",
    )
    queue: QueueSetting | None = Field(
        default=None,
        description="Optional, opt-in: hold runs while the pool is full. Every eligible run is created "
        "pending and released by the leader when a slot frees (runsPerNode on each Ready, tainted node), "
        "by namespace priority, then round-robin between namespaces, then first come first served "
        "(docs/queue.md). Without it runs start at once, as capacity is only a load figure.",
    )
    egress_address: EgressAddress | None = Field(
        default=None,
        description="Optional: where a node's egress address is read (a node label or annotation, e.g. the "
        "public address of the NAT it leaves through). Nodes with the same address share its destinations' "
        "per-address budgets. Default: each node is its own address (docs/budgets.md).",
    )
    destinations: Annotated[
        tuple[Destination, ...], Field(max_length=MAX_DESTINATIONS), AfterValidator(unique_destinations)
    ] = Field(
        default=(),
        description="Optional: the services the pool's runs call (matched by image, Task name or a URL "
        "param's host) and their budgets: runs at once per egress address, runs at once per pool, starts "
        "per window per egress address. A run waits, pending, until every budget it touches has room "
        "(mode Enforce), or is only counted and reported (ReportOnly) (docs/budgets.md).",
    )
    provisioning: Provisioning | None = Field(
        default=None,
        description="Optional: the pool's nodes are provisioned on demand (Karpenter). With no Ready node, "
        "an eligible run's pod is still sent to the pool (its toleration and node affinity, no node "
        "named), so that it waits Pending and the provisioner brings a node up; without it such a run "
        "goes to ordinary nodes (preferred) or is not placed. The pool must be chosen by nodeSelector "
        "alone (no nodes).",
    )

    openapi = OpenAPI(
        rules=(
            Rule(
                "(has(self.nodeSelector) && size(self.nodeSelector) > 0) || (has(self.nodes) && size(self.nodes) > 0)",
                "a pool needs nodeSelector or nodes (or both) to have members",
                reason="FieldValueRequired",
            ),
            Rule(
                "!has(self.provisioning) || !has(self.nodes) || size(self.nodes) == 0",
                PROVISIONING_NEEDS_SELECTOR,
                field_path=".provisioning",
                reason="FieldValueForbidden",
            ),
            Rule(
                "!has(self.destinations) || self.destinations.all(d, self.destinations.exists_one(e, e.name == d.name))",
                "every destination's name must be unique in the pool",
                field_path=".destinations",
                reason="FieldValueDuplicate",
            ),
        )
    )

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

    @model_validator(mode="after")
    def _provisioned_by_selector(self) -> "Pool":
        if self.provisioning is not None and self.nodes:
            raise _FieldError(PROVISIONING_NEEDS_SELECTOR, ("provisioning",))
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
        regex = self.__pydantic_private__["_namespace_regex"]  # not self._namespace_regex: 100 times slower (#24)
        if regex is not None and regex.fullmatch(str(ns.name)):
            return True
        if self.namespace_selector is not None and self.namespace_selector.matches(ns.labels):
            return True
        listed = str(ns.annotations.get(NAMESPACE_POOLS_ANNOTATION) or "")
        return self.name in {p.strip() for p in listed.split(",")}

    def matches_image(self, image: str) -> bool:
        regex = self.__pydantic_private__["_image_regex"]
        return regex is not None and regex.fullmatch(image) is not None

    def taint_for(self) -> Taint:
        return Taint(key=self.taint.key, value=self.name, effect=self.taint.effect)

    def toleration(self) -> dict[str, str]:
        return {"key": self.taint.key, "operator": "Equal", "value": self.name, "effect": self.taint.effect}


class PlacementPolicy(PolicyModel):
    api_version: Literal["egress-placer.io/v1alpha1"] = Field(description="egress-placer.io/v1alpha1")
    kind: Literal["PlacementPolicy"] = Field(description="PlacementPolicy")
    exempt_namespaces: tuple[NamespaceName, ...] = Field(
        default=DEFAULT_EXEMPT_NAMESPACES,
        max_length=MAX_NAMESPACES,
        description="Pods of these namespaces (exact names) are never intruders on pool nodes. Default: "
        "kube-system, kube-node-lease, kube-public; setting it replaces that list.",
    )
    # Namespaces whose node agents (DaemonSets) may run on pool nodes; None: the exempt namespaces.
    agent_namespaces: tuple[NamespaceName, ...] | None = Field(
        default=None,
        max_length=MAX_NAMESPACES,
        description="Node agents (DaemonSets: log shippers, node exporters) of these namespaces (exact "
        "names) may run on pool nodes: new DaemonSets get the pool tolerations at admission, and the "
        "API server's pool guard leaves them out. Default: the exemptNamespaces.",
    )
    # Agent namespaces whose EXISTING DaemonSets the leader may change to add the pool tolerations
    # (which restarts their pods); elsewhere it only reports them (agents.core).
    patch_existing_agents: tuple[NamespaceName, ...] = Field(
        default=(),
        max_length=MAX_NAMESPACES,
        description="Agent namespaces whose EXISTING DaemonSets the leader may change to add the pool "
        "tolerations (their pods restart); elsewhere they are only reported. Each must be an agent "
        "namespace. Default: none.",
    )
    pools: tuple[Pool, ...] = Field(
        default=(), description="The pools, in priority order: a node belongs to the first pool that claims it."
    )

    openapi = OpenAPI(
        rules=(
            Rule(
                "!has(self.patchExistingAgents) || self.patchExistingAgents.all(n, n in "
                "(has(self.agentNamespaces) ? self.agentNamespaces : has(self.exemptNamespaces) ? "
                f"self.exemptNamespaces : {list(DEFAULT_EXEMPT_NAMESPACES)!r}))",
                "every namespace of patchExistingAgents must be an agent namespace (agentNamespaces, by default "
                "the exemptNamespaces)",
                field_path=".patchExistingAgents",
            ),
        )
    )

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
        """The pool named `name` (the first, in file order), by a dict kept for the pools in force: a review
        asks three or four times (#24)."""
        global _POOLS_BY_NAME
        pools, by_name = _POOLS_BY_NAME
        if pools is not self.pools:
            by_name = {}
            for p in self.pools:
                by_name.setdefault(p.name, p)
            _POOLS_BY_NAME = (self.pools, by_name)
        return by_name.get(name)

    def pool_of(self, node: NodeState) -> Pool | None:
        """The pool the node belongs to: the first, in file order, that claims it.

        Memoised by node object (a NodeState is frozen: a node that changed is a new object) for the
        pools in force: a reconcile pass asks for every pool node, several times, and few changed (#24)."""
        global _POOL_MEMO
        pools, memo = _POOL_MEMO
        if pools is not self.pools:
            pools, memo = self.pools, {}
            _POOL_MEMO = (pools, memo)
        hit = memo.get(node.name)
        if hit is not None and hit[0] is node:
            return hit[1]
        pool = next((p for p in pools if p.claims(node)), None)
        memo[node.name] = (node, pool)
        return pool

    def owned_taint_keys(self) -> frozenset[str]:
        """The taint keys egress-placer owns: the one fixed key, with or without pools (so a valid
        policy that drops a pool also drops its taints)."""
        return OWNED_TAINT_KEYS


# pool_of's answers: (the pools they are for, node name -> (the node object asked about, its pool)). One
# policy's at a time (the one in force); not in the model, whose equality counts its private attributes.
_POOL_MEMO: tuple[tuple[Pool, ...], dict[str, tuple[NodeState, Pool | None]]] = ((), {})
# pool's dict: (the pools it is for, name -> pool), likewise one policy's at a time.
_POOLS_BY_NAME: tuple[tuple[Pool, ...], dict[str, Pool]] = ((), {})


def dump_policy(policy: PlacementPolicy) -> str:
    """`policy` as a PlacementPolicy document that `load_policy` reads back equal (defaults left out)."""
    return yaml.safe_dump(policy.model_dump(mode="json", by_alias=True, exclude_defaults=True), sort_keys=False)


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
    with _yaml_errors(text, source) as loader:
        root = loader.get_single_node()
        if root is None:
            raise PolicyError(f"{source}: the policy is empty; expected a {KIND} mapping")
        if not isinstance(root, yaml.MappingNode):
            raise PolicyError(f"{source}:{_line(root)}: expected a {KIND} mapping, got {_node_kind(root)}")
        _refuse_duplicate_keys(root, source)
        data = loader.construct_document(root)
    try:
        return validate_policy(data, lambda loc: f"{source}:{_line(node_at(root, loc))}: {field_path(loc) or '(top level)'}")
    except RecursionError:
        raise PolicyError(f"{source}:{_line(root)}: the policy is nested too deeply") from None


def read_documents(text: str, source: str) -> list[tuple[yaml.Node, Any]]:
    """Every YAML document of `text` (empty ones left out), as its node (for line numbers) and its
    value; PolicyError naming the line for invalid YAML, duplicate keys or a self-referring alias."""
    documents = []
    with _yaml_errors(text, source) as loader:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            _refuse_duplicate_keys(node, source)
            documents.append((node, loader.construct_document(node)))
    return documents


@contextmanager
def _yaml_errors(text: str, source: str) -> Iterator[_PolicyLoader]:
    """A loader of `text` whose YAML errors become PolicyError naming source and line."""
    try:
        loader = _PolicyLoader(text)
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (control characters, surrogates)
        raise PolicyError(f"{source}:{text.count(chr(10), 0, e.position) + 1}: invalid YAML: {e.reason}") from None
    try:
        yield loader
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}" if mark else f"{source}:{loader.line + 1}"
        raise PolicyError(f"{where}: invalid YAML: {yaml_problem(e)}") from None
    except RecursionError:
        raise PolicyError(f"{source}:{loader.line + 1}: invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()


def validate_policy(data: Any, where: Callable[[tuple[str | int, ...]], str]) -> PlacementPolicy:
    """The one validation of a policy, whatever its form (a document, objects of the API): `data` as
    a PlacementPolicy, or PolicyError with one line per problem, `where(loc)` naming the place of the
    field at `loc` (e.g. "policy.yaml:9: pools[0].placement")."""
    try:
        return PlacementPolicy.model_validate(data)
    except ValidationError as e:
        raise PolicyError("\n".join(f"{where(loc)}: {message}" for loc, message in _problems(e))) from None


def _problems(error: ValidationError) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(where, what) of each problem: a _FieldError's own location is added to pydantic's."""
    for err in error.errors():
        loc = tuple(err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, _FieldError):
            loc += cause.loc
        yield loc, str(cause) if cause is not None else err["msg"]


def node_at(root: yaml.Node, loc: tuple[str | int, ...]) -> yaml.Node:
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


def field_path(loc: tuple[str | int, ...]) -> str:
    """`pools[0].namespaceSelector.matchLabels` for a pydantic location."""
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
