"""The pool queue: hold runs while a pool is full, and let them in fairly (opt-in per pool).

A pool with a `queue` setting gets every eligible run created pending (`spec.status: TaskRunPending`
or `PipelineRunPending`) with its placement as usual and a queue entry annotation
(`egress-placer.io/queue`: pool, time, kind). The leader alone releases runs by clearing `spec.status`.

Pure: the entries, the pool's nodes and pods, the clock and the priorities are given; out come the
runs to release and why.

- Slots: `runsPerNode` summed over the pool's nodes that are Ready, schedulable and carry its taint.
- Occupied: active Tekton pods bound to the pool's nodes, plus released entries whose pod is not bound
  yet ("in flight": released, not done, no bound pod), so a burst of passes never releases twice into
  one free slot.
- Order: priority (per namespace, from the policy: a tenant can write any annotation), then
  round-robin between namespaces (turn = the namespace's occupied count plus its place in its own
  line, so fairness holds across passes and after a leader change: nothing is remembered), then first
  come, first served.
- Wait bound (`maxQueueSeconds`): a `preferred` pool releases the run at once (its pod is then sent
  to ordinary nodes, `timed_out`), a `required` pool keeps it waiting with a Warning.
- An entry whose pool no longer queues (setting removed, pool gone, or `governedBy: kueue`) is released.
- Kueue (tekton-kueue, TEP-0164) holds PipelineRuns by the same `spec.status`: a run Kueue holds
  (`held_by_kueue`) is never released by us, waits in no line of ours and takes no slot; once Kueue
  admits it, it is ours to release like any other (docs/coexistence.md, "Kueue").
"""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Callable, Iterable, Literal, Mapping, Sequence

from pydantic import Field, PositiveInt

from controller.core.egress import parse_duration
from controller.core.json_wire import decode
from controller.core.model import POOL_SLOT_GATE, OwnerRef, owner_refs
from controller.core.schema import PolicyModel

QUEUE_ANNOTATION = "egress-placer.io/queue"
# On the pods of a PipelineRun's TaskRuns (Tekton copies a TaskRun's labels onto its pod). The TaskRun's creator
# writes it and it names no uid: no decision of the queue, of admission or of the load picture reads it
# (`claimed_pipelinerun`, `held_by_queue`; the load picture settles a PipelineRun through owners, by uid).
PIPELINERUN_LABEL = "tekton.dev/pipelineRun"
PENDING = {"TaskRun": "TaskRunPending", "PipelineRun": "PipelineRunPending"}
CANCELLED = frozenset({"TaskRunCancelled", "Cancelled", "CancelledRunFinally", "StoppedRunFinally"})
MAX_PRIORITY_ENTRIES = 64
# tekton-kueue's webhook labels every PipelineRun it holds with its LocalQueue; its controller makes a Workload
# (kueue.x-k8s.io) whose controller ownerReference is the run, and clears spec.status when Kueue admits it.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/namespaces/{namespace}/workloads"
GOVERNED_BY_KUEUE = "kueue"
KUEUE_WORKLOAD_WAIT_SECONDS = 60.0  # a labelled run with no Workload this long after it was queued: a Warning


class NamespacePriority(PolicyModel):
    """Runs of these namespaces are released before those of lower priority."""

    namespaces: Annotated[tuple[Annotated[str, Field(min_length=1, max_length=253)], ...], Field(min_length=1, max_length=256)] = Field(
        description="Namespace name globs (fnmatch: * ? [abc])."
    )
    priority: Annotated[int, Field(ge=-1000, le=1000)] = Field(
        description="Higher is released first; namespaces matched by no entry have 0. -1000 to 1000."
    )


