"""Every write egress-placer makes to the API server (and the reads those writes depend on), with
ONE place that classifies errors: `KubeClient`, and the `EventRecorder` that writes Events through it.

`classify` decides, for any error: retry (429 from the API server's flow control, 5xx, connection
errors: the `kube.retry` policy, at least the server's Retry-After), done (404), conflict (409:
methods that take a resourceVersion re-read and retry), refused (429 from a PodDisruptionBudget on
an eviction: "not now") or fail (any other 4xx: raise ApiError at once). The leader's Lease
requests go through `KubeClient.call` too.
"""

from __future__ import annotations

import base64
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from functools import partial
from typing import Any, Callable, Mapping, Sequence, TypeVar

import tenacity
import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from loguru import logger

from controller.core.model import Taint
from controller.core.policy import API_VERSION as POOLS_API_VERSION
from controller.kube.client import JSON_PATCH, MERGE_PATCH, KubeApi, error_body, status_of
from controller.kube.retry import WRITES, RetryPolicy, retrying
from controller.metrics import Metrics

T = TypeVar("T")

REPORTING_CONTROLLER = "egress-placer.io/controller"
MAX_CONFLICT_ATTEMPTS = 5
MAX_NOTE = 1024  # events.k8s.io/v1 refuses longer notes


class Outcome(Enum):
    RETRY = "retry"
    NOT_FOUND = "not-found"
    CONFLICT = "conflict"
    REFUSED = "refused"  # an eviction a PodDisruptionBudget does not allow now
    FAIL = "fail"


def classify(error: BaseException) -> tuple[Outcome, str]:
    """What to do about `error`, and a short cause for metrics and logs."""
    status = status_of(error)
    if status is None:
        if isinstance(error, (urllib3.exceptions.HTTPError, OSError, ApiException)):
            return Outcome.RETRY, "connection"  # ApiException with status 0: TLS/connection trouble
        return Outcome.FAIL, type(error).__name__
    if status == 429:
        causes = (error_body(error).get("details") or {}).get("causes") or []
        if any(c.get("reason") == "DisruptionBudget" for c in causes):  # StatusCause.Type is "reason" in JSON
            return Outcome.REFUSED, "disruption-budget"
        return Outcome.RETRY, "throttled"
    if status >= 500:
        return Outcome.RETRY, "server-error"
    if status == 404:
        return Outcome.NOT_FOUND, "not-found"
    if status == 409:
        return Outcome.CONFLICT, "conflict"
    return Outcome.FAIL, f"http-{status}"


class ApiError(RuntimeError):
    """A request to the API server that did not succeed: refused, or retries exhausted.

    `status` is the HTTP status (None when there was no answer) and `reason` the API Status
    reason ("Conflict", "AlreadyExists", "NotFound"...; "" when the answer had none)."""

    def __init__(self, operation: str, outcome: Outcome, cause: str, error: BaseException) -> None:
        body = error_body(error)
        message = (body.get("message") or getattr(error, "reason", None) or str(error)).strip()
        super().__init__(f"{operation} failed ({cause}): {message}")
        self.operation = operation
        self.outcome = outcome
        self.cause = cause
        self.status = status_of(error)
        self.reason = str(body.get("reason") or "")


def is_transient(error: BaseException) -> bool:
    """Worth trying again: throttled, a server error, or a connection that failed."""
    return classify(error)[0] is Outcome.RETRY


def _retry_after(error: BaseException | None) -> float:
    headers = getattr(error, "headers", None) or {}
    try:
        return max(0.0, float(headers.get("Retry-After") or 0))
    except (TypeError, ValueError):
        return 0.0


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


