"""AdmissionReview v1 in, AdmissionReview v1 out: where Tekton runs and pods are placed.

Everything is answered from memory (`ClusterState` and the pure core): no API call, no I/O on
this path, but for one read the server makes off the event loop (a pod's TaskRun the cache lacks:
`OwnerReadNeeded`). `Admission.review` never raises for a well-formed review: an internal error admits the
object unchanged with a warning (fail-open). A malformed review raises `MalformedReview`, which
the server turns into HTTP 400.

- TaskRun CREATE: decide from the run's images; place into `spec.podTemplate` (pool toleration,
  pool affinity, the least-loaded node preferred) or strip a pool placement the user copied in.
  Coscheduled TaskRuns (affinity assistant) never get a placement added here; a TaskRun is one only when
  Tekton's controller makes it (the request's user) for a PipelineRun our admission moved whole to a pool
  (`_moved_whole`), and keeps that pool only. Any other is an ordinary run: Tekton's marks are anyone's.
- PipelineRun CREATE: a per-task summary. Coscheduled runs are moved whole to a pool through
  `taskRunTemplate.podTemplate` (v1; `spec.podTemplate` in v1beta1) when their tasks agree on one.
- DaemonSet CREATE and UPDATE (`admission.daemonset`): a node agent's pod template tolerates every
  pool taint, so the DaemonSet controller makes its pods on pool nodes too.
- Pod CREATE: Tekton pods are placed again with fresh load (their images are final), when they are
  a run's pods: their controller ownerReference resolves by uid to a TaskRun of the pod's namespace
  carrying our decision (`queue.core.is_run_pod`; a TaskRun not in the cache yet is read from the API
  server: see `OwnerReadNeeded`); a pod that only looks like Tekton's is any other pod. Node agents
  (pods of a real DaemonSet of an agent namespace, resolved by uid in the cache) tolerate every pool
  taint (kube-system's pods do not reach this webhook: their DaemonSets' templates carry it); kubelets' mirror pods are left alone; a coscheduled
  run's pod and its affinity assistant keep only the pool their PipelineRun was moved to whole (`_moved_whole`,
  `_assistant_of`); any other pod loses pool tolerations and pool constraints, and a `nodeName` of a pool
  node its namespace may not use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, NamedTuple

from loguru import logger

from controller.admission.daemonset import admit_daemonset, is_daemonset
from controller.admission.review import (
    MalformedReview,
    Patch,
    Request,
    annotation_ops,
    encode,
    is_object,
    ops_at,
    parse_review,
    pointer,
    review_response,
    text,
    value_at,
    with_namespace,
)
from controller.agents.core import agent_tolerations
from controller.budgets.core import (
    BUDGETS_ANNOTATION,
    REPORT_ONLY,
    RunFacts,
    full_nodes,
    holding,
    match,
    narrow,
    record_annotation,
    taskrun_facts,
    verdict,
)
from controller.core.admission_policy import service_account_user
from controller.core.decide import decide
from controller.core.images import WHOLE_RUN, is_tekton_pod, pipelinerun_images, pod_images, taskrun_images
from controller.admission.events import EventsOnCreation
from controller.admission.memo import Memo, json_key
from controller.intruders.core import Agent, daemonset_agent, is_mirror_pod, refused_pool
from controller.core.model import (
    DECISION_ANNOTATION,
    PLACEMENT_ANNOTATION,
    REVIEW_ANNOTATION,
    Decision,
    ImageSet,
    MeasuredMatch,
    NamespaceState,
    NodeLoad,
    OwnerRef,
    Reason,
)
from controller.core.patches import (
    json_patch,
    over_default,
    place,
    placement_key,
    preferred_node,
    protection,
    tolerates,
    unplace,
    with_default,
    with_placement,
)
from controller.core.policy import PlacementPolicy, Pool
from controller.load.core import ledger_key
from controller.queue.core import (
    GOVERNED_BY_KUEUE,
    PENDING,
    POOL_SLOT_GATE,
    claimed_pipelinerun,
    claimed_taskrun,
    decided_placement,
    gates_pod,
    held_by_queue,
    is_run_pod,
    QUEUE_ANNOTATION,
    entry_annotation,
    pipeline_timeout_problem,
    read_any_entry,
    read_entry,
    timed_out,
)
from controller.queue.view import RunRecord
from controller.suggest.core import pod_group, taskrun_group
from controller.metrics import ERROR, MUTATED, UNCHANGED, Metrics
from controller.settings import Settings
from controller.state import ClusterState

AFFINITY_ASSISTANT_ANNOTATION = "pipeline.tekton.dev/affinity-assistant"
TASK_LABEL = "tekton.dev/task"  # on a run's pod: its Task's name (the TaskRun creator's to write)
COMPONENT_LABEL, AFFINITY_ASSISTANT_COMPONENT = "app.kubernetes.io/component", "affinity-assistant"
MAX_IMAGES_IN_ANNOTATION = 20
TEKTON_CONTROLLER = "tekton-pipelines-controller"  # Tekton's controller ServiceAccount, in settings.tekton_namespace
# Tekton's `coschedule` feature flag (feature-flags ConfigMap).
WARNING_REASONS = {Reason.UNRESOLVED: "Unresolved", Reason.UNKNOWN_POOL: "UnknownPool"}
_SPEC_PLACEMENT_FIELDS = ("tolerations", "affinity")
MEMO_SIZE = 1024  # entries of each memo of a pure step (admission.memo)


@dataclass(frozen=True)
class Placement:
    """What happens to a pod template: the new template, where it sends the pod, and why not."""

    template: dict[str, Any]
    pool: str | None = None
    node: str | None = None
    # The chosen node's load and the least loaded others' (load.view.LOADS_SHOWN at most), before this run.
    loads: Mapping[str, NodeLoad] = field(default_factory=dict)
    note: str = ""  # why the decision's pool was not (or not wholly) applied
    more_nodes: int = 0  # eligible nodes of the pool not in `loads`
    # Sent to a provisioned pool that has no ready node (no node named): its pod is the demand the provisioner
    # brings a node up for. Queued and gated all the same when the pool queues (`queued`): its queue counts
    # the nodes being launched, and one node's runs while there are none (queue.core.provisioned_nodes).
    provisioned: bool = False
    queued: bool = False

    @property
    def capped(self) -> str | None:
        """The pool whose queue or slot gate applies: one with a node chosen, or a queued pool being
        provisioned (None: none)."""
        return self.pool if self.node or (self.provisioned and self.queued) else None




class Reviewed(NamedTuple):
    """An AdmissionReview response, and what its review left for after it is sent (`Admission.review_deferred`)."""

    response: dict[str, Any]
    later: Sequence[Callable[[], None]] = ()

    def finish(self) -> None:
        """Count the review's metrics and hold its Events, once. Never raises: a failed step is logged."""
        for step in self.later:
            try:
                step()
            except Exception:  # noqa: BLE001 - bookkeeping never fails a review that was answered
                logger.opt(exception=True).error("admission bookkeeping failed")
        if type(self.later) is list:
            # The steps hold the request, which holds this list (`Request.later`): emptied, the request and
            # its body are freed at once, not left to the cycle collector (its pauses were the p99).
            self.later.clear()