class QueueSetting(PolicyModel):
    """A pool's queue: at most `runsPerNode` runs at once on each of its nodes; the others wait."""

    runs_per_node: PositiveInt = Field(
        description="Runs at once on each Ready, tainted node of the pool (at least 1); the others wait, pending."
    )
    max_queue_seconds: Annotated[int, Field(ge=1, le=7 * 24 * 3600)] = Field(
        default=3600,
        description="The longest wait (seconds, default 3600). Past it, a run of a preferred pool is "
        "released to ordinary nodes; one of a required pool keeps waiting, with a Warning Event.",
    )
    priorities: Annotated[tuple[NamespacePriority, ...], Field(max_length=MAX_PRIORITY_ENTRIES)] = Field(
        default=(),
        description="Release priority per namespace (the first entry whose globs match wins). Then "
        "round-robin between namespaces, then first come, first served.",
    )
    governed_by: Literal["egress-placer", "kueue"] = Field(
        default="egress-placer",
        description="Who queues the pool's runs. egress-placer (default): runs are created pending and released "
        "by egress-placer. kueue: Kueue with tekton-kueue does (docs/coexistence.md): egress-placer creates no run "
        "pending and releases none; the pool's pods still wait for a free slot (runsPerNode per node) when it is full.",
    )

    def priority_of(self, namespace: str) -> int:
        for entry in self.priorities:
            if any(fnmatchcase(namespace, glob) for glob in entry.namespaces):
                return entry.priority
        return 0


# -- the entry annotation ----------------------------------------------------------------------------


def format_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str) -> float | None:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()


def entry_annotation(pool: str, kind: str, queued_at: float, budgets: Sequence[str] = (), address: str = "") -> str:
    """`budgets`: the Enforce destinations of the pool the run touches (egress budgets, docs/budgets.md):
    the leader releases it only when each has room. `address`: the egress address the leader released it
    to (written with the release): its pod goes behind it when it still has room there."""
    data: dict[str, Any] = {"pool": pool, "kind": kind, "time": format_time(queued_at)}
    if budgets:
        data["budgets"] = list(budgets)
    if address:
        data["address"] = address
    return json.dumps(data, separators=(",", ":"))


@dataclass(frozen=True)
class EntryMark:
    """What the annotation says: the pool, the kind of run it was written on, when."""

    pool: str
    kind: str
    queued_at: float
    budgets: tuple[str, ...] = ()
    address: str = ""  # the egress address the leader released it to (egress budgets)


MAX_ADDRESS_CHARS = 253


def read_entry(value: Any, kind: str) -> EntryMark | None:
    """The entry in an annotation value, if it is one written on a run of `kind` (a PipelineRun's entry
    copied by Tekton onto its TaskRuns and pods is not theirs). None for anything else."""
    if not isinstance(value, str) or not value:
        return None
    try:
        data = decode(value)
    except (ValueError, RecursionError):  # anyone writes annotations: a deep nest is no entry, not a crash
        return None
    if not isinstance(data, dict):
        return None
    pool, written_on, when = data.get("pool"), data.get("kind"), data.get("time")
    if not isinstance(pool, str) or not pool or written_on != kind or not isinstance(when, str):
        return None
    queued_at = parse_time(when)
    names = data.get("budgets")
    budgets = tuple(n for n in names if isinstance(n, str))[:64] if isinstance(names, list) else ()
    address = data.get("address")
    address = address if isinstance(address, str) and len(address) <= MAX_ADDRESS_CHARS else ""
    return None if queued_at is None else EntryMark(pool, written_on, queued_at, budgets, address)


MAX_DECISION_CHARS = 256 * 1024  # admission's record is a few KiB; a longer value is none of ours


def decided_placement(value: Any) -> tuple[str | None, str | None]:
    """(pool, node) admission's decision record (`egress-placer.io/decision`, JSON) names; None for none,
    and both None for anything that is not a record."""
    if not isinstance(value, str) or not value or len(value) > MAX_DECISION_CHARS:
        return None, None
    try:
        data = decode(value)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    pool, node = data.get("pool"), data.get("node")
    pool = pool if isinstance(pool, str) and pool else None
    return pool, node if pool and isinstance(node, str) and node else None


