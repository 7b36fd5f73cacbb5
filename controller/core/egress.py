"""Load that means egress: how busy a pool node's outbound link is, combined with its run count.

`EgressLoad` is the optional `egressLoad` block of a pool (where measured throughput comes from and
how much a node can send). `egress_ratio` turns one node's runs and its measured bytes per second
into the load ratio node choice ranks by; `rank_nodes` does it for a pool. `docs/egress-load.md`
explains the formula.

Pure: the time is passed in; measurements are plain values fetched elsewhere
(`controller.prometheus.egress_source`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Mapping

from decimal import Decimal

from pydantic import (
    BeforeValidator,
    Field,
    HttpUrl,
    PlainSerializer,
    field_validator,
    model_validator,
)

from controller.core.model import NodeLoad
from controller.core.schema import NOT_BLANK, OpenAPI, PolicyModel, Rule

DEFAULT_EGRESS_QUERY = (
    'sum by (instance) (rate(node_network_transmit_bytes_total{device!~"lo|veth.*|cali.*|flannel.*|cni.*"}[1m]))'
)
GIGABIT_BYTES_PER_SECOND = 125_000_000.0

# -- durations ------------------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")
# The durations the API server takes: an integer of seconds or this (Go's time.ParseDuration reads it too).
DURATION_PATTERN = r"^((\d+(\.\d*)?|\.\d+)(ms|s|m|h))+$"
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
PROMETHEUS_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_PROMETHEUS_LABEL = re.compile(PROMETHEUS_LABEL)


def parse_duration(value: Any) -> float:
    """Seconds from a number of seconds or a string like "500ms", "15s", "1m", "1h" or "1m30s"."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '15s', '1m' or '500ms'")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if _DURATION_PART.sub("", text) == "" and text:
            return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))
        try:
            return float(text)
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not a duration: use seconds or a string like '15s', '1m' or '500ms'")


def format_duration(seconds: float) -> str:
    """A duration as `parse_duration` and the API server read it back exactly ("15s", "0.5s")."""
    text = f"{Decimal(repr(float(seconds))):f}"  # the shortest decimal that is this float, never 1e-05
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text + "s"


def _number(value: float) -> float | int:
    """A whole number written without ".0" (bytes per second read better so)."""
    return int(value) if float(value).is_integer() else value


def _cel_duration(field: str, default: float) -> str:
    """CEL: the duration `self.<field>` (an integer of seconds or a string like 15s), or the default."""
    value = f"self.{field}"
    return (
        f"(has({value}) ? (type({value}) == int ? duration(string({value}) + 's') : duration({value})) "
        f": duration('{format_duration(default)}'))"
    )


# Finite and above zero: seconds, or bytes per second.
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False), PlainSerializer(_number, when_used="json")]
Duration = Annotated[
    Positive,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, when_used="json"),
    OpenAPI(
        int_or_string=True,
        patterns=(DURATION_PATTERN,),
        rules=(
            Rule(
                f"type(self) == int ? self > 0 : self.matches(r'{DURATION_PATTERN}') && duration(self) > duration('0s')",
                "a duration is a number of seconds above 0 or a string like 15s, 1m or 500ms",
            ),
        ),
    ),
]


# -- configuration --------------------------------------------------------------------------------


PrometheusUrl = Annotated[
    HttpUrl,
    OpenAPI(
        max_length=2083,
        rules=(
            Rule(
                "isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",
                "must be an http or https URL with a host",
            ),
        ),
    ),
]


