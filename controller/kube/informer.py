"""Informers: list then watch one resource, keeping plain trimmed dicts; each a task of the runner
(controller.runner: `run(stop)`, with `interrupt` as its stop hook).

Why not `kubernetes.informer.SharedInformer` (shipped with the pinned client): it deserializes every
object into a pydantic model (too slow and too big for 20,000 pods), lists without `limit`, does not
ask for bookmarks, waits a fixed 5 s after errors (no backoff, no jitter), treats an ERROR event
other than 410 as a normal event, and keeps its own cache of whole objects. This one reads raw JSON,
trims each object to what the controller needs, and hands it to the consumer (ClusterState is the
cache; the informer keeps only the resourceVersion).

Protocol: list (paginated) -> `on_replace(objs)` -> watch from the list's resourceVersion with
`allowWatchBookmarks` and a server timeout -> `on_event(type, obj)` per event -> on timeout, watch
again from the last resourceVersion (bookmarks advance it) -> on 410 Gone or an ERROR event, relist.
Errors back off exponentially with jitter (`controller.retry`); restarts are counted in
`metrics.watch_restarts{resource, cause}` with cause `timeout` (the server ended the watch: normal),
`gone` (410: relist), `error-event` (an ERROR event: relist after a backoff) or `failure` (a failed
request or a broken connection: resume from the last resourceVersion after a backoff).
A consumer callback that raises is logged; the informer goes on.
"""

from __future__ import annotations

import ctypes
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import tenacity
from kubernetes.watch.watch import iter_resp_lines
from loguru import logger

from controller.agents.core import POOL_TOLERATIONS_ANNOTATION
from controller.compat import core as compat
from controller.core import cluster_resolver
from controller.core.images import TASKRUN_LABEL, image_fields
from controller.intruders.core import MIRROR_POD_ANNOTATION
from controller.core.json_wire import decode_pruned
from controller.budgets.core import BUDGETS_ANNOTATION, STARTS_CONFIGMAP
from controller.budgets.view import BudgetsView
from controller.core.model import DECISION_ANNOTATION, NAMESPACE_POOLS_ANNOTATION, REVIEW_ANNOTATION
from controller.queue.core import KUEUE_QUEUE_LABEL, PIPELINERUN_LABEL, POOL_SLOT_GATE, QUEUE_ANNOTATION, compact_decision
from controller.core.patches import InvalidDefault, default_pod_template
from controller.kube.client import KubeApi, describe_error, status_of
from controller.retry import WATCHES, RetryPolicy, retrying
from controller.metrics import Metrics
from controller.runner import Runner, Task
from controller.settings import Settings
from controller.store import release
from controller.tekton.core import TektonObjects
from controller.tekton.view import TektonView

Obj = dict[str, Any]
Trim = Callable[[Mapping[str, Any]], Obj]

REQUIRED_NODE_AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"
# Tekton's CRDs in v1.15.0 (config/300-crds): Task and Pipeline store v1; StepAction stores v1beta1.
TEKTON_GROUP = "tekton.dev"
TEKTON_FEATURE_FLAGS = "feature-flags"
TEKTON_CONFIG_DEFAULTS = "config-defaults"
DEFAULT_POD_TEMPLATE_KEY = "default-pod-template"


# -- trimming: keep only what the controller reads --------------------------------------------------
#
# Labels, annotations and ownerReferences are the tenant's to write, as many and as long as the API
# server takes (up to about 1.5 MB an object; kubectl apply's last-applied-configuration annotation alone
# repeats the whole object). The cache keeps only the keys some reader looks up, listed here, in ONE
# place: a reader that needs another key adds it to these tables (and to tests/unit/test_trim.py).
# A kind not named keeps no labels or no annotations.

