"""Measured egress load in node choice: a pool's `egressLoad` source, its pollers, and the balancer.

Checks that the policy accepts `egressLoad`, that `choose_node` ranks by the measured figures when
they are given, that a burst spreads away from a node whose uplink is busy (ClusterState with a
fixed snapshot), that stale figures fall back to run counts, and that `EgressPollers` follows the
policy (start, restart on change, stop) and exports its figures as metrics. Prometheus is mocked
with `responses`: the poller speaks HTTP through `requests`.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

import pytest
import responses
from prometheus_client import CollectorRegistry

from bench.oracles import choose_node
from controller.core.egress import Measurement, RatioFigure, rank_nodes
from controller.core.model import NodeLoad, NodeState
from controller.core.policy import Pool, load_policy
from controller.prometheus.egress_source import EgressPollers
from controller.runner import Runner
from controller.state import ClusterState
from tests.waiting import wait_for

NOW = 1_800_000_000.0


def egress_ratios(state: ClusterState, pool: Pool, loads: Mapping[str, NodeLoad]) -> dict[str, RatioFigure] | None:
    """Measured-egress load figures of the pool's nodes as the state holds them (None when the pool has
    no egress source)."""
    figures = state.load._egress.get(pool.name)  # noqa: SLF001
    if figures is None or pool.egress_load is None:
        return None
    return rank_nodes(loads, figures, pool.egress_load.bandwidth_of, NOW, pool.egress_load.prometheus.max_age)
URL = "http://prometheus.test:9090"


def policy_text(extra: str = "") -> str:
    return f"""
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {{pool: overseas}}
    images: ["*/cdn-*"]
    namespaces: [team-cdn]
    capacity: 10
    egressLoad:
      prometheus: {{url: "{URL}", interval: 1s, maxAge: 30s{extra}}}
      bandwidthBytesPerSecond: 100000000
"""


def node(name: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"pool": "overseas"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"pods": "110"}},
    }


def state_with(figures: dict[str, Measurement], clock: float = NOW) -> ClusterState:
    state = ClusterState(load_policy(policy_text()), clock=lambda: clock)
    state.replace("Node", [node("egress-1"), node("egress-2"), node("egress-3")])
    state.load.set_egress_figures("overseas", figures)
    return state


def test_the_policy_accepts_an_egress_source():
    pool = load_policy(policy_text()).pool("overseas")
    assert pool.egress_load is not None
    assert pool.egress_load.bandwidth_of("egress-1") == 100_000_000
    assert pool.egress_load.prometheus.max_age == 30


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ({"a": 0.9, "b": 0.1, "c": 0.5}, "b"),
        ({"a": 0.0, "b": 0.1, "c": 0.5}, "a"),
        # Nodes without a figure keep their run-count ratio (0 here: no load).
        ({"a": 0.9, "b": 0.8}, "c"),
        (None, None),  # no ratios: decided by run counts and the salt alone
    ],
)
def test_choose_node_ranks_by_measured_ratios_when_given(ratios, expected):
    nodes = [NodeState(n) for n in "abc"]
    loads = {n: NodeLoad(n, 0, 0, 10) for n in "abc"}
    chosen = choose_node(nodes, loads, salt="run-1", ratios=ratios)
    if expected is None:
        assert chosen in {"a", "b", "c"}
    else:
        assert chosen == expected


def test_a_burst_avoids_the_node_whose_uplink_is_busy():
    busy = {"egress-1": Measurement(90_000_000, NOW - 5)}  # 90% of 100 MB/s
    state = state_with(busy)
    pool = state.policy.pool("overseas")
    picks = Counter(state.load.choose_and_assume(pool, f"taskrun/team-cdn/run-{i}", salt=f"run-{i}").node for i in range(12))
    # 12 runs on 3 nodes of capacity 10: the busy node (ratio 0.9) only gets runs once the others
    # are as loaded (run ratio >= 0.9 there means 9 runs each), so here it gets none.
    assert picks["egress-1"] == 0
    assert picks["egress-2"] + picks["egress-3"] == 12
    assert abs(picks["egress-2"] - picks["egress-3"]) <= 1


def test_stale_figures_fall_back_to_run_counts():
    stale = {"egress-1": Measurement(90_000_000, NOW - 120)}  # older than maxAge 30s
    state = state_with(stale)
    pool = state.policy.pool("overseas")
    picks = Counter(state.load.choose_and_assume(pool, f"taskrun/team-cdn/run-{i}", salt=f"run-{i}").node for i in range(12))
    assert picks == {"egress-1": 4, "egress-2": 4, "egress-3": 4}
    figures = egress_ratios(state, pool, state.load.loads(pool))
    assert figures is not None and figures["egress-1"].source == "runs"


def test_figures_of_a_stopped_or_replaced_poller_are_not_taken():
    # A poll in flight while the policy changes must not put its figures back after the stop.
    state = state_with({})
    pollers = EgressPollers(state.load, clock=lambda: NOW, runner=Runner())
    pollers._publish("overseas", object(), {"egress-1": Measurement(90_000_000, NOW)})  # type: ignore[arg-type]  # noqa: SLF001
    pool = state.policy.pool("overseas")
    figures = egress_ratios(state, pool, state.load.loads(pool))
    assert figures is not None and figures["egress-1"].source == "runs"


@responses.activate
def test_pollers_follow_the_policy_and_export_metrics():
    responses.get(
        f"{URL}/api/v1/query",
        json={
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [{"metric": {"instance": "egress-2:9100"}, "value": [NOW, "42000000"]}],
            },
        },
    )
    state = ClusterState(load_policy(policy_text()), clock=lambda: NOW)
    state.replace("Node", [node("egress-1"), node("egress-2")])
    registry, runner = CollectorRegistry(), Runner()
    pollers = EgressPollers(state.load, clock=lambda: NOW, runner=runner, registry=registry)
    try:
        pollers.sync(state.policy)
        pool = state.policy.pool("overseas")

        def figure_seen() -> bool:
            ratios = egress_ratios(state, pool, state.load.loads(pool))
            return ratios is not None and ratios["egress-2"].source == "measured"

        wait_for("the measured figure of egress-2", figure_seen, timeout=5, interval=0.05)
        assert registry.get_sample_value(
            "egress_placer_egress_bytes_per_second", {"pool": "overseas", "node": "egress-2"}
        ) == pytest.approx(42_000_000)
        assert registry.get_sample_value("egress_placer_egress_fallback", {"pool": "overseas", "node": "egress-1"}) == 1.0

        # A policy without the source stops the poller and node choice forgets the figures.
        plain = load_policy(policy_text().split("    egressLoad:")[0])
        state.set_policy(plain)
        pollers.sync(plain)
        assert egress_ratios(state, plain.pool("overseas"), {}) is None
        assert pollers.statuses() == []
    finally:
        runner.stop()
