"""Checks the per-pool load index node choice reads (controller/load/index.py) and the state
that feeds it on events (controller/state.py).

Tables: what `PoolLoads` chooses (ratio, count, capacity <= 0 last, full nodes still chosen, ties
spread by salt, assumptions counted or not), what it reports, and how egress figures weigh and go
stale. Properties: the exact rank orders loads as exact fractions do; `measured_ratio` is the egress
formula exactly. The main property drives random sequences of node and pod events, relists,
admissions (assumptions), settles, clock ticks (expiries) and egress figures through ClusterState
and, beside it, a plain model of the same facts; at every step the node the index chooses is the
one a full scan of the model chooses (a node of minimal load, the tie rule of `choose_node`), and
the loads it reports are the model's.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.oracles import choose_node, eligible_nodes
from controller.load.core import load_rank, spread_index
from controller.core.egress import EgressLoad, Measurement, egress_ratio, measured_ratio
from controller.load.index import PoolLoads
from controller.core.model import DECISION_ANNOTATION, NodeLoad, NodeState
from controller.core.policy import load_policy
from controller.load.view import LOADS_SHOWN
from controller.state import ClusterState

GBIT = 125_000_000.0
EGRESS = EgressLoad.model_validate(
    {"prometheus": {"url": "http://prometheus.test:9090", "interval": 1, "maxAge": 30}, "bandwidthBytesPerSecond": 1e8,
     "nodeBandwidth": {"n1": 3e7}}
)
MAX_AGE = 30.0


def index_of(loads: dict[str, tuple[int, int, int]], capacity: int | None = None, **kw: Any) -> PoolLoads:
    """name -> (placed, assumed, allocatable pods)."""
    index = PoolLoads(capacity, **kw)
    for name, (placed, assumed, allocatable) in loads.items():
        index.put(name, allocatable, placed, assumed)
    return index


@pytest.mark.parametrize(
    ("loads", "capacity", "expected"),
    [
        ({"a": (3, 0, 10), "b": (1, 1, 10)}, None, "b"),  # lowest ratio, assumed counts
        ({"a": (2, 0, 10), "b": (1, 0, 4)}, None, "a"),  # ratio, not absolute count
        ({"a": (2, 0, 10), "b": (1, 0, 5)}, None, "b"),  # equal ratio: fewer absolute
        ({"a": (2, 0, 2), "b": (9, 0, 10)}, None, "b"),  # never full before non-full
        ({"a": (5, 0, 2), "b": (3, 0, 2)}, None, "b"),  # all full: least overfull, still chosen
        ({"a": (0, 0, 0), "b": (50, 0, 10)}, None, "b"),  # no capacity comes last
        ({"a": (4, 0, 0), "b": (2, 0, 0)}, None, "b"),  # only nodes without capacity: fewest runs
        ({"a": (3, 0, 110), "b": (1, 0, 4)}, 5, "b"),  # the pool's capacity, not allocatable pods
        ({"a": (1, 2, 10), "b": (2, 0, 10)}, None, "b"),
    ],
)
def test_choice_by_load(loads, capacity, expected):
    index = index_of(loads, capacity)
    assert index.choose("run-1") == expected
    nodes = [NodeState(name, allocatable_pods=allocatable) for name, (_, _, allocatable) in loads.items()]
    assert choose_node(nodes, index.loads(), salt="run-1") == expected  # the full scan agrees


def test_assumptions_are_left_out_when_the_balance_says_so():
    index = index_of({"a": (1, 3, 10), "b": (2, 0, 10)}, count_assumed=False)
    assert index.choose("run-1") == "a"  # ranked by seen pods only
    assert index.load("a") == NodeLoad("a", 1, 3, 10)  # ... but reported with its assumptions


def test_ties_go_to_the_node_the_salt_picks_in_name_order():
    names = [f"n{i:02d}" for i in range(20)]
    index = index_of({n: (1, 0, 10) for n in names} | {"busy": (5, 0, 10)})
    for salt in ("run-1", "run-2", "ci/build-7"):
        assert index.choose(salt) == sorted(names)[spread_index(salt, len(names))]
    picks = Counter(index.choose(f"ci/run-{i}") for i in range(2000))
    assert set(picks) == set(names)  # every equal node is picked for some salt, the busy one never


@settings(max_examples=300, deadline=None)
@given(
    loads=st.dictionaries(st.sampled_from([f"n{i}" for i in range(8)]), st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 4)),
                          min_size=1),
    prefer=st.one_of(st.none(), st.sampled_from([f"n{i}" for i in range(10)])),
    allowed=st.one_of(st.none(), st.frozensets(st.sampled_from([f"n{i}" for i in range(10)]))),
    salt=st.text(max_size=6),
)
def test_a_preferred_node_is_chosen_exactly_when_it_is_among_the_least_loaded(loads, prefer, allowed, salt):
    # A run's pod keeps the node its run was given only among equals: the choice is as least loaded as
    # without the preference; the preference decides only which of the equals.
    index = index_of(loads)
    plain, chosen = index.choose(salt, allowed), index.choose(salt, allowed, prefer)
    if plain is None:
        assert chosen is None
        return
    assert index.rank(chosen) == index.rank(plain)
    may = prefer is not None and prefer in loads and (allowed is None or prefer in allowed)
    assert (chosen == prefer) == (may and index.rank(prefer) == index.rank(plain))
    if chosen != prefer:
        assert chosen == plain


def test_an_empty_pool_chooses_nothing():
    index = index_of({"a": (0, 0, 10)})
    index.remove("a")
    index.remove("never-there")
    assert (index.choose("x"), len(index), index.least_loaded(10)) == (None, 0, [])


def test_updates_move_a_node_and_ignore_strangers():
    index = index_of({"a": (0, 0, 10), "b": (1, 0, 10)})
    assert index.choose("x") == "a"
    index.set_assumed("a", 2)
    assert index.choose("x") == "b"
    index.set_placed("b", 4)
    assert index.choose("x") == "a"
    index.put("b", 100, 4, 0)  # allocatable pods grew: 4/100 < 2/10
    assert index.choose("x") == "b"
    index.set_placed("stranger", 9)
    index.set_assumed("stranger", 9)
    assert "stranger" not in index and len(index) == 2


def test_least_loaded_lists_the_chosen_node_too():
    index = index_of({f"n{i}": (i, 0, 10) for i in range(6)})
    assert [load.name for load in index.least_loaded(3)] == ["n0", "n1", "n2"]
    assert [load.name for load in index.least_loaded(3, include="n5")] == ["n0", "n1", "n5"]
    assert [load.name for load in index.least_loaded(3, include="n1")] == ["n0", "n1", "n2"]


def test_measured_egress_weighs_and_goes_stale_with_time():
    index = index_of({"n1": (0, 0, 10), "n2": (2, 0, 10)}, egress=EGRESS)
    index.refresh(1000.0)
    # n1's link (bandwidth 3e7) sends 2.4e7: 0.8 > n2's 2/10.
    index.set_figures({"n1": Measurement(2.4e7, 995.0), "n2": Measurement(1e6, 995.0)})
    assert index.choose("x") == "n2"
    index.refresh(1025.0)  # n1's figure is 30 s old: still counts
    assert index.choose("x") == "n2"
    index.refresh(1025.5)  # older than maxAge: n1 is ranked by its runs again (0/10)
    assert index.choose("x") == "n1"
    assert index.rank("n1") == load_rank(NodeLoad("n1", 0, 0, 10))
    index.refresh(990.0)  # the clock went back: the figure is fresh again
    assert index.choose("x") == "n2"


def test_a_new_figure_replaces_the_old_one_and_absent_figures_fall_back_to_runs():
    index = index_of({"n1": (0, 0, 10), "n2": (1, 0, 10)}, egress=EGRESS)
    index.refresh(1000.0)
    index.set_figures({"n1": Measurement(2.9e7, 999.0)})
    assert index.choose("x") == "n2"
    index.set_figures({"n1": Measurement(1.0, 999.0)})
    assert index.choose("x") == "n1"
    index.set_figures({})
    assert index.rank("n1") == load_rank(NodeLoad("n1", 0, 0, 10))
    index.set_figures({"n3": Measurement(9e7, 999.0)})
    index.put("n3", 10)  # a node joining takes its figure: 0.9
    assert index.rank("n3")[2] == load_rank(NodeLoad("n3", 0, 0, 10), (9, 10))[2]


# -- exactness ------------------------------------------------------------------------------------

counts = st.integers(0, 300)
capacities = st.integers(-2, 300)


@given(a=st.tuples(counts, counts, capacities), b=st.tuples(counts, counts, capacities))
def test_the_rank_orders_loads_as_exact_fractions_do(a, b):
    def exact(placed: int, assumed: int, capacity: int) -> tuple:
        total = placed + assumed
        return (True, Fraction(0), total) if capacity <= 0 else (False, Fraction(total, capacity), total)

    ra, rb = load_rank(NodeLoad("a", *a)), load_rank(NodeLoad("b", *b))
    ea, eb = exact(*a), exact(*b)
    assert (ra < rb, ra == rb, ra > rb) == (ea < eb, ea == eb, ea > eb)


def test_unequal_ratios_that_round_to_the_same_float_are_still_ordered():
    small, big = 10**17, 10**17 + 1  # 1/10**17 vs 1/(10**17+1): equal as floats? then exact decides
    low, high = load_rank(NodeLoad("a", 0, 0, 1), (1, big)), load_rank(NodeLoad("b", 0, 0, 1), (1, small))
    assert low < high and not low == high
    assert load_rank(NodeLoad("a", 0, 0, 1), (1, 3)) == load_rank(NodeLoad("b", 0, 0, 1), (2, 6))


finite_rates = st.floats(0, 1e12, allow_nan=False) | st.sampled_from([0.0, 1e6, 3e7, 1.25e8, 0.1, 1e-300])


@given(
    placed=counts,
    assumed=counts,
    capacity=st.integers(1, 300),
    sent=finite_rates,
    bandwidth=st.floats(1e-3, 1e12) | st.just(GBIT),
)
def test_measured_ratio_is_the_egress_formula_exactly(placed, assumed, capacity, sent, bandwidth):
    load = NodeLoad("n", placed, assumed, capacity)
    got = measured_ratio(load, Measurement(sent, 0.0), bandwidth, 1.0, MAX_AGE)
    assert got is not None and got[1] > 0
    exact = max(Fraction(sent) / Fraction(bandwidth), Fraction(placed, capacity)) + Fraction(assumed, capacity)
    assert Fraction(*got) == exact
    figure = egress_ratio(load, Measurement(sent, 0.0), bandwidth, 1.0, MAX_AGE)
    assert figure.source == "measured" and math.isclose(figure.ratio, float(exact), rel_tol=1e-9)


@pytest.mark.parametrize(
    ("measurement", "bandwidth", "capacity"),
    [
        (None, GBIT, 10),
        (Measurement(1e6, 0.0), GBIT, 0),  # no capacity: the run count (and last place) decides
        (Measurement(1e6, -100.0), GBIT, 10),  # stale
        (Measurement(math.nan, 0.0), GBIT, 10),
        (Measurement(-1.0, 0.0), GBIT, 10),
        (Measurement(1e6, 0.0), 0.0, 10),
        (Measurement(1e6, 0.0), math.inf, 10),
    ],
)
def test_measured_ratio_is_none_where_egress_ratio_falls_back_to_runs(measurement, bandwidth, capacity):
    load = NodeLoad("n", 1, 1, capacity)
    assert measured_ratio(load, measurement, bandwidth, 1.0, MAX_AGE) is None
    assert egress_ratio(load, measurement, bandwidth, 1.0, MAX_AGE).source == "runs"


# -- the state against a model, over random event sequences ---------------------------------------

NODES = ["n0", "n1", "n2", "n3", "n4"]
TTL = 60.0


def policy_text(capacity: int | None, egress: bool) -> str:
    return "\n".join(
        line
        for line in [
            "apiVersion: egress-placer.io/v1alpha1",
            "kind: PlacementPolicy",
            "pools:",
            "  - name: p",
            "    nodeSelector: {pool: p}",
            "    namespaces: [ci]",
            f"    capacity: {capacity}" if capacity is not None else "",
            "    egressLoad:" if egress else "",
            "      prometheus: {url: 'http://prometheus.test:9090', interval: 1, maxAge: 30}" if egress else "",
            "      bandwidthBytesPerSecond: 100000000" if egress else "",
            "      nodeBandwidth: {n1: 30000000}" if egress else "",
        ]
        if line
    )


node_event = st.fixed_dictionaries(
    {
        "op": st.just("node"),
        "name": st.sampled_from(NODES),
        "in_pool": st.sampled_from([True, True, False]),
        "ready": st.sampled_from([True, True, False]),
        "cordoned": st.sampled_from([False, False, True]),
        "pods": st.sampled_from([0, 2, 4, 4, 110]),
    }
)
pod_event = st.fixed_dictionaries(
    {
        "op": st.just("pod"),
        "name": st.integers(0, 11),
        "node": st.sampled_from([*NODES, None]),
        "phase": st.sampled_from(["Running", "Pending", "Running", "Succeeded", "Failed"]),
        "deleting": st.sampled_from([False, False, True]),
        "daemonset": st.sampled_from([False, False, True]),
        "run": st.integers(0, 7),  # the TaskRun it belongs to (its label settles that run's assumption)
    }
)
operations = st.one_of(
    node_event,
    st.fixed_dictionaries({"op": st.just("node-deleted"), "name": st.sampled_from(NODES)}),
    pod_event,
    pod_event,
    st.fixed_dictionaries({"op": st.just("pod-deleted"), "name": st.integers(0, 11)}),
    st.fixed_dictionaries({"op": st.just("admit"), "run": st.integers(0, 7), "kind": st.sampled_from(["taskrun", "pod"])}),
    st.fixed_dictionaries({"op": st.just("admit"), "run": st.integers(0, 7), "kind": st.just("taskrun")}),
    st.fixed_dictionaries({"op": st.just("forget"), "run": st.integers(0, 7), "kind": st.sampled_from(["taskrun", "pod"])}),
    st.fixed_dictionaries({"op": st.just("tick"), "seconds": st.sampled_from([0.5, 5.0, 20.0, 30.0, 45.0, 61.0])}),
    st.fixed_dictionaries({"op": st.just("relist"), "kind": st.sampled_from(["Pod", "Node"])}),
    st.fixed_dictionaries({"op": st.just("policy"), "capacity": st.sampled_from([None, 1, 3])}),
    st.fixed_dictionaries(
        {
            "op": st.just("figures"),
            "figures": st.dictionaries(
                st.sampled_from(NODES),
                st.tuples(
                    st.sampled_from([0.0, 1e6, 2e7, 3e7, 5e7, 9e7, 1.5e8, 12345678.9, math.nan, -1.0]),
                    st.sampled_from([-5.0, 0.0, 10.0, 29.5, 30.0, 31.0, 100.0]),  # age at arrival
                ),
            ),
        }
    ),
)


@functools.lru_cache
def policy_for(capacity: int | None, egress: bool):
    return load_policy(policy_text(capacity, egress))


class Model:
    """The same facts as plain data, and the full scan over them (Fractions: slow and obviously exact)."""

    def __init__(self, capacity: int | None, egress: bool, count_assumed: bool) -> None:
        self.capacity, self.egress, self.count_assumed = capacity, egress, count_assumed
        self.now = 1000.0
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[int, dict[str, Any]] = {}
        self.assumed: dict[str, tuple[str, float]] = {}  # ledger key -> (node, since)
        # pod ledger key -> when first seen active: a stored object (no decision record here) replaces an
        # admission of its key (load.core.ClaimBook)
        self.stored: dict[str, float] = {}
        self.figures: dict[str, Measurement] = {}

    def policy(self):
        return policy_for(self.capacity, self.egress)

    def eligible(self) -> list[NodeState]:
        states = [NodeState.from_node(node_object(n)) for n in self.nodes.values()]
        return eligible_nodes(self.policy().pool("p"), self.policy(), states)

    def expire(self) -> None:
        self.assumed = {k: (n, since) for k, (n, since) in self.assumed.items() if not self.now - since > TTL}
        self.stored = {k: since for k, since in self.stored.items() if not self.now - since > TTL}

    def loads(self) -> dict[str, NodeLoad]:
        self.expire()
        out = {}
        for node in self.eligible():
            placed = sum(
                1
                for p in self.pods.values()
                if p["node"] == node.name and p["phase"] in ("Pending", "Running") and not p["deleting"] and not p["daemonset"]
            )
            assumed = sum(1 for n, _ in self.assumed.values() if n == node.name)
            capacity = self.capacity if self.capacity is not None else node.allocatable_pods
            out[node.name] = NodeLoad(node.name, placed, assumed, capacity)
        return out

    def rank(self, load: NodeLoad) -> tuple[bool, Fraction, int]:
        assumed = load.assumed if self.count_assumed else 0
        total = load.placed + assumed
        if load.capacity <= 0:
            return (True, Fraction(0), total)
        ratio = Fraction(total, load.capacity)
        figure = self.figures.get(load.name) if self.egress else None
        if figure is not None and math.isfinite(figure.bytes_per_second) and figure.bytes_per_second >= 0:
            if max(0.0, self.now - figure.sampled_at) <= MAX_AGE:
                bandwidth = 3e7 if load.name == "n1" else 1e8
                link = Fraction(figure.bytes_per_second) / Fraction(bandwidth)
                ratio = max(link, Fraction(load.placed, load.capacity)) + Fraction(assumed, load.capacity)
        return (False, ratio, total)

    def choose(self, salt: str) -> str | None:
        ranks = {name: self.rank(load) for name, load in self.loads().items()}
        if not ranks:
            return None
        best = min(ranks.values())
        tied = sorted(name for name, rank in ranks.items() if rank == best)
        return tied[spread_index(salt, len(tied))]

    def seen(self, pod: dict[str, Any]) -> None:
        """A pod seen replaces its own assumption (it has no decision record: it counts only once bound)
        and, when it is the TaskRun's pod (owned by it, by uid), its TaskRun's."""
        key = f"pod/ci/pod-{pod['name']}"
        self.assumed.pop(key, None)
        if not pod["daemonset"]:
            self.assumed.pop(f"taskrun/ci/run-{pod['run']}", None)
        if pod["node"] or pod["deleting"] or pod["phase"] not in ("Pending", "Running"):
            self.stored.pop(key, None)
        elif key not in self.stored or self.now - self.stored[key] > TTL:
            self.stored[key] = self.now


def node_object(node: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": node["name"], "labels": {"pool": "p"} if node["in_pool"] else {}},
        "spec": {"unschedulable": node["cordoned"]},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if node["ready"] else "False"}],
            "allocatable": {"pods": str(node["pods"])},
        },
    }


def pod_object(pod: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ci", "name": f"pod-{pod['name']}", "labels": {"tekton.dev/taskRun": f"run-{pod['run']}"}}
    if pod["deleting"]:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if pod["daemonset"]:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u-1"}]
    else:  # a TaskRun's pod: owned by it, by uid (its label alone settles nothing)
        meta["ownerReferences"] = [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": f"run-{pod['run']}",
                                    "uid": f"uid-run-{pod['run']}", "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": pod["node"]} if pod["node"] else {}, "status": {"phase": pod["phase"]}}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.sampled_from([None, 2]),
    egress=st.booleans(),
    count_assumed=st.booleans(),
    allocatable=st.lists(st.sampled_from([0, 2, 4, 4, 110]), min_size=len(NODES), max_size=len(NODES)),
    steps=st.lists(operations, min_size=1, max_size=60),
)
def test_the_index_chooses_what_a_full_scan_of_the_same_facts_chooses(capacity, egress, count_assumed, allocatable, steps):
    model = Model(capacity, egress, count_assumed)
    state = ClusterState(
        model.policy(), clock=lambda: model.now, assumption_ttl=TTL,
        balance="load" if count_assumed else "load-without-assumptions",
    )
    first = [{"op": "node", "name": n, "in_pool": True, "ready": True, "cordoned": False, "pods": pods}
             for n, pods in zip(NODES, allocatable, strict=True)]
    for run in range(8):  # the TaskRuns the pods belong to, in the cache (finished: their own records count nothing)
        state.apply("TaskRun", "ADDED", {"metadata": {"namespace": "ci", "name": f"run-{run}", "uid": f"uid-run-{run}",
                                                      "annotations": {DECISION_ANNOTATION: "{}"}},
                                         "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}})
    for number, step in enumerate(first + steps):
        op = step["op"]
        if op == "node":
            model.nodes[step["name"]] = step
            state.apply("Node", "MODIFIED", node_object(step))
        elif op == "node-deleted":
            model.nodes.pop(step["name"], None)
            state.apply("Node", "DELETED", {"metadata": {"name": step["name"]}})
        elif op == "pod":
            model.seen(step)
            if step["phase"] in ("Succeeded", "Failed"):
                model.pods.pop(step["name"], None)  # the cache keeps no finished pod
            else:
                model.pods[step["name"]] = step
            state.apply("Pod", "MODIFIED", pod_object(step))
        elif op == "pod-deleted":
            model.pods.pop(step["name"], None)
            model.assumed.pop(f"pod/ci/pod-{step['name']}", None)
            model.stored.pop(f"pod/ci/pod-{step['name']}", None)
            state.apply("Pod", "DELETED", {"metadata": {"namespace": "ci", "name": f"pod-{step['name']}"}})
        elif op == "admit":
            key = f"{step['kind']}/ci/{'run' if step['kind'] == 'taskrun' else 'pod'}-{step['run']}"
            salt = f"salt-{number}"
            expected = model.choose(salt)
            choice = state.load.choose_and_assume(state.policy.pool("p"), key, salt)
            assert choice.node == expected
            if expected is not None and key not in model.stored:
                model.assumed.pop(key, None)
                model.assumed[key] = (expected, model.now)
        elif op == "forget":
            key = f"{step['kind']}/ci/{'run' if step['kind'] == 'taskrun' else 'pod'}-{step['run']}"
            model.assumed.pop(key, None)
            state.load.hand_over(key)
        elif op == "tick":
            model.now += step["seconds"]
        elif op == "relist":
            if step["kind"] == "Pod":
                model.stored = {k: v for k, v in model.stored.items() if int(k.rsplit("-", 1)[1]) in model.pods}
                for pod in model.pods.values():  # each pod is seen again
                    model.seen(pod)
                state.replace("Pod", [pod_object(p) for p in model.pods.values()])
            else:
                state.replace("Node", [node_object(n) for n in model.nodes.values()])
        elif op == "policy":
            model.capacity = step["capacity"]
            state.set_policy(model.policy())
        elif op == "figures":
            model.figures = {
                name: Measurement(bps, model.now - age) for name, (bps, age) in step["figures"].items()
            }
            state.load.set_egress_figures("p", dict(model.figures), chunk=2)  # taken in over several holds (#24)

        # At every step: the same choice as the full scan of the model, and the same loads.
        pool = state.policy.pool("p")
        salt = f"check-{number}"
        expected = model.choose(salt)
        choice = state.load.choose(pool, salt)
        assert choice.node == expected, (step, model.loads())
        loads = model.loads()
        assert state.load.loads(pool) == loads
        if expected is not None:
            assert expected in choice.loads
            assert all(loads[name] == load for name, load in choice.loads.items())
            assert len(choice.loads) == min(LOADS_SHOWN, len(loads))
            assert len(choice.loads) + choice.more_nodes == len(loads)
        if not egress:  # the core's own full scan (run counts only) agrees too
            seen = loads if count_assumed else {n: NodeLoad(n, v.placed, 0, v.capacity) for n, v in loads.items()}
            assert choose_node(model.eligible(), seen, salt=salt) == expected
