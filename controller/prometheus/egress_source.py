"""Measured outbound throughput of pool nodes, read from Prometheus.

`PrometheusClient` runs instant queries (`/api/v1/query`) over `requests`, retrying (`controller.retry`) on
connection errors, timeouts, 5xx and 429 only. `EgressPoller` polls one pool's query (a runner's task),
keeps the last good figure per node and hands them to the state after each poll, where node choice takes them in (admission never waits on the network, nor copies the figures per decision). What the figures mean is decided by `controller.core.egress`.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Protocol

import requests
from loguru import logger
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from controller.core.egress import EgressLoad, Measurement, PrometheusSource, is_fresh, measurement_age
from controller.retry import PROMETHEUS, RetryPolicy, retrying
from controller.runner import Runner, Task

QUERY_PATH = "/api/v1/query"
SCRAPE_RESULTS = ("success", "unavailable", "bad-answer", "failed")
IGNORED_CAUSES = ("not-finite", "negative", "no-node")


class PrometheusError(Exception):
    """A query gave no usable answer."""


class PrometheusUnavailable(PrometheusError):
    """Prometheus could not be reached or was overloaded (connection, timeout, 5xx, 429), after retries."""


class PrometheusAnswerError(PrometheusError):
    """Prometheus answered, but not with an instant vector: an error status, a 4xx, or a malformed body."""


class Sample(NamedTuple):
    """One series of an instant vector: its labels, its value and the evaluation timestamp (Unix seconds)."""

    labels: dict[str, str]
    value: float
    timestamp: float


class InstantQuery(Protocol):
    def query(self, promql: str) -> list[Sample]: ...


class PrometheusClient:
    """A small client for Prometheus' instant-query API."""

    def __init__(
        self,
        url: str,
        timeout: float,
        session: requests.Session | None = None,
        *,
        retry: RetryPolicy = PROMETHEUS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoint = str(url).rstrip("/") + QUERY_PATH
        self.timeout = timeout
        self.session = session or requests.Session()
        self._retrying = retrying(retry, lambda e: isinstance(e, PrometheusUnavailable), sleep=sleep)

    @classmethod
    def for_source(cls, source: PrometheusSource, session: requests.Session | None = None) -> "PrometheusClient":
        return cls(str(source.url), source.timeout, session)

    def query(self, promql: str) -> list[Sample]:
        """The instant vector `promql` evaluates to now. Raises PrometheusError (one of its two kinds)."""
        return self._retrying(self._query_once, promql)

    def _query_once(self, promql: str) -> list[Sample]:
        params = {"query": promql, "timeout": f"{self.timeout:g}s"}
        try:
            response = self.session.get(self.endpoint, params=params, timeout=self.timeout)
        except (requests.ConnectionError, requests.Timeout) as e:
            raise PrometheusUnavailable(f"{self.endpoint}: {type(e).__name__}: {e}") from e
        if response.status_code >= 500 or response.status_code == 429:
            raise PrometheusUnavailable(f"{self.endpoint}: HTTP {response.status_code}: {_error_text(response)}")
        if response.status_code >= 400:
            raise PrometheusAnswerError(f"{self.endpoint}: HTTP {response.status_code}: {_error_text(response)}")
        try:
            body = response.json()
        except ValueError as e:
            raise PrometheusAnswerError(f"{self.endpoint}: the answer is not JSON") from e
        return _parse_vector(body, self.endpoint)


def _error_text(response: requests.Response) -> str:
    """Prometheus' own error message when the body carries one, else the start of the body."""
    try:
        body = response.json()
        if isinstance(body, dict) and body.get("error"):
            return f"{body.get('errorType', 'error')}: {body['error']}"
    except ValueError:
        pass
    return response.text[:200] or response.reason or "no body"


def _parse_vector(body: Any, where: str) -> list[Sample]:
    def bad(what: str) -> PrometheusAnswerError:
        return PrometheusAnswerError(f"{where}: {what}")

    if not isinstance(body, dict):
        raise bad("the answer is not a JSON object")
    if body.get("status") != "success":
        raise bad(f"status {body.get('status')!r}: {body.get('errorType', '')} {body.get('error', '')}".rstrip())
    data = body.get("data")
    if not isinstance(data, dict):
        raise bad("the answer has no data object")
    if data.get("resultType") != "vector":
        raise bad(f"the query must give an instant vector, got resultType {data.get('resultType')!r}")
    result = data.get("result")
    if not isinstance(result, list):
        raise bad("data.result is not a list")
    samples = []
    for i, item in enumerate(result):
        metric = item.get("metric") if isinstance(item, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        if not isinstance(metric, dict) or not all(isinstance(v, str) for v in metric.values()):
            raise bad(f"data.result[{i}].metric is not a map of strings")
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)):
            raise bad(f"data.result[{i}].value is not [timestamp, \"number\"]")
        ts = value[0]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)):
            raise bad(f"data.result[{i}].value has no numeric timestamp")
        try:
            number = float(value[1])  # "NaN", "+Inf" and "-Inf" parse; the poller drops them
        except ValueError:
            raise bad(f"data.result[{i}].value {value[1]!r} is not a number") from None
        samples.append(Sample(dict(metric), number, float(ts)))
    return samples


