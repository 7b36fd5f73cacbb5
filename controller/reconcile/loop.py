"""The reconcile loop: one thread that runs the reconcilers (leader only) after a change or a resync.

It waits for the state's change signal (`ClusterState.subscribe`) or the resync period, waits a
short debounce so a burst of events becomes one pass, then runs every reconciler if this replica
leads. A reconciler that raises is logged; the next pass tries again. The loop never dies of it.
A reconciler that has work it could not finish (an eviction a budget refused) may ask for the next
pass sooner than the resync with a `next_pass_within()` method returning seconds (None: no need).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol, Sequence

from loguru import logger


class ChangeSource(Protocol):
    def subscribe(self, callback: Callable[[str], None]) -> None: ...


class ReconcileLoop:
    def __init__(
        self,
        state: ChangeSource,
        reconcilers: Sequence[Callable[[], object]],
        is_leader: Callable[[], bool],
        *,
        resync_seconds: float = 30.0,
        debounce_seconds: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reconcilers = list(reconcilers)
        self.is_leader = is_leader
        self.resync_seconds = resync_seconds
        self.debounce_seconds = debounce_seconds
        self.clock = clock
        self.passes = 0  # completed passes as leader: tests wait on it (no health check reads it)
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        state.subscribe(lambda kind: self._changed.set())

    def wake(self) -> None:
        """Run a pass soon (e.g. when this replica just became the leader)."""
        self._changed.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="reconcile loop", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._changed.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        next_resync = self.clock()
        while not self._stop.is_set():
            self._changed.wait(max(0.0, next_resync - self.clock()))
            if self._stop.is_set():
                return
            self._stop.wait(self.debounce_seconds)  # let a burst of events settle into one pass
            self._changed.clear()
            self.run_once()
            next_resync = self.clock() + min([self.resync_seconds, *self._wanted_within()])

    def _wanted_within(self) -> list[float]:
        wanted = (getattr(r, "next_pass_within", lambda: None)() for r in self.reconcilers)
        return [seconds for seconds in wanted if seconds is not None]

    def run_once(self) -> None:
        """One pass of every reconciler, if this replica leads."""
        if not self.is_leader():
            return
        for reconcile in self.reconcilers:
            try:
                reconcile()
            except Exception:
                logger.bind(reconciler=type(reconcile).__name__).exception("reconcile pass failed; retrying next pass")
        self.passes += 1