@dataclass(frozen=True)
class ReadOwner:
    """A TaskRun read from the API server for one review: `record` None when it does not exist or the
    read failed (the pod is then no run's pod)."""

    namespace: str
    name: str
    record: RunRecord | None


class OwnerReadNeeded(Exception):
    """A pod claims a TaskRun owner the cache does not have (or has with another uid): the informer may
    lag behind Tekton, which makes the pod right after the TaskRun. Raised before any side effect; the
    server reads the TaskRun off the event loop (`Admission.read_owner`, bounded) and reviews again with
    `ReadOwner`."""

    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"TaskRun {namespace}/{name} not in the cache")
        self.namespace, self.name = namespace, name


class Admission:
    """Answers AdmissionReviews for TaskRuns, PipelineRuns and Pods from the cluster state in memory.

    Tekton's `coschedule` feature flag comes from the state (its informer keeps it current);
    "workspaces", Tekton's default, while it is unknown. So does Tekton's default pod template, which
    placement of a run's template keeps (see `core.patches.over_default`).
    Each decision's Event goes to `events` with the review's uid, which the patch writes into the
    object (`egress-placer.io/review`): the Event is sent once the object exists.
    `clock` only times the requests for `metrics.admission_seconds`; `wall` dates queue entries.

    A pool with a queue setting (queue.core): its runs are created pending, with their placement and
    a queue entry annotation; the leader releases them (queue.reconcile). A run the user created
    pending (or cancelled) is left alone. A Tekton pod of a run that waited past its pool's
    maxQueueSeconds on a preferred pool goes to ordinary nodes.
    """

    def __init__(
        self,
        state: ClusterState,
        metrics: Metrics,
        events: EventsOnCreation,
        settings: Settings,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
        read_taskrun: Callable[[str, str], Mapping[str, Any] | None] | None = None,
    ) -> None:
        self.state = state
        self._read_taskrun = read_taskrun  # None: no reads, the cache alone says (tests, benchmarks)
        self.metrics = metrics
        self.events = events
        self.settings = settings
        self.clock = clock
        self.wall = wall
        # Each decision's debug line only when the log level lets it out: no per-review logger binding otherwise.
        self._debug = settings.log_level.upper() in ("TRACE", "DEBUG")
        # The pure steps every review repeats, memoised (admission.memo): most reviews of a burst are one Task's.
        self._images: Memo[ImageSet] = Memo(MEMO_SIZE)
        self._decisions: Memo[tuple[NamespaceState | None, Decision]] = Memo(MEMO_SIZE)
        self._templates: Memo[dict[str, Any]] = Memo(MEMO_SIZE)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # see `_series`

    def read_owner(self, namespace: str, name: str) -> ReadOwner:
        """Read a TaskRun from the API server (blocking: never on the event loop). A failed read gives
        no record: the pod is then placed as any other pod (fail closed, see docs/security.md)."""
        try:
            obj = self._read_taskrun(namespace, name) if self._read_taskrun is not None else None
        except Exception as error:  # noqa: BLE001 - an unreadable owner proves nothing
            logger.bind(namespace=namespace, name=name).warning("reading the TaskRun of a pod failed: {}", error)
            obj = None
        return ReadOwner(namespace, name, RunRecord.of("TaskRun", obj) if isinstance(obj, Mapping) and obj.get("metadata") else None)

    def review(self, body: Any, owner: ReadOwner | None = None) -> dict[str, Any]:
        """The whole AdmissionReview response for `body`, its metrics counted and its Events held. Raises
        MalformedReview, and OwnerReadNeeded (before any side effect) when a pod's TaskRun must be read first:
        review again with `owner`."""
        reviewed = self.review_deferred(body, owner)
        reviewed.finish()
        return reviewed.response

    def review_deferred(self, body: Any, owner: ReadOwner | None = None) -> Reviewed:
        """`review`, leaving to `Reviewed.finish` what its answer need not wait for: the review's metrics and
        its Events (their notes are written then too). The server calls it once the answer is written (#24:
        on the cold path of a review every few milliseconds that bookkeeping was a quarter of the handler).
        Everything a later review reads (the ledger, the budgets, the queue) is counted at once, as before."""
        try:
            request = parse_review(body)
        except MalformedReview:
            self.metrics.count_malformed_review()
            raise
        kind = request.kind if request.kind in ("TaskRun", "PipelineRun", "Pod", "DaemonSet") else "other"
        started = self.clock()
        warnings: list[str] = []
        try:
            patch = self._dispatch(request, warnings, owner)
            outcome = MUTATED if patch else UNCHANGED
        except OwnerReadNeeded:
            raise  # nothing counted: the review is made again once the owner is read
        except Exception as error:  # noqa: BLE001 - fail-open: never block a run because of a bug here
            outcome = ERROR
            logger.bind(kind=request.kind, namespace=request.namespace, name=request.name).opt(exception=error).error(
                "admission failed; admitting unchanged"
            )
            patch = []
            warnings = [f"egress-placer: internal error ({type(error).__name__}); admitted without placement"]
        seconds = max(self.clock() - started, 0.0)
        request.later.append(partial(self._count_review, kind, outcome, seconds))
        return Reviewed(review_response(request.uid, patch, warnings), request.later)

    def _count_review(self, kind: str, outcome: str, seconds: float) -> None:
        """A review's own metrics, once its answer is written (the series looked up then, not before it)."""
        self._series(self.metrics.admission_seconds, kind).observe(seconds)
        self._series(self.metrics.admission_reviews, kind, outcome).inc()

    def _dispatch(self, request: Request, warnings: list[str], owner: ReadOwner | None = None) -> Patch:
        if is_daemonset(request):
            return self._daemonset(request)
        if request.operation != "CREATE":
            return []
        if request.group == "tekton.dev" and request.version in ("v1", "v1beta1"):
            if request.kind == "TaskRun":
                return self._taskrun(request, warnings)
            if request.kind == "PipelineRun":
                return self._pipelinerun(request, warnings)
        if request.group == "" and request.version == "v1" and request.kind == "Pod":
            return self._pod(request, warnings, owner)
        return []

    # -- TaskRun ------------------------------------------------------------------------------------

    def _taskrun(self, request: Request, warnings: list[str]) -> Patch:
        policy = self.state.policy
        namespace = self.state.namespace(request.namespace)
        history = self.state.history
        measured = history.matches(policy, taskrun_group(request.namespace, request.object)) if history.active else ()
        decision = self._decide(policy, namespace, request.annotations, self._taskrun_images(request), measured)
        template = value_at(request.object, ("spec", "podTemplate"))
        default = self.state.tekton.default_pod_template
        budgets: tuple[str, ...] = ()
        held_in: str | None = None  # the pool a coscheduled run is held in for its budgets
        if AFFINITY_ASSISTANT_ANNOTATION in request.annotations and self._by_tekton(request):
            # Coscheduled only when Tekton's controller made it (the request's user: the API server's): the
            # annotation is anyone's to write. It keeps only the pool our admission moved its PipelineRun to.
            whole = self._moved_whole(request.namespace, claimed_pipelinerun(request.owners), policy)
            why = "coscheduled: its PipelineRun places the whole run"
            placement = _follow_whole(template, policy, whole, why, default)
            # The annotation is anyone's to write: it frees no budget. A run its template sends to a pool
            # waits for that pool's Enforce budgets like any run (docs/budgets.md, coscheduled runs).
            kept = policy.pool(placement.pool) if placement.pool else None
            if kept is not None and self.state.budgets.addresses(kept) and not self._held_whole(request):
                budgets = self._run_budgets(request, replace(decision, pool=kept.name), policy)
                held_in = kept.name if budgets else None
        else:
            key = ledger_key("taskrun", request.namespace, request.key_name)
            # A queued run's pod comes when it is released: nothing to assume now (the pod is placed again).
            budgets = self._run_budgets(request, decision, policy)
            assume = not self._queues(request, decision.pool, budgets)
            placement = self._place(template, decision.pool, policy, key, request.name, request.dry_run or not assume, default)
        self._count(request, decision, placement)
        patch = ops_at(request.object, ("spec", "podTemplate"), placement.template)
        # Tekton copies a TaskRun's annotations to its pod: the pod comes protected (`protection`) and, when its
        # node stays the run's, needs nothing more written (`_carried`).
        annotations = {DECISION_ANNOTATION: _record(decision, placement), REVIEW_ANNOTATION: request.uid, **protection(placement.pool)}
        # No node yet (a provisioned pool): no budget can be weighed against a node, and none is held for
        # (a coscheduled run is held in the pool its template names only while that pool has nodes: held_in).
        queued = self._enqueue(request, placement.capped or held_in, patch, annotations, budgets if placement.node or held_in else ())
        patch += annotation_ops(request.object, annotations)
        if decision.reason == Reason.UNKNOWN_POOL:
            warnings.append(f"egress-placer: {decision.message}")
        self._emit(request, decision, placement)
        if queued:
            self._send(request, "Normal", "Queued", queued)
        return patch

    # -- PipelineRun --------------------------------------------------------------------------------

    def _pipelinerun(self, request: Request, warnings: list[str]) -> Patch:
        policy = self.state.policy
        namespace = self.state.namespace(request.namespace)
        per_task = [
            (task if task != WHOLE_RUN else "(run)", self._decide(policy, namespace, request.annotations, images))
            for task, images in pipelinerun_images(with_namespace(request), self.state.tekton)
        ]
        for _, decision in per_task:
            self._series(self.metrics.decisions, request.kind, str(decision.reason), decision.pool or "").inc()
        wanted = sorted({d.pool for _, d in per_task if d.pool})
        path = ("spec", "taskRunTemplate", "podTemplate") if request.version == "v1" else ("spec", "podTemplate")
        template = value_at(request.object, path)
        summary = "; ".join(f"{task} -> {d.pool or 'none'} ({d.reason})" for task, d in per_task) or "no tasks"
        placement, message = self._whole_run(request, template, wanted, policy, namespace)
        patch = ops_at(request.object, path, placement.template) if placement is not None else []
        record: dict[str, Any] = {
            "pool": placement.pool if placement else None,
            "node": placement.node if placement else None,
            "message": message,
            "tasks": {task: {"pool": d.pool, "reason": str(d.reason)} for task, d in per_task},
        }
        if placement is not None:
            record.update(_loads_record(placement))
        annotations = {DECISION_ANNOTATION: _compact(record), REVIEW_ANNOTATION: request.uid}
        # A coscheduled run moved whole to a queued pool is queued whole (its TaskRuns follow the assistant).
        queued = self._enqueue(request, placement.capped if placement is not None else None, patch, annotations)
        patch += annotation_ops(request.object, annotations)
        unknown = [d for _, d in per_task if d.reason == Reason.UNKNOWN_POOL]
        if unknown:
            warnings.append(f"egress-placer: {unknown[0].message}")
        if not queued:  # its tasks are queued one by one: their waits count against the PipelineRun's timeout
            for pool in filter(None, map(policy.pool, wanted)):
                problem = pool.queue and pipeline_timeout_problem(value_at(request.object, ("spec", "timeouts")), pool.name, pool.queue)
                if problem:
                    warnings.append(f"egress-placer: {problem}")
        if placement is not None and (placement.node or placement.provisioned):
            reason, type_ = "Placed", "Normal"
            where = f"node {placement.node} preferred{_load_note(placement)}" if placement.node else placement.note
            note = f"{message}, {where}: {summary}"
        elif unknown:
            reason, type_, note = "UnknownPool", "Warning", f"{unknown[0].message} ({summary})"
        elif placement is not None and wanted:
            reason, type_, note = "NotPlaced", "Warning", f"{message} ({summary})"
        else:
            reason, type_, note = "TasksDecided", "Normal", f"{summary}; {message}"
        self._send(request, type_, reason, note)
        if queued:
            self._send(request, "Normal", "Queued", queued)
        return patch

    def _whole_run(
        self, request: Request, template: Any, wanted: list[str], policy: PlacementPolicy, namespace: NamespaceState
    ) -> tuple[Placement | None, str]:
        """The placement of a PipelineRun's own template (None: left untouched) and why.

        Only coscheduled runs are placed here: the assistant pod takes its placement from this
        template, and every pod of the run follows the assistant."""
        if not self._coscheduled(request.object):
            return None, "each task is placed when its TaskRun is created"
        default = self.state.tekton.default_pod_template  # merged under taskRunTemplate.podTemplate by Tekton
        if len(wanted) == 1 and self.settings.coscheduled == "whole-run":
            key = ledger_key("pipelinerun", request.namespace, request.key_name)
            assume = not self._queues(request, wanted[0])
            placement = self._place(template, wanted[0], policy, key, request.name, request.dry_run or not assume, default)
            if placement.pool:
                return placement, f"coscheduled run moved whole to pool {placement.pool}"
            return placement, f"coscheduled run left on ordinary nodes: {placement.note}"
        if not wanted:
            why = "no task needs a pool"
        elif len(wanted) > 1:
            why = f"its tasks need different pools ({', '.join(wanted)}) and one assistant pod cannot follow them all"
        else:
            why = f"tasks need pool {wanted[0]} but moving coscheduled runs is off (setting coscheduled=off)"
        # A pool placement the tenant wrote proves nothing: its assistant and TaskRuns keep none (`_moved_whole`).
        placement = _follow_whole(template, policy, None, why, default)
        return placement, f"coscheduled run (affinity assistant) left on ordinary nodes: {why}"

    def _coscheduled(self, run: Mapping[str, Any]) -> bool:
        """Does Tekton's affinity assistant coschedule this PipelineRun's pods?"""
        mode = self.state.tekton.coschedule or "workspaces"
        if mode in ("pipelineruns", "isolate-pipelinerun"):
            return True
        if mode == "disabled":
            return False
        bindings = value_at(run, ("spec", "workspaces"))
        return isinstance(bindings, list) and any(
            isinstance(b, Mapping) and (b.get("persistentVolumeClaim") or b.get("volumeClaimTemplate")) for b in bindings
        )

    # -- DaemonSet ----------------------------------------------------------------------------------

    def _daemonset(self, request: Request) -> Patch:
        admitted = admit_daemonset(request, self.state.policy)
        if admitted.note:
            self.metrics.agent_tolerations_added.labels(by="admission").inc()
            self._send(request, "Normal", "PoolTolerationsAdded", admitted.note)
        return admitted.patch

    # -- Pod ----------------------------------------------------------------------------------------

    def _pod(self, request: Request, warnings: list[str], owner: ReadOwner | None) -> Patch:
        policy = self.state.policy
        pod = request.object
        spec = pod.get("spec")
        if not is_object(spec):
            return []
        owners = request.owners
        node_name = text(spec.get("nodeName"))
        # The same trust as the intruder check (intruders.core), on the facts the tenant cannot forge:
        # a mirror pod's Node owner must carry its node's uid; a DaemonSet owner must resolve by uid to a
        # real DaemonSet of this (the request's) namespace, and that namespace must be an agent namespace.
        if is_mirror_pod(request.annotations, owners, node_name, self.state.node(node_name) if node_name else None):
            return []
        agent = daemonset_agent(policy, request.namespace, owners, self.state.daemonsets)
        if agent is Agent.TRUSTED:
            tolerations = agent_tolerations(spec.get("tolerations"), policy)
            return ops_at(pod, ("spec", "tolerations"), tolerations)
        if agent is Agent.UNRESOLVED:  # an agent namespace's, DaemonSet not in the cache yet: left as it
            return []  # is; the intruder check decides once the cache has it (or evicts it, if it never comes)
        if request.namespace in policy.exempt_namespaces:
            return []
        namespace = self.state.namespace(request.namespace)
        patch = self._ordinary_pod(request, spec, namespace, policy, owner)
        if node_name:
            refused = refused_pool(policy, node_name, self.state.node(node_name), namespace)
            if refused is not None:
                # nodeName skips the scheduler, and with it the pool taint: the pod goes to the scheduler,
                # which keeps it off the pool like any other pod without the toleration.
                patch.append({"op": "remove", "path": "/spec/nodeName"})
                warnings.append(
                    f"egress-placer: nodeName {node_name} removed: it is a node of pool {refused.name}, "
                    f"which namespace {request.namespace} may not use"
                )
        return patch

    def _ordinary_pod(
        self, request: Request, spec: Mapping[str, Any], namespace: NamespaceState, policy: PlacementPolicy, owner: ReadOwner | None
    ) -> Patch:
        """A pod of a non-exempt namespace that is no node agent: Tekton pods placed, the affinity
        assistant kept where its namespace may go, any other pod stripped of pool placement."""
        current = {k: spec[k] for k in _SPEC_PLACEMENT_FIELDS if spec.get(k) is not None}
        labels = request.labels
        if AFFINITY_ASSISTANT_ANNOTATION in request.annotations:
            # A coscheduled run's pod: the annotation is anyone's to write. The pool is kept (or put back)
            # only for a run's pod (its TaskRun by uid) that Tekton's controller makes (the request's user)
            # for a PipelineRun our admission moved whole to that pool (`_moved_whole`); any other loses
            # every pool placement (issue 23: no run of its own, no queue, no pool).
            run = self._run_pod(request, owner)
            whole = self._moved_whole(request.namespace, run.pipelinerun, policy) if run is not None and self._by_tekton(request) else None
            placement = _follow_whole(current, policy, whole, "coscheduled", place_it=True, by_hostname=self.state.hostnames_are_names)
            budget = self._coscheduled_budget(request, namespace, policy, placement) if run is not None else []
            return json_patch(current, placement.template, "/spec") + budget
        if labels.get(COMPONENT_LABEL) == AFFINITY_ASSISTANT_COMPONENT:
            # An affinity assistant's pod: the label is anyone's to write. It keeps (or gets back) only the
            # pool our admission moved a running PipelineRun to whole, whose assistant it is by name.
            placement = _follow_whole(current, policy, self._assistant_of(request, policy), "coscheduled", place_it=True,
                                      by_hostname=self.state.hostnames_are_names)
            return json_patch(current, placement.template, "/spec")
        run = self._run_pod(request, owner) if is_tekton_pod(request.object) else None
        if run is not None:
            return self._tekton_pod(request, current, namespace, policy, run)
        if _carries_pool_toleration(current.get("tolerations"), policy):
            return json_patch(current, unplace(current, policy), "/spec")
        return []

    def _run_pod(self, request: Request, read: ReadOwner | None) -> RunRecord | None:
        """The record of the pod's TaskRun when the pod is a run's pod (`queue.core.is_run_pod`), by the
        cache or by the TaskRun read for this review; None: no run's pod. A claimed TaskRun the cache lacks
        (or knows with another uid, or naming another pod in its status: a retry's pod comes right after
        Tekton clears it) raises OwnerReadNeeded, once: a tenant's forged claim costs one bounded read, and
        the pod is still no run's pod."""
        owner = claimed_taskrun(request.owners)
        if owner is None:
            return None
        record = self.state.queue.taskrun(request.namespace, owner.name)
        # Still held in the cache while Tekton makes its pod: the release (and the address it names) has not
        # reached this replica's informer yet. Read once; a failed read keeps what the cache has.
        stale = record is not None and record.uid == owner.uid and record.entry is not None and record.entry.pending
        if record is None or record.uid != owner.uid or (record.pod_name and record.pod_name != request.name) or stale:
            if read is not None and (read.namespace, read.name) == (request.namespace, owner.name):
                record = read.record if read.record is not None or not stale else record
            elif self._read_taskrun is not None:
                raise OwnerReadNeeded(request.namespace, owner.name)
        if record is None or not is_run_pod(owner, record.uid, record.decided, request.name, record.pod_name):
            return None
        return record

    def _tekton_pod(
        self, request: Request, current: dict[str, Any], namespace: NamespaceState, policy: PlacementPolicy, run: RunRecord
    ) -> Patch:
        history = self.state.history
        measured = history.matches(policy, pod_group(request.namespace, request.labels)) if history.active else ()
        decision = self._decide(policy, namespace, request.annotations, pod_images(request.object), measured)
        overdue = self._waited_too_long(request, decision.pool, policy)
        if overdue:
            decision = replace(decision, pool=None, message=f"{decision.message}; {overdue}")
        owner = claimed_taskrun(request.owners)  # the TaskRun `run` is, by uid (not its label)
        taskrun = owner.name if owner is not None else None
        key = ledger_key("pod", request.namespace, request.key_name)
        if not request.dry_run:
            # The pod is being made: from now on it (or its own assumption) counts, the TaskRun's must
            # not, and not while its node is chosen either (it would count this run twice). Nor does the
            # pod's own assumption from a first call when the API server calls us again (reinvocation
            # after a later webhook changed the pod): the same loads give the same node.
            self.state.load.hand_over(ledger_key("taskrun", request.namespace, taskrun) if taskrun else None, key)
            self.state.budgets.withdraw(request.namespace, request.name)  # nor its own budget use (the same)
        budget = self._budget(request, decision, policy)
        allowed = frozenset(budget[1].nodes) if budget is not None and not budget[1].hold else None
        released = self._released_to(run, policy, decision.pool) if budget is not None and decision.pool else frozenset()
        if released:
            allowed = released  # the leader counted it there; this replica's own count may lag
        elif allowed and decision.pool:
            allowed = self._copied_to(request, policy, decision.pool, allowed)
        # The node its run was given stays unless another is now less loaded: the pod then asks for nothing
        # new, and often nothing at all (`_carried`).
        placement = self._place(current, decision.pool, policy, key, request.name, request.dry_run, allowed=allowed,
                                prefer=preferred_node(current))
        self._count(request, decision, placement)
        template = placement.template
        # The review's uid replaces the TaskRun's, which Tekton copied into the pod with its annotations.
        annotations = {REVIEW_ANNOTATION: request.uid, **protection(placement.pool)}  # and the record, unless `_carried`
        recorded = budget is not None and placement.node is not None and placement.pool == decision.pool
        if recorded:
            assert budget is not None and placement.pool is not None and placement.node is not None
            touched, seen, full, would = budget
            if not seen.hold:  # no room anywhere: placed anyway (the Warning), never kept off every node
                template = narrow(template, [n for n in full if n != placement.node])
            now = self.wall()
            annotations[BUDGETS_ANNOTATION] = record_annotation(placement.pool, touched, placement.node, now)
            pool = policy.pool(placement.pool)
            if not request.dry_run and pool is not None:  # counted at once: the next pod may come before this one is stored
                self.state.budgets.placed(request.namespace, request.name, pool, placement.node, touched, annotations[BUDGETS_ANNOTATION], now)
            self._budget_events(request, replace(seen, hold=False) if released else seen, would, placement.pool)
        patch = json_patch(current, template, "/spec")
        if not recorded and BUDGETS_ANNOTATION in request.annotations:  # a record admission did not write now
            patch.append({"op": "remove", "path": pointer(("metadata", "annotations", BUDGETS_ANNOTATION))})
        patch += self._gate(request, placement.capped, policy, run)
        carried = None if patch or recorded else self._carried(request, placement, annotations)
        if placement.pool or decision.reason in WARNING_REASONS:
            self._emit(request, decision, placement, token=carried)
        if carried is not None:
            return []  # no patch: the API server has nothing to apply (#24: most of a Pod call's cost)
        return patch + annotation_ops(request.object, {DECISION_ANNOTATION: _record(decision, placement), **annotations})

    def _carried(self, request: Request, placement: Placement, annotations: Mapping[str, str]) -> str | None:
        """The review token the pod carries when it needs nothing written: Tekton's controller made it (the
        request's user), and the annotations it copied from its TaskRun, which only admission writes there (the
        run guard), already say where this review places it (pool and node) and protect it as this review
        would. None: the pod gets this review's own record. Not the record's text: its loads are the run's."""
        token = request.annotations.get(REVIEW_ANNOTATION)
        if not token or not self._by_tekton(request):
            return None
        if decided_placement(request.annotations.get(DECISION_ANNOTATION)) != (placement.pool, placement.node):
            return None
        if any(request.annotations.get(k) != v for k, v in annotations.items() if k != REVIEW_ANNOTATION):
            return None
        return token

    def _released_to(self, run: RunRecord, policy: PlacementPolicy, pool_name: str) -> frozenset[str]:
        """The pool's nodes behind the egress address the leader released the run to (the run's own entry,
        written with the release, which the run guard keeps tenants from writing): the pod goes there whatever
        this replica counts, for the one leader's count is the budget's ledger. Replicas admitting pods at
        once, each with its own lagging view of the pods, then never take an address's room twice
        (docs/budgets.md). Empty: no address, or no eligible node behind it any more."""
        address = run.entry.address if run.entry is not None else ""
        pool = policy.pool(pool_name)
        if not address or pool is None:
            return frozenset()
        return frozenset(n for n, a in self.state.budgets.addresses(pool).items() if a == address)

    def _copied_to(self, request: Request, policy: PlacementPolicy, pool_name: str, allowed: frozenset[str]) -> frozenset[str]:
        """The nodes with room behind the address in the entry Tekton copied onto the pod (when the run's own
        is not at hand), when some have room there; else every node with room: an address a tenant wrote on
        a pod only steers its own pod among nodes with room."""
        copied = read_entry(request.annotations.get(QUEUE_ANNOTATION), "TaskRun")
        pool = policy.pool(pool_name)
        if copied is None or not copied.address or pool is None:
            return allowed
        where = self.state.budgets.addresses(pool)
        behind = frozenset(n for n in allowed if where.get(n) == copied.address)
        return behind or allowed

    def _by_tekton(self, request: Request) -> bool:
        """Was the object made by Tekton's controller (its ServiceAccount in Tekton's namespace, by the
        request's user, which the API server sets from the credential)?"""
        return request.user == (self.settings.tekton_controller_user or service_account_user(self.settings.tekton_namespace, TEKTON_CONTROLLER))

    def _moved_whole(self, namespace: str, claim: OwnerRef | None, policy: PlacementPolicy) -> Pool | None:
        """The pool our admission moved a coscheduled PipelineRun to whole: `claim` (a controller
        ownerReference) resolved by uid to a cached PipelineRun whose decision record names the pool; in a
        pool our queue governs, only with our queue entry for that pool (admission's record at CREATE, which
        the run guard keeps tenants from adding or changing). None: no such run."""
        whole = self._owner_run(namespace, claim)
        if whole is None or not whole.whole_pool:
            return None
        pool = policy.pool(whole.whole_pool)
        if pool is None or not pool.allows(self.state.namespace(namespace)):
            return None
        ours = pool.queue is not None and pool.queue.governed_by != GOVERNED_BY_KUEUE
        return None if ours and (whole.entry is None or whole.entry.pool != pool.name) else pool

    def _assistant_of(self, request: Request, policy: PlacementPolicy) -> Pool | None:
        """The pool of the PipelineRun whose affinity assistant a pod is, None: none. The pod is `<name>-0`
        of a StatefulSet `<name>` (its controller ownerReference), and `<name>` is the one Tekton derives
        from the PipelineRun's name (`tekton.dev/pipelineRun`, which Tekton copies onto the assistant; a
        label proves nothing by itself, the hash binds it to that run): a cached PipelineRun our admission
        moved whole to a pool (`_moved_whole`), started (not held) and not finished. So a tenant gets at most
        one such pod per assistant of its own running run, which holds its pool slot."""
        name = request.name if request.named else ""
        claim = next((o for o in request.owners if o.controller and o.kind == "StatefulSet"), None)
        run = request.labels.get("tekton.dev/pipelineRun", "")
        whole = self.state.queue.taskrun(request.namespace, run, "PipelineRun") if run else None
        if claim is None or whole is None or name != f"{claim.name}-0" or claim.name not in whole.assistants or whole.finished:
            return None
        if whole.entry is not None and (whole.entry.pending or whole.entry.done):
            return None
        return self._moved_whole(request.namespace, OwnerRef("tekton.dev/v1", "PipelineRun", run, whole.uid, True), policy)

    def _held_whole(self, request: Request) -> bool:
        """Is a coscheduled TaskRun's PipelineRun (its controller owner, by uid, in the cache) held whole by
        our queue (its entry)? Then the TaskRun is not held again: it would wait for a slot its
        PipelineRun keeps taken while it has no pod bound (queue.core.in_flight)."""
        whole = self._owner_run(request.namespace, claimed_pipelinerun(request.owners))
        return whole is not None and whole.entry is not None

    def _owner_run(self, namespace: str, claim: OwnerRef | None) -> RunRecord | None:
        """The cached PipelineRun a controller ownerReference claims, only when its uid matches (a name is
        anyone's to write); None: no such run."""
        whole = self.state.queue.taskrun(namespace, claim.name, "PipelineRun") if claim is not None else None
        return whole if whole is not None and claim is not None and whole.uid == claim.uid else None

    def _coscheduled_budget(self, request: Request, namespace: NamespaceState, policy: PlacementPolicy, placement: Placement) -> Patch:
        """A coscheduled run's pod on a pool follows its affinity assistant (required pod affinity): never
        moved nor narrowed, but recorded and counted as any run's pod, on the node it is bound to, else its
        assistant's (pod `<annotation>-0` in the cache), else none yet (the bound node counts once bound).
        A Warning when that node's address has no room (the release waited for room on some pool node)."""
        decision = self._decide(policy, namespace, request.annotations, pod_images(request.object))
        budget = self._budget(request, replace(decision, pool=placement.pool), policy) if placement.pool else None
        pool = policy.pool(placement.pool) if placement.pool else None
        if budget is None or pool is None:
            present = BUDGETS_ANNOTATION in request.annotations
            return [{"op": "remove", "path": pointer(("metadata", "annotations", BUDGETS_ANNOTATION))}] if present else []
        touched, seen, full, would = budget
        node = text((request.object.get("spec") or {}).get("nodeName")) or self._assistant_node(request)
        now = self.wall()
        record = record_annotation(pool.name, touched, node, now)
        if not request.dry_run:
            self.state.budgets.placed(request.namespace, request.name, pool, node, touched, record, now)
        self._budget_events(request, seen, would, pool.name)
        if node in full and not seen.hold and not request.dry_run:
            self._send(request, "Warning", "BudgetExceeded",
                       f"placed on its affinity assistant's node {node}, whose egress address has no room for budget {', '.join(touched)}")
        return annotation_ops(request.object, {BUDGETS_ANNOTATION: record})

    def _assistant_node(self, request: Request) -> str:
        """The node of the pod's affinity assistant (Tekton's StatefulSet `<annotation>-0`), "" unknown."""
        name = request.annotations.get(AFFINITY_ASSISTANT_ANNOTATION)
        found = self.state.pods.get((request.namespace, f"{name}-0")) if isinstance(name, str) and name else None
        return (found.node_name or "") if found is not None else ""

    def _budget(self, request: Request, decision: Decision, policy: PlacementPolicy) -> tuple[tuple[str, ...], Any, tuple[str, ...], list[str]] | None:
        """The destinations a run's pod touches in its pool (budgets.core.match: its images, its Task's
        name from the `tekton.dev/task` label: the tenant's to choose), the verdict on them now and the
        pool's nodes without room, the ReportOnly ones that would have held it; None when the pod touches none."""
        pool = policy.pool(decision.pool) if decision.pool else None
        if pool is None or not pool.destinations:
            return None
        task = request.labels.get(TASK_LABEL)
        touched = tuple(t.destination for t in match(pool.destinations, RunFacts(decision.images, (task,) if task else ())))
        now = self.wall()
        budgets = self.state.budgets.pool_budgets(pool, now) if touched else None
        if budgets is None:
            return None
        return touched, verdict(budgets, touched, now), full_nodes(budgets, touched, now), holding(budgets, touched, now, REPORT_ONLY)

    def _budget_events(self, request: Request, seen: Any, would: list[str], pool: str) -> None:
        """Events on the pod: what ReportOnly budgets would have held (`would`: those destinations), and an
        Enforce budget that had no room on any node (placed anyway: the hold is before the pod)."""
        if request.dry_run:
            return
        for note in seen.reported:
            self._send(request, "Normal", "BudgetReport", note)
        for name in would:
            self.metrics.budget_waits.labels(pool=pool, destination=name, mode=REPORT_ONLY).inc()
        if seen.hold:
            self._send(request, "Warning", "BudgetExceeded", f"placed although {seen.reason.removeprefix('waiting for ')} had no room")

    def _gate(self, request: Request, pool_name: str | None, policy: PlacementPolicy, run: RunRecord) -> Patch:
        """A run's pod placed on a queued pool whose run our queue does not hold (its owner, tekton-kueue
        or Pipelines-as-Code created it pending and released it) waits for a slot: a schedulingGate that
        the queue reconciler removes when one frees (`queue.core.gates_pod`, `ungate`)."""
        pool = policy.pool(pool_name) if pool_name else None
        if pool is None or pool.queue is None:
            return []  # no queue: nothing gates it (gates_pod), whoever holds the run
        # The run's PipelineRun by the TaskRun's controller owner, uid to uid (never the pod's
        # `tekton.dev/pipelineRun` label: Tekton copies it from the TaskRun, whose creator wrote it).
        claim = run.pipelinerun
        whole = self.state.queue.taskrun(request.namespace, claim.name, "PipelineRun") if claim is not None else None
        owner = claimed_taskrun(request.owners)
        another = owner is not None and self.state.queue.other_pods(request.namespace, owner, request.name)
        ours = held_by_queue(run.entry, claim, whole.uid if whole else None, whole.entry if whole else None, another)
        if not gates_pod(True, ours):
            return []
        spec = request.object.get("spec") or {}
        gates = [g for g in spec.get("schedulingGates") or [] if isinstance(g, Mapping) and g.get("name") != POOL_SLOT_GATE]
        return ops_at(request.object, ("spec", "schedulingGates"), [*gates, {"name": POOL_SLOT_GATE}])

    # -- the queue ----------------------------------------------------------------------------------

    def _queues(self, request: Request, pool_name: str | None, budgets: tuple[str, ...] = ()) -> bool:
        """Is this run to be created pending in `pool_name`'s queue? The pool has a queue setting our queue
        governs (`governedBy: kueue`: Kueue holds the runs, we create none pending), or the run touches one
        of its Enforce egress budgets (`budgets`), and the user did not set spec.status (pending, cancelled)
        themselves; and, for a TaskRun, this Tekton can hold one (`TaskRunPending`, controller.compat)."""
        pool = self.state.policy.pool(pool_name) if pool_name else None
        if pool is None or (pool.queue is None and not budgets) or value_at(request.object, ("spec", "status")):
            return False  # no pool, or nothing to hold the run for (most runs: asked first), or the user's own status
        if request.kind == "TaskRun" and not self.state.tekton.support.taskrun_pending:
            return False  # this Tekton cannot hold a TaskRun (controller.compat): its pod waits at the pool's slot gate
        return (pool.queue is not None and pool.queue.governed_by != GOVERNED_BY_KUEUE) or bool(budgets)

    def _run_budgets(self, request: Request, decision: Decision, policy: PlacementPolicy) -> tuple[str, ...]:
        """The Enforce destinations of its pool a TaskRun touches (docs/budgets.md: its images, Task name,
        params; the tenant's to choose): it waits, pending, until each has room."""
        pool = policy.pool(decision.pool) if decision.pool else None
        if pool is None or not pool.destinations:
            return ()
        enforced = {d.name for d in pool.destinations if d.enforced}
        touched = match(pool.destinations, taskrun_facts(request.object, decision.images))
        return tuple(t.destination for t in touched if t.destination in enforced)

    def _enqueue(self, request: Request, pool_name: str | None, patch: Patch, annotations: dict[str, str],
                 budgets: tuple[str, ...] = ()) -> str:
        """Queue the run when its pool queues (`patch` and `annotations` get the pending status and the
        entry); the Event's note, "" when not queued.

        The entry is admission's own record: one the request brings (a tenant writes any annotation; a
        copied one) is removed from a run not queued, whatever it says; the run guard (core.run_guard)
        refuses one added later by UPDATE. Kept: a PipelineRun's entry that Tekton copied onto one of its
        TaskRuns, which the queue never reads as the TaskRun's (`read_entry` by kind)."""
        if not self._queues(request, pool_name, budgets):
            value = request.annotations.get(QUEUE_ANNOTATION)
            copied = request.kind == "TaskRun" and read_entry(value, "PipelineRun") is not None
            if value is not None and not copied:
                patch.append({"op": "remove", "path": pointer(("metadata", "annotations", QUEUE_ANNOTATION))})
            return ""
        assert pool_name is not None
        now = self.wall()
        patch += ops_at(request.object, ("spec", "status"), PENDING[request.kind])
        annotations[QUEUE_ANNOTATION] = entry_annotation(pool_name, request.kind, now, budgets)
        if not request.dry_run:
            self.metrics.queue_admitted.labels(pool=pool_name).inc()
        pool = self.state.policy.pool(pool_name)
        if pool is not None and pool.queue is None:
            return self._budget_note(pool, budgets, now)
        return self.state.queue.queued_note(pool_name, request.namespace, now, join=not request.dry_run)

    def _budget_note(self, pool: Pool, budgets: tuple[str, ...], now: float) -> str:
        """The Event's note for a run held for egress budgets: "waiting for budget X on A: ..." now."""
        picture = self.state.budgets.pool_budgets(pool, now)
        seen = verdict(picture, budgets, now) if picture is not None else None
        if picture is not None and seen is not None and seen.hold:
            for name in holding(picture, budgets, now):
                self.metrics.budget_waits.labels(pool=pool.name, destination=name, mode="Enforce").inc()
            return f"held for egress budgets of pool {pool.name}: {seen.reason}"
        return f"held for egress budgets of pool {pool.name} ({', '.join(budgets)}): room now, released shortly"

    def _waited_too_long(self, request: Request, pool_name: str | None, policy: PlacementPolicy) -> str:
        """Why a Tekton pod of a run released past its preferred pool's wait goes to ordinary nodes ("": it does not)."""
        pool = policy.pool(pool_name) if pool_name else None
        if pool is None or pool.queue is None or pool.placement != "preferred":
            return ""
        mark = read_any_entry(request.annotations)
        if mark is None or mark.pool != pool.name or not timed_out(mark.queued_at, pool.queue, self.wall()):
            return ""
        return f"waited over {pool.queue.max_queue_seconds}s in pool {pool.name}'s queue (preferred): sent to ordinary nodes"

    # -- shared -------------------------------------------------------------------------------------

    def _place(
        self,
        template: Any,
        pool_name: str | None,
        policy: PlacementPolicy,
        key: str,
        salt: str,
        dry_run: bool,
        default: Mapping[str, Any] | None = None,
        allowed: frozenset[str] | None = None,
        prefer: str | None = None,
    ) -> Placement:
        """Send the template to `pool_name` and its least-loaded node (assumed under `key`), or, with no
        pool (or a pool without a ready node), strip any pool placement; a provisioned pool without a
        ready node gets the pod anyway, with no node named (its provisioner sees the demand). `default`: Tekton's default
        pod template, merged under a run's template: what it gives is kept (see `over_default`). `prefer`: that
        node among the equally least-loaded (a run's pod: the node its run was given)."""
        pool = policy.pool(pool_name) if pool_name else None
        if pool is None:
            return Placement(self._template(template, policy, default, None, None))
        # A dry run has no side effects: nothing is assumed.
        if dry_run:
            choice = self.state.load.choose(pool, salt, allowed=allowed, prefer=prefer)
        else:
            choice = self.state.load.choose_and_assume(pool, key, salt, allowed=allowed, prefer=prefer)
        if choice.node is None:
            if pool.provisioning is not None:
                # Sent to the pool with no node named: the pod waits Pending, Unschedulable, which is the
                # demand the pool's provisioner (Karpenter's NodePool) brings a node up for.
                note = f"pool {pool.name} has no ready node: left to NodePool {pool.provisioning.karpenter.node_pool} to provision"
                return Placement(self._template(template, policy, default, pool, None), pool.name, note=note, provisioned=True,
                                 queued=pool.queue is not None)
            return Placement(self._template(template, policy, default, None, None), note=f"pool {pool.name} has no ready node")
        new = self._template(template, policy, default, pool, choice.node)
        return Placement(new, pool.name, choice.node, choice.loads, more_nodes=choice.more_nodes)

    # -- memoised pure steps (admission.memo): keyed on what they read ------------------------------

    def _template(
        self, template: Any, policy: PlacementPolicy, default: Mapping[str, Any] | None, pool: Pool | None, node: str | None
    ) -> dict[str, Any]:
        """The template sent to `pool` and `node` (None: stripped of pool placement), over Tekton's
        default. Shared by the reviews that ask the same (never changed in place: a patch holds its members).
        A pool's listed nodes by hostname while every node's hostname is its name (`hostnames_are_names`)."""
        by_hostname = self.state.hostnames_are_names
        if pool is None:
            change: Callable[[dict[str, Any]], dict[str, Any]] = lambda t: unplace(t, policy)  # noqa: E731
        else:
            change = lambda t: place(unplace(t, policy, keep_pool=pool.name), pool, node, by_hostname)  # noqa: E731
        # Keyed on the fields placement reads, not the whole template: a pod's spec is each run's own (its
        # containers' args and volumes), so a whole-spec key never repeats, nor does the node its TaskRun was
        # preferred on (`placement_key`, #24). None (no podTemplate), or not an object: the whole of it.
        whole = not is_object(template)
        fields = template if whole else placement_key(template)
        text = json_key(fields)
        key = None if text is None else (text, pool.name if pool else None, node, by_hostname)
        placed = self._templates.get(key, lambda: over_default(fields, default, change), (policy, default))
        return placed if whole else with_placement(template, placed)

    def _taskrun_images(self, request: Request) -> ImageSet:
        """`taskrun_images` of the run: it reads the run's namespace, taskRef, taskSpec and params, and
        Tekton's objects (whose generation is new after every change)."""
        tekton = self.state.tekton
        spec = request.object.get("spec")
        spec = spec if is_object(spec) else {}
        key = json_key([request.namespace, spec.get("taskRef"), spec.get("taskSpec"), spec.get("params")])
        return self._images.get(key, lambda: taskrun_images(with_namespace(request), tekton), (tekton, tekton.generation))

    def _decide(
        self, policy: PlacementPolicy, namespace: NamespaceState, annotations: Mapping[str, str], images: ImageSet,
        measured: tuple[MeasuredMatch, ...] = (),
    ) -> Decision:
        """`decide`: it reads the policy, the namespace (the state's object, replaced on every change; a
        namespace the state lacks is its name alone), the placement annotation, the images and the run's
        matches in the pools' measured sets (`state.history`, read from memory)."""
        known = self.state.namespaces.get(namespace.name)
        if known is not None and known is not namespace:
            return decide(policy, namespace, annotations, images, measured)
        key = (namespace.name, id(known), annotations.get(PLACEMENT_ANNOTATION), images, measured)
        # The answer holds the namespace object: its id is not reused while the entry lives.
        return self._decisions.get(key, lambda: (known, decide(policy, namespace, annotations, images, measured)), (policy,))[1]

    def _series(self, metric: Any, *values: str) -> Any:
        """`metric.labels(*values)` (values in the metric's label order), looked up once: the few series
        every review counts in (admitted kinds, reasons, configured pools) are kept by this Admission."""
        key = (id(metric), values)  # the metrics live as long as this Admission
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def _count(self, request: Request, decision: Decision, placement: Placement) -> None:
        request.later.append(partial(self._count_now, request.kind, decision, placement))

    def _count_now(self, kind: str, decision: Decision, placement: Placement) -> None:
        self._series(self.metrics.decisions, kind, str(decision.reason), placement.pool or "").inc()
        if self._debug:
            logger.bind(kind=kind, pool=placement.pool, node=placement.node).debug(
                "{}: {} {}", decision.reason, decision.message, placement.note
            )

    def _emit(self, request: Request, decision: Decision, placement: Placement, token: str | None = None) -> None:
        """The decision's Event (written once the answer is: `review_deferred`)."""
        if not request.dry_run:
            request.later.append(partial(self._emit_now, request, decision, placement, token))

    def _emit_now(self, request: Request, decision: Decision, placement: Placement, token: str | None) -> None:
        if placement.pool:
            where = f"node {placement.node}{_load_note(placement)}" if placement.node else placement.note
            note = f"Pool {placement.pool}, {where}: {decision.message}"
            self._hold(request, "Normal", "Placed", note, token)
        elif decision.reason in WARNING_REASONS:
            self._hold(request, "Warning", WARNING_REASONS[decision.reason], decision.message, token)
        else:
            why = "; ".join(p for p in (decision.message, placement.note) if p)
            self._hold(request, "Warning" if placement.note else "Normal", "NotPlaced", why, token)

    def _send(self, request: Request, type_: str, reason: str, note: str, token: str | None = None) -> None:
        """Hold the Event until the object exists (the patch writes the review's uid into it; `token`: the
        review token the object already carries, when nothing is written), once the answer is written."""
        if not request.dry_run:
            request.later.append(partial(self._hold, request, type_, reason, note, token))

    def _hold(self, request: Request, type_: str, reason: str, note: str, token: str | None) -> None:
        generate_name = "" if request.named else request.name
        self.events.hold(token or request.uid, request.regarding(), type_, reason, note[:1024], "Admit", generate_name=generate_name)


