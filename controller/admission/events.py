"""Admission's Events, held off the runs' critical path.

Each placed run gets two Events (TaskRun CREATE, Pod CREATE), and writing one costs CPU in this
process (the API client) and in the API server and etcd. Sent at once, they compete for the CPU with
the very run they describe: its Pod CREATE (and its webhook call) follows the TaskRun's Event by a
few milliseconds, its scheduling follows the Pod's. `QuietEvents` stands between `Admission` and the
real sink: it holds each Event until admission has been quiet for `quiet` seconds (no other Event
emitted meanwhile), and never longer than `max_delay` seconds after the oldest held one, then hands
them all on, in order. Nothing is dropped or reordered; Events only arrive a little later.

`emit` never blocks and never raises (the EventSink contract). `stop()` hands on whatever is held.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from loguru import logger

from controller.event_sink import EventSink

QUIET_SECONDS = 0.05  # longer than a run's Pod CREATE follows its TaskRun CREATE, and its binding the Pod's
MAX_DELAY_SECONDS = 1.0  # under steady admission traffic, Events still go out about once a second

Held = tuple[float, tuple[dict[str, Any], str, str, str, str]]


class QuietEvents:
    """An EventSink that forwards to `sink` once admission is quiet; see the module docstring."""

    def __init__(
        self,
        sink: EventSink,
        *,
        quiet: float = QUIET_SECONDS,
        max_delay: float = MAX_DELAY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.quiet = quiet
        self.max_delay = max_delay
        self.clock = clock
        self._cond = threading.Condition()
        self._held: list[Held] = []
        self._last = 0.0  # when the latest Event was emitted
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- the EventSink side (admission's thread) ----------------------------------------------------
    def emit(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "") -> None:
        try:
            with self._cond:
                now = self.clock()
                self._last = now
                self._held.append((now, (regarding, type, reason, note, action)))
                if len(self._held) == 1:  # the sender sleeps with nothing held: wake it; otherwise it will look again
                    self._cond.notify()
        except Exception:  # never let reporting break admission
            logger.opt(exception=True).debug("event not held")

    # -- the sending side ----------------------------------------------------------------------------
    def due_in(self, now: float) -> float | None:
        """Seconds until the held Events are due (0: now), None when nothing is held."""
        with self._cond:
            if not self._held:
                return None
            due = min(self._last + self.quiet, self._held[0][0] + self.max_delay)
            return max(0.0, due - now)

    def take_due(self, now: float) -> list[Held]:
        """The held Events if they are due at `now` (all of them), else none."""
        with self._cond:
            if self._held and (self._stopping or self.due_in(now) == 0.0):
                batch, self._held = self._held, []
                return batch
            return []

    def forward(self, batch: list[Held]) -> None:
        for _, args in batch:
            try:
                self.sink.emit(*args)
            except Exception:  # the sink promises not to raise; keep the others if it does
                logger.opt(exception=True).debug("event not forwarded")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._held and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self._held:
                    return
                wait = 0.0 if self._stopping else self.due_in(self.clock())
                if wait:
                    self._cond.wait(wait)
                    continue
            self.forward(self.take_due(self.clock()))

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="admission events", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Hand on everything held (at once), then stop."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.forward(self.take_due(self.clock()))  # not started, or emitted after the thread ended
