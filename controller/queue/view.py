"""The queue as the stores show it: the runs carrying a queue entry (`queue.core`), a queued pool's
slots and occupants, and the line summaries admission counts on when a run joins a line.

The run stores keep a `RunRecord` per TaskRun and PipelineRun, indexed by "queued" (and TaskRuns by
the uid of the PipelineRun their controller ownerReference claims); the pod store's "TaskRun" index says
which TaskRuns have a pod bound to a node, by the pod's owner uid: the entry's has_pod. No label is
read: a pod's `tekton.dev/*` labels are its TaskRun creator's to write.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from controller.core.model import DECISION_ANNOTATION, OwnerRef, PodState, owner_refs
from controller.core.policy import PlacementPolicy, Pool
from controller.load.view import LoadView
from controller.queue.core import (
    POOL_SLOT_GATE,
    KUEUE_QUEUE_LABEL,
    NODEPOOL_LABEL,
    QUEUE_ANNOTATION,
    GatedPod,
    LineSummary,
    PoolPod,
    PoolQueue,
    QueueEntry,
    RunFacts,
    claimed_pipelinerun,
    claimed_taskrun,
    decided_placement,
    is_run_pod,
    provisioned_nodes,
    slots,
)
from controller.store import Store

RUN_KINDS = ("TaskRun", "PipelineRun")
RunKey = tuple[str, str, str]  # kind, namespace, name
QUEUE_SUMMARY_SECONDS = 1.0  # admission reads a queued pool's line summary at most this old (plus its own additions)


def run_key(kind: str, obj: Mapping[str, Any]) -> RunKey:
    meta = obj["metadata"]
    return (kind, meta.get("namespace") or "default", meta["name"])


@dataclass(frozen=True)
class RunRecord:
    """What is kept of a TaskRun or PipelineRun: has it a decision, its uid, its queue entry (queue.core),
    and, of a TaskRun, the PipelineRun its controller ownerReference claims (`claimed_pipelinerun`)."""

    decided: bool
    uid: str
    entry: QueueEntry | None
    pipelinerun: OwnerRef | None = None
    pod_name: str = ""  # status.podName: the pod Tekton made for it (Tekton's controller alone writes status)
    # Of a PipelineRun: the pool admission's decision record (written at CREATE) moved it to whole ("": none),
    # the names Tekton gives its affinity assistants (`assistant_names`), and whether it finished.
    whole_pool: str = ""
    assistants: tuple[str, ...] = ()
    finished: bool = False

    @classmethod
    def of(cls, kind: str, obj: Mapping[str, Any]) -> "RunRecord":
        """The queue entry is read once here, not per admission (has_pod unset: see queue_entries)."""
        meta = obj["metadata"]
        annotations = meta.get("annotations") or {}
        value = annotations.get(QUEUE_ANNOTATION)
        conditions = (obj.get("status") or {}).get("conditions") or []
        done = any(c.get("type") == "Succeeded" and c.get("status") in ("True", "False") for c in conditions if isinstance(c, Mapping))
        key = run_key(kind, obj)
        facts = RunFacts(kind, key[1], key[2], meta.get("uid") or "", value, str((obj.get("spec") or {}).get("status") or ""), done,
                         annotations.get(DECISION_ANNOTATION), KUEUE_QUEUE_LABEL in (meta.get("labels") or {}))
        entry = facts.queue_entry(has_pod=False) if value is not None else None
        claim = claimed_pipelinerun(owner_refs(meta)) if kind == "TaskRun" else None
        pod_name = (obj.get("status") or {}).get("podName") if kind == "TaskRun" else ""
        whole = _record_pool(annotations.get(DECISION_ANNOTATION)) if kind == "PipelineRun" else ""
        assistants = assistant_names(key[2], (obj.get("spec") or {}).get("workspaces")) if whole else ()
        return cls(DECISION_ANNOTATION in annotations, meta.get("uid") or "", entry, claim, pod_name if isinstance(pod_name, str) else "",
                   whole, assistants, done)

    def queued(self) -> bool | None:
        """The run store's "queued" index."""
        return True if self.entry is not None else None

    def claimed_uid(self) -> str | None:
        """The TaskRun store's "pipelinerun" index: the uid of the PipelineRun it claims as its owner."""
        return self.pipelinerun.uid if self.pipelinerun is not None else None

    @staticmethod
    def entry_changed(obj: Mapping[str, Any], deleted: bool, old: RunRecord | None, new: RunRecord | None) -> bool:
        """A queue entry came, went or changed: the release reconciler looks again."""
        return (old.entry if old else None) != (new.entry if new else None)


