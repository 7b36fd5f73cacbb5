"""Checks node choice inside a pool (controller/load/core.py): which nodes are eligible, which
one `choose_node` picks by load ratio and salt, and the `LoadLedger` bookkeeping of assumed
placements; properties: bursts spread evenly, ties fall on every node for some salt, same inputs
same answer."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.oracles import choose_node, eligible_nodes
from controller.load.core import LoadLedger, ledger_key
from controller.core.model import NodeLoad, NodeState
from controller.core.policy import load_policy

POLICY = load_policy(
    """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: fast
    nodeSelector: {egress: fast}
    nodes: [edge-1]
  - name: slow
    nodeSelector: {egress: slow}
    nodes: [edge-1, edge-2]
"""
)
FAST = POLICY.pool("fast")
SLOW = POLICY.pool("slow")


def node(name: str, egress: str | None = "fast", **kw) -> NodeState:
    return NodeState(name=name, labels={"egress": egress} if egress else {}, **kw)


@pytest.mark.parametrize(
    ("pool", "candidate", "eligible"),
    [
        (FAST, node("a"), True),
        (FAST, node("a", ready=False), False),
        (FAST, node("a", unschedulable=True), False),
        (FAST, node("a", egress="slow"), False),
        (FAST, node("a", egress=None), False),
        (FAST, node("edge-1", egress=None), True),  # listed by name
        (SLOW, node("edge-1", egress="slow"), False),  # listed in both: the first pool (fast) owns it
        (SLOW, node("edge-2", egress=None), True),
    ],
)
def test_eligible_nodes(pool, candidate, eligible):
    assert (eligible_nodes(pool, POLICY, [candidate]) == [candidate]) is eligible


def load(name: str, placed: int, assumed: int, capacity: int) -> NodeLoad:
    return NodeLoad(name=name, placed=placed, assumed=assumed, capacity=capacity)


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ({"a": load("a", 3, 0, 10), "b": load("b", 1, 1, 10)}, "b"),  # lowest ratio, assumed counts
        ({"a": load("a", 2, 0, 10), "b": load("b", 1, 0, 4)}, "a"),  # ratio, not absolute count
        ({"a": load("a", 2, 0, 10), "b": load("b", 1, 0, 5)}, "b"),  # equal ratio: fewer absolute
        ({"a": load("a", 10, 0, 10), "b": load("b", 9, 1, 10)}, None),  # both equally full: salt decides
        ({"a": load("a", 2, 0, 2), "b": load("b", 9, 0, 10)}, "b"),  # never full before non-full
        ({"a": load("a", 5, 0, 2), "b": load("b", 3, 0, 2)}, "b"),  # all full: least overfull
        ({"a": load("a", 0, 0, 0), "b": load("b", 50, 0, 10)}, "b"),  # no capacity comes last
        ({"a": load("a", 1, 0, 10)}, "b"),  # b missing from loads: empty, capacity allocatable
    ],
)
def test_choose_node_by_load(loads, expected):
    nodes = [node("a"), node("b")]
    chosen = choose_node(nodes, loads, salt="run-1")
    if expected is None:  # a tie: either node, but always the same for the same salt
        assert chosen in {"a", "b"}
        assert chosen == choose_node(list(reversed(nodes)), loads, salt="run-1")
    else:
        assert chosen == expected


def test_choose_node_missing_load_uses_allocatable_pods():
    nodes = [node("small", allocatable_pods=4), node("big", allocatable_pods=100)]
    loads = {"big": load("big", 10, 0, 100)}  # small is missing: 0/4 beats 10/100
    assert choose_node(nodes, loads, salt="x") == "small"
    loads = {"big": load("big", 1, 0, 100), "small": load("small", 1, 0, 4)}  # 1/100 beats 1/4
    assert choose_node(nodes, loads, salt="x") == "big"


def test_choose_node_without_nodes_is_none():
    assert choose_node([], {}, salt="x") is None


def test_ledger_assume_settle_and_move():
    ledger = LoadLedger()
    key = ledger_key("taskrun", "ci", "build-1")
    assert key == "taskrun/ci/build-1"
    ledger.assume(key, "fast", "a", now=0.0)
    ledger.assume("pod/ci/other", "fast", "a", now=1.0)
    assert ledger.assumed_on("a") == 2
    ledger.assume(key, "fast", "b", now=2.0)  # moves, no double count
    assert (ledger.assumed_on("a"), ledger.assumed_on("b"), len(ledger)) == (1, 1, 2)
    ledger.settle(key)
    ledger.settle("never/assumed/key")
    assert (ledger.assumed_on("b"), len(ledger), key in ledger) == (0, 1, False)


def test_ledger_expire_drops_only_stale_keys():
    ledger = LoadLedger()
    ledger.assume("taskrun/ci/old", "fast", "a", now=0.0)
    ledger.assume("taskrun/ci/new", "fast", "a", now=50.0)
    assert ledger.expire(now=60.0, ttl=30.0) == ["taskrun/ci/old"]
    assert ledger.assumed_on("a") == 1
    assert ledger.expire(now=60.0, ttl=30.0) == []
    ledger.assume("taskrun/ci/new", "fast", "a", now=100.0)  # re-assuming refreshes the clock
    assert ledger.expire(now=110.0, ttl=30.0) == []


def test_ledger_loads_combines_placed_assumed_and_capacity():
    ledger = LoadLedger()
    ledger.assume("pod/ci/p", "fast", "a", now=0.0)
    nodes = [node("a", allocatable_pods=30), node("b", allocatable_pods=20)]
    assert ledger.loads(nodes, {"a": 2}, capacity=None) == {
        "a": NodeLoad("a", placed=2, assumed=1, capacity=30),
        "b": NodeLoad("b", placed=0, assumed=0, capacity=20),
    }
    assert ledger.loads(nodes, {}, capacity=5)["b"].capacity == 5


node_names = st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True), min_size=1, max_size=8, unique=True)


@settings(max_examples=60)
@given(names=node_names, placements=st.integers(0, 60), capacity=st.one_of(st.none(), st.integers(1, 20)))
def test_burst_on_equal_nodes_is_even(names, placements, capacity):
    nodes = [node(n) for n in names]
    ledger = LoadLedger()
    for i in range(placements):
        chosen = choose_node(nodes, ledger.loads(nodes, {}, capacity), salt=f"ci/run-{i}")
        assert chosen is not None
        ledger.assume(ledger_key("taskrun", "ci", f"run-{i}"), "fast", chosen, now=float(i))
    counts = [ledger.assumed_on(n) for n in names]
    assert sum(counts) == placements
    assert max(counts) - min(counts) <= 1


node_states = st.builds(
    NodeState,
    name=st.sampled_from(["a", "b", "c", "d", "edge-1", "edge-2"]),
    labels=st.dictionaries(st.just("egress"), st.sampled_from(["fast", "slow", "none"]), max_size=1),
    ready=st.booleans(),
    unschedulable=st.booleans(),
    allocatable_pods=st.integers(1, 110),
)


@given(
    nodes=st.lists(node_states, max_size=8),
    placed=st.dictionaries(st.sampled_from(["a", "b", "c", "d", "edge-1", "edge-2"]), st.integers(0, 200)),
    salt=st.text(max_size=10),
)
def test_choice_is_always_an_eligible_member(nodes, placed, salt):
    for pool in (FAST, SLOW):
        eligible = eligible_nodes(pool, POLICY, nodes)
        assert all(n.ready and not n.unschedulable and POLICY.pool_of(n) == pool for n in eligible)
        chosen = choose_node(eligible, LoadLedger().loads(eligible, placed, None), salt=salt)
        assert (chosen is None) == (not eligible)
        if chosen is not None:
            assert chosen in {n.name for n in eligible}


@settings(max_examples=30)
@given(names=node_names)
def test_every_equal_node_is_first_for_some_salt(names):
    nodes = [node(n) for n in names]
    firsts = Counter(choose_node(nodes, {}, salt=f"ci/run-{i}") for i in range(400))
    assert set(firsts) == set(names)


@given(
    names=node_names,
    placed=st.lists(st.integers(0, 5), min_size=8, max_size=8),
    capacity=st.integers(1, 6),
    salt=st.text(max_size=10),
)
def test_same_inputs_same_answer(names, placed, capacity, salt):
    nodes = [node(n) for n in names]
    loads = LoadLedger().loads(nodes, dict(zip(names, placed, strict=False)), capacity)
    first = choose_node(nodes, loads, salt=salt)
    assert choose_node(nodes, dict(loads), salt=salt) == first
    assert choose_node(list(reversed(nodes)), loads, salt=salt) == first  # input order does not matter
