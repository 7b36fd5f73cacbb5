"""The leader's queue release: level-based passes that clear `spec.status` of the next queued runs.

Each pass (the reconcile loop runs it after a change: a queued run changed, a pod on a pool node
came or went, a node or the policy changed; and before the earliest wait bound) reads the queue
from the informers' state, asks the core (`queue.core.plan`) which runs to release, and releases
them through the one adapter (`KubeClient.release_run`: a JSON patch that tests the uid and the
pending status, then removes `spec.status`; nothing else of the run is written).

Nothing is kept that the cluster does not hold, except the runs this replica released whose change
the informers have not shown yet (so the next pass does not count their slot as free again). A new
leader rebuilds the queue from the cluster: the pending runs carrying a queue entry.

Kueue (tekton-kueue) holds PipelineRuns by the same `spec.status`. Before planning, a pass looks once at
the Workloads of each namespace with a pending PipelineRun entry (`RunReleaser.kueue_workloads`; only such
runs can be Kueue's) and marks the entries Kueue holds (`queue.core.held_by_kueue`): they wait in no line
and take no slot. `_release`, which every release goes through, asks the same question again and releases
no run Kueue holds. While one is held, passes come at least every KUEUE_LOOK_SECONDS (an admission by Kueue
changes no run we watch). A run held by tekton-kueue's label alone, with no Workload `kueue_wait` seconds
after it was queued (`queue.core.kueue_workload_missing`: tekton-kueue not running, not handling its
namespace, or the label the tenant's own), gets a Warning, KueueWorkloadMissing, once per run and leadership:
it is not released, but not silently stuck either.

Events (the one sink): Released (Normal) with the wait and the reason; QueueWaitExceeded (Warning)
once per run and leadership for a run of a required pool past its maxQueueSeconds; QueueOverCap (Warning)
once per pod and leadership for a run's pod bound to a queued pool beyond its slots (`queue.core.over_cap`:
made while the webhook did not answer, or the pool lost nodes). Such a pod is reported, not evicted: it is
a run's upload under way, and the queue releases nothing into that pool until the pods are back under
its cap (docs/security.md, "Tenants and runs", "What is left").
Metrics: queue_length, queue_slots and queue_over_cap_pods per pool, queue_releases_total by reason,
queue_wait_seconds (pool "": a pool no longer in the policy).
"""

from __future__ import annotations

import time
from dataclasses import replace
from collections import defaultdict
from typing import Any, Callable, Protocol

from loguru import logger

from controller.budgets.view import BudgetsView
from controller.core.policy import PlacementPolicy, Pool
from controller.queue.core import (
    KUEUE_QUEUE_LABEL,
    PENDING,
    POOL_SLOT_GATE,
    Workloads,
    GatedPod,
    Plan,
    PoolPod,
    PoolQueue,
    QueueEntry,
    Release,
    ReleaseReason,
    entry_annotation,
    held_by_kueue,
    kueue_may_hold,
    kueue_workload_missing,
    launching,
    KUEUE_WORKLOAD_WAIT_SECONDS,
    over_cap,
    plan,
    release_all,
    release_order,
    ungate,
)
from controller.event_sink import EventSink
from controller.metrics import GaugeSnapshot, Metrics
from controller.queue.view import QueueView

RELEASE_MEMORY_SECONDS = 60.0  # how long a release this replica made counts while the informers lag
KUEUE_LOOK_SECONDS = 2.0  # the longest between passes while Kueue holds a queued run
PROVISION_LOOK_SECONDS = 2.0  # the longest between passes while runs wait in a provisioned pool's queue
BUDGET_RECHECK_SECONDS = 1.0  # while runs wait for an egress budget (a window frees with time alone)


class QueueState(Protocol):
    @property
    def policy(self) -> PlacementPolicy: ...

    policy_in_force: bool

    queue: QueueView

    budgets: BudgetsView


class RunReleaser(Protocol):
    def release_run(self, kind: str, namespace: str, name: str, uid: str, pending: str, entry: str | None = None) -> bool: ...

    def ungate_pod(self, namespace: str, name: str, uid: str, gates: tuple[str, ...], gate: str) -> bool: ...

    def kueue_workloads(self, namespace: str) -> Workloads | None: ...

    def node_claims(self, node_pool: str) -> list[dict[str, Any]] | None: ...


