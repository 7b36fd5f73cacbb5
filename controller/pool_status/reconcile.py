"""The leader writes each EgressPool's `status` (pools API only, `policy_source: pools`).

Level-based, one of the leader's reconcilers: each pass computes every pool's status from the
objects as the policy source holds them, the policy in force, the cached nodes and loads, the runs
placed and the errors seen (`pool_status.core.pool_status`, pure), compares it with the status the
object has, and writes the difference (a merge patch of the status subresource, through the
writer's one retry policy). Rate-limited: a pass computes at most every `min_interval` seconds (so a
pool's status is written at most that often, and the load of 10,000 nodes is not counted on every
pod event); a pass that comes sooner is skipped and asks the loop back when the interval is over, so
a change shows within `min_interval` plus the loop's debounce.

What it reads besides the state:
- the placement log (`placement_log.view.PlacementLog`): the pods of TaskRuns bound to a pool node,
  created within the last hour.
- `PoolErrors`: errors about a pool seen by other reconcilers (a taint the leader could not write),
  the newest per pool, in memory; the status keeps the last one written, also across a leader change.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

from loguru import logger

from controller.core.model import NodeState
from controller.core.policy import PlacementPolicy
from controller.core.conversion import POOL_KIND, V1BETA1, status_in
from controller.core.pools import QueueStatus
from controller.pool_status.core import (
    READY,
    PoolObject,
    SeenError,
    config_status,
    members_by_pool,
    status_patch,
    pool_status,
)
from controller.load.view import LoadView
from controller.placement_log.view import PlacementLog
from controller.queue.view import QueueView
from controller.pool_status.metrics import pool_loads
from controller.suggest.view import MeasuredView


class PoolState(Protocol):
    @property
    def policy(self) -> PlacementPolicy: ...

    def node(self, name: str) -> NodeState | None: ...

    def node_list(self) -> list[NodeState]: ...

    @property
    def nodes(self) -> Mapping[str, NodeState]: ...

    load: LoadView
    queue: QueueView
    history: MeasuredView


class PoolObjects(Protocol):
    def pool_objects(self) -> tuple[list[PoolObject], str | None]:
        """The EgressPools as stored, and why the loader refuses them (None: they are in force)."""
        ...

    def config_object(self) -> PoolObject | None:
        """The EgressPlacerConfig as stored (None: there is none, or not every kind is listed yet)."""
        ...


class StatusWriter(Protocol):
    def set_pool_status(self, name: str, patch: Mapping[str, Any]) -> None: ...

    def set_config_status(self, name: str, patch: Mapping[str, Any]) -> None: ...


class PoolErrors:
    """The newest error seen about each pool (`report`), for its status."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._errors: dict[str, SeenError] = {}
        self._lock = threading.Lock()

    def report(self, pool: str, message: str) -> None:
        with self._lock:
            self._errors[pool] = SeenError(message, self.clock())

    def of(self, pool: str) -> list[SeenError]:
        with self._lock:
            seen = self._errors.get(pool)
        return [seen] if seen is not None else []


class PoolStatusWriter:
    def __init__(
        self,
        state: PoolState,
        objects: PoolObjects,
        writer: StatusWriter,
        placements: PlacementLog,
        errors: PoolErrors,
        *,
        clock: Callable[[], float] = time.time,
        min_interval: float = 5.0,
    ) -> None:
        self.state = state
        self.objects = objects
        self.writer = writer
        self.placements = placements
        self.errors = errors
        self.clock = clock
        self.min_interval = min_interval
        self._next_pass = float("-inf")
        self._skipped = False

    def __call__(self) -> float | None:
        """The loop's pass; its requeue-after: after a skipped pass, the seconds until the next may compute."""
        self.reconcile()
        return max(0.0, self._next_pass - self.clock()) if self._skipped else None

    def reconcile(self) -> list[str]:
        """One pass; the pools whose status was written. A failed write is logged and tried next pass."""
        now = self.clock()
        if now < self._next_pass:
            self._skipped = True
            return []
        self._skipped = False
        self._next_pass = now + self.min_interval
        objects, refusal = self.objects.pool_objects()
        config = self.objects.config_object()
        written = self._config(config, refusal, now) if config is not None else []
        if not objects:
            return written
        policy = self.state.policy
        members = members_by_pool(policy, self.state.node_list())
        placed = self.placements.placed()
        for obj in objects:
            pool = policy.pool(obj.name)
            loads = pool_loads(self.state.load, pool, self.state.nodes) if pool is not None else {}
            counts = self.state.queue.queue_counts(pool, now) if pool is not None else None
            queue = QueueStatus(waiting=counts[0], slots=counts[1], occupied=counts[2]) if counts is not None else None
            history = self.state.history.status(pool.name) if pool is not None and pool.history is not None else None
            desired = status_in(POOL_KIND, V1BETA1, pool_status(
                obj, policy, members.get(obj.name, []), loads, placed, refusal, self.errors.of(obj.name), now, queue, history
            ))  # the objects are read and written as v1beta1 (its load field names)
            if desired == dict(obj.status):
                continue
            log = logger.bind(kind="EgressPool", name=obj.name)
            try:
                self.writer.set_pool_status(obj.name, status_patch(obj.status, desired))
            except Exception as e:
                log.warning("pool status not written: {}", e)
                continue
            written.append(obj.name)
            ready, before = _ready(desired), _ready(obj.status)
            if ready != before:
                log.bind(status=ready[0], reason=ready[1]).info("pool {}: Ready {} ({})", obj.name, ready[0], ready[1])
        return written


    def _config(self, config: PoolObject, refusal: str | None, now: float) -> list[str]:
        """The EgressPlacerConfig's status, written when it changed; [its name] when written."""
        desired = config_status(config, len(self.state.policy.pools), refusal, now)
        if desired == dict(config.status):
            return []
        try:
            self.writer.set_config_status(config.name, status_patch(config.status, desired))
        except Exception as e:
            logger.bind(kind="EgressPlacerConfig", name=config.name).warning("config status not written: {}", e)
            return []
        return [config.name]


def _ready(status: Mapping[str, Any]) -> tuple[str, str]:
    for condition in status.get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == READY:
            return str(condition.get("status")), str(condition.get("reason"))
    return "", ""