KEPT_LABELS: dict[str, frozenset[str] | None] = {  # None: every label
    # The administrator's (the `edit` role cannot write Nodes): the policy's node selectors name any.
    "Node": None,
    # The namespace owner's, not a tenant's (nor Namespaces): the policy's namespaceSelectors name any,
    # and a changed policy must not need a relist to see them. The API server bounds each (key 317,
    # value 63 characters).
    "Namespace": None,
    # The load picture: a bound pod settles its TaskRun's (or PipelineRun's) assumed placement. The queue
    # reads no label: a run's pods are found by their owner's uid.
    "Pod": frozenset({TASKRUN_LABEL, PIPELINERUN_LABEL}),
    # tekton-kueue's LocalQueue label: the queue leaves such a run to Kueue until its Workload says otherwise
    # (queue.core.held_by_kueue). A tenant's label only keeps its own run waiting.
    "PipelineRun": frozenset({KUEUE_QUEUE_LABEL}),
}
KEPT_ANNOTATIONS: dict[str, frozenset[str]] = {
    "Namespace": frozenset({NAMESPACE_POOLS_ANNOTATION}),  # Pool.allows
    # intruders.core.is_mirror_pod (its presence); admission.events: the review token of a held Event
    # ... and the load picture: the pool and node admission chose (every replica counts it, load.view)
    # ... and the egress budgets: the budget record admission writes (budgets.core.read_record)
    "Pod": frozenset({MIRROR_POD_ANNOTATION, REVIEW_ANNOTATION, DECISION_ANNOTATION, BUDGETS_ANNOTATION}),
    # missed runs: admitted without a decision (its presence); admission.events: the review token
    # ... and the queue: the entry written at admission (queue.core)
    "TaskRun": frozenset({DECISION_ANNOTATION, REVIEW_ANNOTATION, QUEUE_ANNOTATION}),
    "PipelineRun": frozenset({DECISION_ANNOTATION, REVIEW_ANNOTATION, QUEUE_ANNOTATION}),
    "DaemonSet": frozenset({POOL_TOLERATIONS_ANNOTATION}),  # agents.core: the pools a node agent opts into
    # The administrator's (tenants cannot write Nodes): only the keys the policy names as a pool's egress
    # address (`egressAddress.annotation`, budgets.core.address_of), set by `keep_node_annotations`.
    "Node": frozenset(),
}


def keep_node_annotations(keys: Iterable[str]) -> bool:
    """The Node annotation keys the cache keeps from now on (the policy's `egressAddress.annotation`s);
    True when a key is new: the Node informer must relist (`Informer.relist`) to see it on the nodes it has."""
    wanted = frozenset(keys)
    new = bool(wanted - KEPT_ANNOTATIONS["Node"])
    KEPT_ANNOTATIONS["Node"] = wanted
    return new
# A kept annotation value longer than this is kept empty (the key is there, its value is not read):
# presence is what a pod's and a run's annotations tell; an empty pools annotation gives no pool (never
# more rights). Label values are kept as they are (see _kept_labels).
MAX_KEPT_VALUE_CHARS = 4096


def _kept_labels(labels: Any, keys: frozenset[str] | None) -> dict[str, str] | None:
    """Label values as they are: the API server bounds them (63 characters), and any other value could
    change what a selector matches (`DoesNotExist`, `NotIn`, a value "")."""
    if not isinstance(labels, Mapping) or not labels:
        return None
    return dict(labels.items() if keys is None else ((k, labels[k]) for k in keys if k in labels)) or None


def _kept_annotations(annotations: Any, keys: frozenset[str]) -> dict[str, str] | None:
    if not isinstance(annotations, Mapping):
        return None
    out = {
        k: v if isinstance(v, str) and len(v) <= MAX_KEPT_VALUE_CHARS else ""
        for k, v in ((k, annotations[k]) for k in keys if k in annotations)
    }
    return out or None


def _kept_owners(owners: Any) -> list[Obj] | None:
    """The controller owner (what a node agent or a mirror pod must resolve to) and the first DaemonSet
    owner (load counting leaves DaemonSet pods out): at most two of however many the tenant wrote."""
    if not isinstance(owners, list):
        return None
    entries = [o for o in owners if isinstance(o, Mapping)]
    controller = next((o for o in entries if o.get("controller") is True), None)
    daemonset = next((o for o in entries if o.get("kind") == "DaemonSet"), None)
    kept = [controller] if controller is not None else []
    if daemonset is not None and daemonset is not controller:
        kept.append(daemonset)
    return [{k: o[k] for k in ("apiVersion", "kind", "name", "uid", "controller") if k in o} for o in kept] or None


