"""Checks the pool guard's pure tests (controller/intruders/core.py) from the attacker's side: which
DaemonSet owner claims make a node agent (only a uid that resolves to a real apps/v1 DaemonSet of the
same namespace and name, in an agent namespace), which mirror pods are a kubelet's (the annotation AND
the node's own Node owner, uid included), which nodes a namespace may not use, and which pods are
intruders (terminating ones included, with their grace). Properties: pods in allowed or exempt
namespaces are never intruders; a DaemonSet claim in a tenant namespace never protects a pod."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.intruders.core import (
    Agent,
    Intruder,
    check_pod,
    daemonset_agent,
    eviction_grace,
    find_intruders,
    is_mirror_pod,
    refused_pool,
)
from controller.core.model import DaemonSetState, NamespaceState, NodeState, OwnerRef, PodState, owner_refs
from controller.core.policy import load_policy

POLICY = load_policy(
    """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
exemptNamespaces: [kube-system, monitoring]
agentNamespaces: [kube-system, node-agents]
pools:
  - name: fast
    nodeSelector: {egress: fast}
    nodes: [edge-1]
    namespaces: ["ci-*"]
    namespaceSelector: {matchLabels: {egress: allowed}}
"""
)
NODES = {
    "pool-1": NodeState("pool-1", labels={"egress": "fast"}, uid="node-uid-pool-1"),
    "plain-1": NodeState("plain-1", uid="node-uid-plain-1"),
}
NAMESPACES = {
    "ci-build": NamespaceState("ci-build"),
    "team-a": NamespaceState("team-a"),
    "team-b": NamespaceState("team-b", labels={"egress": "allowed"}),
    "team-c": NamespaceState("team-c", annotations={"egress-placer.io/pools": "other, fast"}),
}
DAEMONSETS = {
    "ds-agent": DaemonSetState("node-agents", "log-shipper", "ds-agent"),
    "ds-tenant": DaemonSetState("team-a", "miner", "ds-tenant"),  # the `edit` role may create one
}


def ds_owner(uid: str = "ds-agent", name: str = "log-shipper", api_version: str = "apps/v1", controller: bool = True) -> OwnerRef:
    return OwnerRef(api_version, "DaemonSet", name, uid, controller)


def node_owner(name: str = "pool-1", uid: str = "node-uid-pool-1") -> OwnerRef:
    return OwnerRef("v1", "Node", name, uid, True)


MIRROR = {"kubernetes.io/config.mirror": "abc"}


@pytest.mark.parametrize(
    ("namespace", "owners", "agent"),
    [
        ("node-agents", (ds_owner(),), Agent.TRUSTED),
        ("kube-system", (ds_owner(),), Agent.NONE),  # the uid is of a DaemonSet in node-agents: copied
        ("node-agents", (ds_owner(name="other"),), Agent.NONE),  # real uid, another name
        ("node-agents", (ds_owner(uid="ds-tenant", name="miner"),), Agent.NONE),  # a tenant's DaemonSet's uid
        ("team-a", (ds_owner(uid="ds-tenant", name="miner"),), Agent.NONE),  # a real DaemonSet, tenant namespace
        ("team-a", (ds_owner(uid="made-up"),), Agent.NONE),
        ("node-agents", (ds_owner(uid="made-up"),), Agent.UNRESOLVED),  # the cache may be behind
        ("node-agents", (ds_owner(uid="made-up", api_version="extensions/v1beta1"),), Agent.NONE),  # GC cannot resolve it
        ("node-agents", (ds_owner(api_version="extensions/v1beta1"),), Agent.NONE),
        ("node-agents", (ds_owner(controller=False),), Agent.NONE),  # not its controller
        ("node-agents", (OwnerRef("apps/v1", "ReplicaSet", "log-shipper", "ds-agent", True),), Agent.NONE),
        ("node-agents", (), Agent.NONE),
    ],
    ids=[
        "real-agent", "uid-copied-to-another-namespace", "real-uid-other-name", "tenant-uid-in-agent-namespace",
        "tenant-daemonset", "made-up-uid-tenant", "made-up-uid-agent-namespace", "extensions-made-up",
        "extensions-real-uid", "not-controller", "other-kind", "no-owner",
    ],
)
def test_which_daemonset_claims_make_a_node_agent(namespace, owners, agent):
    assert daemonset_agent(POLICY, namespace, owners, DAEMONSETS) is agent


def test_agent_namespaces_default_to_the_exempt_namespaces():
    policy = load_policy("apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\nexemptNamespaces: [infra]\n")
    daemonsets = {"u": DaemonSetState("infra", "agent", "u")}
    assert daemonset_agent(policy, "infra", (ds_owner("u", "agent"),), daemonsets) is Agent.TRUSTED
    assert daemonset_agent(policy, "kube-system", (ds_owner("u", "agent"),), daemonsets) is Agent.NONE


@pytest.mark.parametrize(
    ("annotations", "owners", "node_name", "mirror"),
    [
        (MIRROR, (node_owner(),), "pool-1", True),
        (MIRROR, (), "pool-1", False),  # forged annotation
        (MIRROR, (node_owner(uid="guessed"),), "pool-1", False),  # not the node's uid
        (MIRROR, (node_owner(name="plain-1", uid="node-uid-plain-1"),), "pool-1", False),  # another node's
        (MIRROR, (OwnerRef("foo/v1", "Node", "pool-1", "node-uid-pool-1", True),), "pool-1", False),
        (MIRROR, (OwnerRef("v1", "Node", "pool-1", "node-uid-pool-1", False),), "pool-1", False),
        ({}, (node_owner(),), "pool-1", False),
        (MIRROR, (node_owner(name="ghost", uid=""),), "ghost", False),  # node not cached: no uid to match
    ],
    ids=["kubelet", "annotation-only", "wrong-uid", "other-node", "bogus-api-version", "not-controller", "no-annotation", "unknown-node"],
)
def test_which_pods_are_a_kubelets_mirror_pods(annotations, owners, node_name, mirror):
    assert is_mirror_pod(annotations, owners, node_name, NODES.get(node_name)) is mirror


@pytest.mark.parametrize(
    ("node", "namespace", "pool"),
    [
        ("pool-1", "team-a", "fast"),
        ("edge-1", "team-a", "fast"),  # listed by name, not cached
        ("plain-1", "team-a", None),
        ("ghost", "team-a", None),
        ("pool-1", "ci-build", None),
        ("pool-1", "team-b", None),
        ("pool-1", "team-c", None),
    ],
)
def test_refused_pool(node, namespace, pool):
    refused = refused_pool(POLICY, node, NODES.get(node), NAMESPACES[namespace])
    assert (refused.name if refused else None) == pool


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
        (pod(namespace="node-agents", owners=(ds_owner(),)), False),  # a real node agent
        (pod(namespace="node-agents"), True),  # an agent namespace is not exempt
        (pod(owners=(ds_owner(uid="ds-tenant", name="miner"),)), True),  # the tenant's own real DaemonSet
        (pod(owners=(ds_owner(uid="made-up", api_version="extensions/v1beta1"),)), True),  # attack 1
        (pod(owners=(OwnerRef("apps/v1", "ReplicaSet", "rs", "u", True),)), True),
        (pod(annotations=MIRROR, owners=(node_owner(),)), False),  # static pod
        (pod(annotations=MIRROR), True),  # forged: a kubelet sets the Node owner
        (pod(annotations=MIRROR, owners=(node_owner(uid="guessed"),)), True),
        (pod(phase="Succeeded"), False),
        (pod(phase="Failed"), False),
        (pod(deleting=True), True),  # terminating still holds the node (a day, with a day's grace)
        (pod(phase="Succeeded", deleting=True), False),
    ],
)
def test_is_intruder(candidate, intruder):
    found = find_intruders(POLICY, NODES, [candidate], NAMESPACES, DAEMONSETS)
    assert bool(found) is intruder
    node = NODES.get(candidate.node_name or "")
    assert (check_pod(POLICY, candidate, node, NAMESPACES.get(candidate.namespace), DAEMONSETS) is not None) is intruder


def test_intruder_record_and_reason():
    found = check_pod(POLICY, pod(uid="u1", grace_seconds=86400, deleting=True), NODES["pool-1"], NAMESPACES["team-a"], {})
    assert found == Intruder(
        namespace="team-a",
        name="p",
        node="pool-1",
        pool="fast",
        uid="u1",
        grace_seconds=86400,
        terminating=True,
        reason="Pod team-a/p is on node pool-1 of pool fast, which namespace team-a may not use.",
    )
    assert found.key == "u1"


def test_an_unresolved_daemonset_owner_in_an_agent_namespace_is_an_intruder_marked_unresolved():
    found = check_pod(POLICY, pod("node-agents", owners=(ds_owner(uid="new"),)), NODES["pool-1"], None, DAEMONSETS)
    assert found is not None and found.unresolved_owner
    found = check_pod(POLICY, pod(owners=(ds_owner(uid="new"),)), NODES["pool-1"], None, DAEMONSETS)
    assert found is not None and not found.unresolved_owner  # a tenant namespace: no wait


def test_a_pod_recreated_under_the_same_name_is_another_intruder():
    first = check_pod(POLICY, pod(uid="u1"), NODES["pool-1"], None, {})
    second = check_pod(POLICY, pod(uid="u2"), NODES["pool-1"], None, {})
    assert first is not None and second is not None and first.key != second.key


def test_find_intruders_sorted():
    pods = [PodState("team-z", "b", "pool-1"), PodState("team-a", "c", "pool-1"), PodState("team-a", "a", "edge-1")]
    assert [(i.namespace, i.name) for i in find_intruders(POLICY, NODES, pods, NAMESPACES, {})] == [
        ("team-a", "a"),
        ("team-a", "c"),
        ("team-z", "b"),
    ]


@pytest.mark.parametrize(("own", "cap", "grace"), [(86400, 10, 10), (0, 10, 0), (5, 10, 5), (30, 0, 0), (-1, 10, 0)])
def test_eviction_grace_is_the_pods_own_capped(own, cap, grace):
    assert eviction_grace(own, cap) == grace


@pytest.mark.parametrize(
    ("pod_object", "grace"),
    [
        ({"metadata": {"name": "p"}, "spec": {}}, 30),
        ({"metadata": {"name": "p"}, "spec": {"terminationGracePeriodSeconds": 86400}}, 86400),
        ({"metadata": {"name": "p", "deletionGracePeriodSeconds": 10}, "spec": {"terminationGracePeriodSeconds": 86400}}, 10),
        ({"metadata": {"name": "p", "deletionGracePeriodSeconds": 0}, "spec": {"terminationGracePeriodSeconds": 86400}}, 0),
        ({"metadata": {"name": "p"}, "spec": {"terminationGracePeriodSeconds": "x"}}, 30),
    ],
)
def test_a_pods_grace_is_its_deletions_then_its_own(pod_object, grace):
    assert PodState.from_pod(pod_object).grace_seconds == grace


@pytest.mark.parametrize(
    ("meta", "owners"),
    [
        ({}, ()),
        ({"ownerReferences": "x"}, ()),
        ({"ownerReferences": [1, None, "x"]}, ()),
        ({"ownerReferences": [{"kind": 3, "controller": "true"}]}, (OwnerRef("", "", "", "", False),)),
        (
            {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": True}]},
            (OwnerRef("apps/v1", "DaemonSet", "d", "u", True),),
        ),
    ],
)
def test_owner_references_as_sent_by_anyone(meta, owners):
    assert owner_refs(meta) == owners


owner_refs_strategy = st.lists(
    st.builds(
        OwnerRef,
        api_version=st.sampled_from(["apps/v1", "extensions/v1beta1", "v1"]),
        kind=st.sampled_from(["DaemonSet", "ReplicaSet", "Node", "TaskRun"]),
        name=st.sampled_from(["log-shipper", "miner", "pool-1"]),
        uid=st.sampled_from(["ds-agent", "ds-tenant", "node-uid-pool-1", "made-up"]),
        controller=st.booleans(),
    ),
    max_size=2,
).map(tuple)
pods = st.builds(
    PodState,
    namespace=st.sampled_from([*NAMESPACES, "kube-system", "monitoring", "node-agents", "other"]),
    name=st.from_regex(r"[a-z]{1,5}", fullmatch=True),
    node_name=st.sampled_from([None, "pool-1", "plain-1", "edge-1"]),
    phase=st.sampled_from(["Pending", "Running", "Succeeded"]),
    owners=owner_refs_strategy,
    annotations=st.sampled_from([{}, MIRROR]),
    deleting=st.booleans(),
)


@given(candidate=pods)
def test_allowed_and_exempt_pods_are_never_intruders_and_tenant_claims_never_protect(candidate):
    namespace = NAMESPACES.get(candidate.namespace, NamespaceState(candidate.namespace))
    found = find_intruders(POLICY, NODES, [candidate], NAMESPACES, DAEMONSETS)
    if POLICY.pool("fast").allows(namespace) or candidate.namespace in POLICY.exempt_namespaces:
        assert found == []
    elif candidate.namespace not in ("node-agents",):  # no node agent outside agent namespaces
        on_pool = candidate.node_name in ("pool-1", "edge-1") and candidate.phase != "Succeeded"
        mirror = is_mirror_pod(candidate.annotations, candidate.owners, candidate.node_name, NODES.get(candidate.node_name or ""))
        assert bool(found) == (on_pool and not mirror)


def find_intruders_pod_by_pod(policy, nodes, pods, namespaces, daemonsets):
    """find_intruders as it was before #24: `check_pod` on every pod, with no lookup shared between pods."""
    found = (check_pod(policy, p, nodes.get(p.node_name or ""), namespaces.get(p.namespace), daemonsets) for p in pods)
    return sorted((i for i in found if i is not None), key=lambda i: (i.namespace, i.name, i.uid))


@given(candidates=st.lists(pods, max_size=30))
def test_a_whole_pass_decides_as_check_pod_on_each_pod(candidates):
    """The pass's shared lookups (a node's pool, a namespace allowed in a pool) change no decision (#24)."""
    assert find_intruders(POLICY, NODES, candidates, NAMESPACES, DAEMONSETS) == find_intruders_pod_by_pod(
        POLICY, NODES, candidates, NAMESPACES, DAEMONSETS
    )
