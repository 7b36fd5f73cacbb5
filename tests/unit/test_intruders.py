"""Checks the intruder test (controller/core/intruders.py): which active pods sit on a pool node
although their namespace may not use that pool, with DaemonSet, mirror and exempt-namespace pods
left alone. Property: pods in allowed or exempt namespaces and DaemonSet pods are never intruders."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.core.intruders import Intruder, check_pod, find_intruders, is_intruder
from controller.core.model import NamespaceState, NodeState, PodState
from controller.core.policy import load_policy

POLICY = load_policy(
    """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
exemptNamespaces: [kube-system, monitoring]
pools:
  - name: fast
    nodeSelector: {egress: fast}
    nodes: [edge-1]
    namespaces: ["ci-*"]
    namespaceSelector: {matchLabels: {egress: allowed}}
"""
)
NODES = {
    "pool-1": NodeState("pool-1", labels={"egress": "fast"}),
    "plain-1": NodeState("plain-1"),
}
NAMESPACES = {
    "ci-build": NamespaceState("ci-build"),
    "team-a": NamespaceState("team-a"),
    "team-b": NamespaceState("team-b", labels={"egress": "allowed"}),
    "team-c": NamespaceState("team-c", annotations={"egress-placer.io/pools": "other, fast"}),
}


def pod(namespace: str = "team-a", node: str | None = "pool-1", **kw) -> PodState:
    return PodState(namespace=namespace, name="p", node_name=node, **kw)


@pytest.mark.parametrize(
    ("candidate", "intruder"),
    [
        (pod(), True),
        (pod(phase="Running"), True),
        (pod(namespace="unknown-ns"), True),  # not in the cache: no labels, not allowed
        (pod(node="edge-1"), True),  # node not cached, but the pool lists it by name
        (pod(node="plain-1"), False),
        (pod(node=None), False),  # not scheduled yet
        (pod(node="ghost"), False),  # unknown node, not listed: no pool
        (pod(namespace="ci-build"), False),  # name glob
        (pod(namespace="ci-unknown"), False),  # name glob works without the cache
        (pod(namespace="team-b"), False),  # label selector
        (pod(namespace="team-c"), False),  # Namespace annotation
        (pod(namespace="kube-system"), False),  # exempt
        (pod(namespace="monitoring"), False),  # exempt
        (pod(owner_kinds=("DaemonSet",)), False),
        (pod(owner_kinds=("ReplicaSet",)), True),
        (pod(annotations={"kubernetes.io/config.mirror": "abc"}, owner_kinds=("Node",)), False),  # static pod
        (pod(annotations={"kubernetes.io/config.mirror": "abc"}), True),  # forged: a kubelet sets the Node owner
        (pod(phase="Succeeded"), False),
        (pod(phase="Failed"), False),
        (pod(deleting=True), False),
    ],
)
def test_is_intruder(candidate, intruder):
    found = find_intruders(POLICY, NODES, [candidate], NAMESPACES)
    assert bool(found) is intruder
    assert (
        is_intruder(POLICY, candidate, NODES.get(candidate.node_name or ""), NAMESPACES.get(candidate.namespace))
        is intruder
    )


def test_intruder_record_and_reason():
    found = check_pod(POLICY, pod(namespace="team-a"), NODES["pool-1"], NAMESPACES["team-a"])
    assert found == Intruder(
        namespace="team-a",
        name="p",
        node="pool-1",
        pool="fast",
        reason="Pod team-a/p is on node pool-1 of pool fast, which namespace team-a may not use.",
    )


def test_find_intruders_sorted():
    pods = [PodState("team-z", "b", "pool-1"), PodState("team-a", "c", "pool-1"), PodState("team-a", "a", "edge-1")]
    assert [(i.namespace, i.name) for i in find_intruders(POLICY, NODES, pods, NAMESPACES)] == [
        ("team-a", "a"),
        ("team-a", "c"),
        ("team-z", "b"),
    ]


pods = st.builds(
    PodState,
    namespace=st.sampled_from([*NAMESPACES, "kube-system", "monitoring", "other"]),
    name=st.from_regex(r"[a-z]{1,5}", fullmatch=True),
    node_name=st.sampled_from([None, "pool-1", "plain-1", "edge-1"]),
    phase=st.sampled_from(["Pending", "Running", "Succeeded"]),
    owner_kinds=st.lists(st.sampled_from(["DaemonSet", "ReplicaSet", "TaskRun", "Job"]), max_size=2).map(tuple),
    deleting=st.booleans(),
)


@given(candidate=pods)
def test_allowed_exempt_and_daemonset_pods_are_never_intruders(candidate):
    namespace = NAMESPACES.get(candidate.namespace, NamespaceState(candidate.namespace))
    found = find_intruders(POLICY, NODES, [candidate], NAMESPACES)
    if (
        POLICY.pool("fast").allows(namespace)
        or candidate.namespace in POLICY.exempt_namespaces
        or "DaemonSet" in candidate.owner_kinds
    ):
        assert found == []
    else:  # the rest are intruders exactly when active on a pool node
        assert bool(found) == (candidate.active and candidate.node_name in ("pool-1", "edge-1"))
