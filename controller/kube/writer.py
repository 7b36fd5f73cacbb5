"""Every write egress-placer makes to the API server: `KubeClient` (a `reader.KubeReader` too: one
object reads and writes, every request through the reader's retrying, classifying `call`; the
leader's Lease requests too), and the `EventRecorder` that writes Events through it. `update` is
the one optimistic-concurrency loop (read, change, write with the resourceVersion, on 409 again).
"""

from __future__ import annotations

import base64
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from typing import Any, Callable, Mapping, Sequence

from loguru import logger

from controller.core.model import Taint
from controller.core.conversion import V1BETA1 as POOLS_API_VERSION
from controller.kube.client import JSON, JSON_PATCH, MERGE_PATCH, ApiError, Outcome
from controller.kube.reader import KubeReader
from controller.queue.core import KUEUE_WORKLOADS, NODECLAIMS, NODEPOOL_LABEL, QUEUE_ANNOTATION, Workloads, workload_of
from controller.metrics import Metrics

REPORTING_CONTROLLER = "egress-placer.io/controller"
MAX_CONFLICT_ATTEMPTS = 5
MAX_NOTE = 1024  # events.k8s.io/v1 refuses longer notes

# What `update`'s `change` returns for a write: (method, body, content type, what `update` returns).
Write = tuple[str, Any, str, Any]