class QueueReconciler:
    def __init__(
        self,
        state: QueueState,
        client: RunReleaser,
        events: EventSink,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        kueue_wait: float = KUEUE_WORKLOAD_WAIT_SECONDS,
    ) -> None:
        self.state = state
        self.client = client
        self.events = events
        self.metrics = metrics
        self.clock = clock
        self.kueue_wait = kueue_wait
        self._no_workload: set[tuple[str, str, str]] = set()  # runs told KueueWorkloadMissing (still without one)
        self.plans: dict[str, Plan] = {}  # pool -> the last pass's plan (tests, logs)
        self._released: dict[tuple[str, str, str], float] = {}  # released by us, not yet seen so
        # the egress address each run is released to (egress budgets: `budgets.core.release_to`), this pass's,
        # and of the runs released by us not yet seen so (their entry then still has none)
        self._release_to: dict[tuple[str, str, str], str] = {}
        self._ungated: dict[tuple[str, str], tuple[float, GatedPod]] = {}  # let in by us, not yet seen bound
        self._warned: set[tuple[str, str, str]] = set()
        self._over_reported: set[str] = set()  # uids of the pods over a cap reported (those still over)
        self._workloads: dict[str, Workloads | None] = {}  # namespace -> this pass's look at its Workloads
        self._length = GaugeSnapshot(metrics.queue_length)
        self._slots = GaugeSnapshot(metrics.queue_slots)
        self._over = GaugeSnapshot(metrics.queue_over_cap_pods)

    def __call__(self) -> float | None:
        """One pass; its requeue-after: the seconds to the earliest wait bound (a preferred pool's run to
        release, a Warning to send), None when nothing waits."""
        if not self.state.policy_in_force:  # no policy yet: every pool would look unqueued
            return None
        now = self.clock()
        deadlines: list[float] = []
        self._workloads = {}
        entries = [replace(e, kueue_held=self._held_by_kueue(e)) for e in self._as_seen(self.state.queue.queue_entries(), now)]
        if any(e.kueue_held for e in entries):
            deadlines.append(now + KUEUE_LOOK_SECONDS)
        self._report_no_workload(entries, now)
        by_pool: dict[str, list[QueueEntry]] = defaultdict(list)
        for entry in entries:
            by_pool[entry.pool].append(entry)
        length: dict[tuple[str, ...], float] = {}
        slots: dict[tuple[str, ...], float] = {}
        plans: dict[str, Plan] = {}
        free: dict[str, int] = {}
        over: dict[str, tuple[PoolPod, ...]] = {}
        for pool in self.state.policy.pools:
            picture = self.state.queue.pool_queue(pool, self._launching(pool))
            if picture is None:
                if pool.destinations and self._budget_pass(pool, by_pool.pop(pool.name, []), now):
                    deadlines.append(now + BUDGET_RECHECK_SECONDS)  # a window frees with time, not with a change
                continue
            over[pool.name] = over_cap(self.state.queue.pool_pods(pool), picture.slots)
            mine = by_pool.pop(pool.name, [])
            result = self._within_budgets(pool, plan(picture, mine, now), mine, now)
            plans[pool.name] = result
            for release in result.releases:
                self._release(release, now, result)
            for entry in result.overdue:
                self._warn(entry, picture)
            length[(pool.name,)] = len(result.line)
            slots[(pool.name, "total")] = result.slots
            slots[(pool.name, "occupied")] = result.occupied + sum(1 for r in result.releases if r.reason is ReleaseReason.SLOT)
            free[pool.name] = result.slots - slots[(pool.name, "occupied")]
            deadlines += [e.queued_at + picture.setting.max_queue_seconds for e in result.line if e.key not in self._warned]
            if pool.provisioning is not None and result.line:  # a launching NodeClaim changes nothing we watch
                deadlines.append(now + PROVISION_LOOK_SECONDS)
        for leftover in by_pool.values():  # pools that no longer queue (setting removed, pool gone)
            for release in release_all(leftover):
                self._release(release, now, None)
        self._let_in(free, now)
        self._report_over(over, slots)
        self.plans = plans
        self._length.set(length)
        self._slots.set(slots)
        self._over.set({(pool,): float(len(pods)) for pool, pods in over.items()})
        return max(0.5, min(deadlines) - self.clock()) if deadlines else None

    def _within_budgets(self, pool: Pool, result: Plan, entries: list[QueueEntry], now: float) -> Plan:
        """A queued pool's plan whose slot releases also fit its egress budgets (docs/budgets.md); those
        that do not stay first in the line. A release touching no destination is the queue's alone: no
        budget picture is built for it, and it goes with no address (`budgets.core.release_to`)."""
        slot = [r.entry for r in result.releases if r.reason is ReleaseReason.SLOT]
        if not pool.destinations or not any(e.budgets for e in slot):
            return result
        flying = [(e.budgets, e.address) for e in entries if not e.pending and not e.done and not e.has_pod]
        fits = self.state.budgets.releasable(pool, [(e.key, e.budgets) for e in slot], flying, now)
        self._release_to.update(fits)
        kept = tuple(r for r in result.releases if r.reason is not ReleaseReason.SLOT or r.entry.key in fits)
        return replace(result, releases=kept, line=tuple(e for e in slot if e.key not in fits) + result.line)

    def _budget_pass(self, pool: Pool, entries: list[QueueEntry], now: float) -> bool:
        """A pool without a queue whose runs wait for its egress budgets: release, in the queue's order,
        those whose every budget has room on some pool node (the same release path: `_release`)."""
        line = release_order([e for e in entries if e.waiting], lambda namespace: 0, {})
        flying = [(e.budgets, e.address) for e in entries if not e.pending and not e.done and not e.has_pod]
        fits = self.state.budgets.releasable(pool, [(e.key, e.budgets) for e in line], flying, now)
        self._release_to.update(fits)
        for entry in line:
            if entry.key in fits:
                self._release(Release(entry, ReleaseReason.BUDGET), now, None)
        return len(fits) < len(line)  # some still wait

    def _as_seen(self, entries: list[QueueEntry], now: float) -> list[QueueEntry]:
        """Entries with the runs this replica released, and the informers still show pending, as released."""
        for key, when in list(self._released.items()):
            if now - when > RELEASE_MEMORY_SECONDS:
                del self._released[key]
        out = []
        shown_pending = set()
        for entry in entries:
            if entry.key in self._released and entry.pending:
                shown_pending.add(entry.key)
                entry = replace(entry, pending=False, address=self._release_to.get(entry.key, entry.address))
            out.append(entry)
        for key in set(self._released) - shown_pending:  # the informers caught up (or it is gone)
            del self._released[key]
        for key in set(self._release_to) - set(self._released):
            del self._release_to[key]
        return out

    def _launching(self, pool: Pool) -> int:
        """The nodes Karpenter is launching for a provisioned, queued pool (`queue.core.launching`): one look
        per pass at its NodePool's NodeClaims; 0 when the look failed (fewer slots, never more)."""
        if pool.provisioning is None or pool.queue is None:
            return 0
        node_pool = pool.provisioning.karpenter.node_pool
        claims = self.client.node_claims(node_pool)
        return launching(claims or [], pool.node_selector, self.state.queue.counted_nodes_of(pool, node_pool))

    def _held_by_kueue(self, entry: QueueEntry) -> bool:
        """`queue.core.held_by_kueue`, on one look per pass at the Workloads of the entry's namespace."""
        if not kueue_may_hold(entry):
            return False
        if entry.namespace not in self._workloads:
            self._workloads[entry.namespace] = self.client.kueue_workloads(entry.namespace)
        return held_by_kueue(entry, self._workloads[entry.namespace])

    def _report_no_workload(self, entries: list[QueueEntry], now: float) -> None:
        """A Warning Event, once per run and leadership, on each run held by tekton-kueue's label alone for
        longer than `kueue_wait` (`kueue_workload_missing`)."""
        missing = {e.key: e for e in entries if e.kueue_held and kueue_workload_missing(e, self._workloads.get(e.namespace), now, self.kueue_wait)}
        for key, entry in missing.items():
            if key in self._no_workload:
                continue
            note = (f"held for Kueue by its label {KUEUE_QUEUE_LABEL} for {now - entry.queued_at:.0f}s, but no Kueue Workload "
                    f"owns it: tekton-kueue is not running or does not handle namespace {entry.namespace}. egress-placer never "
                    "releases a run Kueue may hold: remove the label to leave it to egress-placer's queue (docs/coexistence.md)")
            logger.bind(kind=entry.kind, namespace=entry.namespace, name=entry.name, pool=entry.pool).warning(note)
            self.events.emit(self._regarding(entry), "Warning", "KueueWorkloadMissing", note, action="Queue")
        labelled = {e.key for e in entries if e.kueue_held and e.kueue_label}
        self._no_workload = (self._no_workload | set(missing)) & labelled  # a failed look forgets nothing

    def _let_in(self, free: dict[str, int], now: float) -> None:
        """Remove the gate of the gated pods that fit in the pools' free slots (`queue.core.ungate`). A pod
        let in by this replica counts in its pools until the informers show it bound (then the pool's
        pods count it), gone, or RELEASE_MEMORY_SECONDS passed."""
        for key, (when, pod) in list(self._ungated.items()):
            seen = self.state.queue.pod(*key)
            if seen is None or seen.uid != pod.uid or seen.node_name or now - when > RELEASE_MEMORY_SECONDS:
                del self._ungated[key]
                continue
            for pool in pod.pools:
                free[pool] = free.get(pool, 0) - 1
        waiting = [p for p in self.state.queue.gated_pods() if p.key not in self._ungated]
        for pod in ungate({k: max(0, v) for k, v in free.items()}, waiting):
            self._ungated[pod.key] = (now, pod)
            if self.client.ungate_pod(pod.namespace, pod.name, pod.uid, pod.gates, POOL_SLOT_GATE):
                logger.bind(namespace=pod.namespace, name=pod.name, pools=list(pod.pools)).info("a pool slot is free: pod let in")

    def _report_over(self, over: dict[str, tuple[PoolPod, ...]], slots: dict[tuple[str, ...], float]) -> None:
        """A Warning Event, once per pod and leadership, on each run's pod over a queued pool's cap."""
        still = set()
        for pool, pods in over.items():
            total = int(slots.get((pool, "total"), 0))
            for pod in pods:
                still.add(pod.uid)
                if pod.uid in self._over_reported:
                    continue
                note = (f"pool {pool}'s queue has {len(pods)} run pod(s) beyond its {total} slot(s), this one among them: "
                        "it was made while egress-placer's webhook did not answer (so it was not gated), or the pool "
                        "lost nodes; it is left to finish, and the queue releases nothing into the pool until it is back under its cap")
                logger.bind(namespace=pod.namespace, name=pod.name, pool=pool).warning(note)
                self.events.emit({"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
                                 "Warning", "QueueOverCap", note, action="Queue")
        self._over_reported = still

    def _release(self, release: Release, now: float, result: Plan | None) -> None:
        """Every release goes through here: never one of a run Kueue holds (whoever asks)."""
        entry = release.entry
        if self._held_by_kueue(entry):
            logger.bind(kind=entry.kind, namespace=entry.namespace, name=entry.name, pool=entry.pool).info("not released: Kueue holds it")
            return
        address = self._release_to.get(entry.key, "")
        if address:  # the egress address it was counted behind goes on the run with the release (its entry)
            text = entry_annotation(entry.pool, entry.kind, entry.queued_at, entry.budgets, address)
            released = self.client.release_run(entry.kind, entry.namespace, entry.name, entry.uid, PENDING[entry.kind], text)
        else:
            released = self.client.release_run(entry.kind, entry.namespace, entry.name, entry.uid, PENDING[entry.kind])
        self._released[entry.key] = now
        self._warned.discard(entry.key)
        if not released:
            return
        waited = max(0.0, now - entry.queued_at)
        # Label values only from configured pools: a pool gone from the policy counts as "" (its name came
        # from an annotation, and would add series that are never removed).
        label = entry.pool if self.state.policy.pool(entry.pool) is not None else ""
        self.metrics.queue_releases.labels(pool=label, reason=str(release.reason)).inc()
        self.metrics.queue_wait_seconds.labels(pool=label).observe(waited)
        if release.reason is ReleaseReason.TIMEOUT:
            note = f"released from pool {entry.pool}'s queue after {waited:.0f}s, past its longest wait: it runs on ordinary nodes"
        elif release.reason is ReleaseReason.BUDGET:
            note = f"released: every egress budget it waited for in pool {entry.pool} has room (waited {waited:.0f}s)"
        elif release.reason is ReleaseReason.UNQUEUED:
            note = f"released: pool {entry.pool} no longer queues (waited {waited:.0f}s)"
        else:
            taken = f" ({result.slots} slots, {result.occupied} taken before this pass)" if result is not None else ""
            note = f"released from pool {entry.pool}'s queue after {waited:.0f}s{taken}"
        logger.bind(kind=entry.kind, namespace=entry.namespace, name=entry.name, pool=entry.pool, reason=str(release.reason)).info(note)
        self.events.emit(self._regarding(entry), "Normal", "Released", note, action="Release")

    def _warn(self, entry: QueueEntry, picture: PoolQueue) -> None:
        if entry.key in self._warned:
            return
        self._warned.add(entry.key)
        note = (
            f"waiting in pool {entry.pool}'s queue longer than its maxQueueSeconds ({picture.setting.max_queue_seconds}s); "
            f"the pool's placement is required, so it keeps waiting for a slot ({picture.slots} slots)"
        )
        self.events.emit(self._regarding(entry), "Warning", "QueueWaitExceeded", note, action="Queue")

    @staticmethod
    def _regarding(entry: QueueEntry) -> dict[str, str]:
        return {"apiVersion": "tekton.dev/v1", "kind": entry.kind, "namespace": entry.namespace, "name": entry.name, "uid": entry.uid}
