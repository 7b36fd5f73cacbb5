"""A pool's `history` rule in the controller: one reader per pool with the rule, a task of the one runner,
reads what the window's Tekton pods sent (controller.prometheus.history.read_sent: two instant queries),
computes the pool's measured set (suggest.core.measured_set) and puts it in force in the state's
`MeasuredView`, which admission reads. Nothing here is on the webhook's path.

Every replica reads (each one's webhook answers); only the leader writes the pool's Event when its set
changes (`MeasuredSetChanged`: the Tasks it now takes and those it no longer takes). A failed read keeps
the set in force (it stays what the last good read said; the metric of the last read's time says how old
it is); a changed or removed rule drops the set at once (nothing is placed by a rule no longer written).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable, Mapping

from loguru import logger

from controller.core.egress import MeasuredHistory
from controller.core.policy import PlacementPolicy
from controller.event_sink import EventSink
from controller.metrics import Metrics
from controller.prometheus.auth import PrometheusAuth
from controller.prometheus.egress_source import InstantQuery, PrometheusClient, PrometheusError, PrometheusUnavailable
from controller.prometheus.history import read_sent
from controller.runner import Runner, Task
from controller.suggest.core import MeasuredSet, measured_set, set_change
from controller.suggest.view import MeasuredView

SHOWN_IN_EVENT = 10  # groups named in one Event (the rest counted)


class HistoryReader:
    """Reads one pool's history every `interval` and puts its measured set in force."""

    def __init__(
        self,
        pool: str,
        rule: MeasuredHistory,
        client: InstantQuery,
        publish: Callable[["HistoryReader", MeasuredSet], tuple[bool, MeasuredSet | None]],
        on_error: Callable[["HistoryReader", str], None],
        metrics: Metrics,
        events: EventSink,
        is_leader: Callable[[], bool],
        clock: Callable[[], float],
        regarding: Callable[[str], dict[str, Any]],
    ) -> None:
        self.pool, self.rule, self._client, self._publish, self._on_error = pool, rule, client, publish, on_error
        self._metrics, self._events, self._is_leader, self._clock, self._regarding = metrics, events, is_leader, clock, regarding
        self.last_error: str | None = None
        self._log = logger.bind(pool=pool)

    def read_once(self) -> MeasuredSet | None:
        """One read; the set put in force (None: the read failed, the set in force stays)."""
        try:
            history = read_sent(self._client, self.rule.window, self.rule.prometheus.bytes_query)
        except PrometheusError as e:
            self._failed("unavailable" if isinstance(e, PrometheusUnavailable) else "bad-answer", e)
            return None
        measured = replace(measured_set(history.pods, self.rule.p90_bytes_at_least, self.rule.min_runs), read_at=self._clock())
        current, old = self._publish(self, measured)
        if not current:  # this reader was stopped or replaced during its read: its set is not the rule's
            return None
        self._metrics.history_reads.labels(self.pool, "success").inc()
        self._metrics.history_groups.labels(self.pool).set(len(measured.groups))
        self._metrics.history_read_timestamp.labels(self.pool).set(self._clock())
        if self.last_error is not None:
            self._log.info("history is read again")
        self.last_error = None
        if measured.dropped:
            self._log.bind(dropped=measured.dropped).warning("measured set capped: the groups of smallest p90 are left out")
        added, removed = set_change(old, measured)
        if (added or removed) and self._is_leader():
            self._events.emit(self._regarding(self.pool), "Normal", "MeasuredSetChanged", self._note(measured, added, removed), action="Measure")
        return measured

    def _note(self, measured: MeasuredSet, added: tuple[str, ...], removed: tuple[str, ...]) -> str:
        def named(keys: tuple[str, ...]) -> str:
            more = f" and {len(keys) - SHOWN_IN_EVENT} more" if len(keys) > SHOWN_IN_EVENT else ""
            return ", ".join(keys[:SHOWN_IN_EVENT]) + more

        parts = [f"pool {self.pool} takes by measured history (p90 at least {self.rule.p90_bytes_at_least} bytes over {self.rule.window}) "
                 f"{len(measured.groups)} Task(s) of {measured.runs_read} runs read"]
        if added:
            parts.append(f"now takes {named(added)}")
        if removed:
            parts.append(f"no longer takes {named(removed)}")
        return "; ".join(parts)

    def _failed(self, result: str, error: Exception) -> None:
        self._metrics.history_reads.labels(self.pool, result).inc()
        if self.last_error is None:
            self._log.warning("history read failed, the measured set in force stays: {}", error)
        self.last_error = str(error)
        self._on_error(self, self.last_error)

    def run(self, stop: threading.Event) -> None:
        """Read every `interval` until `stop`. Never raises: an unexpected error is counted and logged."""
        while not stop.is_set():
            started = self._clock()
            try:
                self.read_once()
            except Exception as e:  # noqa: BLE001 - a bug must not end the reader
                self._failed("failed", e)
                self._log.exception("history read failed")
            stop.wait(max(0.0, self.rule.prometheus.interval - (self._clock() - started)))