def decided_pool(value: Any) -> str | None:
    """The pool admission's decision record names; None for none, and for anything that is not a record."""
    return decided_placement(value)[0]


def compact_decision(value: Any) -> str:
    """What the run and pod caches keep of a decision record: its pool and node (`{"pool":...,"node":...}`,
    the node when there is one), "" for none."""
    pool, node = decided_placement(value)
    if not pool:
        return ""
    return json.dumps({"pool": pool, "node": node} if node else {"pool": pool}, separators=(",", ":"))


def admitted_entry(mark: EntryMark | None, decision: Any) -> bool:
    """Is a run's queue entry admission's own: its pool is the one admission's decision record on the
    same run names. Admission writes both at CREATE (and removes an entry it did not write); the run
    guard keeps tenants from adding or changing either afterwards. An entry stored while the webhook
    was unreachable (failurePolicy Ignore), or in a namespace the webhook skips, has no decision of
    ours beside it: it is no entry."""
    return mark is not None and decided_pool(decision) == mark.pool


def read_any_entry(annotations: Mapping[str, str]) -> EntryMark | None:
    """The entry a pod carries (copied from its TaskRun, or from a coscheduled PipelineRun)."""
    value = annotations.get(QUEUE_ANNOTATION)
    return read_entry(value, "TaskRun") or read_entry(value, "PipelineRun")


# -- a run's pods -------------------------------------------------------------------------------------


def _claimed(owners: Iterable[OwnerRef], kind: str) -> OwnerRef | None:
    """The controller ownerReference, when it names a `tekton.dev/*` object of `kind` with a name and a uid."""
    owner = next((o for o in owners if o.controller), None)  # at most one: the API server refuses two
    if owner is None or owner.kind != kind or not owner.api_version.startswith("tekton.dev/"):
        return None
    return owner if owner.name and owner.uid else None


def claimed_taskrun(owners: Iterable[OwnerRef]) -> OwnerRef | None:
    """The TaskRun a pod's controller ownerReference names (`tekton.dev/*`, kind TaskRun, with a name and
    a uid), as Tekton writes it on the pods it makes. A claim: anyone who may create a pod writes any
    ownerReference, so it proves nothing until `is_run_pod` resolves it."""
    return _claimed(owners, "TaskRun")


def claimed_pipelinerun(owners: Iterable[OwnerRef]) -> OwnerRef | None:
    """The PipelineRun a TaskRun's controller ownerReference names, as Tekton writes it on the TaskRuns
    of a PipelineRun. A claim (a tenant writes its TaskRun's ownerReferences): see `held_by_queue`.
    The `tekton.dev/pipelineRun` label, which Tekton also copies onto the pods, is never read: it is
    the TaskRun creator's to write, and names no uid."""
    return _claimed(owners, "PipelineRun")


def is_run_pod(owner: OwnerRef | None, run_uid: str | None, run_decided: bool, pod_name: str = "", run_pod_name: str = "") -> bool:
    """Is a pod a run's pod: its claimed TaskRun (`claimed_taskrun`), looked up by name in the pod's own
    namespace, exists with the uid the claim names (uids are the API server's: a made-up or copied one
    does not match), carries admission's decision (written at CREATE; the run guard keeps tenants
    from adding it later), and, once Tekton has named the run's pod (`status.podName`, `run_pod_name`), is
    that pod (`pod_name`). `run_uid` None: no such TaskRun (not in the cache, not found by a read).

    `status` is a subresource of Tekton's run CRDs: a CREATE drops it, and `edit` (with Tekton's
    `tekton-aggregate-edit`, which grants `taskruns`, not `taskruns/status`) cannot write it; Tekton's
    controller alone does. Before it names the pod (the pod's own CREATE; a retry clears it first, and a
    pod Tekton makes again after a deletion takes the same name) the uid and the decision decide."""
    if owner is None or not run_uid or run_uid != owner.uid or not run_decided:
        return False
    return not run_pod_name or run_pod_name == pod_name