def trim_metadata(meta: Mapping[str, Any], kind: str) -> Obj:
    """Who the object is, whether it is being deleted, and the labels and annotations `kind` keeps."""
    out: Obj = {"name": meta.get("name")}
    for key in ("namespace", "uid", "resourceVersion", "deletionTimestamp"):
        if meta.get(key):
            out[key] = meta[key]
    if meta.get("deletionGracePeriodSeconds") is not None:  # 0 counts
        out["deletionGracePeriodSeconds"] = meta["deletionGracePeriodSeconds"]
    if kind in KEPT_LABELS and (labels := _kept_labels(meta.get("labels"), KEPT_LABELS[kind])):
        out["labels"] = labels
    if kind in KEPT_ANNOTATIONS and (annotations := _kept_annotations(meta.get("annotations"), KEPT_ANNOTATIONS[kind])):
        if kind in ("TaskRun", "PipelineRun", "Pod") and DECISION_ANNOTATION in annotations:
            # A decision record may pass MAX_KEPT_VALUE_CHARS (20 images and their loads): the queue needs
            # only its pool (queue.core.admitted_entry), the load picture its node; kept from the whole value.
            annotations[DECISION_ANNOTATION] = compact_decision((meta.get("annotations") or {}).get(DECISION_ANNOTATION))
        out["annotations"] = annotations
    # A pod's: its TaskRun (queue.core.claimed_taskrun); a TaskRun's: its PipelineRun (claimed_pipelinerun).
    if kind in ("Pod", "TaskRun") and (owners := _kept_owners(meta.get("ownerReferences"))):
        out["ownerReferences"] = owners
    # the pool status's runs placed in the last hour; the load picture: how long a decision record counts
    if kind in ("Pod", "TaskRun", "PipelineRun"):
        for key in ("creationTimestamp", "generateName"):  # load.view: generateName, what admission keyed it by
            if meta.get(key):
                out[key] = meta[key]
    return out


def _head(obj: Mapping[str, Any], api_version: str, kind: str) -> Obj:
    return {"apiVersion": api_version, "kind": kind, "metadata": trim_metadata(obj.get("metadata") or {}, kind)}


def trim_node(obj: Mapping[str, Any]) -> Obj:
    out = _head(obj, "v1", "Node")
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    out["spec"] = {"taints": spec.get("taints") or [], "unschedulable": bool(spec.get("unschedulable"))}
    ready = [
        {"type": "Ready", "status": c.get("status")} for c in status.get("conditions") or [] if c.get("type") == "Ready"
    ]
    allocatable = {"pods": status["allocatable"]["pods"]} if "pods" in (status.get("allocatable") or {}) else {}
    out["status"] = {"conditions": ready, "allocatable": allocatable}
    return out