def _delete_options(uid: str, grace_seconds: int | None) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if uid:
        options["preconditions"] = {"uid": uid}
    if grace_seconds is not None:
        options["gracePeriodSeconds"] = grace_seconds
    return options


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def micro_time(ts: float) -> str:
    """A MicroTime as the API server writes it: 2026-07-01T12:00:00.000000Z."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubeClient(KubeReader):
    """The API writes egress-placer makes, on plain JSON: node taints, evictions, DaemonSet tolerations,
    Secrets, the webhook's CA bundle, the ConfigMaps the leader keeps (the pool guard's params, the
    last good policy), an EgressPool's status, releasing a queued run, Events."""

    def _call_or_done(self, operation: str, fn: Callable[[], Any], *outcomes: Outcome) -> bool:
        """`call`; False when it failed with one of `outcomes`, which mean done (e.g. NOT_FOUND: gone)."""
        try:
            self.call(operation, fn)
            return True
        except ApiError as e:
            if e.outcome in outcomes:
                return False
            raise

    def update(
        self, operation: str, path: str, change: Callable[[dict[str, Any]], Write | None], *, read_as: str,
        read: dict[str, Any] | None = None,
    ) -> Any:
        """The optimistic-concurrency loop on the object at `path`: `read` (the version the caller has) or
        one read fresh (as operation `read_as`) goes to `change`, whose write carries its resourceVersion;
        a conflict reads again. None when gone or nothing to do; else the result the write names."""
        for _ in range(MAX_CONFLICT_ATTEMPTS):
            fresh = read if read is not None else self.get(read_as, path)
            read = None
            write = change(fresh) if fresh is not None else None
            if write is None:
                return None
            method, body, content_type, result = write
            try:
                self.call(operation, partial(self.api.call, method, path, body=body, content_type=content_type))
                return result
            except ApiError as e:
                if e.outcome is Outcome.NOT_FOUND:
                    return None
                if e.outcome is not Outcome.CONFLICT:
                    raise
        raise ApiError(operation, Outcome.CONFLICT, "conflict", RuntimeError(f"{path} kept changing under us"))

    # -- nodes ----------------------------------------------------------------------------------------
    def set_node_taints(
        self,
        node: str,
        taints: Sequence[Taint],
        resource_version: str | None,
        *,
        rebase: Callable[[tuple[Taint, ...]], Sequence[Taint]] | None = None,
    ) -> None:
        """Make `taints` the node's whole taint list, if the node is still at `resource_version`.

        On a conflict the node is re-read; with `rebase` the list is recomputed from the fresh taints
        (e.g. `TaintChange.apply`, so a taint added meanwhile by someone else is kept), without it
        `taints` is written again. A node that is gone is done.
        """
        first = True

        def change(node: dict[str, Any]) -> Write | None:
            nonlocal taints, first
            if not first:  # read fresh after a conflict
                current = tuple(Taint.from_dict(t) for t in (node.get("spec") or {}).get("taints") or [])
                taints = tuple(rebase(current)) if rebase is not None else taints
                if tuple(taints) == current:
                    return None
            first = False
            body: dict[str, Any] = {"spec": {"taints": [t.to_dict() for t in taints] or None}}
            if node["metadata"].get("resourceVersion"):
                body["metadata"] = {"resourceVersion": node["metadata"]["resourceVersion"]}
            return "PATCH", body, MERGE_PATCH, None

        read = {"metadata": {"resourceVersion": resource_version}}
        self.update("set-node-taints", f"/api/v1/nodes/{node}", change, read_as="read-node", read=read)

    # -- pods -----------------------------------------------------------------------------------------
    def evict(self, namespace: str, name: str, uid: str = "", grace_seconds: int | None = None) -> bool:
        """Evict a pod (policy/v1 Eviction, so PodDisruptionBudgets are honoured); with `uid`, only
        that pod, not a later one of the same name; with `grace_seconds`, its containers get that long
        to stop instead of the pod's own terminationGracePeriodSeconds (a pod already terminating with
        a longer grace gets the shorter one: the API server only ever shortens it).

        True when the pod is being evicted or is already gone (or replaced); False when a
        PodDisruptionBudget does not allow it now (try again later).
        """
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        options = _delete_options(uid, grace_seconds)
        if options:
            body["deleteOptions"] = options
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"
        try:  # gone, or another pod of that name now (404, 409): done
            self._call_or_done("evict", lambda: self.api.call("POST", path, body=body), Outcome.NOT_FOUND, Outcome.CONFLICT)
        except ApiError as e:
            if e.outcome is Outcome.REFUSED:
                return False
            raise
        return True

    def delete_pod(self, namespace: str, name: str, uid: str = "", grace_seconds: int | None = None) -> None:
        """Delete a pod (no PodDisruptionBudget asked); with `uid`, only that pod, not a later one of
        the same name; with `grace_seconds` (0: at once, as a kubelet does once its containers stopped)
        instead of the pod's own grace. A pod already gone (or replaced) is fine."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        options = _delete_options(uid, grace_seconds)
        body = {"apiVersion": "v1", "kind": "DeleteOptions", **options} if options else None
        self._call_or_done("delete-pod", lambda: self.api.call("DELETE", path, body=body), Outcome.NOT_FOUND, Outcome.CONFLICT)

    # -- daemonsets -----------------------------------------------------------------------------------
    def set_daemonset_tolerations(
        self,
        namespace: str,
        name: str,
        uid: str,
        rebase: Callable[[list[Any]], list[Any]],
        annotations: Mapping[str, str],
    ) -> list[Any] | None:
        """Make the pod template's tolerations `rebase(fresh tolerations)` and set `annotations`, on
        the DaemonSet read fresh: only that one (`uid`), only if still at the version read (a merge
        patch with the resourceVersion as precondition; re-read on a conflict), and keeping the
        tolerations its owner wrote meanwhile. Changing a template restarts the DaemonSet's pods.

        The tolerations written, or None when there was nothing to change (or it is gone, or replaced).
        """

        def change(fresh: dict[str, Any]) -> Write | None:
            meta = fresh.get("metadata") or {}
            if meta.get("uid") != uid or meta.get("deletionTimestamp"):
                return None
            current = list((((fresh.get("spec") or {}).get("template") or {}).get("spec") or {}).get("tolerations") or [])
            wanted = rebase(current)
            if wanted == current:
                return None
            body = {
                "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": dict(annotations)},
                "spec": {"template": {"spec": {"tolerations": wanted}}},  # a merge patch replaces the list whole
            }
            return "PATCH", body, MERGE_PATCH, wanted

        path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
        return self.update("set-daemonset-tolerations", path, change, read_as="read-daemonset")

    # -- secrets --------------------------------------------------------------------------------------
    def write_secret(self, namespace: str, name: str, data: dict[str, bytes], resource_version: str | None) -> None:
        """Create the Secret (`resource_version` None) or update its data if it is still at that version.

        Secrets are not re-read and retried on a conflict: someone else (another replica) wrote it
        meanwhile, and the caller must read it and decide again. That raises ApiError with outcome
        CONFLICT (also when a Secret to create already exists).
        """
        encoded = {k: _b64(v) for k, v in data.items()}
        if resource_version is None:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "type": "Opaque",
                "data": encoded,
            }
            path = f"/api/v1/namespaces/{namespace}/secrets"
            self.call("create-secret", lambda: self.api.call("POST", path, body=body))
            return
        # A merge patch keeps the Secret's type, labels and annotations; the version is a precondition.
        patch = {"metadata": {"resourceVersion": resource_version}, "data": encoded}
        path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
        self.call("update-secret", lambda: self.api.call("PATCH", path, body=patch, content_type=MERGE_PATCH))

    # -- webhook configuration ------------------------------------------------------------------------
    def set_webhook_ca_bundle(self, config_name: str, ca_pem: bytes, kind: str = "mutating") -> bool:
        """Give every webhook of the `kind` ("mutating" or "validating") webhook configuration
        `config_name` this CA bundle.

        True when something changed; False when all webhooks had it already or the configuration
        does not exist (nothing to do).
        """
        if kind not in ("mutating", "validating"):
            raise ValueError(f"a webhook configuration is mutating or validating, not {kind!r}")
        wanted = _b64(ca_pem)

        def change(current: dict[str, Any]) -> Write | None:
            webhooks = current.get("webhooks") or []
            if all((w.get("clientConfig") or {}).get("caBundle") == wanted for w in webhooks):
                return None
            for w in webhooks:
                w.setdefault("clientConfig", {})["caBundle"] = wanted
            return "PUT", current, JSON, True  # PUT carries metadata.resourceVersion

        path = f"/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations/{config_name}"
        return bool(self.update("set-webhook-ca-bundle", path, change, read_as="read-webhook-config"))

    def set_crd_conversion_ca_bundle(self, crd_name: str, ca_pem: bytes) -> bool:
        """Give the CustomResourceDefinition `crd_name`'s conversion webhook this CA bundle (a merge patch
        of spec.conversion.webhook.clientConfig.caBundle alone, the resourceVersion as precondition).
        True when something changed; False when it had it, converts no other way than None, or does
        not exist."""
        wanted = _b64(ca_pem)

        def change(current: dict[str, Any]) -> Write | None:
            conversion = (current.get("spec") or {}).get("conversion") or {}
            config = (conversion.get("webhook") or {}).get("clientConfig") or {}
            if conversion.get("strategy") != "Webhook" or config.get("caBundle") == wanted:
                return None
            patch = {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": wanted}}}},
            }
            return "PATCH", patch, MERGE_PATCH, True

        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}"
        return bool(self.update("set-crd-ca-bundle", path, change, read_as="read-crd"))

    # -- ConfigMaps the leader keeps (the pool guard's params, the last good policy) --
    def create_configmap(self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str]) -> None:
        """Create the ConfigMap; one that exists already raises ApiError with outcome CONFLICT."""
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "data": dict(data),
        }
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        self.call("create-configmap", lambda: self.api.call("POST", path, body=body))

    def replace_configmap(self, configmap: Mapping[str, Any]) -> None:
        """Replace the ConfigMap as read (its metadata.resourceVersion is the precondition: a conflict
        raises ApiError with outcome CONFLICT; the caller reads again on its next pass)."""
        meta = configmap["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/configmaps/{meta['name']}"
        self.call("replace-configmap", lambda: self.api.call("PUT", path, body=dict(configmap)))

    # -- the pools API: an EgressPool's status (the leader's) -----------------------------------------
    def set_pool_status(self, name: str, patch: Mapping[str, Any]) -> None:
        """Merge `patch` into the EgressPool's status (RFC 7386 on the status subresource: a null deletes its
        key; `pool_status.core.status_patch` makes one). A pool that is gone is done."""
        body = {"status": dict(patch)}
        path = f"/apis/{POOLS_API_VERSION}/egresspools/{name}/status"
        self._call_or_done("set-pool-status", partial(self.api.call, "PATCH", path, body=body, content_type=MERGE_PATCH), Outcome.NOT_FOUND)

    def set_config_status(self, name: str, patch: Mapping[str, Any]) -> None:
        """The EgressPlacerConfig's status, as `set_pool_status` writes a pool's."""
        body = {"status": dict(patch)}
        path = f"/apis/{POOLS_API_VERSION}/egressplacerconfigs/{name}/status"
        self._call_or_done("set-config-status", partial(self.api.call, "PATCH", path, body=body, content_type=MERGE_PATCH), Outcome.NOT_FOUND)

    # -- the queue: releasing a pending run (the leader's) -----------------------------------------------
    def release_run(self, kind: str, namespace: str, name: str, uid: str, pending: str, entry: str | None = None) -> bool:
        """Clear `spec.status` of a queued TaskRun or PipelineRun (Tekton then starts it), and nothing
        else (but `entry`: our queue entry's new text, in the same patch: the egress address an egress
        budget released it to): a JSON patch that first tests the run's uid and that spec.status is
        still `pending`, so a run cancelled meanwhile stays cancelled and a release repeated (a second
        pass, a new leader) is a no-op. True when this call released it; False when it was already
        released, cancelled, gone or replaced."""
        plural = {"TaskRun": "taskruns", "PipelineRun": "pipelineruns"}[kind]
        path = f"/apis/tekton.dev/v1/namespaces/{namespace}/{plural}/{name}"
        written = [{"op": "add", "path": "/metadata/annotations/" + QUEUE_ANNOTATION.replace("~", "~0").replace("/", "~1"), "value": entry}] if entry else []
        return self._patch_as_seen("release-run", path, uid, [
            {"op": "test", "path": "/spec/status", "value": pending},
            {"op": "remove", "path": "/spec/status"},
            *written,
        ])

    def kueue_workloads(self, namespace: str) -> Workloads | None:
        """The PipelineRuns of `namespace` Kueue has a Workload for (queue.core.workload_of): uid -> admitted.
        Empty when Kueue is not installed (404); None when the look failed (the queue then releases none of
        the namespace's PipelineRuns this pass)."""
        try:
            listed = self.get("list-workloads", KUEUE_WORKLOADS.format(namespace=namespace))
        except ApiError as e:
            logger.bind(namespace=namespace).warning(f"cannot read Kueue's Workloads: {e}")
            return None
        return dict(filter(None, map(workload_of, (listed or {}).get("items") or [])))

    def node_claims(self, node_pool: str) -> list[dict[str, Any]] | None:
        """The NodeClaims of Karpenter's NodePool `node_pool` (label karpenter.sh/nodepool), for the queue of a
        provisioned pool (queue.core.launching). Empty when Karpenter is not installed (404); None when the
        look failed."""
        query = {"labelSelector": f"{NODEPOOL_LABEL}={node_pool}"}
        try:
            listed = self.call("list-nodeclaims", lambda: self.api.call("GET", NODECLAIMS, query=query))
        except ApiError as e:
            if e.outcome is Outcome.NOT_FOUND:
                return []
            logger.bind(node_pool=node_pool).warning(f"cannot read Karpenter's NodeClaims: {e}")
            return None
        items = (listed or {}).get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def ungate_pod(self, namespace: str, name: str, uid: str, gates: tuple[str, ...], gate: str) -> bool:
        """Remove `gate` from a pod's spec.schedulingGates (the scheduler then places it), and nothing
        else: a JSON patch that first tests the pod's uid and its gates as seen. True when this call
        removed it; False when the pod is gone, replaced, or its gates changed meanwhile (the next pass
        looks again)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        kept = [{"name": g} for g in gates if g != gate]
        return self._patch_as_seen("ungate-pod", path, uid, [
            {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": g} for g in gates]},
            {"op": "replace", "path": "/spec/schedulingGates", "value": kept} if kept else {"op": "remove", "path": "/spec/schedulingGates"},
        ])

    def _patch_as_seen(self, what: str, path: str, uid: str, ops: list[dict[str, Any]]) -> bool:
        """A JSON patch of `ops` behind a test of the object's uid (when known): True when it applied;
        False when a test failed (422: changed meanwhile, or another object of that name now), the
        object is gone (404) or conflicted (409)."""
        body = [*([{"op": "test", "path": "/metadata/uid", "value": uid}] if uid else []), *ops]
        try:
            self.call(what, partial(self.api.call, "PATCH", path, body=body, content_type=JSON_PATCH))
        except ApiError as e:
            if e.outcome is Outcome.NOT_FOUND or e.status == 422 or e.outcome is Outcome.CONFLICT:
                return False
            raise
        return True

    # -- events ---------------------------------------------------------------------------------------
    def create_event(self, event: Mapping[str, Any]) -> dict[str, Any]:
        namespace = event["metadata"]["namespace"]
        path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
        return self.call("create-event", lambda: self.api.call("POST", path, body=dict(event)))

    def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}"
        return self.call(
            "update-event", lambda: self.api.call("PATCH", path, body=dict(patch), content_type=MERGE_PATCH)
        )


@dataclass
class _Series:
    namespace: str
    name: str
    count: int


class EventRecorder:
    """events.k8s.io/v1 Events written by a task of the runner (`run(stop)`, with `wake` as its stop
    hook): when stopped, it writes what is queued, then ends.

    `emit` never blocks and never raises: when the bounded queue is full the event is dropped and
    counted in `metrics.events_dropped`. A repeat of the same (object, type, reason, note) within
    `series_window` seconds updates the first Event's `series` (count, lastObservedTime) instead of
    creating another.
    """

    def __init__(
        self,
        writer: KubeClient,
        metrics: Metrics,
        identity: str,
        *,
        max_queue: int = 1000,
        series_window: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.writer = writer
        self.metrics = metrics
        self.identity = identity
        self.series_window = series_window
        self.clock = clock
        self._queue: queue.Queue[tuple[dict[str, Any], str, str, str, str, float] | None] = queue.Queue(max_queue)
        self._series: OrderedDict[tuple[str, ...], tuple[_Series, float]] = OrderedDict()

    def emit(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "") -> None:
        try:
            self._queue.put_nowait((dict(regarding), type, reason, note, action, self.clock()))
        except queue.Full:
            self.metrics.events_dropped.inc()
        except Exception:  # never let reporting break the caller
            logger.opt(exception=True).debug("event not queued")

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued event was handled (tests)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._queue.unfinished_tasks

    def wake(self, timeout: float = 5.0) -> None:
        """The stop hook: behind what is queued, a mark that makes `run` look at its stop event."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass

    def run(self, stop: threading.Event) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    if stop.is_set():
                        return
                    continue
                self._write(*item)
            except Exception as e:
                logger.bind(reason=item[2] if item else "").warning("event not written: {}", e)
            finally:
                self._queue.task_done()

    def _write(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str, ts: float) -> None:
        # An Event about a cluster-scoped object (an EgressPool) must be in `default`: the API server
        # refuses it in any other namespace.
        namespace = regarding.get("namespace") or "default"
        note = note[:MAX_NOTE]
        key = (
            namespace,
            regarding.get("kind", ""),
            regarding.get("name", ""),
            regarding.get("uid", ""),
            type,
            reason,
            note,
        )
        known = self._series.get(key)
        if known is not None and ts - known[1] < self.series_window:
            series = known[0]
            series.count += 1
            try:
                self.writer.patch_event(
                    series.namespace,
                    series.name,
                    {"series": {"count": series.count, "lastObservedTime": micro_time(ts)}},
                )
                self._series.move_to_end(key)
                return
            except ApiError as e:
                if e.outcome is not Outcome.NOT_FOUND:
                    raise
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            # Named as client-go names them: <object>.<nanoseconds in hex>.
            "metadata": {
                "name": f"{regarding.get('name') or 'egress-placer'}.{time.time_ns():x}",
                "namespace": namespace,
            },
            "eventTime": micro_time(ts),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.identity,
            "action": action or reason,
            "reason": reason,
            "type": type,
            "note": note,
            "regarding": {k: v for k, v in regarding.items() if v},
        }
        created = self.writer.create_event(event)
        self._series[key] = (_Series(namespace, created["metadata"]["name"], 1), ts)
        while len(self._series) > 1000:
            self._series.popitem(last=False)