class PrometheusSource(PolicyModel):
    """Where a pool's per-node outbound throughput (bytes per second) is read from."""

    url: PrometheusUrl = Field(description="Prometheus' base URL, e.g. http://prometheus.monitoring:9090.")
    query: Annotated[str, OpenAPI(patterns=(NOT_BLANK,))] = Field(
        default=DEFAULT_EGRESS_QUERY,
        description="The PromQL query giving each node's outbound bytes per second, one series per node. "
        f"Default: {DEFAULT_EGRESS_QUERY}",
    )
    # The result label that names the node; "node-1:9100" matches node "node-1" (the part before ":").
    node_label: Annotated[str, OpenAPI(patterns=(f"^{PROMETHEUS_LABEL}$",))] = Field(
        default="instance",
        description="The result label that names the node (node-1:9100 matches node node-1: the part "
        "before the colon). Default: instance.",
    )
    interval: Duration = Field(default=15.0, description="How often to query: seconds, or a string like 15s. Default: 15s.")
    timeout: Duration = Field(default=3.0, description="How long one query may take. Default: 3s.")
    max_age: Duration = Field(
        default=60.0,
        description="A figure older than this is stale: the node's run count is used instead. Longer than "
        "interval. Default: 60s.",
    )

    openapi = OpenAPI(
        rules=(
            Rule(
                f"{_cel_duration('maxAge', 60.0)} > {_cel_duration('interval', 15.0)}",
                "maxAge must be longer than interval, or every figure goes stale before the next poll",
                field_path=".maxAge",
            ),
        )
    )

    @field_validator("query")
    @classmethod
    def _query_not_empty(cls, query: str) -> str:
        if not re.search(NOT_BLANK, query):
            raise ValueError("the query must not be empty")
        return query

    @field_validator("node_label")
    @classmethod
    def _is_label_name(cls, name: str) -> str:
        if not _PROMETHEUS_LABEL.fullmatch(name):
            raise ValueError(f"{name!r} is not a Prometheus label name")
        return name

    @model_validator(mode="after")
    def _figures_outlive_a_poll(self) -> "PrometheusSource":
        if self.max_age <= self.interval:
            raise ValueError(
                f"maxAge ({self.max_age:g}s) must be longer than interval ({self.interval:g}s), "
                "or every figure goes stale before the next poll"
            )
        return self


class EgressLoad(PolicyModel):
    """A pool's `egressLoad`: measured throughput and each node's outbound capacity."""

    prometheus: PrometheusSource = Field(description="Where each node's outbound throughput is read from.")
    bandwidth_bytes_per_second: Positive = Field(
        default=GIGABIT_BYTES_PER_SECOND,
        description="What one node can send, in bytes per second (above 0). Default: 125000000 (1 Gbit/s).",
    )
    node_bandwidth: dict[str, Positive] = Field(
        default_factory=dict,
        description="Per node name, what that node can send in bytes per second, instead of bandwidthBytesPerSecond.",
    )

    def bandwidth_of(self, node: str) -> float:
        """Outbound capacity of `node` in bytes per second (its override, else the pool's)."""
        return self.node_bandwidth.get(node, self.bandwidth_bytes_per_second)


PROMETHEUS_WINDOW = r"^[1-9][0-9]{0,4}(m|h|d|w)$"  # a Prometheus range: 30m, 12h, 7d, 2w


class HistorySource(PolicyModel):
    """Where a pool's measured history (what past runs sent) is read from: the queries of
    `egress-placer suggest` (docs/suggest.md)."""

    url: PrometheusUrl = Field(description="Prometheus' base URL, e.g. http://prometheus.monitoring:9090.")
    interval: Duration = Field(
        default=300.0, description="How often the history is read again: seconds, or a string like 5m. Default: 5m."
    )
    timeout: Duration = Field(default=30.0, description="How long one query may take. Default: 30s.")
    bytes_query: Annotated[str, OpenAPI(patterns=(NOT_BLANK,))] | None = Field(
        default=None,
        description="Optional: PromQL giving one series per namespace and pod with the bytes that pod sent to the "
        "internet in the window (a flow exporter's external-destination series). Default: cAdvisor's "
        "container_network_transmit_bytes_total, every byte the pod sent (an upper bound).",
    )


class MeasuredHistory(PolicyModel):
    """A pool's `history`: it also takes the runs of the Tasks (and Pipeline tasks) whose past runs, in the
    run's own namespace, sent at least `p90BytesAtLeast` at the 90th percentile over `window`. Opt-in, off
    without it; only for namespaces the pool allows; after the image globs (docs/suggest.md)."""

    prometheus: HistorySource = Field(description="Where the history is read from.")
    p90_bytes_at_least: Annotated[int, Field(ge=1)] = Field(
        description="Bytes: a Task (or Pipeline task) of a namespace whose runs' p90 of bytes sent reaches this "
        "is taken by the pool."
    )
    window: Annotated[str, OpenAPI(patterns=(PROMETHEUS_WINDOW,))] = Field(
        default="7d", description="How far back the history goes: a Prometheus range like 12h, 7d or 2w. Default: 7d."
    )
    min_runs: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=3, description="Runs a Task needs in the window before its history counts. Default: 3."
    )

    @field_validator("window")
    @classmethod
    def _is_range(cls, window: str) -> str:
        if not re.fullmatch(PROMETHEUS_WINDOW, window):
            raise ValueError(f"{window!r} is not a Prometheus range like 12h, 7d or 2w")
        return window


# -- the combination ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """Outbound throughput of one node, and when it was sampled (seconds, the clock of `now`)."""

    bytes_per_second: float
    sampled_at: float