# -- the picture the leader sees ---------------------------------------------------------------------


@dataclass(frozen=True)
class QueueEntry:
    """A run carrying our queue entry, as the informers see it."""

    kind: str
    namespace: str
    name: str
    pool: str
    queued_at: float
    pending: bool  # spec.status is still the pending value
    done: bool = False  # finished or cancelled
    has_pod: bool = False  # a pod of the run is bound to a node
    uid: str = ""
    kueue_label: bool = False  # carries tekton-kueue's LocalQueue label (KUEUE_QUEUE_LABEL)
    kueue_held: bool = False  # `held_by_kueue`: by its label alone, until a pass looks at its Workload
    budgets: tuple[str, ...] = ()  # the Enforce destinations it waits for (egress budgets, docs/budgets.md)
    address: str = ""  # the egress address the leader released it to ("": none)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)

    @property
    def waiting(self) -> bool:
        """Waiting in our line: pending, not done, and not held by Kueue (which releases it, not us)."""
        return self.pending and not self.done and not self.kueue_held


class ReleaseReason(str, Enum):
    SLOT = "slot"  # a slot is free
    TIMEOUT = "timeout"  # waited past maxQueueSeconds on a preferred pool: to ordinary nodes
    UNQUEUED = "unqueued"  # the pool no longer queues (setting removed, pool gone)
    BUDGET = "budget"  # every egress budget it touches has room (a pool without a queue: docs/budgets.md)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Release:
    entry: QueueEntry
    reason: ReleaseReason


@dataclass(frozen=True)
class PoolQueue:
    """One queued pool at one moment: its setting and placement, slots and what occupies them."""

    pool: str
    setting: QueueSetting
    placement: str  # required | preferred
    slots: int
    # Active Tekton pods bound to the pool's nodes, per namespace (they occupy slots and count in the
    # round-robin turn of their namespace).
    pods_by_namespace: Mapping[str, int] = field(default_factory=dict)

    @property
    def pool_pods(self) -> int:
        return sum(self.pods_by_namespace.values())


@dataclass(frozen=True)
class Plan:
    """What the leader does now: releases in order, runs that waited too long on a required pool, and
    the waiting line in release order (for positions and `status`)."""

    releases: tuple[Release, ...] = ()
    overdue: tuple[QueueEntry, ...] = ()
    line: tuple[QueueEntry, ...] = ()
    occupied: int = 0
    slots: int = 0


# -- Kueue ---------------------------------------------------------------------------------------------

# What one look at a namespace's Workloads found: the uid of the PipelineRun each is owned by -> admitted.
Workloads = Mapping[str, bool]


def workload_of(obj: Mapping[str, Any]) -> tuple[str, bool] | None:
    """(the PipelineRun's uid, admitted) of a Workload tekton-kueue made for a PipelineRun: its controller
    ownerReference names a `tekton.dev/*` PipelineRun by uid; admitted: its Admitted condition is True.
    None for any other Workload. Only Kueue's controllers write Workloads: its roles aggregate to its own
    `batch-user`/`batch-admin` labels, not to `edit`, so no tenant forges one."""
    claim = claimed_pipelinerun(owner_refs(obj.get("metadata")))
    if claim is None:
        return None
    status = obj.get("status")
    conditions = (status.get("conditions") if isinstance(status, Mapping) else None) or []
    admitted = any(isinstance(c, Mapping) and c.get("type") == "Admitted" and c.get("status") == "True" for c in conditions)
    return claim.uid, admitted


