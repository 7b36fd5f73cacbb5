"""Plain data shared by the pure core, the adapters and the command line.

Everything here is immutable and built from plain dicts (the shapes the API server serves),
so the same values flow from informer caches, admission requests and manifest files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from collections.abc import Mapping
from typing import Any, NamedTuple

from controller.core.json_wire import is_object

# Annotations and labels egress-placer reads or writes.
PLACEMENT_ANNOTATION = "egress-placer.io/placement"  # on a run: auto | none | <pool name>
NAMESPACE_POOLS_ANNOTATION = "egress-placer.io/pools"  # on a Namespace: "pool-a,pool-b"
POOL_SLOT_GATE = "egress-placer.io/pool-slot"  # a pod's schedulingGate: its run is not queued by us, it waits for a slot
DECISION_ANNOTATION = "egress-placer.io/decision"  # written on admitted runs and pods (JSON)
# Written with the decision: the AdmissionReview's uid, so the decision's Event finds the object once it exists.
REVIEW_ANNOTATION = "egress-placer.io/review"
# Karpenter's: a node with a pod that has it (value "true") is not voluntarily disrupted (consolidation,
# drift, expiry) while the pod runs. Written on every pod placed on a pool (core.patches.protection).
DO_NOT_DISRUPT_ANNOTATION = "karpenter.sh/do-not-disrupt"
# The node label a kubelet sets to its hostname, which is the node's name unless it was told otherwise: a pool's
# listed nodes are written as one requirement on it while every node's equals its name (core.patches.pool_terms).
HOSTNAME_LABEL = "kubernetes.io/hostname"
# The one key of the taints egress-placer keeps on pool nodes (value: the pool name). Fixed: every
# taint with this key is egress-placer's, whatever the policy says now, so the taints of a pool that
# was removed are found and removed, and the webhook's matchConditions can name it (k8s/webhook.yaml).
TAINT_KEY = "egress-placer.io/pool"
PREFERRED_NODE_WEIGHT = 100  # weight of the preferred-node term egress-placer writes
POOL_PREFERENCE_WEIGHT = 80  # weight of the pool term when a pool's placement is "preferred"


class Reason(StrEnum):
    """Why a run goes (or does not go) to a pool. Values are the `explain` contract."""

    IMAGE_MATCH = "image-match"
    OPT_IN = "opt-in"
    OPT_OUT = "opt-out"
    NO_MATCH = "no-match"
    NAMESPACE_NOT_ALLOWED = "namespace-not-allowed"
    UNKNOWN_POOL = "unknown-pool"
    UNRESOLVED = "unresolved"
    MEASURED = "measured-history"  # a pool's `history` rule: the run's Task sent much in the past


@dataclass(frozen=True)
class MeasuredMatch:
    """A run's Task (or Pipeline task) found in a pool's measured set (suggest.core.measured_matches):
    `namespace` is the run's own (the set is looked up by it), `group` the history's group, `why` its
    evidence in one phrase."""

    pool: str
    namespace: str
    group: str
    why: str


@dataclass(frozen=True)
class Taint:
    key: str
    value: str | None
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Taint":
        return cls(key=d["key"], value=d.get("value") or None, effect=d["effect"])

    def to_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class NodeState:
    """What the core needs to know about a node (trimmed from the Node object)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    unschedulable: bool = False
    allocatable_pods: int = 110
    uid: str = ""  # set by the API server: what a mirror pod's Node owner must name
    annotations: Mapping[str, str] = field(default_factory=dict)  # only those the informer keeps (egress address)

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> "NodeState":
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        try:
            pods = int(str((status.get("allocatable") or {}).get("pods", "110")))
        except ValueError:
            pods = 110
        return cls(
            name=meta["name"],
            labels=dict(meta.get("labels") or {}),
            taints=tuple(Taint.from_dict(t) for t in spec.get("taints") or []),
            ready=ready,
            unschedulable=bool(spec.get("unschedulable")),
            allocatable_pods=pods,
            uid=_text(meta.get("uid")),
            annotations=dict(meta.get("annotations") or {}),
        )


