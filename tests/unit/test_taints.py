"""Checks the taint plan (controller/taints/core.py): which owned taints each node gains or loses so
that exactly the members of a pool carry that pool's taint. Properties: foreign taints are never
touched, applying the plan then planning again gives nothing, a member ends with exactly its
pool's taint and a non-member with no owned taint."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.core.model import NodeState, Taint
from controller.core.policy import load_policy
from controller.taints.core import TaintChange, desired_taints, plan_taints

POLICY = load_policy(
    """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: fast
    nodeSelector: {egress: fast}
    nodes: [edge-1]
  - name: soft
    nodeSelector: {egress: soft}
    taint: {effect: NoExecute}
"""
)
NO_POOLS = load_policy("apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\n")
ONLY_SOFT = load_policy(
    """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: soft
    nodeSelector: {egress: soft}
    taint: {effect: NoExecute}
"""
)
FAST = Taint("egress-placer.io/pool", "fast", "NoSchedule")
SOFT = Taint("egress-placer.io/pool", "soft", "NoExecute")
FORMER_KEY = Taint("example.com/soft", "soft", "PreferNoSchedule")  # a custom key of an older version
FOREIGN = Taint("node.kubernetes.io/unreachable", None, "NoExecute")
GPU = Taint("nvidia.com/gpu", "present", "NoSchedule")


def node(name: str, egress: str | None, *taints: Taint) -> NodeState:
    return NodeState(name=name, labels={"egress": egress} if egress else {}, taints=taints)


@pytest.mark.parametrize(
    ("candidate", "add", "remove"),
    [
        (node("a", "fast"), (FAST,), ()),
        (node("a", "fast", GPU, FAST), (), ()),  # already right: no change
        (node("edge-1", None, GPU), (FAST,), ()),  # member by name
        (node("a", "soft", FOREIGN), (SOFT,), ()),  # its own effect
        (node("a", "soft", FORMER_KEY), (SOFT,), ()),  # another key is foreign, even with a pool's value
        (
            node("a", "fast", Taint("egress-placer.io/pool", "soft", "NoSchedule")),
            (FAST,),
            (Taint("egress-placer.io/pool", "soft", "NoSchedule"),),
        ),
        (
            node("a", "fast", Taint("egress-placer.io/pool", "fast", "NoExecute")),
            (FAST,),
            (Taint("egress-placer.io/pool", "fast", "NoExecute"),),
        ),
        (node("a", "slow", FAST, GPU), (), (FAST,)),  # left every pool
        (node("a", "fast", SOFT), (FAST,), (SOFT,)),  # moved from soft to fast
        (
            node("a", None, Taint("egress-placer.io/pool", "gone", "NoSchedule")),
            (),
            (Taint("egress-placer.io/pool", "gone", "NoSchedule"),),
        ),
        (node("a", None, GPU, FOREIGN), (), ()),  # foreign only: never touched
    ],
)
def test_plan_taints(candidate, add, remove):
    changes = plan_taints(POLICY, [candidate])
    if not add and not remove:
        assert changes == []
    else:
        assert changes == [TaintChange(node=candidate.name, add=add, remove=remove)]


@pytest.mark.parametrize(
    ("policy", "candidate", "add", "remove"),
    [
        # A valid policy without pools: every owned taint goes, foreign ones stay.
        (NO_POOLS, node("a", "fast", FAST, GPU), (), (FAST,)),
        (NO_POOLS, node("edge-1", None, SOFT, FOREIGN), (), (SOFT,)),
        (NO_POOLS, node("a", None, GPU, FOREIGN, FORMER_KEY), (), ()),
        # Pool `fast` removed from the policy: its members lose its taint, `soft` keeps its own.
        (ONLY_SOFT, node("a", "fast", FAST), (), (FAST,)),
        (ONLY_SOFT, node("edge-1", None, FAST, GPU), (), (FAST,)),
        (ONLY_SOFT, node("b", "soft", SOFT), (), ()),
        # A taint whose effect the policy changed: the old one goes, the new one comes.
        (ONLY_SOFT, node("b", "soft", Taint("egress-placer.io/pool", "soft", "NoSchedule")), (SOFT,),
         (Taint("egress-placer.io/pool", "soft", "NoSchedule"),)),
        # A PreferNoSchedule taint an older version left (no pool may have it now) is replaced too.
        (ONLY_SOFT, node("b", "soft", Taint("egress-placer.io/pool", "soft", "PreferNoSchedule")), (SOFT,),
         (Taint("egress-placer.io/pool", "soft", "PreferNoSchedule"),)),
    ],
)
def test_owned_taints_of_pools_the_policy_no_longer_has_are_removed(policy, candidate, add, remove):
    changes = plan_taints(policy, [candidate])
    assert changes == ([TaintChange(node=candidate.name, add=add, remove=remove)] if add or remove else [])


def test_desired_taints():
    assert desired_taints(node("a", "fast"), POLICY) == (FAST,)
    assert desired_taints(node("a", "soft"), POLICY) == (SOFT,)
    assert desired_taints(node("a", "other"), POLICY) == ()


def test_apply_keeps_foreign_taints_in_order():
    change = TaintChange(node="a", add=(FAST,), remove=(SOFT,))
    assert change.apply((GPU, SOFT, FOREIGN)) == (GPU, FOREIGN, FAST)
    assert change.apply((GPU, FAST)) == (GPU, FAST)  # already there: not added twice


def test_only_nodes_that_need_a_change_appear_in_input_order():
    nodes = [node("c", "fast"), node("b", "fast", FAST), node("a", None, FAST)]
    assert [c.node for c in plan_taints(POLICY, nodes)] == ["c", "a"]


taints = st.builds(
    Taint,
    key=st.sampled_from(
        ["egress-placer.io/pool", "example.com/soft", "nvidia.com/gpu", "node.kubernetes.io/unreachable"]
    ),
    value=st.sampled_from([None, "fast", "soft", "gone"]),
    effect=st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
)
nodes = st.builds(
    NodeState,
    name=st.sampled_from(["a", "b", "edge-1"]),
    labels=st.dictionaries(st.just("egress"), st.sampled_from(["fast", "soft", "slow"]), max_size=1),
    # Kubernetes keeps taints unique by key and effect
    taints=st.lists(taints, max_size=5, unique_by=lambda t: (t.key, t.effect)).map(tuple),
)


def applied(candidate: NodeState) -> NodeState:
    changes = plan_taints(POLICY, [candidate])
    if not changes:
        return candidate
    return NodeState(name=candidate.name, labels=candidate.labels, taints=changes[0].apply(candidate.taints))


@given(candidate=nodes)
def test_foreign_taints_never_touched(candidate):
    owned = POLICY.owned_taint_keys()
    foreign = lambda ts: Counter(t for t in ts if t.key not in owned)  # noqa: E731
    assert foreign(applied(candidate).taints) == foreign(candidate.taints)
    for change in plan_taints(POLICY, [candidate]):
        assert all(t.key in owned for t in (*change.add, *change.remove))


@given(candidate=nodes)
def test_plan_is_idempotent(candidate):
    assert plan_taints(POLICY, [applied(candidate)]) == []


@given(candidate=nodes)
def test_member_ends_with_exactly_its_pool_taint(candidate):
    owned = POLICY.owned_taint_keys()
    after = [t for t in applied(candidate).taints if t.key in owned]
    pool = POLICY.pool_of(candidate)
    assert after == ([pool.taint_for()] if pool else [])


UNREGISTERED = Taint("karpenter.sh/unregistered", None, "NoExecute")  # Karpenter's, until the node registers


@pytest.mark.parametrize(
    ("taints", "add", "remove"),
    [
        ((UNREGISTERED, FAST), (), ()),  # as Karpenter creates it, from a NodePool declaring the pool taint
        ((FAST,), (), ()),  # registered: nothing for us to write, nothing to fight over
        ((UNREGISTERED,), (FAST,), ()),  # a NodePool without the pool taint: ours is added, Karpenter's kept
        ((Taint("egress-placer.io/pool", "fast", "NoExecute"),), (FAST,), (Taint("egress-placer.io/pool", "fast", "NoExecute"),)),
    ],
)
def test_a_karpenter_node_with_the_nodepools_taint_needs_no_change(taints: tuple[Taint, ...], add: tuple, remove: tuple) -> None:
    """docs/coexistence.md, Karpenter: a NodePool declaring the pool taint in template.spec.taints gives new
    nodes exactly what the taint plan wants; one with another effect is corrected (so the NodePool must
    declare the pool's own effect)."""
    candidate = NodeState(name="fast-abcde", labels={"egress": "fast", "karpenter.sh/nodepool": "fast"}, taints=taints)
    planned = plan_taints(POLICY, [candidate])
    assert planned == ([TaintChange(node="fast-abcde", add=add, remove=remove)] if add or remove else [])