def node_of(label_value: str, nodes: frozenset[str] | set[str]) -> str | None:
    """The node a result label names: the value itself, else its host part ("node-1:9100" -> "node-1")."""
    if label_value in nodes:
        return label_value
    host, sep, port = label_value.rpartition(":")
    if sep and port.isdigit():
        host = host.removeprefix("[").removesuffix("]")  # "[fd00::1]:9100"
        if host in nodes:
            return host
    return None


class EgressPoller:
    """Polls one pool's throughput query and keeps the newest good figure per node.

    A failed poll keeps the old figures (they go stale by age and node choice falls back to run
    counts) and records the error. All public methods are thread-safe; `snapshot` and `status`
    only take a short lock.
    """

    def __init__(
        self,
        pool_name: str,
        config: EgressLoad,
        client: InstantQuery,
        clock: Callable[[], float],
        node_names: Callable[[], Iterable[str]],
        publish: Callable[[Mapping[str, Measurement]], None] | None = None,
    ) -> None:
        """`publish`, when given, receives the figures kept (a new dict, not changed after) after each
        successful poll: node choice takes them where they arrive, not per decision."""
        self.pool_name = pool_name
        self.config = config
        self._client = client
        self._clock = clock  # Unix seconds: compared with Prometheus' sample timestamps
        self._node_names = node_names
        self._publish = publish
        self._lock = threading.Lock()
        self._figures: dict[str, Measurement] = {}
        self._scrapes: Counter[str] = Counter()
        self._ignored: Counter[str] = Counter()  # samples dropped, by cause
        self._unmatched: tuple[str, ...] = ()
        self._failing = False  # the last poll failed
        self._last_error: str | None = None
        self._last_error_at: float | None = None
        self._last_success_at: float | None = None
        self._log = logger.bind(pool=pool_name)

    def poll_once(self, now: float) -> dict[str, Measurement]:
        """Query once; return the figures this poll produced (empty when it failed) and keep them.

        Several series naming the same node are added (a query per device works). NaN, infinite
        and negative values, and series that name no pool node, are ignored. A sample stamped
        after `now` counts as sampled at `now`.
        """
        source = self.config.prometheus
        nodes = frozenset(self._node_names())
        try:
            samples = self._client.query(source.query)
        except PrometheusError as e:
            self._record_failure("unavailable" if isinstance(e, PrometheusUnavailable) else "bad-answer", e, now)
            return {}
        fresh: dict[str, Measurement] = {}
        ignored: Counter[str] = Counter()
        unmatched: set[str] = set()
        for sample in samples:
            if not math.isfinite(sample.value) or sample.value < 0:
                ignored["not-finite" if not math.isfinite(sample.value) else "negative"] += 1
                continue
            label = sample.labels.get(source.node_label)
            node = node_of(label, nodes) if label is not None else None
            if node is None:
                ignored["no-node"] += 1
                unmatched.add(label if label is not None else f"<no {source.node_label} label>")
                continue
            sampled_at = min(sample.timestamp, now)
            old = fresh.get(node)
            total = sample.value + (old.bytes_per_second if old else 0.0)
            fresh[node] = Measurement(total, min(sampled_at, old.sampled_at) if old else sampled_at)
        with self._lock:
            for node, figure in fresh.items():
                kept = self._figures.get(node)
                if kept is None or figure.sampled_at >= kept.sampled_at:
                    self._figures[node] = figure
            for gone in set(self._figures) - nodes:
                del self._figures[gone]
            self._scrapes["success"] += 1
            self._ignored.update(ignored)
            self._unmatched = tuple(sorted(unmatched))
            self._last_success_at = now
            recovered, self._failing = self._failing, False
            kept = dict(self._figures)
        if self._publish is not None:
            self._publish(kept)
        if recovered:
            self._log.info("egress figures are back from {}", source.url)
        return fresh

    def _record_failure(self, result: str, error: Exception, now: float) -> None:
        with self._lock:
            first, self._failing = not self._failing, True
            self._scrapes[result] += 1
            self._last_error = str(error)
            self._last_error_at = now
        if first:
            self._log.warning("egress query failed, keeping the last figures until they are stale: {}", error)

    def snapshot(self) -> dict[str, Measurement]:
        """The figures kept now, per node (fresh or not: the core judges age)."""
        with self._lock:
            return dict(self._figures)

    def status(self) -> dict[str, Any]:
        """Counters, the last error and per-node figures (bps, age, source) for metrics and `status`."""
        now = self._clock()
        max_age = self.config.prometheus.max_age
        with self._lock:
            figures = dict(self._figures)
            out: dict[str, Any] = {
                "pool": self.pool_name,
                "url": str(self.config.prometheus.url),
                "scrapes": {result: self._scrapes[result] for result in SCRAPE_RESULTS},
                "ignored_samples": {cause: self._ignored[cause] for cause in IGNORED_CAUSES},
                "unmatched": list(self._unmatched),
                "failing": self._failing,
                "last_error": self._last_error,
                "last_error_at": self._last_error_at,
                "last_success_at": self._last_success_at,
            }
        names = sorted(set(self._node_names()) | set(figures))
        out["nodes"] = {name: _node_status(figures.get(name), now, max_age) for name in names}
        return out

    def run(self, stop: threading.Event) -> None:
        """Poll every `interval` until `stop` is set. Never raises: an unexpected error is recorded."""
        interval = self.config.prometheus.interval
        while not stop.is_set():
            started = self._clock()
            try:
                self.poll_once(started)
            except Exception as e:  # a bug or a failing node_names(); the loop must survive it
                self._record_failure("failed", e, started)
                self._log.exception("egress poll failed")
            stop.wait(max(0.0, interval - (self._clock() - started)))