@dataclass(frozen=True)
class NamespaceState:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_namespace(cls, ns: Mapping[str, Any]) -> "NamespaceState":
        meta = ns.get("metadata") or {}
        return cls(
            name=meta["name"],
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
        )


class NodeLoad(NamedTuple):
    """Load of one pool node as the balancer sees it (a named tuple: a choice reports ten of them per
    review, and a tuple is made at a tenth of a frozen dataclass's cost)."""

    name: str
    placed: int  # pods egress-placer placed there that are pending or running
    assumed: int  # placements chosen at admission whose pods have not appeared yet
    capacity: int  # runs the node should take (pool setting or allocatable pods)

    @property
    def total(self) -> int:
        return self.placed + self.assumed


@dataclass(frozen=True)
class ImageSet:
    """The images a run or pod will use, as far as they can be known."""

    images: tuple[str, ...] = ()  # resolved images, sorted, no duplicates
    unresolved: tuple[str, ...] = ()  # one human-readable cause per image that could not be known

    @property
    def complete(self) -> bool:
        return not self.unresolved


@dataclass(frozen=True)
class Decision:
    """The answer for one run, pipeline task or pod."""

    pool: str | None
    reason: Reason
    images: tuple[str, ...] = ()
    unresolved: tuple[str, ...] = ()
    message: str = ""  # one sentence for Events, the decision annotation and logs

    @property
    def placed(self) -> bool:
        return self.pool is not None