class HistoryReaders:
    """One `HistoryReader` per pool with a `history` rule, kept in step with the policy (`sync`)."""

    def __init__(
        self,
        view: MeasuredView,
        runner: Runner,
        metrics: Metrics,
        events: EventSink,
        is_leader: Callable[[], bool],
        clock: Callable[[], float],
        regarding: Callable[[str], dict[str, Any]],
        client: Callable[[MeasuredHistory], InstantQuery] | None = None,
        auth: PrometheusAuth = PrometheusAuth(),
    ) -> None:
        self._view, self._runner, self._metrics, self._events = view, runner, metrics, events
        self._is_leader, self._clock, self._regarding = is_leader, clock, regarding
        self._client = client or (lambda rule: PrometheusClient(str(rule.prometheus.url), rule.prometheus.timeout, auth.session()))
        self._running: dict[str, tuple[MeasuredHistory, HistoryReader, Task]] = {}
        self._lock = threading.Lock()

    def sync(self, policy: PlacementPolicy) -> None:
        wanted: Mapping[str, MeasuredHistory] = {p.name: p.history for p in policy.pools if p.history is not None}
        with self._lock:
            for name in list(self._running):
                rule, _, task = self._running[name]
                if wanted.get(name) != rule:
                    self._runner.cancel(task)
                    del self._running[name]
                    self._view.publish(name, None)  # a rule changed or gone: its old set places nothing
                    self._view.failed(name, "")
                    for gauge in (self._metrics.history_groups, self._metrics.history_read_timestamp):
                        try:
                            gauge.remove(name)
                        except KeyError:  # never read
                            pass
            for name, rule in wanted.items():
                if name not in self._running:
                    reader = HistoryReader(name, rule, self._client(rule), self._put, self._error, self._metrics, self._events,
                                           self._is_leader, self._clock, self._regarding)
                    self._running[name] = (rule, reader, self._runner.start(f"history {name}", reader.run, wait=False))

    def _put(self, reader: HistoryReader, measured: MeasuredSet) -> tuple[bool, MeasuredSet | None]:
        """A reader's set goes in force unless the reader was stopped or replaced meanwhile."""
        with self._lock:
            running = self._running.get(reader.pool)
            if running is None or running[1] is not reader:
                return False, None
            return True, self._view.publish(reader.pool, measured)

    def _error(self, reader: HistoryReader, error: str) -> None:
        with self._lock:
            running = self._running.get(reader.pool)
            if running is not None and running[1] is reader:
                self._view.failed(reader.pool, error[:1000])

    def readers(self) -> dict[str, HistoryReader]:
        with self._lock:
            return {name: reader for name, (_, reader, _) in self._running.items()}
