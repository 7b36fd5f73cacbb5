"""Egress budgets as the stores show them (docs/budgets.md): one pool's `PoolBudgets` now, and the lines
`egress-placer status` prints.

Counts come only from controller-trusted facts: the pod store's "budgeted" index (pods carrying a
budget record, by the pool it names: `budgets.core.read_record`), each pod a run's pod by uid
(`QueueView.is_run_pod`), counted on the node it is bound to (else the node admission chose), whose
egress address is the node's own (label, or the node's name). A pod the cache no longer keeps (finished)
no longer counts at once, but its starts stay in the window: `pod_ended` keeps them (checked a run's pod
while the cache still had it) for the longest window of its pool, in memory of every replica, and a
relist keeps those of the finished pods the API server still lists (Tekton keeps a TaskRun's pod until
the TaskRun is deleted). A pod deleted while no replica watched would lose its start: the leader keeps
the window's starts in a ConfigMap of the controller's namespace (`budgets.reconcile.BudgetStartsKeeper`:
`window_starts` out, `restore` in, at every replica's start and when a replica starts leading).
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from loguru import logger

from controller.budgets.core import (
    BUDGETS_ANNOTATION,
    MAX_WINDOW_SECONDS,
    STARTS_KEY,
    PoolBudgets,
    Kept,
    Record,
    Start,
    address_of,
    addresses,
    decode_starts,
    describe,
    figures,
    read_record,
    release_to,
    Use,
    trusted_use,
)
from controller.core.model import PodState
from controller.core.policy import PlacementPolicy, Pool
from controller.load.view import LoadView
from controller.queue.view import QueueView
from controller.store import Store


RECORDS_KEPT = 32_768  # budget records kept parsed (by their text), the least recently read dropped first


@lru_cache(maxsize=RECORDS_KEPT)
def _parsed(text: str) -> Record | None:
    return read_record(text)


def record_of(pod: PodState) -> Record | None:
    """The pod's budget record, parsed once: when the pod is stored (the "budgeted" index below reads it
    first), then answered by its text from a bounded table (a pure function of the text: a copy of
    another pod's text gets the same record, which proves nothing until the view checks the pod is a
    run's pod). Keeping it by text, not on the stored pod, leaves the pod store's values as they are."""
    text = pod.annotations.get(BUDGETS_ANNOTATION)
    return _parsed(text) if isinstance(text, str) else None


def budgeted(pod: PodState) -> str | None:
    """The pod store's "budgeted" index: the pool a pod's budget record names (a claim until the view
    checks it is a run's pod)."""
    record = record_of(pod)
    return record.pool if record is not None else None


MAX_ENDED = 100_000  # starts of ended pods kept (per replica), oldest dropped first
PLACING_SECONDS = 30.0  # how long a pod admission placed counts before the pod store shows it


class BudgetsView:
    def __init__(self, stores: Mapping[str, Store[Any, Any]], load: LoadView, queue: QueueView, policy: Callable[[], PlacementPolicy]) -> None:
        self._stores, self._load, self._queue, self._policy = stores, load, queue, policy
        self._ended: dict[str, tuple[str, tuple[Start, ...]]] = {}  # pod uid -> (pool, its starts): pods gone from the cache
        self._ended_lock = threading.Lock()  # the pod informer writes, admission and the leader read
        # Pods counted as a run's use while their TaskRun was in the cache, with their starts: these stay once
        # the pod ends, even if its TaskRun was deleted first (a tenant deleting its run frees no window), and
        # count from here while the pod is gone from the cache but `pod_ended` has not run yet (the store
        # publishes first, then tells the state) or while it is being deleted (no longer active).
        self._verified: dict[str, tuple[str, tuple[Start, ...]]] = {}
        # Pods this replica's admission just placed, by (namespace, name): counted until the pod store shows
        # the pod with that record (or PLACING_SECONDS passed: its CREATE failed). Without it, pods made
        # within milliseconds of each other (runs released in one pass) each see the same room.
        self._placing: dict[tuple[str, str], tuple[float, str, str, Use, tuple[Start, ...]]] = {}

    def placed(self, namespace: str, name: str, pool: Pool, node: str, touched: Iterable[str], record: str, now: float) -> None:
        """Admission placed a run's pod `name` touching `touched` on `node` with the budget record `record`
        (the annotation's text): it counts (a use, its starts) from now, not from when the store shows it."""
        known = {d.name for d in pool.destinations}
        names = frozenset(t for t in touched if t in known)
        if not name or not names:
            return
        address = self._address(node, pool)
        use = Use(f"placing/{namespace}/{name}", node, names)
        with self._ended_lock:
            self._placing[(namespace, name)] = (now, record, pool.name, use, tuple(Start(n, address, now) for n in sorted(names)))

    def withdraw(self, namespace: str, name: str) -> None:
        """The API server calls admission again for the pod `name` (reinvocation): its use from the first
        call must not count against itself (the same pod is placed again)."""
        with self._ended_lock:
            self._placing.pop((namespace, name), None)

    def _placing_uses(self, pool: Pool, now: float) -> list[tuple[Use, tuple[Start, ...]]]:
        """The pods admission placed that the pod store does not show yet (with their record)."""
        pods = self._stores["Pod"].items
        out = []
        with self._ended_lock:
            for key, (when, record, name, use, starts) in list(self._placing.items()):
                pod = pods.get(key)
                if now - when > PLACING_SECONDS or (pod is not None and pod.annotations.get(BUDGETS_ANNOTATION) == record):
                    del self._placing[key]
                elif name == pool.name:
                    out.append((use, starts))
        return out

    def pod_ended(self, pod: PodState) -> None:
        """A pod left the cache (finished or deleted): keep its starts when it was a run's pod with a record
        of a pool with destinations (their window outlives the pod)."""
        record = record_of(pod)
        pool = self._policy().pool(record.pool) if record is not None else None
        if record is None or pool is None or not pool.destinations or not pod.uid:
            return
        with self._ended_lock:
            verified = self._verified.pop(pod.uid, None) is not None
        run_pod = verified or self._queue.is_run_pod(pod.namespace, pod.owners, pod.name)
        use = trusted_use(pod.uid, record, run_pod, pool.name, pod.node_name, [d.name for d in pool.destinations])
        if use is None:
            return
        address = self._address(use.node, pool)
        with self._ended_lock:
            self._ended[pod.uid] = (pool.name, tuple(Start(n, address, record.started) for n in sorted(use.destinations)))
            while len(self._ended) > MAX_ENDED:
                del self._ended[next(iter(self._ended))]

    def pods_listed(self, pods: Iterable[PodState]) -> None:
        """A relist: the finished pods the API server still lists (the cache keeps none)."""
        for pod in pods:
            if pod.finished and BUDGETS_ANNOTATION in pod.annotations:
                self.pod_ended(pod)

    def restore(self, kept: Kept) -> int:
        """The starts of the leader's record (`budgets.reconcile.BudgetStartsKeeper`): kept as those of ended
        pods, unless this replica already keeps the pod's (ended, or live: a live pod's record counts, and
        `_ended_starts` leaves out the uids of live pods). The number taken."""
        taken = 0
        with self._ended_lock:
            for uid, (pool, starts) in kept.items():
                if uid not in self._ended and len(self._ended) < MAX_ENDED:
                    self._ended[uid] = (pool, tuple(starts))
                    taken += 1
        return taken

    def record_seen(self, configmap: Mapping[str, Any] | None) -> int:
        """The leader's record of starts as this replica's informer shows it (kube.informer: every replica
        follows the ConfigMap, from its first list on, so a follower counts the starts of pods it never saw
        and has them when it starts leading). Additive: a row only adds a pod's starts this replica lacks;
        rows leave by their window alone. The number taken."""
        taken = self.restore(decode_starts(((configmap or {}).get("data") or {}).get(STARTS_KEY)))
        if taken:
            logger.bind(runs=taken).debug("budget window starts taken from the leader's record")
        return taken

    def window_starts(self, now: float) -> dict[str, tuple[str, tuple[Start, ...]]]:
        """Every start this replica counts, by pod uid (live run pods' records and the ended pods' kept):
        what the leader's record keeps (`budgets.core.starts_to_keep` bounds it)."""
        out: dict[str, tuple[str, tuple[Start, ...]]] = {}
        for pool in self._policy().pools:
            if pool.destinations:
                for use, starts in self._live(pool):
                    out[use.key] = (pool.name, starts)
        with self._ended_lock:
            for uid, (pool_name, starts) in [*self._ended.items(), *self._verified.items()]:
                out.setdefault(uid, (pool_name, starts))
        return out

    def _ended_starts(self, pool: Pool, now: float, live: set[str]) -> list[Start]:
        window = max((d.window_seconds or 0 for d in pool.destinations), default=0) or MAX_WINDOW_SECONDS
        out = []
        with self._ended_lock:
            for uid, (name, starts) in list(self._ended.items()):
                if starts and now - starts[0].time > max(window, 1) and name == pool.name:
                    del self._ended[uid]  # out of every window of its pool
                elif name == pool.name and uid not in live:
                    out += starts
            for uid, (name, starts) in self._verified.items():  # gone from the cache, not yet told
                if name == pool.name and uid not in live and uid not in self._ended:
                    out += [s for s in starts if now - s.time <= max(window, 1)]
        return out

    def addresses(self, pool: Pool) -> dict[str, str]:
        """node -> egress address, for the pool's eligible nodes (members, Ready, not cordoned)."""
        nodes = self._stores["Node"].items
        return {n: self._address(n, pool) for n in self._load.pool_names(pool.name) if n in nodes}

    def pool_budgets(self, pool: Pool, now: float) -> PoolBudgets | None:
        """The pool's budgets now; None when it has no destinations. O(pods carrying a record of the pool,
        and ended pods' starts kept)."""
        if not pool.destinations:
            return None
        live = self._live(pool)
        uses = [use for use, _ in live]
        starts = [s for _, mine in live for s in mine] + self._ended_starts(pool, now, {u.key for u in uses})
        for use, mine in self._placing_uses(pool, now):
            uses.append(use)
            starts += mine
        return PoolBudgets(pool.name, pool.destinations, self.addresses(pool), tuple(uses), tuple(starts))

    def _live(self, pool: Pool) -> list[tuple[Use, tuple[Start, ...]]]:
        """The active run pods' uses of the pool and their starts (from their budget records)."""
        where = self.addresses(pool)
        known = [d.name for d in pool.destinations]
        out = []
        for pod in self._stores["Pod"].snapshot.under("budgeted", pool.name).values():
            record = record_of(pod)
            use = trusted_use(pod.uid, record, pod.active and self._queue.is_run_pod(pod.namespace, pod.owners, pod.name), pool.name, pod.node_name, known)
            if use is None or record is None:
                continue
            address = where.get(use.node) or self._address(use.node, pool)
            starts = tuple(Start(name, address, record.started) for name in sorted(use.destinations))
            if self._verified.get(pod.uid) != (pool.name, starts):
                with self._ended_lock:
                    self._verified[pod.uid] = (pool.name, starts)
            out.append((use, starts))
        return out

    def _address(self, name: str, pool: Pool) -> str:
        node = self._stores["Node"].items.get(name)
        return address_of(name, node.labels if node else {}, node.annotations if node else {}, pool.egress_address)

    def releasable(self, pool: Pool, line: Sequence[tuple[Hashable, Sequence[str]]], flying: Sequence[tuple[Sequence[str], str]],
                   now: float) -> dict[Hashable, str]:
        """Which of the waiting runs (`line`: key and the destinations each waits for, in release order) fit
        the pool's budgets now, each with the egress address it is released to, with the runs released and
        not yet on a node (`flying`: destinations and the address each was released to) counted. Every key
        (no address) when the pool has no destinations."""
        budgets = self.pool_budgets(pool, now)
        if budgets is None:
            return {key: "" for key, _ in line}
        return release_to(budgets, line, flying, now)

    def status_lines(self, now: float) -> list[str]:
        """Each budget's use per pool, destination and address (`egress-placer status`)."""
        lines: list[str] = []
        for pool in self._policy().pools:
            budgets = self.pool_budgets(pool, now)
            if budgets is None:
                continue
            lines.append(f"pool {pool.name}: {len(budgets.addresses)} nodes behind {len(addresses(budgets))} egress addresses")
            for d in pool.destinations:
                shown = figures(budgets, d, None, now) + [f for a in addresses(budgets) for f in figures(budgets, d, a, now)]
                for f in shown:
                    mark = " (full)" if f.full else ""
                    mode = "" if d.enforced else f" [{d.mode}]"
                    lines.append(f"  {describe(f, pool.name).removeprefix('budget ')}{mark}{mode}")
        return lines