def held_by_kueue(entry: QueueEntry, workloads: Workloads | None) -> bool:
    """Does Kueue hold this run, so that we must not clear its `spec.status` (tekton-kueue stops a run
    released without an admitted Workload: docs/coexistence-design.md, fact 2)?

    Only a pending PipelineRun can be held (TEP-0164 queues no TaskRun). Then, by the Workload owned by its
    uid (`workloads`: one look at its namespace's, None when that look failed):
    - a Workload, not admitted: held, whatever the run's labels say (a tenant removing the LocalQueue label
      from its run does not make us release it);
    - a Workload, admitted: not held; Kueue let it go, and it waits for one of our slots like any other;
    - no Workload: held while the run carries tekton-kueue's LocalQueue label (its controller makes the
      Workload a moment after CREATE); not held without it;
    - the look failed: held (never release on doubt; the next pass looks again).
    A tenant's own label only keeps its own run waiting: a held run waits in no line and takes no slot,
    so it neither gains a slot nor stops the runs behind it."""
    if not kueue_may_hold(entry):
        return False
    if workloads is None:
        return True
    admitted = workloads.get(entry.uid) if entry.uid else None
    if admitted is not None:
        return not admitted
    return entry.kueue_label


def kueue_workload_missing(entry: QueueEntry, workloads: Workloads | None, now: float, wait: float) -> bool:
    """Is the run held by tekton-kueue's label alone (`held_by_kueue`: no Workload owns it) `wait` seconds or
    more after it was queued? tekton-kueue makes the Workload a moment after CREATE; one that never comes means
    tekton-kueue is not running, or does not handle the namespace, or the label is the tenant's own: the run
    would wait unseen for ever (we never release a run Kueue may hold), so the leader says so (a Warning).
    False when the look failed (`workloads` None): nothing is known."""
    if workloads is None or not entry.kueue_label or not kueue_may_hold(entry):
        return False
    return not (entry.uid and entry.uid in workloads) and now - entry.queued_at >= wait


def kueue_may_hold(entry: QueueEntry) -> bool:
    """Is it worth looking at the Workloads of the entry's namespace: a pending, unfinished PipelineRun."""
    return entry.kind == "PipelineRun" and entry.pending and not entry.done


def slots(runs_per_node: int, nodes: int) -> int:
    return max(0, runs_per_node) * max(0, nodes)


# -- Karpenter: the nodes a provisioned pool's queue counts ---------------------------------------------

NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
NODEPOOL_LABEL = "karpenter.sh/nodepool"  # Karpenter's label on a NodePool's NodeClaims and Nodes


def launching(claims: Iterable[Mapping[str, Any]], node_selector: Mapping[str, str], counted: int) -> int:
    """The nodes Karpenter is launching for a provisioned pool: its NodePool's NodeClaims (the caller lists
    those) that carry every label of the pool's nodeSelector (copied from the NodePool's template: a node made
    from a template without them is no pool member) and are not being deleted, less the NodePool's nodes the
    queue already counts (`counted`: Ready, tainted, labelled karpenter.sh/nodepool with it). Not matched by
    name: a NodeClaim names its Node only once registered, and a Node may be Ready before that (seen with the
    KWOK provider: counted twice, 4 runs went onto one node of 2 slots). NodeClaims are cluster-scoped and
    Karpenter's: no tenant writes one."""
    live = 0
    for claim in claims:
        meta = claim.get("metadata") if isinstance(claim, Mapping) else None
        if not isinstance(meta, Mapping) or meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
        if all(labels.get(k) == v for k, v in node_selector.items()):
            live += 1
    return max(0, live - max(0, counted))


def provisioned_nodes(ready: int, launching_now: int) -> int:
    """The nodes a provisioned pool's queue counts slots on: its Ready, tainted nodes plus the ones launching;
    with none at all, one: the node the first runsPerNode released runs bring up (their pods are the demand
    Karpenter provisions for; queued runs make no pod, so with 0 slots nothing would ever bring a node up)."""
    return max(1, max(0, ready) + max(0, launching_now))


def timed_out(queued_at: float, setting: QueueSetting, now: float) -> bool:
    return now - queued_at >= setting.max_queue_seconds