def trim_pod(obj: Mapping[str, Any]) -> Obj:
    """Where it runs, its phase, its grace: not its containers or tolerations (admission reads those from
    the request, not the cache)."""
    out = _head(obj, "v1", "Pod")
    spec = obj.get("spec") or {}
    out["spec"] = {
        "nodeName": spec.get("nodeName"),
        "terminationGracePeriodSeconds": spec.get("terminationGracePeriodSeconds"),
    }
    gates = [{"name": g["name"]} for g in spec.get("schedulingGates") or [] if isinstance(g, Mapping) and isinstance(g.get("name"), str)]
    if any(g["name"] == POOL_SLOT_GATE for g in gates):  # waiting for a pool slot (queue.core): which pools it tolerates
        out["spec"]["schedulingGates"] = gates
        out["spec"]["tolerations"] = [{k: t[k] for k in ("key", "operator", "value") if k in t} for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
    out["status"] = {"phase": (obj.get("status") or {}).get("phase") or "Pending"}
    return out


def trim_daemonset(obj: Mapping[str, Any]) -> Obj:
    """Who the DaemonSet is (namespace, name, uid: what a pod's owner must resolve to), its annotations
    and deletion, and the parts of its pod template that decide which nodes it runs on (tolerations,
    nodeSelector, required node affinity, hostNetwork). No status, no containers."""
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp") if meta.get(k)}
    if annotations := _kept_annotations(meta.get("annotations"), KEPT_ANNOTATIONS["DaemonSet"]):
        kept["annotations"] = annotations
    pod_spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    spec: Obj = {k: pod_spec[k] for k in ("tolerations", "nodeSelector", "hostNetwork") if pod_spec.get(k)}
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED_NODE_AFFINITY)
    if required:
        spec["affinity"] = {"nodeAffinity": {REQUIRED_NODE_AFFINITY: required}}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": kept, "spec": {"template": {"spec": spec}}}


def trimmer(api_version: str, kind: str, keep: Sequence[str] = ()) -> Trim:
    """Metadata plus the top-level fields in `keep` (e.g. "data" of a ConfigMap)."""

    def trim(obj: Mapping[str, Any]) -> Obj:
        out = _head(obj, api_version, kind)
        for key in keep:
            if key in obj:
                out[key] = obj[key]
        return out

    return trim


def run_trimmer(api_version: str, kind: str) -> Trim:
    """A TaskRun or PipelineRun: metadata, `spec.status` (pending, cancelled), whether it is done
    (its Succeeded condition's status) and, of a TaskRun, `status.podName`, for the queue (queue.core)."""

    def trim(obj: Mapping[str, Any]) -> Obj:
        out = _head(obj, api_version, kind)
        status = (obj.get("spec") or {}).get("status")
        if isinstance(status, str) and status:
            out["spec"] = {"status": status[:64]}
        conditions = (obj.get("status") or {}).get("conditions")
        succeeded = [
            {"type": "Succeeded", "status": c.get("status")}
            for c in (conditions if isinstance(conditions, list) else [])
            if isinstance(c, Mapping) and c.get("type") == "Succeeded"
        ]
        kept: dict[str, Any] = {"conditions": succeeded[:1]} if succeeded else {}
        pod_name = (obj.get("status") or {}).get("podName")
        if kind == "TaskRun" and isinstance(pod_name, str) and pod_name:
            kept["podName"] = pod_name[:253]  # the pod Tekton made for it (queue.core.is_run_pod)
        if kept:
            out["status"] = kept
        return out

    return trim


def tekton_definition_trimmer(api_version: str, kind: str) -> Trim:
    """A Task, Pipeline or StepAction: metadata and only the fields of its spec image discovery reads
    (steps' names, images, refs and params, not their scripts; see core.images.image_fields)."""

    def trim(obj: Mapping[str, Any]) -> Obj:
        out = _head(obj, api_version, kind)
        if "spec" in obj:
            out["spec"] = image_fields(kind, obj["spec"])
        return out

    return trim


# -- resources ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    """One collection to list and watch."""

    name: str  # for metrics and logs: "pods", "tasks", "configmap egress-placer/policy"
    kind: str  # the kind the consumer sees: "Pod", "Task"...
    path: str  # collection URL: /api/v1/pods, /apis/tekton.dev/v1/tasks, /api/v1/namespaces/x/configmaps
    trim: Trim
    field_selector: str | None = None
    label_selector: str | None = None


def nodes() -> Resource:
    return Resource("nodes", "Node", "/api/v1/nodes", trim_node)


def namespaces() -> Resource:
    return Resource("namespaces", "Namespace", "/api/v1/namespaces", trimmer("v1", "Namespace"))


def pods() -> Resource:
    return Resource("pods", "Pod", "/api/v1/pods", trim_pod)


def daemonsets() -> Resource:
    return Resource("daemonsets", "DaemonSet", "/apis/apps/v1/daemonsets", trim_daemonset)