@dataclass(frozen=True)
class RatioFigure:
    """The load ratio of one node (1.0 = full) and where it came from."""

    ratio: float
    source: Literal["measured", "runs"]
    note: str


def measurement_age(measurement: Measurement, now: float) -> float:
    """Seconds since the sample; never negative (a sample stamped in the future counts as new)."""
    return max(0.0, now - measurement.sampled_at)


def is_fresh(measurement: Measurement | None, now: float, max_age: float) -> bool:
    """There is a usable figure: present, finite, not negative and at most `max_age` seconds old."""
    return (
        measurement is not None
        and math.isfinite(measurement.bytes_per_second)
        and measurement.bytes_per_second >= 0
        and measurement_age(measurement, now) <= max_age
    )


def _runs_figure(load: NodeLoad, why: str) -> RatioFigure:
    ratio = load.total / load.capacity
    return RatioFigure(ratio, "runs", f"{why}: runs {load.placed}+{load.assumed} of {load.capacity}")


def egress_ratio(
    load: NodeLoad, measurement: Measurement | None, bandwidth_bps: float, now: float, max_age: float
) -> RatioFigure:
    """The load ratio of one node.

    With a fresh measurement: max(measured / bandwidth, placed / capacity) + assumed / capacity.
    The measurement already carries the runs that move bytes; assumed placements have no bytes yet
    and are added on top; the run count is a floor so idle-but-many runs still count. Without one
    (missing, stale, not finite, or no bandwidth): (placed + assumed) / capacity. A node with
    capacity <= 0 takes no runs: its ratio is infinite.
    """
    if load.capacity <= 0:
        return RatioFigure(math.inf, "runs", f"capacity {load.capacity}: the node takes no runs")
    if measurement is None:
        return _runs_figure(load, "no measurement")
    if not is_fresh(measurement, now, max_age):
        if not math.isfinite(measurement.bytes_per_second) or measurement.bytes_per_second < 0:
            return _runs_figure(load, f"unusable measurement {measurement.bytes_per_second!r}")
        age = measurement_age(measurement, now)
        return _runs_figure(load, f"measurement {age:.0f}s old (max {max_age:g}s)")
    if not (math.isfinite(bandwidth_bps) and bandwidth_bps > 0):
        return _runs_figure(load, f"unusable bandwidth {bandwidth_bps!r}")
    link = measurement.bytes_per_second / bandwidth_bps
    runs = load.placed / load.capacity
    ratio = max(link, runs) + load.assumed / load.capacity
    floor = "link" if link >= runs else "runs"
    return RatioFigure(
        ratio,
        "measured",
        f"{floor} dominates: sending {measurement.bytes_per_second:.0f} of {bandwidth_bps:.0f} B/s ({link:.2f}), "
        f"runs {load.placed} of {load.capacity} ({runs:.2f}), +{load.assumed} assumed",
    )


def measured_ratio(
    load: NodeLoad, measurement: Measurement | None, bandwidth_bps: float, now: float, max_age: float
) -> tuple[int, int] | None:
    """`egress_ratio` as an exact fraction (numerator, denominator > 0) when a fresh measurement
    counts; None when the run count ranks alone ((placed + assumed) / capacity, or capacity <= 0).

    Same formula, computed in integers from the exact values of the float inputs (bytes per second,
    bandwidth), so equal loads tie and unequal ones keep their order: node choice
    (`load.index`) compares these without floats.
    """
    if (
        load.capacity <= 0
        or not is_fresh(measurement, now, max_age)
        or not (math.isfinite(bandwidth_bps) and bandwidth_bps > 0)
    ):
        return None
    assert measurement is not None  # is_fresh
    sent_num, sent_den = measurement.bytes_per_second.as_integer_ratio()
    bandwidth_num, bandwidth_den = bandwidth_bps.as_integer_ratio()
    link_num, link_den = sent_num * bandwidth_den, sent_den * bandwidth_num  # sent / bandwidth
    if link_num * load.capacity >= load.placed * link_den:  # the link dominates the run count
        return link_num * load.capacity + load.assumed * link_den, link_den * load.capacity
    return load.total, load.capacity


def rank_nodes(
    loads: Mapping[str, NodeLoad],
    measurements: Mapping[str, Measurement],
    bandwidth: Callable[[str], float],
    now: float,
    max_age: float,
) -> dict[str, RatioFigure]:
    """The figure of every node in `loads`, least loaded first (ties by name)."""
    figures = {
        name: egress_ratio(load, measurements.get(name), bandwidth(name), now, max_age) for name, load in loads.items()
    }
    return dict(sorted(figures.items(), key=lambda item: (item[1].ratio, item[0])))