def in_flight(entry: QueueEntry, queue: PoolQueue, now: float) -> bool:
    """Released, not done, and no pod bound yet: it will take a slot (a preferred pool's run released
    past its wait goes to ordinary nodes: it takes none)."""
    if entry.pending or entry.done or entry.has_pod:
        return False
    return not (queue.placement == "preferred" and timed_out(entry.queued_at, queue.setting, now))


def release_order(waiting: Sequence[QueueEntry], priority: Callable[[str], int], occupied: Mapping[str, int]) -> list[QueueEntry]:
    """Waiting entries in release order: priority (higher first), then round-robin between namespaces
    (turn = the namespace's occupied count + its place in its own line), then the namespace whose
    oldest waiting run came first, then first come, first served."""
    by_namespace: dict[str, list[QueueEntry]] = {}
    for entry in sorted(waiting, key=lambda e: (e.queued_at, e.name, e.kind)):
        by_namespace.setdefault(entry.namespace, []).append(entry)
    keyed = []
    for namespace, line in by_namespace.items():
        head = line[0].queued_at
        for turn, entry in enumerate(line):
            keyed.append(((-priority(namespace), occupied.get(namespace, 0) + turn, head, namespace, turn), entry))
    keyed.sort(key=lambda k: k[0])
    return [entry for _, entry in keyed]


def plan(queue: PoolQueue, entries: Iterable[QueueEntry], now: float) -> Plan:
    """The releases for one queued pool now. `entries`: this pool's entries (waiting and released). A pool
    Kueue governs steps aside: what still waits in our line (queued before the setting) is let go."""
    entries = list(entries)
    flying = [e for e in entries if in_flight(e, queue, now)]
    occupied = queue.pool_pods + len(flying)
    if queue.setting.governed_by == GOVERNED_BY_KUEUE:
        return Plan(release_all(entries), (), (), occupied, queue.slots)
    turns: dict[str, int] = dict(queue.pods_by_namespace)
    for e in flying:
        turns[e.namespace] = turns.get(e.namespace, 0) + 1
    waiting = [e for e in entries if e.waiting]
    releases: list[Release] = []
    overdue: list[QueueEntry] = []
    still: list[QueueEntry] = []
    for e in waiting:
        if timed_out(e.queued_at, queue.setting, now):
            if queue.placement == "preferred":
                releases.append(Release(e, ReleaseReason.TIMEOUT))
                continue
            overdue.append(e)
        still.append(e)
    line = release_order(still, queue.setting.priority_of, turns)
    free = max(0, queue.slots - occupied)
    for e in line[:free]:
        releases.append(Release(e, ReleaseReason.SLOT))
    released = {r.entry.key for r in releases}
    rest = tuple(e for e in line if e.key not in released)
    return Plan(tuple(releases), tuple(e for e in overdue if e.key not in released), rest, occupied, queue.slots)


@dataclass(frozen=True)
class GatedPod:
    """A pod admission gated (POOL_SLOT_GATE): a run's pod on a queued pool whose run carries no entry
    of ours (its owner, tekton-kueue or Pipelines-as-Code created it pending and released it). It waits,
    taking no slot, for a free slot in every queued pool it tolerates (a tenant may add tolerations to
    a pod: one more pool only makes it wait longer)."""

    namespace: str
    name: str
    uid: str
    created: str  # creationTimestamp (RFC 3339: sorts as text)
    pools: tuple[str, ...]
    gates: tuple[str, ...] = (POOL_SLOT_GATE,)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def held_by_queue(
    own: QueueEntry | None, claim: OwnerRef | None, pipelinerun_uid: str | None, pipelinerun: QueueEntry | None, another_pod: bool = False
) -> bool:
    """Is a run's pod's run one our queue holds (its slot was counted when the queue released it, so its
    pod is not gated): its TaskRun (`is_run_pod`) carries our entry (`own`), or the TaskRun's controller
    owner (`claimed_pipelinerun`) resolves by uid to a PipelineRun of its namespace (`pipelinerun_uid`:
    the cached one's uid, None when there is none) carrying our entry; either run released by the queue
    and not finished (a held run has no pod and no TaskRuns yet, a finished one makes no more); and the
    TaskRun has no other active pod (`another_pod`): Tekton makes one pod at a time for a TaskRun.

    A run's uid is no secret to its namespace: a tenant may write it into a bare pod's (or, a
    PipelineRun's, another TaskRun's) controller ownerReference. Such a pod passes only while the run
    is released, running and without a pod of its own yet: at most the one slot the release counted."""
    if another_pod:
        return False
    if own is not None:
        return not own.pending and not own.done
    return (
        claim is not None and bool(pipelinerun_uid) and pipelinerun_uid == claim.uid
        and pipelinerun is not None and not pipelinerun.pending and not pipelinerun.done
    )


