"""One runner owns every background task (controller-runtime's Manager and Runnable).

A task is `run(stop)`, a loop that returns soon after `stop` is set. `start` runs one at once (tasks
start in the order given); `stop` stops them newest first, each joined before the next is told (the
Events flush into the recorder, the reconcile loop ends before the lease is released). `on_stop` wakes a
task blocked elsewhere (a watch connection, a queue); `ready` is set once it is of use (a first list);
`wait=False`: stop tells it but does not wait for it (a poller in a slow query holds nothing up).
`health()`: each task running, waiting (not ready), stopped or died (raised, or returned unasked).

`GiveWay`: background work gives way to admission. The tasks share one interpreter with the event loop
that answers the API server's reviews; a pass over 5,000 pool nodes would take turns with a review
every switch interval. A task walks its large collections through `paced`, which waits, with the
interpreter released, while a review is in flight (at most `most_seconds` at a time, so a flood of
reviews slows the pass and never stops it).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol, TypeVar

from loguru import logger

T = TypeVar("T")


@dataclass(eq=False)
class Task:
    name: str
    run: Callable[[threading.Event], None]
    on_stop: Callable[[], None] | None = None
    ready: threading.Event | None = None
    wait: bool = True
    stop_event: threading.Event = field(default_factory=threading.Event)
    died: str | None = None  # why it ended before it was asked to stop

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._main, name=self.name, daemon=True)

    def stop(self) -> None:
        """Ask the task to end, without waiting for it."""
        self.stop_event.set()
        try:
            if self.on_stop is not None:
                self.on_stop()
        except Exception:
            logger.bind(task=self.name).exception("stop hook failed")

    def _main(self) -> None:
        try:
            self.run(self.stop_event)
            if not self.stop_event.is_set():
                self.died = "it returned before it was stopped"
                logger.bind(task=self.name).error("background task died: {}", self.died)
        except BaseException as error:  # noqa: BLE001 - reported (health), not raised into nowhere
            self.died = f"{type(error).__name__}: {error}"
            logger.bind(task=self.name).exception("background task died")

    @property
    def state(self) -> str:
        if self.died is not None:
            return f"died: {self.died}"
        if not self.thread.is_alive():
            return "stopped"
        return "waiting" if self.ready is not None and not self.ready.is_set() else "running"


class Runner:
    def __init__(self) -> None:
        self._tasks: list[Task] = []
        self._lock = threading.Lock()
        self._stopping = False

    def start(
        self,
        name: str,
        run: Callable[[threading.Event], None],
        *,
        on_stop: Callable[[], None] | None = None,
        ready: threading.Event | None = None,
        wait: bool = True,
    ) -> Task:
        """`run(stop)` in a daemon thread named `name`, now; the task (for `cancel`)."""
        task = Task(name, run, on_stop, ready, wait)
        with self._lock:
            if self._stopping:  # e.g. a poller a policy event starts during the stop: never started
                task.stop_event.set()
                return task
            self._tasks.append(task)
        task.thread.start()
        return task

    def cancel(self, task: Task) -> None:
        """Stop one task without waiting for it (a poller replaced), and forget it."""
        with self._lock:
            self._tasks = [t for t in self._tasks if t is not task]
        task.stop()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every task, newest first, each joined (within `timeout`) before the next is told."""
        with self._lock:
            tasks, self._tasks, self._stopping = self._tasks[::-1], [], True
        for task in tasks:
            task.stop()
            task.thread.join(timeout if task.wait else 0.0)
            if task.wait and task.thread.is_alive():
                logger.bind(task=task.name).warning("background task still running {:.0f}s after its stop", timeout)
        with self._lock:
            self._stopping = False  # stopped: it may start again

    def health(self) -> dict[str, str]:
        """Each task's state, by name, in start order."""
        with self._lock:
            return {task.name: task.state for task in self._tasks}

    def problem(self) -> str | None:
        """The dead tasks in one sentence (/readyz's body), None when none died."""
        dead = [f"{name} ({state})" for name, state in self.health().items() if state.startswith("died")]
        return "background task died: " + "; ".join(dead) if dead else None


class Pace(Protocol):
    """`GiveWay.paced`, or `unpaced`: how a reconciler walks a large collection."""

    def __call__(self, items: Iterable[T], every: int | None = None) -> Iterator[T]: ...


class GiveWay:
    """Background work gives way to the reviews in flight (module docstring, #24). `follow(in_flight)`: the
    admission server's count of the requests its event loop is inside now and of the large reviews being
    answered in their thread (`AdmissionServer.reviews_in_flight`, read from other threads).
    `paced(items, every)`: `items`, waiting before every `every`-th one (an item's cost: one node or pod,
    the default; 1 for a chunk of them) while a review is in flight, at most
    `most_seconds` per wait, polling every `poll_seconds` with the interpreter released. Before `follow`,
    or with no review in flight, it only counts."""

    def __init__(self, every: int = 32, most_seconds: float = 0.01, poll_seconds: float = 0.0002,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.most_seconds, self.poll_seconds = every, most_seconds, poll_seconds
        self.sleep, self.clock = sleep, clock
        self._in_flight: Callable[[], int] = lambda: 0
        self.waits = 0  # the waits so far (tests read it)

    def follow(self, in_flight: Callable[[], int]) -> None:
        self._in_flight = in_flight

    def paced(self, items: Iterable[T], every: int | None = None) -> Iterator[T]:
        every, in_flight = every or self.every, self._in_flight
        for i, item in enumerate(items):
            if not i % every and in_flight():
                self._wait(in_flight)
            yield item

    def _wait(self, in_flight: Callable[[], int]) -> None:
        self.waits += 1
        until = self.clock() + self.most_seconds
        while in_flight() and self.clock() < until:
            self.sleep(self.poll_seconds)


def unpaced(items: Iterable[T], every: int | None = None) -> Iterator[T]:
    """`GiveWay.paced` where nothing gives way (tests, tools): the items as they are."""
    return iter(items)