def _node_status(figure: Measurement | None, now: float, max_age: float) -> dict[str, Any]:
    if figure is None:
        return {"bps": None, "age": None, "source": "runs"}
    return {
        "bps": figure.bytes_per_second,
        "age": measurement_age(figure, now),
        "source": "measured" if is_fresh(figure, now, max_age) else "runs",
    }


class EgressPollers:
    """One poller per pool that has an `egressLoad` source, kept in step with the policy.

    `sync(policy)` starts pollers (`runner`'s tasks) for new or changed sources, stops the others; each poll's
    figures go to the load view (`LoadView.set_egress_figures`), whose index node choice reads. The
    figures are exported as Prometheus metrics through a collector (read at scrape time).
    """

    def __init__(
        self,
        state: "EgressTarget",
        clock: Callable[[], float],
        runner: Runner,
        registry: Any | None = None,
        session: Callable[[], requests.Session] = requests.Session,
    ) -> None:
        """`session`: a new HTTP session per poller, with the controller's Prometheus credentials
        (controller.prometheus.auth.PrometheusAuth.session)."""
        self._session = session
        self._state = state
        self._clock = clock
        self._runner = runner
        self._running: dict[str, tuple[EgressLoad, EgressPoller, Task]] = {}
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(_EgressCollector(self))

    def sync(self, policy: Any) -> None:
        wanted = {pool.name: pool for pool in policy.pools if pool.egress_load is not None}
        with self._lock:
            for name in list(self._running):
                config, _, task = self._running[name]
                if name not in wanted or wanted[name].egress_load != config:
                    self._runner.cancel(task)
                    del self._running[name]
                    self._state.set_egress_figures(name, None)
            for name, pool in wanted.items():
                if name not in self._running:
                    self._start(name, pool)

    def _start(self, name: str, pool: Any) -> None:
        config = pool.egress_load
        poller = EgressPoller(
            name,
            config,
            PrometheusClient.for_source(config.prometheus, self._session()),
            self._clock,
            node_names=lambda: [n.name for n in self._state.pool_nodes(pool)],
            publish=lambda figures: self._publish(name, poller, figures),
        )
        self._state.set_egress_figures(name, {})
        self._running[name] = (config, poller, self._runner.start(f"egress {name}", poller.run, wait=False))

    def _publish(self, name: str, poller: EgressPoller, figures: Mapping[str, Measurement]) -> None:
        """A poll's figures go to the state, unless its poller was stopped or replaced meanwhile."""
        with self._lock:
            running = self._running.get(name)
            if running is not None and running[1] is poller:
                self._state.set_egress_figures(name, figures)

    def statuses(self) -> list[dict[str, Any]]:
        with self._lock:
            pollers = [poller for _, poller, _ in self._running.values()]
        return [p.status() for p in pollers]


class EgressTarget(Protocol):
    def set_egress_figures(self, pool: str, figures: Mapping[str, Measurement] | None) -> None: ...

    def pool_nodes(self, pool: Any) -> list[Any]: ...


class _EgressCollector:
    """Prometheus metrics of the egress figures, computed when scraped."""

    def __init__(self, pollers: EgressPollers) -> None:
        self._pollers = pollers

    def collect(self) -> Iterable[Any]:
        bps = GaugeMetricFamily(
            "egress_placer_egress_bytes_per_second", "Measured outbound throughput of a pool node.", labels=["pool", "node"]
        )
        age = GaugeMetricFamily(
            "egress_placer_egress_figure_age_seconds", "Age of a pool node's egress figure.", labels=["pool", "node"]
        )
        fallback = GaugeMetricFamily(
            "egress_placer_egress_fallback",
            "1 when a pool node's load falls back to run counts (no fresh egress figure).",
            labels=["pool", "node"],
        )
        scrapes = CounterMetricFamily(
            "egress_placer_egress_scrapes", "Prometheus queries for egress figures, by result.", labels=["pool", "result"]
        )
        for status in self._pollers.statuses():
            pool = status["pool"]
            for result, count in status["scrapes"].items():
                scrapes.add_metric([pool, result], count)
            for node, figure in status["nodes"].items():
                fallback.add_metric([pool, node], 1.0 if figure["source"] == "runs" else 0.0)
                if figure["bps"] is not None:
                    bps.add_metric([pool, node], figure["bps"])
                    age.add_metric([pool, node], figure["age"])
        yield from (bps, age, fallback, scrapes)