def gates_pod(queues: bool, ours: bool) -> bool:
    """Is a run's pod placed on a pool gated at CREATE: the pool queues and the run is not one our queue
    holds (it carries no entry of ours). The reconciler lets it in when a slot frees (`ungate`); one
    of our released runs already took its slot in the plan (in flight)."""
    return queues and not ours


def ungate(free: Mapping[str, int], gated: Iterable[GatedPod]) -> tuple[GatedPod, ...]:
    """The gated pods to let in now, oldest first: each when every queued pool it tolerates has a free
    slot left (`free`: slots minus occupied, after this pass's releases), taking one in each. A pod that
    tolerates no queued pool (the pool no longer queues) is let in."""
    left = dict(free)
    out = []
    for pod in sorted(gated, key=lambda p: (p.created, p.namespace, p.name)):
        if all(left.get(pool, 0) > 0 for pool in pod.pools):
            for pool in pod.pools:
                left[pool] -= 1
            out.append(pod)
    return tuple(out)


@dataclass(frozen=True)
class PoolPod:
    """A run's pod (`is_run_pod`) bound to a node of a queued pool: it takes one of the pool's slots."""

    namespace: str
    name: str
    uid: str
    created: str  # creationTimestamp (RFC 3339: sorts as text)


def over_cap(pods: Iterable[PoolPod], slots: int) -> tuple[PoolPod, ...]:
    """The runs' pods bound to a queued pool beyond its slots, newest first (creationTimestamp, then name):
    the ones that came in past the cap. The queue releases into free slots only and admission gates the
    others, so a pod gets here when it was made while the webhook did not answer (failurePolicy Ignore:
    the pod of a run its owner released then was not gated, and its TaskRun's pod template already
    tolerates the pool), or when the pool lost nodes (fewer slots than running pods). Nothing a tenant
    writes puts one here while the webhook answers."""
    ordered = sorted(pods, key=lambda p: (p.created, p.namespace, p.name), reverse=True)
    return tuple(ordered[: max(0, len(ordered) - max(0, slots))])


def release_all(entries: Iterable[QueueEntry]) -> tuple[Release, ...]:
    """Every waiting entry of a pool that no longer queues."""
    return tuple(Release(e, ReleaseReason.UNQUEUED) for e in sorted(entries, key=lambda e: (e.queued_at, e.key)) if e.waiting)


