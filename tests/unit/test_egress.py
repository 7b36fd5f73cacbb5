"""The pure egress-load core (`controller.core.egress`): the `egressLoad` configuration (durations,
defaults, refusals), the combination of measured throughput with run counts (tables), and its
properties: monotone in measured bytes, placed and assumed runs; stale data is the same as no data;
without measurements the order is the order of (placed + assumed) / capacity.
"""

from fractions import Fraction
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from controller.core.egress import (
    DEFAULT_EGRESS_QUERY,
    EgressLoad,
    Measurement,
    RatioFigure,
    egress_ratio,
    parse_duration,
    rank_nodes,
)
from controller.core.model import NodeLoad

NOW = 1_000_000.0
MAX_AGE = 60.0
GBIT = 125e6


# -- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given_value, seconds",
    [
        ("15s", 15.0),
        ("1m", 60.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        (" 2s ", 2.0),
        (3, 3.0),
        (2.5, 2.5),
        ("7", 7.0),
    ],
)
def test_durations_accept_units_and_seconds(given_value, seconds):
    assert parse_duration(given_value) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "abc", "15x", "1m 30s", "s", "-5s", True, None, [15]])
def test_durations_refuse_what_is_not_one(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_the_documented_example_parses_with_its_values():
    load = EgressLoad.model_validate(
        {
            "prometheus": {
                "url": "http://prometheus.monitoring:9090",
                "nodeLabel": "kubernetes_node",
                "interval": "15s",
                "timeout": "500ms",
                "maxAge": "1m",
            },
            "bandwidthBytesPerSecond": 125000000,
            "nodeBandwidth": {"egress-1": 250000000},
        }
    )
    assert str(load.prometheus.url).startswith("http://prometheus.monitoring:9090")
    assert (load.prometheus.interval, load.prometheus.timeout, load.prometheus.max_age) == (15.0, 0.5, 60.0)
    assert load.prometheus.node_label == "kubernetes_node"
    assert load.bandwidth_of("egress-1") == 250e6
    assert load.bandwidth_of("egress-2") == 125e6


def test_defaults_are_the_documented_ones():
    load = EgressLoad.model_validate({"prometheus": {"url": "https://prom.example:9091/prometheus"}})
    source = load.prometheus
    assert source.query == DEFAULT_EGRESS_QUERY
    assert (source.node_label, source.interval, source.timeout, source.max_age) == ("instance", 15.0, 3.0, 60.0)
    assert load.bandwidth_bytes_per_second == GBIT
    assert load.node_bandwidth == {}


@pytest.mark.parametrize(
    "doc, field",
    [
        ({}, "prometheus"),
        ({"prometheus": {}}, "prometheus.url"),
        ({"prometheus": {"url": "prometheus:9090"}}, "prometheus.url"),
        ({"prometheus": {"url": "ftp://prometheus"}}, "prometheus.url"),
        ({"prometheus": {"url": "http://p", "interval": "0s"}}, "prometheus.interval"),
        ({"prometheus": {"url": "http://p", "timeout": "-1"}}, "prometheus.timeout"),
        ({"prometheus": {"url": "http://p", "maxAge": "soon"}}, "prometheus.maxAge"),
        ({"prometheus": {"url": "http://p", "interval": "1m"}}, "prometheus"),  # maxAge 60s is not > 1m
        ({"prometheus": {"url": "http://p", "nodeLabel": "node-name"}}, "prometheus.nodeLabel"),
        ({"prometheus": {"url": "http://p", "query": "  "}}, "prometheus.query"),
        ({"prometheus": {"url": "http://p", "intervall": "5s"}}, "prometheus.intervall"),
        ({"prometheus": {"url": "http://p"}, "bandwidthBytesPerSecond": 0}, "bandwidthBytesPerSecond"),
        ({"prometheus": {"url": "http://p"}, "nodeBandwidth": {"n": -1}}, "nodeBandwidth.n"),
        ({"prometheus": {"url": "http://p"}, "nodeBandwidth": {"n": "inf"}}, "nodeBandwidth.n"),
    ],
)
def test_bad_configurations_are_refused_at_the_field(doc, field):
    with pytest.raises(ValidationError) as caught:
        EgressLoad.model_validate(doc)
    assert field in {".".join(str(p) for p in e["loc"]) for e in caught.value.errors()}


# -- the combination: tables ----------------------------------------------------------------------


def _m(bps: float, age: float = 5.0) -> Measurement:
    return Measurement(bytes_per_second=bps, sampled_at=NOW - age)


@pytest.mark.parametrize(
    "placed, assumed, capacity, measurement, bandwidth, ratio, source, note_has",
    [
        (2, 1, 10, None, GBIT, 0.3, "runs", "no measurement"),
        (2, 1, 10, _m(62.5e6), GBIT, 0.6, "measured", "link dominates"),  # 0.5 link + 0.1 assumed
        (5, 1, 10, _m(0.0), GBIT, 0.6, "measured", "runs dominates"),  # idle runs keep the floor
        (1, 0, 10, _m(250e6), GBIT, 2.0, "measured", "link"),  # more than the link: over full
        (1, 0, 10, _m(125e6), 250e6, 0.5, "measured", "link"),  # a bigger node link halves the ratio
        (2, 1, 10, _m(62.5e6, age=61.0), GBIT, 0.3, "runs", "61s old"),
        (2, 1, 10, _m(62.5e6, age=60.0), GBIT, 0.6, "measured", ""),  # exactly max_age is still fresh
        (2, 1, 10, _m(62.5e6, age=-30.0), GBIT, 0.6, "measured", ""),  # stamped in the future: new
        (2, 1, 10, _m(math.nan), GBIT, 0.3, "runs", "unusable measurement"),
        (2, 1, 10, _m(math.inf), GBIT, 0.3, "runs", "unusable measurement"),
        (2, 1, 10, _m(-1.0), GBIT, 0.3, "runs", "unusable measurement"),
        (2, 1, 10, _m(62.5e6), 0.0, 0.3, "runs", "unusable bandwidth"),
        (0, 0, 0, _m(62.5e6), GBIT, math.inf, "runs", "takes no runs"),
    ],
)
def test_egress_ratio(placed, assumed, capacity, measurement, bandwidth, ratio, source, note_has):
    figure = egress_ratio(NodeLoad("n", placed, assumed, capacity), measurement, bandwidth, NOW, MAX_AGE)
    assert figure.ratio == pytest.approx(ratio)
    assert figure.source == source
    assert note_has in figure.note


def test_two_uploads_weigh_more_than_ten_quiet_runs():
    loads = {"quiet": NodeLoad("quiet", 10, 0, 20), "cdn": NodeLoad("cdn", 2, 0, 20), "idle": NodeLoad("idle", 0, 0, 20)}
    measurements = {"quiet": _m(5e6), "cdn": _m(110e6), "idle": _m(1e3)}
    ranked = rank_nodes(loads, measurements, lambda node: GBIT, NOW, MAX_AGE)
    assert list(ranked) == ["idle", "quiet", "cdn"]
    assert all(f.source == "measured" for f in ranked.values())


def test_rank_nodes_uses_each_nodes_bandwidth_and_falls_back_per_node():
    loads = {name: NodeLoad(name, 1, 0, 10) for name in ("big", "small", "unmeasured")}
    measurements = {"big": _m(400e6), "small": _m(100e6)}
    config = EgressLoad.model_validate({"prometheus": {"url": "http://p"}, "nodeBandwidth": {"big": 1e9}})
    ranked = rank_nodes(loads, measurements, config.bandwidth_of, NOW, MAX_AGE)
    assert list(ranked) == ["unmeasured", "big", "small"]
    assert ranked["unmeasured"] == RatioFigure(0.1, "runs", ranked["unmeasured"].note)
    assert (ranked["big"].ratio, ranked["small"].ratio) == (pytest.approx(0.4), pytest.approx(0.8))


# -- the combination: properties ------------------------------------------------------------------

counts = st.integers(min_value=0, max_value=500)
capacities = st.integers(min_value=1, max_value=500)
rates = st.floats(min_value=0, max_value=1e11, allow_nan=False, allow_infinity=False)
bandwidths = st.floats(min_value=1.0, max_value=1e11, allow_nan=False, allow_infinity=False)
ages = st.floats(min_value=-100.0, max_value=1000.0, allow_nan=False)
measurements = st.one_of(st.none(), st.builds(lambda bps, age: _m(bps, age), rates, ages))


@given(counts, counts, capacities, rates, rates, ages, bandwidths)
def test_ratio_is_monotone_in_measured_bytes(placed, assumed, capacity, a, b, age, bandwidth):
    low, high = sorted((a, b))
    load = NodeLoad("n", placed, assumed, capacity)
    assert (
        egress_ratio(load, _m(low, age), bandwidth, NOW, MAX_AGE).ratio
        <= egress_ratio(load, _m(high, age), bandwidth, NOW, MAX_AGE).ratio
    )


@given(counts, counts, counts, capacities, measurements, bandwidths)
def test_ratio_is_monotone_in_placed_runs(a, b, assumed, capacity, measurement, bandwidth):
    low, high = sorted((a, b))
    fewer = egress_ratio(NodeLoad("n", low, assumed, capacity), measurement, bandwidth, NOW, MAX_AGE)
    more = egress_ratio(NodeLoad("n", high, assumed, capacity), measurement, bandwidth, NOW, MAX_AGE)
    assert fewer.ratio <= more.ratio


@given(counts, counts, counts, capacities, measurements, bandwidths)
def test_ratio_is_monotone_in_assumed_runs(placed, a, b, capacity, measurement, bandwidth):
    low, high = sorted((a, b))
    fewer = egress_ratio(NodeLoad("n", placed, low, capacity), measurement, bandwidth, NOW, MAX_AGE)
    more = egress_ratio(NodeLoad("n", placed, high, capacity), measurement, bandwidth, NOW, MAX_AGE)
    assert fewer.ratio <= more.ratio


@given(counts, counts, st.integers(min_value=-5, max_value=500), rates, bandwidths, st.floats(0.001, 1e6))
def test_stale_data_gives_the_same_answer_as_no_data(placed, assumed, capacity, bps, bandwidth, beyond):
    load = NodeLoad("n", placed, assumed, capacity)
    stale = egress_ratio(load, _m(bps, MAX_AGE + beyond), bandwidth, NOW, MAX_AGE)
    none = egress_ratio(load, None, bandwidth, NOW, MAX_AGE)
    assert (stale.ratio, stale.source) == (none.ratio, none.source)
    assert stale.source == "runs"


@given(counts, counts, capacities, measurements, bandwidths)
def test_a_measurement_never_counts_less_than_the_runs(placed, assumed, capacity, measurement, bandwidth):
    load = NodeLoad("n", placed, assumed, capacity)
    runs_only = (placed + assumed) / capacity
    assert egress_ratio(load, measurement, bandwidth, NOW, MAX_AGE).ratio >= runs_only * (1 - 1e-12)


@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=4), st.tuples(counts, counts, capacities), max_size=8))
def test_without_measurements_the_order_is_the_run_ratio_order(nodes):
    loads = {name: NodeLoad(name, p, a, c) for name, (p, a, c) in nodes.items()}
    ranked = rank_nodes(loads, {}, lambda node: GBIT, NOW, MAX_AGE)
    assert set(ranked) == set(loads)
    exact = {name: Fraction(load.total, load.capacity) for name, load in loads.items()}
    assert list(ranked) == sorted(loads, key=lambda name: (exact[name], name))
    assert all(f.source == "runs" for f in ranked.values())


@given(st.dictionaries(st.sampled_from("abcdefgh"), st.tuples(counts, counts, capacities, measurements), max_size=8))
def test_rank_nodes_is_sorted_and_agrees_with_egress_ratio(nodes):
    loads = {name: NodeLoad(name, p, a, c) for name, (p, a, c, _) in nodes.items()}
    measured = {name: m for name, (_, _, _, m) in nodes.items() if m is not None}
    ranked = rank_nodes(loads, measured, lambda node: GBIT, NOW, MAX_AGE)
    ratios = [f.ratio for f in ranked.values()]
    assert ratios == sorted(ratios)
    for name, figure in ranked.items():
        assert figure == egress_ratio(loads[name], measured.get(name), GBIT, NOW, MAX_AGE)