TEKTON_RESOURCES: dict[str, tuple[str, str]] = {
    # kind: (version, plural)
    "Task": ("v1", "tasks"),
    "Pipeline": ("v1", "pipelines"),
    "StepAction": ("v1beta1", "stepactions"),
    "TaskRun": ("v1", "taskruns"),  # metadata only: finds runs admitted without a decision
    "PipelineRun": ("v1", "pipelineruns"),
}


def tekton(kind: str) -> Resource:
    version, plural = TEKTON_RESOURCES[kind]
    api_version = f"{TEKTON_GROUP}/{version}"
    trim = tekton_definition_trimmer if kind in TektonObjects.KINDS else run_trimmer
    return Resource(plural, kind, f"/apis/{api_version}/{plural}", trim(api_version, kind))


def pools_api(kind: str, plural: str, api_version: str) -> Resource:
    """The objects of one kind of the pools API (EgressPool, EgressPlacerConfig): metadata with the
    generation (the status's observedGeneration), spec and status (the status writer compares it)."""
    keep = trimmer(api_version, kind, ("spec", "status"))

    def trim(obj: Mapping[str, Any]) -> Obj:
        out = keep(obj)
        generation = (obj.get("metadata") or {}).get("generation")
        if isinstance(generation, int):
            out["metadata"]["generation"] = generation
        return out

    return Resource(plural, kind, f"/apis/{api_version}/{plural}", trim)


def config_map(namespace: str, name: str) -> Resource:
    """One ConfigMap, by name (a field selector), with its data."""
    return Resource(
        f"configmap {namespace}/{name}",
        "ConfigMap",
        f"/api/v1/namespaces/{namespace}/configmaps",
        trimmer("v1", "ConfigMap", ("data",)),
        field_selector=f"metadata.name={name}",
    )


# -- the informer ------------------------------------------------------------------------------------

# Objects per list page: one page is decoded whole before it is trimmed, and a tenant's objects can be
# big (250 runs with 10 KB of annotations each: 2.5 MB of JSON, several times that decoded). Memory freed
# after the first sync mostly stays with the process, so the page bounds what the first sync costs for
# good. Measured at 5,000 nodes, 20,000 pods and 20,000 TaskRuns: 100 a page adds 9 MB for tenant-sized
# metadata but the first sync on the local cluster took over 60 s (each page costs the API server too);
# 500 adds 30 MB; 250 adds 19 MB with a first sync of 42 s (bench.scale).
LIST_PAGE_SIZE = 250


class WatchExpired(Exception):
    """410 Gone: the resourceVersion is too old; the informer relists."""


class WatchError(Exception):
    """An ERROR event in the watch stream (other than 410)."""