def assistant_names(pipelinerun: str, workspaces: Any) -> tuple[str, ...]:
    """The names Tekton gives a PipelineRun's affinity assistants (StatefulSets; their pod is `<name>-0`):
    one per workspace binding (`coschedule: workspaces`) and one for the whole run (`pipelineruns`,
    `isolate-pipelinerun`): "affinity-assistant-" and the first 10 hex digits of sha256(workspace + run)
    (pkg/reconciler/pipelinerun/affinity_assistant.go, GetAffinityAssistantName)."""
    bound = [w.get("name") for w in workspaces if isinstance(w, Mapping)] if isinstance(workspaces, list) else []
    return tuple(f"affinity-assistant-{hashlib.sha256((w + pipelinerun).encode()).hexdigest()[:10]}"
                 for w in ("", *(w for w in bound if isinstance(w, str) and w)))


def _record_pool(value: Any) -> str:
    """The `pool` of a decision record (compact JSON), "" when it has none or is no record (anything a
    tenant writes there, a nest too deep to read included: `decided_placement`)."""
    if not isinstance(value, str) or '"pool":' not in value:
        return ""
    return decided_placement(value)[0] or ""


def bound_taskrun(pod: PodState) -> tuple[str, str, str] | None:
    """(namespace, TaskRun, its uid) of a pod bound to a node, by its controller ownerReference: the pod
    store's "TaskRun" index. A released run has a bound pod only when that uid is the run's own (a pod
    labelled with a run's name is none of its pods: its label proves nothing)."""
    owner = claimed_taskrun(pod.owners)
    return (pod.namespace, owner.name, owner.uid) if pod.node_name and owner is not None else None


def run_of(pod: PodState) -> tuple[str, str, str] | None:
    """(namespace, TaskRun, its uid) of an active pod by its controller ownerReference, bound or not: the
    pod store's "run" index (a TaskRun has one pod at a time: `held_by_queue`'s another_pod)."""
    owner = claimed_taskrun(pod.owners)
    return (pod.namespace, owner.name, owner.uid) if pod.active and owner is not None else None


def gated(pod: PodState) -> bool | None:
    """The pod store's "gated" index: pods waiting for a pool slot (queue.core.GatedPod)."""
    return True if POOL_SLOT_GATE in pod.gates else None


def tolerates(pod: PodState, pool: Pool) -> bool:
    """Does the pod tolerate the pool's taint (by key and value, as the scheduler matches them)."""
    return any(key in ("", pool.taint.key) and (op == "Exists" or value == pool.name) for key, op, value in pod.tolerated)


