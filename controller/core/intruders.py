"""The intruder test: a pod on a pool node whose namespace may not use that pool.

Pure: the reconciler passes the cached nodes, pods and namespaces and decides what to do
(event, eviction) with the answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.core.model import NamespaceState, NodeState, PodState
from controller.core.policy import PlacementPolicy

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class Intruder:
    namespace: str
    name: str
    node: str
    pool: str
    reason: str  # one sentence, for the Event and the log
    uid: str = ""  # the pod's uid: an eviction or delete must not hit a later pod of the same name


def check_pod(
    policy: PlacementPolicy,
    pod: PodState,
    node: NodeState | None,
    namespace: NamespaceState | None,
) -> Intruder | None:
    """The intruder record for `pod`, or None when it may stay where it is.

    `node` is the pod's node from the cache; when None (not cached yet) a bare NodeState of the
    pod's node name is used, so pools that list nodes by name still count. `namespace` None means
    unknown: a namespace without labels or annotations.
    """
    if not pod.active or not pod.node_name:
        return None
    if "DaemonSet" in pod.owner_kinds or is_mirror_pod(pod):
        return None
    if pod.namespace in policy.exempt_namespaces:
        return None
    pool = policy.pool_of(node if node is not None else NodeState(name=pod.node_name))
    if pool is None or pool.allows(namespace if namespace is not None else NamespaceState(name=pod.namespace)):
        return None
    return Intruder(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        node=pod.node_name,
        pool=pool.name,
        reason=(
            f"Pod {pod.namespace}/{pod.name} is on node {pod.node_name} of pool {pool.name}, "
            f"which namespace {pod.namespace} may not use."
        ),
    )


def is_mirror_pod(pod: PodState) -> bool:
    """A kubelet's mirror of a static pod: the annotation AND the Node owner the kubelet must set
    (NodeRestriction). Anyone may write the annotation; a forged Node owner is removed by the garbage
    collector unless it carries the node's real uid."""
    return MIRROR_POD_ANNOTATION in pod.annotations and "Node" in pod.owner_kinds


def is_intruder(
    policy: PlacementPolicy, pod: PodState, node: NodeState | None, namespace: NamespaceState | None
) -> bool:
    return check_pod(policy, pod, node, namespace) is not None


def find_intruders(
    policy: PlacementPolicy,
    nodes: Mapping[str, NodeState],
    pods: Iterable[PodState],
    namespaces: Mapping[str, NamespaceState],
) -> list[Intruder]:
    """Every intruder among `pods`, sorted by namespace, name."""
    found = (check_pod(policy, pod, nodes.get(pod.node_name or ""), namespaces.get(pod.namespace)) for pod in pods)
    return sorted((i for i in found if i is not None), key=lambda i: (i.namespace, i.name))