class Informer:
    """List + watch of one Resource; see the module docstring."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        on_replace: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        metrics: Metrics,
        *,
        page_size: int = LIST_PAGE_SIZE,
        watch_timeout_seconds: int = 300,
        backoff: RetryPolicy = WATCHES,
        on_error: Callable[[BaseException | None], None] = lambda error: None,
        required: bool = True,
    ) -> None:
        self.api = api
        # False: the controller starts and is ready without this cache (what it feeds stays unknown)
        self.required = required
        self.resource = resource
        self.on_replace = on_replace
        self.on_event = on_event
        self.on_error = on_error  # told of each failed list or watch, before the backoff
        self.metrics = metrics
        self.page_size = page_size
        self.watch_timeout_seconds = watch_timeout_seconds
        self.synced = threading.Event()
        self.resource_version: str | None = None  # None: the next session lists first
        self.backoff = backoff
        self._response_lock = threading.Lock()
        self._response: Any = None
        self._relist = threading.Event()
        self._log = logger.bind(resource=resource.name)

    def relist(self) -> None:
        """List again (what it keeps of each object changed, e.g. `keep_node_annotations`): the open watch
        is shut and the next session lists."""
        self._relist.set()
        self.interrupt()

    # -- lifecycle ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """List and watch until `stop` (a stop also ends a backoff at once)."""
        retry = retrying(self.backoff, lambda e: not stop.is_set(), sleep=stop.wait, before_sleep=self._before_retry)
        while not stop.is_set():
            try:
                retry(self._session, stop)
            except Exception:  # only when stopping: retry covers everything else
                if not stop.is_set():
                    self._log.exception("informer loop failed")

    def interrupt(self) -> None:
        """The stop hook: shut the open watch connection down, so that `run` ends promptly."""
        with self._response_lock:
            _shutdown(self._response)

    # -- one session: (re)list if needed, then one watch until it ends ------------------------------
    def _session(self, stop: threading.Event) -> None:
        if stop.is_set():
            return
        if self._relist.is_set():
            self._relist.clear()
            self.resource_version = None
        if self.resource_version is None:
            self._list(stop)
        try:
            self._watch(stop)
        except WatchExpired:
            self._restart("gone", relist=True)
            return
        if not stop.is_set():
            self._restart("timeout", relist=False)

    def _restart(self, cause: str, relist: bool) -> None:
        self.metrics.watch_restarts.labels(resource=self.resource.name, cause=cause).inc()
        if relist:
            self.resource_version = None
        self._log.bind(cause=cause).debug("watch restarts")

    def _before_retry(self, state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, WatchExpired):  # 410 on a paginated list (expired continue token)
            cause, relist = "gone", True
        elif isinstance(error, WatchError):
            cause, relist = "error-event", True
        else:
            cause, relist = "failure", False
        self._restart(cause, relist)
        try:
            self.on_error(error)
        except Exception:
            self._log.exception("error handler failed")
        wait = state.next_action.sleep if state.next_action else 0.0
        self._log.bind(cause=cause, attempt=state.attempt_number).warning(
            "list/watch failed, retrying in {:.1f}s: {}", wait, describe_error(error)
        )

    def _list(self, stop: threading.Event) -> None:
        items: list[Obj] = []
        token: str | None = None
        while True:
            query = {
                "limit": self.page_size,
                "continue": token,
                "fieldSelector": self.resource.field_selector,
                "labelSelector": self.resource.label_selector,
            }
            try:
                page = self.api.call("GET", self.resource.path, query=query)
            except Exception as e:
                if status_of(e) == 410:
                    raise WatchExpired(str(e)) from e
                raise
            trim = self.resource.trim
            items.extend(trim(o) for o in page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                rv = meta.get("resourceVersion")
                break
            if stop.is_set():
                return
        # A copy: what the sink keeps is its own. Ours is freed a step at a time once read (20,000 trimmed
        # pods freed at once would hold the interpreter ~10 ms: every admission answer waits for it).
        self.on_replace(list(items))
        release(items, freeze=False)
        self.resource_version = rv
        self.synced.set()
        self._log.bind(count=len(items), resource_version=rv).debug("listed")

    def _watch(self, stop: threading.Event) -> None:
        query = {
            "watch": True,
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": self.watch_timeout_seconds,
            "fieldSelector": self.resource.field_selector,
            "labelSelector": self.resource.label_selector,
        }
        # The read timeout is a safety net for a dead connection; the server ends the watch first.
        timeout = (self.api.timeout, self.watch_timeout_seconds + 30.0)
        try:
            response = self.api.stream(self.resource.path, query=query, timeout=timeout)
        except Exception as e:
            if status_of(e) == 410:
                raise WatchExpired(str(e)) from e
            raise
        with self._response_lock:
            self._response = response
        try:
            if stop.is_set() or self._relist.is_set():  # a relist asked before this watch could be shut
                return
            for line in iter_resp_lines(response):
                if stop.is_set() or self._relist.is_set():
                    return
                if line:
                    self._handle(decode_pruned(line))
        except Exception:
            if stop.is_set() or self._relist.is_set():
                return  # the connection was shut down on purpose
            raise
        finally:
            with self._response_lock:
                self._response = None
            response.close()  # a half-read stream must not go back to the pool as is
            response.release_conn()

    def _handle(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise WatchExpired(obj.get("message", "410 Gone"))
            raise WatchError(f"{obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:  # before the handler, so a consumer woken by it sees the new version (BOOKMARKs only do this)
            self.resource_version = rv
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            trimmed = self.resource.trim(obj)
            try:
                self.on_event(kind, trimmed)
            except Exception:  # a consumer's bug must not stall the watch on this event forever
                meta = trimmed["metadata"]
                self._log.bind(event=kind, namespace=meta.get("namespace"), name=meta.get("name")).exception(
                    "event handler failed; the next relist repairs the cache"
                )


def start_informers(runner: Runner, informers: Sequence[Informer]) -> list[Task]:
    """Each informer as a task of `runner` (ready once listed), its watch connection shut down on stop."""
    fixed_mmap_threshold()
    return [runner.start(f"informer {i.resource.name}", i.run, on_stop=i.interrupt, ready=i.synced) for i in informers]


M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES = -3, 128 * 1024  # glibc's mallopt parameter, and its default


def fixed_mmap_threshold() -> bool:
    """Keep glibc's malloc from raising its mmap threshold (it does, up to 32 MiB, each time it frees a
    mapped block): the few-MiB buffers orjson parses a list page into would then come from the informer
    threads' heaps, which seldom give memory back, and the first sync would leave 10-25 MB more RSS than
    it keeps. Fixed at the default, they are mapped and unmapped. False where there is no glibc."""
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def _shutdown(response: Any) -> None:
    """Unblock a thread reading `response` (the same trick as kubernetes.watch.Watch.stop)."""
    if response is None:
        return
    try:
        sock = getattr(getattr(response, "connection", None), "sock", None)
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


# -- wiring: every informer the controller needs ------------------------------------------------------


class ObjectObserver(Protocol):
    """What looks at the objects the informers see: `replace` with a whole list, `apply` one event."""

    def replace(self, kind: str, objs: list[Obj]) -> None: ...

    def apply(self, kind: str, event: str, obj: Obj) -> None: ...


class ObjectSink(ObjectObserver, Protocol):
    """Where cluster objects go first (ClusterState: one store per resource), and Tekton's settings."""

    # Tekton's definitions and settings (tekton.view.TektonView): its `cluster_resolver` is replaced whole
    # when a resolvers ConfigMap changes
    tekton: TektonView
    # the egress budgets (budgets.view.BudgetsView): the leader's record of window starts goes to it
    budgets: BudgetsView