class OwnerRef(NamedTuple):
    """One ownerReference of an object, as written: the tenant's to write, so it proves nothing until
    it is resolved against what the API server made (see intruders.core). A named tuple: every Pod review
    reads one, and a tuple is made at a tenth of a frozen dataclass's cost."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False


def owner_refs(meta: Any) -> tuple[OwnerRef, ...]:
    """The ownerReferences of `meta` (an object's metadata), skipping entries that are not objects;
    fields of the wrong type read as empty (admission sees whatever the tenant sent)."""
    owners = meta.get("ownerReferences") if is_object(meta) else None
    if not isinstance(owners, list):
        return ()
    return tuple(
        OwnerRef(
            api_version=_text(o.get("apiVersion")),
            kind=_text(o.get("kind")),
            name=_text(o.get("name")),
            uid=_text(o.get("uid")),
            controller=o.get("controller") is True,
        )
        for o in owners
        if is_object(o)
    )


@dataclass(frozen=True)
class AgentTemplate:
    """The parts of a DaemonSet's pod template that decide which nodes its pods go to."""

    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms; None: no required node affinity
    required_terms: tuple[Mapping[str, Any], ...] | None = None
    host_network: bool = False

    @classmethod
    def from_pod_spec(cls, spec: Any) -> "AgentTemplate":
        spec = spec if isinstance(spec, Mapping) else {}
        tolerations = spec.get("tolerations")
        selector = spec.get("nodeSelector")
        affinity = spec.get("affinity")
        node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
        required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(node_affinity, Mapping) else None
        terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
        return cls(
            tolerations=tuple(t for t in tolerations if isinstance(t, Mapping)) if isinstance(tolerations, list) else (),
            node_selector={k: v for k, v in selector.items() if isinstance(v, str)} if isinstance(selector, Mapping) else {},
            required_terms=tuple(terms) if isinstance(terms, list) else None,
            host_network=spec.get("hostNetwork") is True,
        )


@dataclass(frozen=True)
class DaemonSetState:
    """A DaemonSet as the API server has it, trimmed to who it is (what a pod's DaemonSet owner must
    resolve to before the pod is trusted as a node agent) and where its pods go (the pool nodes a node
    agent misses, agents.core)."""

    namespace: str
    name: str
    uid: str
    template: AgentTemplate = field(default_factory=AgentTemplate)
    annotations: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False
    # The precondition of a template patch; not compared, so a status update changes nothing kept here.
    resource_version: str = field(default="", compare=False)

    @classmethod
    def from_daemonset(cls, ds: Mapping[str, Any]) -> "DaemonSetState":
        meta = ds.get("metadata") or {}
        template = (ds.get("spec") or {}).get("template") or {}
        return cls(
            namespace=meta.get("namespace") or "default",
            name=meta["name"],
            uid=meta.get("uid") or "",
            template=AgentTemplate.from_pod_spec(template.get("spec")),
            annotations=dict(meta.get("annotations") or {}),
            deleting=bool(meta.get("deletionTimestamp")),
            resource_version=meta.get("resourceVersion") or "",
        )


DEFAULT_GRACE_SECONDS = 30  # the API server's default terminationGracePeriodSeconds


@dataclass(frozen=True)
class PodState:
    """What the core needs to know about a pod (trimmed from the Pod object)."""

    namespace: str
    name: str
    node_name: str | None = None
    phase: str = "Pending"
    owners: tuple[OwnerRef, ...] = ()  # the ownerReferences as written (by the tenant, for a bare pod)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False
    uid: str = ""  # this pod, not a later one of the same name (preconditions of evictions and deletes)
    # Seconds its containers get to stop: the deletion's grace once it is being deleted, else its own
    # terminationGracePeriodSeconds (the tenant's to choose: a day, with a process that ignores SIGTERM).
    grace_seconds: int = DEFAULT_GRACE_SECONDS
    # Only for a pod waiting for a pool slot (POOL_SLOT_GATE, queue.core.GatedPod): spec.schedulingGates'
    # names and its tolerations (which pools it waits for).
    gates: tuple[str, ...] = ()
    tolerated: tuple[tuple[str, str, str], ...] = ()  # (key, operator, value)
    # creationTimestamp: the order gated pods go in (GatedPod), and which run pods came in past a queued
    # pool's cap (queue.core.over_cap)
    created: str = ""

    @property
    def owner_kinds(self) -> tuple[str, ...]:
        """The kinds its ownerReferences claim (load counting only: a claim proves nothing)."""
        return tuple(o.kind for o in self.owners)

    @property
    def finished(self) -> bool:
        """Succeeded or Failed: it holds no node and takes no place any more (the cache drops it)."""
        return self.phase in ("Succeeded", "Failed")

    @property
    def on_node(self) -> bool:
        """Pending or running on its node, being deleted or not: it holds the node until it is gone."""
        return self.phase in ("Pending", "Running") and bool(self.node_name)

    @property
    def active(self) -> bool:
        """Pending or running, and not being deleted: it takes a place on its node."""
        return self.phase in ("Pending", "Running") and not self.deleting

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> "PodState":
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        return cls(
            namespace=meta.get("namespace") or "default",
            name=meta["name"],
            node_name=spec.get("nodeName") or None,
            phase=status.get("phase") or "Pending",
            owners=owner_refs(meta),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            deleting=bool(meta.get("deletionTimestamp")),
            uid=meta.get("uid") or "",
            grace_seconds=_grace(meta.get("deletionGracePeriodSeconds"), spec.get("terminationGracePeriodSeconds")),
            created=_text(meta.get("creationTimestamp")),
            **_gated(meta, spec),
        )


def _gated(meta: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    gates = tuple(g["name"] for g in spec.get("schedulingGates") or [] if isinstance(g, Mapping) and isinstance(g.get("name"), str))
    if POOL_SLOT_GATE not in gates:
        return {}
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
    tolerated = tuple((_text(t.get("key")), _text(t.get("operator")) or "Equal", _text(t.get("value"))) for t in tolerations)
    return {"gates": gates, "tolerated": tolerated}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _grace(deletion: Any, spec: Any) -> int:
    """The deletion's grace when set, else the pod's own, else the API server's default."""
    for value in (deletion, spec):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return DEFAULT_GRACE_SECONDS