@dataclass(frozen=True)
class LineSummary:
    """A queued pool's line in counts (what admission needs to tell a new run its place, in
    O(namespaces)): per namespace the runs waiting, the time of its oldest, and the slots it occupies."""

    setting: QueueSetting
    slots: int
    occupied: int
    waiting: Mapping[str, int] = field(default_factory=dict)
    heads: Mapping[str, float] = field(default_factory=dict)
    occupied_by_namespace: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, queue: PoolQueue, entries: Iterable[QueueEntry], now: float) -> "LineSummary":
        waiting: dict[str, int] = {}
        heads: dict[str, float] = {}
        occupied = dict(queue.pods_by_namespace)
        for e in entries:
            if e.waiting:
                waiting[e.namespace] = waiting.get(e.namespace, 0) + 1
                heads[e.namespace] = min(heads.get(e.namespace, e.queued_at), e.queued_at)
            elif in_flight(e, queue, now):
                occupied[e.namespace] = occupied.get(e.namespace, 0) + 1
        return cls(queue.setting, queue.slots, sum(occupied.values()), waiting, heads, occupied)

    def place_of_new(self, namespace: str, queued_at: float) -> tuple[int, int]:
        """(1-based place, line length) of a run of `namespace` joining the line now (it is the newest
        of its namespace), by the same order as `release_order`."""
        mine = self.setting.priority_of(namespace)
        turn = self.occupied_by_namespace.get(namespace, 0) + self.waiting.get(namespace, 0)
        head = self.heads.get(namespace, queued_at)
        ahead = 0
        for other, count in self.waiting.items():
            theirs = self.setting.priority_of(other)
            if theirs != mine:
                ahead += count if theirs > mine else 0
                continue
            first = self.occupied_by_namespace.get(other, 0)  # the turn of its first waiting run
            before = max(0, min(count, turn - first))  # its runs with a smaller turn
            if other != namespace and first <= turn < first + count and (self.heads[other], other) < (head, namespace):
                before += 1  # the one at the same turn, of a namespace whose oldest came first
            ahead += before
        return ahead + 1, sum(self.waiting.values()) + 1


def position(line: Sequence[QueueEntry], key: tuple[str, str, str]) -> int | None:
    """1-based place of the run in the waiting line, None when not in it."""
    for i, entry in enumerate(line):
        if entry.key == key:
            return i + 1
    return None


TEKTON_DEFAULT_PIPELINE_TIMEOUT = 3600.0  # config-defaults default-timeout-minutes: 60


def pipeline_timeout_problem(timeouts: Any, pool: str, setting: QueueSetting) -> str:
    """Why a PipelineRun's own timeout may run out while one of its tasks waits in `pool`'s queue ("":
    it will not). Tekton starts that clock when the PipelineRun starts, so a queued task's wait counts."""
    value = timeouts.get("pipeline") if isinstance(timeouts, Mapping) else None
    try:
        seconds = TEKTON_DEFAULT_PIPELINE_TIMEOUT if value is None else parse_duration(value)
    except ValueError:
        return ""
    if seconds <= 0 or seconds > setting.max_queue_seconds:  # 0: no timeout
        return ""
    shown = "the default 1h" if value is None else str(value)
    return (
        f"its pipeline timeout ({shown}) is not longer than pool {pool}'s maxQueueSeconds ({setting.max_queue_seconds}s): "
        "a task waiting in that queue counts against it (docs/queue.md)"
    )


@dataclass(frozen=True)
class RunFacts:
    """What the informers keep of a TaskRun or PipelineRun for the queue."""

    kind: str
    namespace: str
    name: str
    uid: str = ""
    entry: str | None = None  # the queue annotation's value
    spec_status: str = ""
    done: bool = False  # Succeeded condition True or False
    decision: str | None = None  # admission's decision record (its pool must be the entry's)
    kueue_label: bool = False  # tekton-kueue's LocalQueue label (KUEUE_QUEUE_LABEL) is on the run

    def queue_entry(self, has_pod: bool) -> QueueEntry | None:
        mark = read_entry(self.entry, self.kind)
        if mark is None or not admitted_entry(mark, self.decision):
            return None
        pending = self.spec_status == PENDING.get(self.kind)
        done = self.done or self.spec_status in CANCELLED
        labelled = self.kind == "PipelineRun" and self.kueue_label
        # Held by Kueue as far as the run itself tells (its label): what admission's line summary counts on; the
        # leader's pass decides with the run's Workload (`held_by_kueue`).
        return QueueEntry(self.kind, self.namespace, self.name, mark.pool, mark.queued_at, pending, done, has_pod, self.uid,
                          kueue_label=labelled, kueue_held=labelled and pending and not done, budgets=mark.budgets,
                          address=mark.address)
