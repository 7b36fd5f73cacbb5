"""Checks what an EgressPool's status says (controller/pool_status/core.py), from data given: the Ready
condition's status, reason and message for each case (tables), its observedGeneration and
lastTransitionTime, the counts and the load (totals, busy and full nodes, the 5 most loaded), the runs
placed in the last hour, the last error (newest of a refusal, an error seen and the one stored), and
that it stays small at 10,000 members. Properties: a status computed again over itself is the same
(nothing to write), and it always fits the CRD's status schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.model import NodeLoad, NodeState, Taint
from controller.core.policy import PlacementPolicy
from controller.pool_status.core import (
    PoolObject,
    SeenError,
    load_status,
    members_by_pool,
    pool_status,
    ready_condition,
    refusal_about,
)
from controller.core.pools import PoolStatus, policy_from_objects
from controller.placement_log.core import Placed, parse_rfc3339, rfc3339

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
HOUR = 3600.0


def egress_pool(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "egress-placer.io/v1alpha1", "kind": "EgressPool", "metadata": {"name": name}, "spec": spec}


POLICY = policy_from_objects(
    [
        egress_pool("overseas", priority=10, nodeSelector={"egress": "overseas"}, capacity=4),
        egress_pool("lab", priority=20, nodes=["lab-1", "egress-9"], placement="preferred"),
    ]
)
OVERSEAS = POLICY.pool("overseas")
LAB = POLICY.pool("lab")
assert OVERSEAS is not None and LAB is not None
TAINT = OVERSEAS.taint_for()
LAB_TAINT = LAB.taint_for()


def node(name: str, *taints: Taint, ready: bool = True, cordoned: bool = False, pool: str = "overseas") -> NodeState:
    return NodeState(name=name, labels={"egress": pool}, taints=taints, ready=ready, unschedulable=cordoned)


def load(name: str, placed: int, assumed: int = 0, capacity: int = 4) -> NodeLoad:
    return NodeLoad(name=name, placed=placed, assumed=assumed, capacity=capacity)


def obj(name: str = "overseas", generation: int | None = 3, status: dict[str, Any] | None = None) -> PoolObject:
    return PoolObject(name, generation, status or {})


def status_of(
    members: list[NodeState],
    loads: dict[str, NodeLoad] | None = None,
    *,
    pool: PoolObject | None = None,
    policy: PlacementPolicy = POLICY,
    placed: list[Placed] | None = None,
    refusal: str | None = None,
    errors: list[SeenError] | None = None,
    now: float = NOW,
) -> dict[str, Any]:
    return pool_status(pool or obj(), policy, members, loads or {}, placed or [], refusal, errors or [], now)


def ready(status: dict[str, Any], kind: str = "Ready") -> dict[str, Any]:
    assert [c["type"] for c in status["conditions"]] == ["Ready", "PolicyAccepted", "NodesReady"]
    (condition,) = [c for c in status["conditions"] if c["type"] == kind]
    return condition


@pytest.mark.parametrize(
    ("case", "accepted", "nodes_ready"),
    [
        ("not in force", ("False", "NotInForce"), ("False", "NoMembers")),
        ("ready", ("True", "InForce"), ("True", "NodesTainted")),
    ],
)
def test_v1beta1s_conditions_split_ready_into_policy_accepted_and_nodes_ready(case: str, accepted: tuple[str, str], nodes_ready: tuple[str, str]) -> None:
    status = status_of([node("e1", TAINT)], pool=obj("new" if case == "not in force" else "overseas"))
    assert (ready(status, "PolicyAccepted")["status"], ready(status, "PolicyAccepted")["reason"]) == accepted
    assert (ready(status, "NodesReady")["status"], ready(status, "NodesReady")["reason"]) == nodes_ready
    assert all(c["message"] and c["observedGeneration"] is not None for c in status["conditions"])  # required in v1beta1


# -- the Ready condition -------------------------------------------------------------------------------

REFUSAL = (
    "EgressPool overseas: spec.egressLoad.prometheus.url: Input should be a valid URL, invalid port number\n"
    "EgressPool lab: spec.capacity: Input should be greater than 0"
)


@pytest.mark.parametrize(
    ("name", "members", "ready_nodes", "refusal", "expected", "says"),
    [
        ("overseas", [node("e1", TAINT)], 1, REFUSAL, ("False", "SpecRefused"), "EgressPool overseas: spec.egressLoad.prometheus.url"),
        ("lab", [], 0, "EgressPool overseas: spec.x: bad", ("False", "PolicyRefused"), "another object is refused (EgressPool overseas: spec.x: bad)"),
        ("overseas", [], 0, None, ("False", "NoMembers"), "no node is a member"),
        ("overseas", [node("e1", TAINT), node("e2")], 2, None, ("False", "TaintsPending"), "1 of 2 member nodes carry the taint egress-placer.io/pool=overseas:NoSchedule"),
        ("overseas", [node("e1", TAINT, ready=False)], 0, None, ("False", "NoReadyNodes"), "runs sent to the pool wait for one"),
        ("lab", [node("lab-1", LAB_TAINT, cordoned=True)], 0, None, ("False", "NoReadyNodes"), "runs sent to the pool go to ordinary nodes"),
        ("overseas", [node("e1", TAINT), node("e2", TAINT, ready=False)], 1, None, ("True", "NodesTainted"), "2 member nodes carry the taint"),
        ("overseas", [node("e1", Taint(TAINT.key, "overseas", "PreferNoSchedule"))], 1, None, ("False", "TaintsPending"), "0 of 1"),
    ],
    ids=["refused-this", "refused-another", "no-members", "taints-pending", "none-ready-required", "none-ready-preferred", "ready", "wrong-effect"],
)
def test_the_ready_condition(name, members, ready_nodes, refusal, expected, says):
    status, reason, message = ready_condition(name, POLICY.pool(name), members, ready_nodes, refusal)
    assert (status, reason) == expected
    assert says in message


def test_a_pool_not_in_the_policy_in_force_is_not_ready():
    status = status_of([node("e1", TAINT)], pool=obj("new"))
    assert (ready(status)["status"], ready(status)["reason"]) == ("False", "NotInForce")
    assert (status["nodes"], status["taintedNodes"], status["load"]["capacity"]) == (0, 0, 0)


def test_the_refusal_lines_about_a_pool():
    assert refusal_about(REFUSAL, "lab") == "EgressPool lab: spec.capacity: Input should be greater than 0"
    assert refusal_about(REFUSAL, "over") == ""  # a name that is a prefix of another's is not it


def test_observed_generation_is_the_objects_and_the_transition_time_moves_only_with_the_status():
    first = status_of([node("e1")], pool=obj(generation=3), now=NOW)
    assert ready(first)["observedGeneration"] == 3
    assert ready(first)["lastTransitionTime"] == rfc3339(NOW) == "2027-01-15T08:00:00Z"
    # Still False (for another reason): the time stays. True: it moves.
    still = status_of([node("e1", TAINT, ready=False)], pool=obj(generation=4, status=first), now=NOW + 60)
    assert (ready(still)["reason"], ready(still)["observedGeneration"]) == ("NoReadyNodes", 4)
    assert ready(still)["lastTransitionTime"] == rfc3339(NOW)
    now_ready = status_of([node("e1", TAINT)], pool=obj(status=still), now=NOW + 120)
    assert ready(now_ready)["lastTransitionTime"] == rfc3339(NOW + 120)


# -- counts and load -----------------------------------------------------------------------------------


def test_counts_members_ready_and_tainted_nodes():
    members = [node("e1", TAINT), node("e2", TAINT, ready=False), node("e3", cordoned=True), node("e4", TAINT)]
    status = status_of(members)
    assert (status["nodes"], status["readyNodes"], status["taintedNodes"]) == (4, 2, 3)


@pytest.mark.parametrize(
    ("loads", "totals", "most_loaded"),
    [
        ([], (0, 0, 0, 0, 0), []),
        ([load("a", 0), load("b", 0)], (0, 0, 8, 0, 0), []),  # idle nodes are not listed
        ([load("a", 1), load("b", 3, 1), load("c", 2)], (6, 1, 12, 3, 1), ["b", "c", "a"]),
        ([load("a", 2, capacity=2), load("b", 3, capacity=8)], (5, 0, 10, 2, 1), ["a", "b"]),  # by share, not by count
        ([load("b", 1), load("a", 1)], (2, 0, 8, 2, 0), ["a", "b"]),  # ties by name
        ([load("a", 1, capacity=0), load("b", 4)], (5, 0, 4, 2, 2), ["a", "b"]),  # no capacity: full
        ([load(f"n{i:02}", i % 4) for i in range(12)], (18, 0, 48, 9, 0), ["n03", "n07", "n11", "n02", "n06"]),
    ],
    ids=["none", "idle", "some", "share", "tie", "no-capacity", "top-5"],
)
def test_the_load_totals_and_the_most_loaded(loads, totals, most_loaded):
    out = load_status({n.name: n for n in loads})
    assert (out.placed, out.assumed, out.capacity, out.busy_nodes, out.full_nodes) == totals
    assert [n.node for n in out.most_loaded] == most_loaded


def test_members_by_pool_follows_the_policy_order():
    nodes = [node("e1"), NodeState(name="lab-1"), node("egress-9"), NodeState(name="plain")]
    assert {k: [n.name for n in v] for k, v in members_by_pool(POLICY, nodes).items()} == {
        "overseas": ["e1", "egress-9"],  # egress-9: claimed by both, overseas has the lower priority
        "lab": ["lab-1"],
    }


def test_runs_placed_in_the_last_hour_on_the_pools_members():
    placed = [
        Placed("e1", NOW - 10),
        Placed("e1", NOW - HOUR + 1),
        Placed("e2", NOW - HOUR),  # an hour ago exactly: out
        Placed("lab-1", NOW - 5),  # another pool's
        Placed("e2", NOW + 5),  # a clock behind the API server's: not yet
    ]
    assert status_of([node("e1"), node("e2")], placed=placed)["runsPlacedLastHour"] == 2


# -- the last error ------------------------------------------------------------------------------------


def test_a_refusal_naming_the_pool_is_its_last_error_once():
    first = status_of([node("e1", TAINT)], refusal=REFUSAL, now=NOW)
    assert first["lastError"] == {
        "message": "EgressPool overseas: spec.egressLoad.prometheus.url: Input should be a valid URL, invalid port number",
        "time": rfc3339(NOW),
    }
    again = status_of([node("e1", TAINT)], pool=obj(status=first), refusal=REFUSAL, now=NOW + 30)
    assert again["lastError"] == first["lastError"]  # the same refusal keeps its time
    other = status_of([node("e1", TAINT)], pool=obj("lab"), refusal="EgressPool overseas: spec.x: bad")
    assert "lastError" not in other  # another pool's refusal is not this one's error


def test_the_newest_error_wins_and_the_stored_one_stays():
    stored = {"lastError": {"message": "old", "time": rfc3339(NOW - 100)}}
    kept = status_of([], pool=obj(status=stored))
    assert kept["lastError"] == stored["lastError"]  # a new leader keeps it
    seen = [SeenError("the taint of node e1 could not be written: 403", NOW - 10), SeenError("older", NOW - 50)]
    newer = status_of([], pool=obj(status=stored), errors=seen)
    assert newer["lastError"] == {"message": seen[0].message, "time": rfc3339(NOW - 10)}
    older = status_of([], pool=obj(status=stored), errors=[SeenError("before", NOW - 200)])
    assert older["lastError"] == stored["lastError"]


def test_long_messages_are_cut():
    refusal = "EgressPool overseas: spec.images[0]: " + "x" * 10_000
    status = status_of([], refusal=refusal)
    assert len(status["lastError"]["message"]) == 4096 and len(ready(status)["message"]) == 4096
    again = status_of([], pool=obj(status=status), refusal=refusal, now=NOW + 5)
    assert again == {**status, "conditions": again["conditions"]} and again["lastError"] == status["lastError"]


# -- size and stability --------------------------------------------------------------------------------


def test_it_stays_small_at_10000_members():
    members = [node(f"egress-{i:05}", TAINT) for i in range(10_000)]
    loads = {n.name: load(n.name, i % 5, capacity=4) for i, n in enumerate(members)}
    placed = [Placed(f"egress-{i:05}", NOW - i) for i in range(3000)]
    status = status_of(members, loads, placed=placed, errors=[SeenError("e" * 5000, NOW)])
    assert status["nodes"] == 10_000 and len(status["load"]["mostLoaded"]) == 5
    assert status["runsPlacedLastHour"] == 3000
    assert len(json.dumps(status)) < 10_000  # etcd's limit is 1.5 MiB


members_st = st.lists(
    st.builds(
        node,
        st.sampled_from([f"e{i}" for i in range(8)]),
        st.sampled_from([(), (TAINT,), (LAB_TAINT,)]).map(lambda t: t[0] if t else Taint("x", None, "NoSchedule")),
        ready=st.booleans(),
        cordoned=st.booleans(),
    ),
    max_size=8,
    unique_by=lambda n: n.name,
)
loads_st = st.lists(
    st.builds(load, st.sampled_from([f"e{i}" for i in range(8)]), st.integers(0, 9), st.integers(0, 3), st.integers(0, 6)),
    max_size=8,
    unique_by=lambda n: n.name,
)


@settings(max_examples=200, deadline=None)
@given(
    members=members_st,
    loads=loads_st,
    refusal=st.sampled_from([None, REFUSAL, "EgressPool lab: spec.x: bad"]),
    errors=st.lists(st.builds(SeenError, st.text(max_size=20), st.floats(NOW - HOUR, NOW)), max_size=3),
    generation=st.none() | st.integers(1, 10),
    later=st.floats(0, 600),
)
def test_computed_again_over_itself_it_is_the_same_and_fits_the_schema(members, loads, refusal, errors, generation, later):
    loads_by_name = {n.name: n for n in loads}
    first = status_of(members, loads_by_name, pool=obj(generation=generation), refusal=refusal, errors=errors)
    PoolStatus.model_validate(first)  # what the CRD's status schema is rendered from
    again = status_of(
        members, loads_by_name, pool=obj(generation=generation, status=first), refusal=refusal, errors=errors, now=NOW + later
    )
    assert again == first


def test_times_read_back():
    assert parse_rfc3339(rfc3339(NOW)) == NOW
    assert parse_rfc3339("not a time") is None and parse_rfc3339(None) is None
