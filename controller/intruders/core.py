"""The pool guard's tests: which pod is a trusted node agent (a DaemonSet pod of an agent namespace,
a kubelet's mirror pod), which node a namespace may not use, and which pods are intruders.

Pure: the admission handler and the reconciler pass what the informers cached (nodes with their
uids, DaemonSets by uid, namespaces) and act on the answer. Admission and the intruder check use the
SAME functions, so a pod trusted at admission is trusted on the node and the other way round.

Written from the attacker's side: labels, annotations, ownerReferences, names, tolerations,
nodeName and terminationGracePeriodSeconds are the tenant's to write. Each check below says which
fact it relies on that the tenant cannot forge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from controller.core.model import DaemonSetState, NamespaceState, NodeState, OwnerRef, PodState
from controller.core.policy import PlacementPolicy, Pool, is_agent_namespace

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
DAEMONSET_API_VERSION = "apps/v1"


class Agent(Enum):
    """What a pod's DaemonSet owner claim is worth."""

    NONE = "none"  # no DaemonSet claimed, or claimed where node agents may not run: an ordinary pod
    TRUSTED = "trusted"  # a real DaemonSet of an agent namespace (resolved by uid in the cache)
    UNRESOLVED = "unresolved"  # claims an apps/v1 DaemonSet of an agent namespace the cache does not hold (yet)


@dataclass(frozen=True)
class Intruder:
    namespace: str
    name: str
    node: str
    pool: str
    reason: str  # one sentence, for the Event and the log
    uid: str = ""  # the pod's uid: an eviction or delete must not hit a later pod of the same name
    grace_seconds: int = 30  # the pod's own grace (its deletion's, once terminating)
    terminating: bool = False  # being deleted already (by its owner, by us, by the tenant with a day's grace)
    # Claims a DaemonSet of an agent namespace that the cache does not hold: the DaemonSet informer may
    # be a moment behind the pod informer, so the reconciler gives the cache a few seconds first.
    unresolved_owner: bool = False

    @property
    def key(self) -> str:
        """Who it is for the reconciler's bookkeeping: the uid (a pod re-created under the same name
        is another pod, and another intruder at once)."""
        return self.uid or f"{self.namespace}/{self.name}"


def controller_owner(owners: Iterable[OwnerRef]) -> OwnerRef | None:
    """The owner marked `controller: true` (at most one: the API server refuses two)."""
    return next((o for o in owners if o.controller), None)


def daemonset_agent(
    policy: PlacementPolicy, namespace: str, owners: Iterable[OwnerRef], daemonsets: Mapping[str, DaemonSetState]
) -> Agent:
    """Is this pod a node agent: a pod of a real DaemonSet of an agent namespace?

    Facts the tenant cannot forge: the pod's namespace (the request's, or the cached pod's: a tenant
    who may create pods only in its own namespace cannot put one in an agent namespace), and the uid
    of its controller owner resolved in the informer cache to an `apps/v1` DaemonSet of that
    namespace and name (uids are made by the API server). A made-up uid, an apiVersion the garbage
    collector cannot resolve (`extensions/v1beta1`), or a real DaemonSet of a tenant namespace (the
    `edit` role may create one) does not make a node agent.
    """
    owner = controller_owner(owners)
    if owner is None or owner.kind != "DaemonSet" or not is_agent_namespace(policy, namespace):
        return Agent.NONE
    if owner.api_version != DAEMONSET_API_VERSION:
        return Agent.NONE
    daemonset = daemonsets.get(owner.uid) if owner.uid else None
    if daemonset is None:
        return Agent.UNRESOLVED
    if daemonset.namespace == namespace and daemonset.name == owner.name:
        return Agent.TRUSTED
    return Agent.NONE  # the uid of a DaemonSet elsewhere (copied), or under another name


def is_mirror_pod(
    annotations: Mapping[str, str], owners: Iterable[OwnerRef], node_name: str | None, node: NodeState | None
) -> bool:
    """A kubelet's mirror of a static pod: the annotation AND a controller owner `v1` Node that is the
    pod's own node, by name and by the uid the API server gave that node (NodeRestriction makes a
    kubelet write exactly that). Anyone may write the annotation; the node's uid is the fact the
    tenant cannot forge (the `edit` role cannot read Nodes, and a wrong uid resolves to nothing)."""
    if MIRROR_POD_ANNOTATION not in annotations or not node_name or node is None or not node.uid:
        return False
    owner = controller_owner(owners)
    return (
        owner is not None
        and (owner.api_version, owner.kind, owner.name, owner.uid) == ("v1", "Node", node_name, node.uid)
    )