# --- helpers --------------------------------------------------------------------------------------


def _placed_pool(template: Any, policy: PlacementPolicy) -> Pool | None:
    """The pool whose own (Equal) toleration the template carries, first in policy order."""
    tolerations = template.get("tolerations") if isinstance(template, Mapping) else None
    for pool in policy.pools:
        for t in tolerations or ():
            if (
                isinstance(t, Mapping)
                and t.get("key") == pool.taint.key
                and (t.get("operator") or "Equal") == "Equal"
                and tolerates(t, pool.taint_for())
            ):
                return pool
    return None


def _follow_whole(
    template: Any, policy: PlacementPolicy, whole: Pool | None, why: str, default: Mapping[str, Any] | None = None,
    place_it: bool = False, by_hostname: bool = False,
) -> Placement:
    """A coscheduled run's template: every pool placement stripped but that of `whole` (the pool its
    PipelineRun was moved to, `Admission._moved_whole`; None: strip all), which a pod gets back
    (`place_it`: no node preferred, it follows its assistant; its listed nodes by hostname: `by_hostname`)
    when Tekton lost it on the way."""
    if whole is None:
        return Placement(over_default(template, default, lambda t: unplace(t, policy)), note=why)
    kept = whole.name
    placed = _placed_pool(with_default(template, default), policy)
    on_it = placed is not None and placed.name == kept
    if place_it and not on_it:
        return Placement(place(unplace(template, policy), whole, None, by_hostname), pool=kept, note=why)
    change = (lambda t: unplace(t, policy, keep_pool=kept)) if on_it else (lambda t: unplace(t, policy))  # noqa: E731
    return Placement(over_default(template, default, change), pool=kept if on_it else None, note=why)