class QueueView:
    def __init__(self, stores: Mapping[str, Store[Any, Any]], load: LoadView, policy: Callable[[], PlacementPolicy]) -> None:
        self._stores, self._load, self._policy = stores, load, policy
        self._line_summaries: dict[str, tuple[float, LineSummary]] = {}  # pool -> (when, summary)
        self._line_lock = threading.Lock()

    @property
    def _queued(self) -> dict[RunKey, QueueEntry]:
        """The runs carrying a queue entry, has_pod unset."""
        return {k: r.entry for kind in RUN_KINDS for k, r in self._stores[kind].snapshot.under("queued", True).items()}

    def queue_entries(self, pool: str | None = None) -> list[QueueEntry]:
        """The runs carrying a queue entry (of `pool`, or every pool), each with whether a pod of it is
        bound to a node (`_has_pod`). O(queued runs, and the TaskRuns claiming a queued PipelineRun)."""
        bound = self._stores["Pod"].snapshot.indexes["TaskRun"]
        return [replace(entry, has_pod=True) if self._has_pod(bound, entry) else entry
                for entry in self._queued.values() if pool is None or entry.pool == pool]

    def _has_pod(self, bound: Mapping[Any, Any], entry: QueueEntry) -> bool:
        """A TaskRun's pod is bound: a pod whose controller owner is the TaskRun, by uid. A PipelineRun's: a
        pod bound so of one of its TaskRuns, each a decided TaskRun of its namespace whose controller owner
        is the PipelineRun, by uid. A pod's labels naming the run count for nothing."""
        if entry.kind == "TaskRun":
            return (entry.namespace, entry.name, entry.uid) in bound
        if not entry.uid:
            return False
        children = self._stores["TaskRun"].snapshot.under("pipelinerun", entry.uid)
        return any(namespace == entry.namespace and record.decided and (namespace, name, record.uid) in bound
                   for (_, namespace, name), record in children.items())

    def taskrun(self, namespace: str, name: str, kind: str = "TaskRun") -> RunRecord | None:
        """The cached record of a TaskRun (or a PipelineRun: `kind`; None: not in the cache, or not yet)."""
        record: RunRecord | None = self._stores[kind].items.get((kind, namespace, name))
        return record

    def other_pods(self, namespace: str, owner: OwnerRef, name: str) -> bool:
        """Has the TaskRun `owner` names (by name and uid) an active pod other than `name` in the cache?"""
        pods = self._stores["Pod"].snapshot.under("run", (namespace, owner.name, owner.uid))
        return any(pod_name != name for _, pod_name in pods)

    def has_run_pod(self, kind: str, namespace: str, name: str, uid: str, pod_name: str = "") -> bool:
        """Has the run (`kind`, by name and uid; a TaskRun's status.podName `pod_name`) an active pod of its
        own in the cache: a pod whose controller owner is the TaskRun by uid, the one its status names once
        it names one; a PipelineRun's, a pod so of one of its decided TaskRuns (their controller owner is
        the PipelineRun, by uid). For the load picture: from then on the pod counts, not the run."""
        if kind == "PipelineRun":
            children = self._stores["TaskRun"].snapshot.under("pipelinerun", uid)
            return any(child_namespace == namespace and record.decided
                       and self.has_run_pod("TaskRun", namespace, child, record.uid, record.pod_name)
                       for (_, child_namespace, child), record in children.items())
        pods = self._stores["Pod"].snapshot.under("run", (namespace, name, uid))
        return any(not pod_name or found == pod_name for _, found in pods)

    def is_run_pod(self, namespace: str, owners: tuple[OwnerRef, ...], name: str) -> bool:
        """A pod `name` of `namespace` is a run's pod by the cache: its controller owner resolves by uid to
        a TaskRun of that namespace carrying our decision, whose status.podName, once set, is `name`
        (queue.core.is_run_pod)."""
        owner = claimed_taskrun(owners)
        record = self.taskrun(namespace, owner.name) if owner is not None else None
        return record is not None and is_run_pod(owner, record.uid, record.decided, name, record.pod_name)

    def counted_nodes(self, pool: Pool) -> list[str]:
        """The pool's nodes its queue counts slots on: eligible (Ready, schedulable) and carrying its taint."""
        names = self._load.pool_names(pool.name)
        nodes = self._stores["Node"].items
        taint = pool.taint_for()
        return [n for n in names if n in nodes and any(t.key == taint.key and t.value == taint.value for t in nodes[n].taints)]

    def counted_nodes_of(self, pool: Pool, node_pool: str) -> int:
        """The pool's counted nodes (`counted_nodes`) that Karpenter's NodePool `node_pool` made (its label)."""
        nodes = self._stores["Node"].items
        return sum(1 for n in self.counted_nodes(pool) if nodes[n].labels.get(NODEPOOL_LABEL) == node_pool)

    def pool_queue(self, pool: Pool, launching: int = 0) -> PoolQueue | None:
        """The queued pool's slots (runsPerNode on each eligible node carrying its taint; a provisioned pool's
        also on the nodes Karpenter is `launching` for it, and with none at all on one: `provisioned_nodes`)
        and the active pods of runs (`is_run_pod`: not every pod that looks like Tekton's) bound to its nodes,
        per namespace. None when the pool does not queue."""
        if pool.queue is None:
            return None
        nodes = len(self.counted_nodes(pool))
        if pool.provisioning is not None:
            nodes = provisioned_nodes(nodes, launching)
        pods = Counter(pod.namespace for pod in self.pool_pods(pool))
        return PoolQueue(pool.name, pool.queue, pool.placement, slots(pool.queue.runs_per_node, nodes), dict(pods))

    def pool_pods(self, pool: Pool) -> list[PoolPod]:
        """The active pods of runs (`is_run_pod`) bound to the pool's eligible nodes: its slots' occupants."""
        pods_by_node = self._stores["Pod"].snapshot
        return [PoolPod(pod.namespace, pod.name, pod.uid, pod.created)
                for node in self._load.pool_names(pool.name) for pod in pods_by_node.under("node", node).values()
                if pod.active and self.is_run_pod(pod.namespace, pod.owners, pod.name)]

    def gated_pods(self) -> list[GatedPod]:
        """The runs' pods waiting for a pool slot (admission gates only those: `is_run_pod`; another pod
        carrying the gate is its creator's, left alone), each with the queued pools it tolerates.
        O(gated pods)."""
        queued = [p for p in self._policy().pools if p.queue is not None]
        return [GatedPod(pod.namespace, pod.name, pod.uid, pod.created, tuple(p.name for p in queued if tolerates(pod, p)), pod.gates)
                for pod in self._stores["Pod"].snapshot.under("gated", True).values() if self.is_run_pod(pod.namespace, pod.owners, pod.name)]

    def pod(self, namespace: str, name: str) -> PodState | None:
        pod: PodState | None = self._stores["Pod"].items.get((namespace, name))
        return pod

    def queue_counts(self, pool: Pool, now: float) -> tuple[int, int, int] | None:
        """(waiting, slots, occupied) of a queued pool now; None when it does not queue. O(pods + queued runs)."""
        picture = self.pool_queue(pool)
        if picture is None:
            return None
        summary = LineSummary.of(picture, self.queue_entries(pool.name), now)
        return sum(summary.waiting.values()), summary.slots, summary.occupied

    def join_queue(self, pool: Pool, namespace: str, now: float) -> tuple[int, int, bool] | None:
        """A run of `namespace` joins `pool`'s line now: its place, the line's length, and whether a slot
        is free for it. From a summary at most QUEUE_SUMMARY_SECONDS old (rebuilt: O(pods + queued runs)),
        counted on with the runs admission queued since: O(namespaces) per call. None: no queue.
        Only admission calls it, on the event loop or in its large-review thread: the summaries have
        a lock of their own, which no relist takes."""
        with self._line_lock:
            cached = self._line_summaries.get(pool.name)
            if cached is None or now - cached[0] > QUEUE_SUMMARY_SECONDS or cached[0] > now:
                picture = self.pool_queue(pool)
                if picture is None:
                    return None
                cached = (now, LineSummary.of(picture, self.queue_entries(pool.name), now))
            summary = cached[1]
            place, length = summary.place_of_new(namespace, now)
            waiting = dict(summary.waiting)
            waiting[namespace] = waiting.get(namespace, 0) + 1
            heads = {**summary.heads, namespace: summary.heads.get(namespace, now)}
            self._line_summaries[pool.name] = (cached[0], replace(summary, waiting=waiting, heads=heads))
            return place, length, place <= summary.slots - summary.occupied

    def queued_note(self, pool_name: str, namespace: str, now: float, join: bool) -> str:
        """The Event's note for a run queued in `pool_name` now; `join` False (a dry run): it joins no line."""
        pool = self._policy().pool(pool_name)
        joined = self.join_queue(pool, namespace, now) if pool is not None and join else None
        if joined is None:
            return f"queued for pool {pool_name}"
        place, length, free = joined
        if free:
            return f"queued for pool {pool_name}: a slot is free, released shortly"
        return f"queued for pool {pool_name}, position {place} of {length}"