def refused_pool(
    policy: PlacementPolicy, node_name: str, node: NodeState | None, namespace: NamespaceState
) -> Pool | None:
    """The pool of node `node_name` when `namespace` may not use it (None: not a pool node, or allowed).

    `node` is the cached node; when None (not cached yet) a bare NodeState of that name is used, so
    pools that list nodes by name still count. Facts the tenant cannot forge: the node's labels (the
    `edit` role cannot write Nodes) and the namespace's name, labels and annotations (nor Namespaces).
    """
    pool = policy.pool_of(node if node is not None else NodeState(name=node_name))
    if pool is None or pool.allows(namespace):
        return None
    return pool


def check_pod(
    policy: PlacementPolicy,
    pod: PodState,
    node: NodeState | None,
    namespace: NamespaceState | None,
    daemonsets: Mapping[str, DaemonSetState],
) -> Intruder | None:
    """The intruder record for `pod`, or None when it may stay where it is.

    A pod being deleted still holds its node until it is gone (a day, with a day's grace and a process
    that ignores SIGTERM): it stays an intruder, marked `terminating`. `namespace` None means unknown:
    a namespace without labels or annotations.
    """
    if not pod.on_node or pod.node_name is None:
        return None
    if pod.namespace in policy.exempt_namespaces:  # the cached pod's namespace: only admins create pods there
        return None
    agent = daemonset_agent(policy, pod.namespace, pod.owners, daemonsets)
    if agent is Agent.TRUSTED:
        return None
    if is_mirror_pod(pod.annotations, pod.owners, pod.node_name, node):
        return None
    pool = refused_pool(policy, pod.node_name, node, namespace or NamespaceState(name=pod.namespace))
    if pool is None:
        return None
    return Intruder(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        node=pod.node_name,
        pool=pool.name,
        grace_seconds=pod.grace_seconds,
        terminating=pod.deleting,
        unresolved_owner=agent is Agent.UNRESOLVED,
        reason=(
            f"Pod {pod.namespace}/{pod.name} is on node {pod.node_name} of pool {pool.name}, "
            f"which namespace {pod.namespace} may not use."
        ),
    )


def find_intruders(
    policy: PlacementPolicy,
    nodes: Mapping[str, NodeState],
    pods: Iterable[PodState],
    namespaces: Mapping[str, NamespaceState],
    daemonsets: Mapping[str, DaemonSetState],
) -> list[Intruder]:
    """Every intruder among `pods`, sorted by namespace, name, uid.

    The same decision as `check_pod` on each pod, made cheap for a pass over a whole pool (#24): a pod
    that `check_pod` would let stay for its namespace being exempt, its node being in no pool, or its
    namespace being allowed in the node's pool is let stay at a dict lookup, from answers worked out
    once per node and once per (pool, namespace) in this call; only the rest (the would-be intruders)
    go through `check_pod` itself."""
    exempt = frozenset(policy.exempt_namespaces)
    pool_by_node: dict[str, Pool | None] = {}
    allowed: dict[tuple[str, str], bool] = {}
    found = []
    for pod in pods:
        node_name, namespace = pod.node_name, pod.namespace
        if not pod.on_node or node_name is None or namespace in exempt:
            continue
        node = nodes.get(node_name)
        if node_name in pool_by_node:
            pool = pool_by_node[node_name]
        else:
            pool = pool_by_node[node_name] = policy.pool_of(node if node is not None else NodeState(name=node_name))
        if pool is None:
            continue
        key = (pool.name, namespace)
        ns = namespaces.get(namespace)
        if key not in allowed:
            allowed[key] = pool.allows(ns or NamespaceState(name=namespace))
        if allowed[key]:
            continue
        intruder = check_pod(policy, pod, node, ns, daemonsets)
        if intruder is not None:
            found.append(intruder)
    return sorted(found, key=lambda i: (i.namespace, i.name, i.uid))


def eviction_grace(pod_grace: int, cap: int) -> int:
    """The grace an intruder's eviction gives: its own (the tenant's to choose), at most `cap`."""
    return max(0, min(pod_grace, cap))