def _carries_pool_toleration(tolerations: Any, policy: PlacementPolicy) -> bool:
    owned = policy.owned_taint_keys()
    for t in tolerations or ():
        if not isinstance(t, Mapping):
            continue
        if t.get("key") in owned or any(tolerates(t, p.taint_for()) for p in policy.pools):
            return True
    return False


def _loads_record(placement: Placement) -> dict[str, Any]:
    """`loads` (node -> "placed+assumed/capacity" of the nodes the choice reported, by name) and
    `moreNodes` (the pool's other eligible nodes, when there are some)."""
    out: dict[str, Any] = {}
    if placement.loads:
        out["loads"] = {name: f"{load.placed + load.assumed}/{load.capacity}" for name, load in sorted(placement.loads.items())}
    if placement.more_nodes:
        out["moreNodes"] = placement.more_nodes
    return out


def _load_note(placement: Placement) -> str:
    load = placement.loads.get(placement.node or "")
    return f" (load {load.total}/{load.capacity} before this run)" if load else ""


def _compact(record: Mapping[str, Any]) -> str:
    """Compact JSON in the record's key order (orjson: non-ASCII text as UTF-8, not \\u escapes)."""
    return encode(record).decode()


def _record(decision: Decision, placement: Placement) -> str:
    """The `egress-placer.io/decision` annotation: compact JSON of the decision and where it went."""
    record: dict[str, Any] = {
        "pool": placement.pool,
        "reason": str(decision.reason),
        "node": placement.node,
        "images": list(decision.images[:MAX_IMAGES_IN_ANNOTATION]),
        "message": "; ".join(p for p in (decision.message, placement.note) if p),
    }
    if len(decision.images) > MAX_IMAGES_IN_ANNOTATION:
        record["moreImages"] = len(decision.images) - MAX_IMAGES_IN_ANNOTATION
    if decision.unresolved:
        record["unresolved"] = list(decision.unresolved[:MAX_IMAGES_IN_ANNOTATION])
    if decision.pool and decision.pool != placement.pool:
        record["wanted"] = decision.pool
    record.update(_loads_record(placement))
    return _compact(record)


__all__ = [
    "Admission",
    "OwnerReadNeeded",
    "ReadOwner",
    "Reviewed",
    "MalformedReview",
    "Placement",
    "Request",
    "parse_review",
    "review_response",
]
