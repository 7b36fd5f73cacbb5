"""The reconcile loop: a runner's task that runs the reconcilers (leader only) after a change or a resync.

It waits for the state's change signal (`ClusterState.subscribe`) or the resync period, waits a
short debounce so a burst of events becomes one pass, then runs every reconciler if this replica
leads. A reconciler that raises is logged; the next pass tries again. The loop never dies of it.
A reconciler is called for one pass and returns its requeue-after: the seconds within which it wants
the next pass (an eviction a budget refused, a grace to wait out), or None; the loop takes the least.
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
        reconcilers: Sequence[Callable[[], float | None]],
        is_leader: Callable[[], bool],
        *,
        resync_seconds: float = 30.0,
        debounce_seconds: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reconcilers = list(reconcilers)
        self._asked: list[float | None] = [None] * len(self.reconcilers)  # each one's last requeue-after
        self.is_leader = is_leader
        self.resync_seconds = resync_seconds
        self.debounce_seconds = debounce_seconds
        self.clock = clock
        self.passes = 0  # completed passes as leader: tests wait on it (no health check reads it)
        self._changed = threading.Event()
        state.subscribe(lambda kind: self._changed.set())

    def wake(self) -> None:
        """Run a pass soon (e.g. when this replica just became the leader)."""
        self._changed.set()

    def run(self, stop: threading.Event) -> None:
        """Until `stop` (its stop hook: `wake`)."""
        next_resync = self.clock()
        while not stop.is_set():
            self._changed.wait(max(0.0, next_resync - self.clock()))
            if stop.wait(self.debounce_seconds):  # let a burst of events settle into one pass
                return
            self._changed.clear()
            next_resync = self.clock() + min([self.resync_seconds, *self.run_once()])

    def run_once(self) -> list[float]:
        """One pass of every reconciler, if this replica leads; the requeue-afters they asked for."""
        if not self.is_leader():
            return []
        for i, reconcile in enumerate(self.reconcilers):
            try:
                self._asked[i] = reconcile()
            except Exception:  # what it asked for before still holds: its pending work is still pending
                logger.bind(reconciler=type(reconcile).__name__).exception("reconcile pass failed; retrying next pass")
        self.passes += 1
        return [seconds for seconds in self._asked if seconds is not None]