class KubeClient:
    """The API calls egress-placer makes, on plain JSON: node taints, evictions, Secrets, the webhook's
    CA bundle, the ConfigMaps the leader keeps (the pool guard's params, the last good policy), Events; `call` is the one retrying, classifying way to make another."""

    def __init__(
        self,
        api_client: ApiClient | KubeApi,
        metrics: Metrics,
        *,
        retry: RetryPolicy = WRITES,
        sleep: Callable[[float], None] = time.sleep,
        timeout: float = 10.0,
    ) -> None:
        """`timeout` (per request) applies when an ApiClient is given; a KubeApi brings its own."""
        self.api = api_client if isinstance(api_client, KubeApi) else KubeApi(api_client, timeout)
        self.metrics = metrics
        # Exponential backoff with jitter, but never less than the server's Retry-After.
        self._retrying = retrying(retry, is_transient, sleep=sleep, at_least=_retry_after)

    # -- the one retrying call -----------------------------------------------------------------------
    def call(self, operation: str, fn: Callable[[], T]) -> T:
        """Run `fn` (one API request) with retries on transient errors; any other outcome raises ApiError."""

        def count(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            cause = classify(error)[1] if error else "unknown"
            self.metrics.api_write_retries.labels(operation=operation, cause=cause).inc()
            logger.bind(operation=operation, cause=cause, attempt=state.attempt_number).debug("write retried")

        try:
            return self._retrying.copy(before_sleep=count)(fn)
        except Exception as e:
            outcome, cause = classify(e)
            raise ApiError(operation, outcome, cause, e) from e

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
        path = f"/api/v1/nodes/{node}"
        for _ in range(MAX_CONFLICT_ATTEMPTS):
            body: dict[str, Any] = {"spec": {"taints": [t.to_dict() for t in taints] or None}}
            if resource_version:
                body["metadata"] = {"resourceVersion": resource_version}
            try:
                self.call("set-node-taints", partial(self.api.call, "PATCH", path, body=body, content_type=MERGE_PATCH))
                return
            except ApiError as e:
                if e.outcome is Outcome.NOT_FOUND:
                    return
                if e.outcome is not Outcome.CONFLICT:
                    raise
            try:
                fresh = self.call("read-node", lambda: self.api.call("GET", path))
            except ApiError as e:
                if e.outcome is Outcome.NOT_FOUND:
                    return
                raise
            current = tuple(Taint.from_dict(t) for t in (fresh.get("spec") or {}).get("taints") or [])
            resource_version = fresh["metadata"]["resourceVersion"]
            if rebase is not None:
                taints = tuple(rebase(current))
            if tuple(taints) == current:
                return
        raise ApiError(
            "set-node-taints", Outcome.CONFLICT, "conflict", RuntimeError(f"node {node} kept changing under us")
        )

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
        try:
            self.call("evict", lambda: self.api.call("POST", path, body=body))
        except ApiError as e:
            if e.outcome in (Outcome.NOT_FOUND, Outcome.CONFLICT):  # gone, or another pod of that name now
                return True
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
        try:
            self.call("delete-pod", lambda: self.api.call("DELETE", path, body=body))
        except ApiError as e:
            if e.outcome not in (Outcome.NOT_FOUND, Outcome.CONFLICT):
                raise

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
        path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
        for _ in range(MAX_CONFLICT_ATTEMPTS):
            try:
                fresh = self.call("read-daemonset", lambda: self.api.call("GET", path))
            except ApiError as e:
                if e.outcome is Outcome.NOT_FOUND:
                    return None
                raise
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
            try:
                self.call("set-daemonset-tolerations", partial(self.api.call, "PATCH", path, body=body, content_type=MERGE_PATCH))
                return wanted
            except ApiError as e:
                if e.outcome is Outcome.NOT_FOUND:
                    return None
                if e.outcome is not Outcome.CONFLICT:
                    raise
        raise ApiError(
            "set-daemonset-tolerations", Outcome.CONFLICT, "conflict", RuntimeError(f"{namespace}/{name} kept changing under us")
        )

    # -- secrets --------------------------------------------------------------------------------------
    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        """(data, resourceVersion) of a Secret, None when it does not exist."""
        path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
        try:
            secret = self.call("read-secret", lambda: self.api.call("GET", path))
        except ApiError as e:
            if e.outcome is Outcome.NOT_FOUND:
                return None
            raise
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        return data, secret["metadata"]["resourceVersion"]

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
        path = f"/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations/{config_name}"
        wanted = _b64(ca_pem)
        for _ in range(MAX_CONFLICT_ATTEMPTS):
            try:
                current = self.call("read-webhook-config", lambda: self.api.call("GET", path))
            except ApiError as e:
                if e.outcome is Outcome.NOT_FOUND:
                    return False
                raise
            webhooks = current.get("webhooks") or []
            if all((w.get("clientConfig") or {}).get("caBundle") == wanted for w in webhooks):
                return False
            for w in webhooks:
                w.setdefault("clientConfig", {})["caBundle"] = wanted
            try:  # PUT carries metadata.resourceVersion: a conflict means someone wrote in between
                self.call("set-webhook-ca-bundle", partial(self.api.call, "PUT", path, body=current))
                return True
            except ApiError as e:
                if e.outcome is Outcome.NOT_FOUND:
                    return False
                if e.outcome is not Outcome.CONFLICT:
                    raise
        raise ApiError(
            "set-webhook-ca-bundle", Outcome.CONFLICT, "conflict", RuntimeError(f"{config_name} kept changing under us")
        )

    # -- ConfigMaps the leader keeps (the pool guard's params, the last good policy), the guard's binding --
    def _read(self, operation: str, path: str) -> dict[str, Any] | None:
        try:
            return self.call(operation, lambda: self.api.call("GET", path))
        except ApiError as e:
            if e.outcome is Outcome.NOT_FOUND:
                return None
            raise

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, None when it does not exist."""
        return self._read("read-configmap", f"/api/v1/namespaces/{namespace}/configmaps/{name}")

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

    def read_policy_binding(self, name: str) -> dict[str, Any] | None:
        """The ValidatingAdmissionPolicyBinding, None when it does not exist."""
        return self._read(
            "read-policy-binding", f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{name}"
        )

    def replace_policy_binding(self, binding: Mapping[str, Any]) -> None:
        """Replace the binding as read (its metadata.resourceVersion is the precondition)."""
        path = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{binding['metadata']['name']}"
        self.call("replace-policy-binding", lambda: self.api.call("PUT", path, body=dict(binding)))

    # -- the pools API: an EgressPool's status (the leader's) -----------------------------------------
    def set_pool_status(self, name: str, status: Mapping[str, Any], removed: Sequence[str] = ()) -> None:
        """Make `status` the EgressPool's status (a merge patch of the status subresource; the keys in
        `removed` are deleted). A pool that is gone is done."""
        body = {"status": {**{key: None for key in removed}, **dict(status)}}
        path = f"/apis/{POOLS_API_VERSION}/egresspools/{name}/status"
        try:
            self.call("set-pool-status", partial(self.api.call, "PATCH", path, body=body, content_type=MERGE_PATCH))
        except ApiError as e:
            if e.outcome is not Outcome.NOT_FOUND:
                raise

    # -- the queue: releasing a pending run (the leader's) -----------------------------------------------
    def release_run(self, kind: str, namespace: str, name: str, uid: str, pending: str) -> bool:
        """Clear `spec.status` of a queued TaskRun or PipelineRun (Tekton then starts it), and nothing
        else: a JSON patch that first tests the run's uid and that spec.status is still `pending`, so a
        run cancelled meanwhile stays cancelled and a release repeated (a second pass, a new leader) is
        a no-op. True when this call released it; False when it was already released, cancelled, gone
        or replaced."""
        plural = {"TaskRun": "taskruns", "PipelineRun": "pipelineruns"}[kind]
        path = f"/apis/tekton.dev/v1/namespaces/{namespace}/{plural}/{name}"
        body = [
            *([{"op": "test", "path": "/metadata/uid", "value": uid}] if uid else []),
            {"op": "test", "path": "/spec/status", "value": pending},
            {"op": "remove", "path": "/spec/status"},
        ]
        try:
            self.call("release-run", partial(self.api.call, "PATCH", path, body=body, content_type=JSON_PATCH))
        except ApiError as e:
            # 422: a test failed (released, cancelled, or another run of that name now); 404: gone.
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