def coschedule_of(feature_flags: Mapping[str, Any] | None) -> str | None:
    """The `coschedule` value of Tekton's feature-flags ConfigMap (None when absent)."""
    if not feature_flags:
        return None
    return (feature_flags.get("data") or {}).get("coschedule") or None


def default_pod_template_of(config_defaults: Mapping[str, Any] | None) -> Obj | None:
    """The placement fields of the `default-pod-template` in Tekton's config-defaults ConfigMap (None
    when absent). An unreadable one counts as none, with a warning: Tekton refuses it too."""
    if not config_defaults:
        return None
    text = (config_defaults.get("data") or {}).get(DEFAULT_POD_TEMPLATE_KEY)
    try:
        return default_pod_template(text)
    except InvalidDefault as e:
        logger.bind(configmap=TEKTON_CONFIG_DEFAULTS, key=DEFAULT_POD_TEMPLATE_KEY).warning(
            "Tekton's default pod template is ignored: {}", e
        )
        return None


def _fan_out(
    first: Callable[..., None], observers: Sequence[ObjectObserver], method: str, kind: str
) -> Callable[..., None]:
    """`first(kind, ...)`, then the same call on each observer (one that raises does not stop the others)."""

    def call(*args: Any) -> None:
        first(kind, *args)
        for observer in observers:
            try:
                getattr(observer, method)(kind, *args)
            except Exception:
                logger.bind(kind=kind).exception("object observer failed")

    return call


