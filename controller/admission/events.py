"""Admission's Events, held off the runs' critical path.

Each placed run gets two Events (TaskRun CREATE, Pod CREATE), and writing one costs CPU in this
process (the API client) and in the API server and etcd. Sent at once, they compete for the CPU with
the very run they describe: its Pod CREATE (and its webhook call) follows the TaskRun's Event by a
few milliseconds, its scheduling follows the Pod's. `QuietEvents` stands between `Admission` and the
real sink: it holds each Event until admission has been quiet for `quiet` seconds (no other Event
emitted meanwhile), and never longer than `max_delay` seconds after the oldest held one, then hands
them all on, in order. Nothing is dropped or reordered; Events only arrive a little later.

`emit` never blocks and never raises (the EventSink contract). Stopped, its task hands on what is held.

Before that, `CreationEvents` (below) holds each Event until the object it is about exists: admission
sees objects before they are created, without uid (and, with `generateName`, without name).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from loguru import logger

from controller.core.model import REVIEW_ANNOTATION
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
        self.sink, self.clock = sink, clock
        self.quiet, self.max_delay = quiet, max_delay  # see the module docstring
        self._cond = threading.Condition()
        self._held: list[Held] = []
        self._last = 0.0  # when the latest Event was emitted

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

    def take_due(self, now: float, stopping: bool = False) -> list[Held]:
        """The held Events if they are due at `now` (or `stopping`: all of them), else none."""
        with self._cond:
            if self._held and (stopping or self.due_in(now) == 0.0):
                batch, self._held = self._held, []
                return batch
            return []

    def forward(self, batch: list[Held]) -> None:
        for _, args in batch:
            try:
                self.sink.emit(*args)
            except Exception:  # the sink promises not to raise; keep the others if it does
                logger.opt(exception=True).debug("event not forwarded")

    def run(self, stop: threading.Event) -> None:
        """Forward the held Events when due; when `stop` (its stop hook: `wake`), all of them at once."""
        while not stop.is_set():
            with self._cond:
                while not self._held and not stop.is_set():
                    self._cond.wait()
                wait = 0.0 if stop.is_set() else self.due_in(self.clock())
                if wait:
                    self._cond.wait(wait)
                    continue
            self.forward(self.take_due(self.clock()))
        self.forward(self.take_due(self.clock(), stopping=True))

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()


# --- Events about objects being created -------------------------------------------------------------

CREATION_WAIT_SECONDS = 60.0  # an Event whose object has not appeared by then is dropped (and logged)
MAX_AWAITING = 10_000  # beyond that, the oldest held Event is dropped (and logged)
REPORTED_KINDS = ("TaskRun", "PipelineRun", "Pod", "DaemonSet")  # the kinds admission reports Events on


class EventsOnCreation(Protocol):
    """Where admission sends the Event of a decision about an object that does not exist yet."""

    def hold(
        self,
        token: str,
        regarding: dict[str, Any],
        type: str,
        reason: str,
        note: str,
        action: str = "",
        *,
        generate_name: str = "",
    ) -> None:
        """`regarding` without uid; its name, or (`generate_name`) none yet. Never blocks, never raises."""


@dataclass
class _Awaiting:
    since: float
    regarding: dict[str, Any]
    generate_name: str  # when the object had no name at admission
    args: tuple[str, str, str, str]  # type, reason, note, action


class CreationEvents:
    """Admission's Events held until the informers see the object they are about, then sent on with
    the object's name and uid.

    At admission the object does not exist yet: it has no uid (and `kubectl describe` shows only
    Events whose `regarding` carries the object's uid), and an object made with `generateName` has
    no name either (the API server names it after mutating admission). So admission writes the
    AdmissionReview's uid into the object (the `egress-placer.io/review` annotation, the token) and
    `hold`s the Event under (kind, namespace, token); the informers call `apply`/`replace` with every
    TaskRun, PipelineRun, Pod and DaemonSet they see, and the first one carrying that token in that namespace,
    with that name (or a name starting with that generateName), releases the Event to `sink` (which
    keeps it off the run's critical path: QuietEvents). A second review with the same uid (webhook
    reinvocation) replaces the held Event: the last decision is the one written.

    An Event whose object never appears (its creation refused later, by another webhook or a quota)
    is dropped after `ttl` seconds with a log line; so is the oldest when `max_held` are waiting.
    `hold`, `apply` and `replace` never block on I/O and never raise.
    """

    def __init__(
        self,
        sink: EventSink,
        *,
        ttl: float = CREATION_WAIT_SECONDS,
        max_held: int = MAX_AWAITING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink, self.clock = sink, clock
        self.ttl, self.max_held = ttl, max_held  # how long, and how many, Events wait for their object
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str, str], _Awaiting] = {}  # oldest first

    # -- admission's side --------------------------------------------------------------------------
    def hold(
        self,
        token: str,
        regarding: dict[str, Any],
        type: str,
        reason: str,
        note: str,
        action: str = "",
        *,
        generate_name: str = "",
    ) -> None:
        try:
            key = (str(regarding.get("kind") or ""), str(regarding.get("namespace") or ""), token)
            awaiting = _Awaiting(self.clock(), dict(regarding), generate_name, (type, reason, note, action))
            with self._lock:
                self._held.pop(key, None)
                self._held[key] = awaiting
                while len(self._held) > self.max_held:
                    oldest_key = next(iter(self._held))
                    oldest = self._held.pop(oldest_key)
                    _log_dropped(oldest_key[0], oldest_key[1], oldest, f"more than {self.max_held} Events waiting")
        except Exception:  # never let reporting break admission
            logger.opt(exception=True).debug("event not held")

    # -- the informers' side (ObjectObserver) --------------------------------------------------------
    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """One object seen (added, changed or deleted: it existed, so its Event is true)."""
        if kind in REPORTED_KINDS and self._held:
            self._release(kind, [obj])

    def replace(self, kind: str, objs: list[Any]) -> None:
        """A full list (a relist can be the first sight of an object created during a watch gap)."""
        if kind in REPORTED_KINDS and self._held:
            self._release(kind, objs)

    def _release(self, kind: str, objs: Sequence[Mapping[str, Any]]) -> None:
        ready: list[tuple[dict[str, Any], tuple[str, str, str, str]]] = []
        with self._lock:
            for obj in objs:
                meta = obj.get("metadata") or {}
                token = (meta.get("annotations") or {}).get(REVIEW_ANNOTATION)
                if not token:
                    continue
                key = (kind, meta.get("namespace") or "", token)
                held = self._held.get(key)
                name, uid = meta.get("name") or "", meta.get("uid") or ""
                # The token is an annotation, which the tenant writes too. What makes the match
                # trustworthy: the object was seen by our own informer with this kind, in the namespace
                # the review was for (the API server, not the tenant, says which), and with the name
                # (or generateName prefix) that review admitted. A copied or guessed token can at most
                # attach our Event to the tenant's own object, of that kind, in its own namespace; and a
                # pending token is known only to the API server until its object exists.
                if held is None or not name or not uid:
                    continue
                if not (name.startswith(held.generate_name) if held.generate_name else name == held.regarding.get("name")):
                    continue
                del self._held[key]
                ready.append(({**held.regarding, "name": name, "uid": uid}, held.args))
        for regarding, (type_, reason, note, action) in ready:
            try:
                self.sink.emit(regarding, type_, reason, note, action)
            except Exception:  # the sink promises not to raise; keep the others if it does
                logger.opt(exception=True).debug("event not forwarded")

    # -- expiry --------------------------------------------------------------------------------------
    def sweep(self) -> int:
        """Drop (and log) the Events held longer than `ttl`; how many."""
        now = self.clock()
        with self._lock:
            expired = [(k, a) for k, a in self._held.items() if now - a.since >= self.ttl]
            for key, _ in expired:
                del self._held[key]
        for (kind, namespace, _), awaiting in expired:
            why = f"the object did not appear within {self.ttl:.0f}s (its creation refused after admission?)"
            _log_dropped(kind, namespace, awaiting, why)
        return len(expired)

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def run(self, stop: threading.Event) -> None:
        """Sweep until `stop`. Then Events still waiting for their object are dropped (their objects may
        appear after this process ends: another replica has their Events only if it admitted them)."""
        while not stop.wait(min(5.0, self.ttl / 2)):
            try:
                self.sweep()
            except Exception:
                logger.opt(exception=True).warning("sweep of held Events failed")
        with self._lock:
            waiting, self._held = len(self._held), {}
        if waiting:
            logger.bind(count=waiting).info(
                "{} admission Event(s) dropped at shutdown: their objects were not seen yet", waiting
            )


def _log_dropped(kind: str, namespace: str, awaiting: _Awaiting, why: str) -> None:
    type_, reason, note, _ = awaiting.args
    name = awaiting.regarding.get("name") or awaiting.generate_name
    logger.bind(kind=kind, namespace=namespace, name=name, reason=reason).info(
        "admission Event dropped: {}: {} {}", why, type_, note
    )