def cluster_informers(
    api: KubeApi,
    sink: ObjectSink,
    settings: Settings,
    metrics: Metrics,
    *,
    backoff: RetryPolicy = WATCHES,
    observers: Sequence[ObjectObserver] = (),
) -> list[Informer]:
    """The informers that feed the controller's state (not started), and then `observers`. The policy
    ConfigMap has its own (see policy_source)."""
    resources = [nodes(), namespaces(), pods(), daemonsets(), *(tekton(k) for k in TEKTON_RESOURCES)]
    out = [
        Informer(
            api,
            r,
            on_replace=_fan_out(sink.replace, observers, "replace", r.kind),
            on_event=_fan_out(sink.apply, observers, "apply", r.kind),
            metrics=metrics,
            watch_timeout_seconds=settings.watch_timeout_seconds,
            backoff=backoff,
        )
        for r in resources
    ]

    def tekton_config(
        name: str, read: Callable[[Obj | None], Any], keep: Callable[[Any], None], namespace: str = settings.tekton_namespace
    ) -> Informer:
        """An informer on one of Tekton's ConfigMaps: `keep(read(configmap))`, `keep(read(None))` once it is gone."""
        return Informer(
            api,
            config_map(namespace, name),
            on_replace=lambda objs: keep(read(objs[0] if objs else None)),
            on_event=lambda event, obj: keep(read(None if event == "DELETED" else obj)),
            metrics=metrics,
            watch_timeout_seconds=settings.watch_timeout_seconds,
            backoff=backoff,
        )

    out.append(tekton_config(TEKTON_FEATURE_FLAGS, coschedule_of, sink.tekton.set_coschedule))
    # Not Tekton's: the egress budgets' record of window starts in the controller's namespace, written by the
    # leader, followed by every replica (a follower that leads after a failover has the leader's starts).
    # Not required, as before it was followed: a controller whose rights lack it (RBAC of an older release during
    # an upgrade) still becomes ready, with the starts its leader records itself (docs/budgets.md).
    starts = tekton_config(STARTS_CONFIGMAP, lambda configmap: configmap, sink.budgets.record_seen, settings.namespace)
    starts.required = False
    out.append(starts)
    out.append(tekton_config(TEKTON_CONFIG_DEFAULTS, default_pod_template_of, sink.tekton.set_default_pod_template))

    # Tekton's version (controller.compat): not required; unreadable, it turns off what needs a known version.
    info = tekton_config(compat.PIPELINES_INFO, compat.version_of, sink.tekton.set_tekton_version)
    info.required = False

    def info_unreadable(error: BaseException | None) -> None:
        if error is not None and not info.synced.is_set():
            sink.tekton.set_tekton_version(None, f"ConfigMap {compat.PIPELINES_INFO} unreadable: {describe_error(error)}")

    info.on_error = info_unreadable
    out.append(info)

    # Tekton's cluster resolver rules: until both are read, no `resolver: cluster` reference is followed.
    # Two informers' threads replace the one value: each change under a lock, so neither is lost.
    resolver_lock = threading.Lock()

    def keep_settings(data: Mapping[str, Any] | str) -> None:
        with resolver_lock:
            sink.tekton.cluster_resolver = sink.tekton.cluster_resolver.with_settings(data)

    def keep_flags(data: Mapping[str, Any] | str) -> None:
        with resolver_lock:
            sink.tekton.cluster_resolver = sink.tekton.cluster_resolver.with_flags(data)

    def resolver_config(name: str, keep: Callable[[Mapping[str, Any] | str], None]) -> Informer:
        """Not required: unreadable (no Role, no namespace), it leaves the rules unknown, not the controller down."""
        informer = tekton_config(name, cluster_resolver.config_map_data, keep, settings.tekton_resolvers_namespace)
        informer.required = False

        def unreadable(error: BaseException | None) -> None:
            if error is not None and not informer.synced.is_set():
                keep(f"unreadable: {describe_error(error)}")

        informer.on_error = unreadable
        return informer

    out.append(resolver_config(cluster_resolver.CONFIG_MAP, keep_settings))
    out.append(resolver_config(cluster_resolver.FEATURE_FLAGS, keep_flags))
    return out
