"""The API client, and raw JSON access through it.

`make_api_client` configures the pinned `kubernetes` client, finding the cluster as kubectl does
(`kubeconfig_source`): EGRESS_PLACER_KUBECONFIG, else $KUBECONFIG (a list of files, merged), else
~/.kube/config when it exists, else the pod's ServiceAccount. It raises `ClusterConfigError` when
none of these gives a usable configuration.
`KubeApi` sends requests through that client's `ApiClient` (authentication, TLS, connection pool,
token refresh) but reads and writes plain JSON: no pydantic models, which are too slow and too big
for tens of thousands of pods. Errors are the client's own `ApiException` (with `.status`).
`classify` is the one classification of them (retry, not found, conflict, refused by a disruption
budget, fail); the verbs over this transport (`reader`, `writer`) retry by it and raise `ApiError`.
"""

from __future__ import annotations

import json
import os
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

import urllib3
from kubernetes import config
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from controller.core.json_wire import decode_pruned
from controller.settings import Settings

# Informers hold one long-lived watch connection each; writers, events and the lease need more.
CONNECTION_POOL_SIZE = 32

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ClusterConfigError(Exception):
    """No usable way to reach a cluster (a kubeconfig that cannot be read, no kubeconfig outside a pod).
    The message says which source was tried and why it failed."""


def kubeconfig_source(settings: Settings, environ: Mapping[str, str] | None = None, home: Path | None = None) -> str | None:
    """The kubeconfig to load, as kubectl finds it: `settings.kubeconfig` (EGRESS_PLACER_KUBECONFIG, or
    the command's --kubeconfig), else $KUBECONFIG (one path or several joined by os.pathsep, merged),
    else ~/.kube/config when it exists; None: the pod's ServiceAccount (in-cluster)."""
    environ = os.environ if environ is None else environ
    if settings.kubeconfig:
        return settings.kubeconfig
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"]
    default = (home if home is not None else Path(os.path.expanduser("~"))) / ".kube" / "config"
    return str(default) if default.is_file() else None


def make_api_client(settings: Settings, environ: Mapping[str, str] | None = None, home: Path | None = None) -> ApiClient:
    """An ApiClient for the kubeconfig `kubeconfig_source` names (its `settings.kube_context`, or its
    current context), or for the pod's ServiceAccount; ClusterConfigError when neither works."""
    configuration = Configuration()
    source = kubeconfig_source(settings, environ, home)
    try:
        if source is not None:
            config.load_kube_config(config_file=source, context=settings.kube_context, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except Exception as e:  # ConfigException, an unreadable file, YAML that is no kubeconfig...
        where = (
            f"kubeconfig {source}"
            if source is not None
            else "no kubeconfig (EGRESS_PLACER_KUBECONFIG, KUBECONFIG, ~/.kube/config) and no in-cluster ServiceAccount"
        )
        raise ClusterConfigError(" ".join(f"{where}: {type(e).__name__}: {e}".split())[:300]) from None
    configuration.connection_pool_maxsize = CONNECTION_POOL_SIZE
    return ApiClient(configuration)


class KubeApi:
    """Plain-JSON requests through an ApiClient. Thread-safe (urllib3 pools are)."""

    def __init__(self, api_client: ApiClient, timeout: float = 10.0) -> None:
        self.api_client = api_client
        self.timeout = timeout

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str,
        timeout: float | tuple[float, float] | None,
        accept: str = JSON,
    ) -> Any:
        query_params = [(k, v) for k, v in (query or {}).items() if v is not None]
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, header_params, body, post_params = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query_params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api_client.call_api(
            method, url, header_params, body, post_params, _request_timeout=timeout or self.timeout
        )

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer. Raises ApiException on any non-2xx status."""
        response = self._send(method, path, query, body, content_type, timeout)
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        return decode_pruned(data) if data else {}

    def stream(self, path: str, *, query: Mapping[str, Any], timeout: tuple[float, float]) -> urllib3.BaseHTTPResponse:
        """A streaming GET (a watch). The caller reads it line by line and must close it."""
        response = self._send("GET", path, query, None, JSON, timeout)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException(http_resp=response)
        raw: urllib3.BaseHTTPResponse = response.response
        return raw


def status_of(error: BaseException) -> int | None:
    """The HTTP status of an API error, None for anything else (connection errors...)."""
    if isinstance(error, ApiException) and isinstance(error.status, int) and error.status > 0:
        return error.status
    return None


def describe_error(error: BaseException | None) -> str:
    """One short line for logs and messages: "HTTP 403 Forbidden: <the API server's message>", or the
    error's type and text (connection errors...)."""
    if error is None:
        return ""
    status = status_of(error)
    if status is not None:
        message = str(error_body(error).get("message") or "")
        return f"HTTP {status} {getattr(error, 'reason', '') or ''}".strip() + (f": {message}"[:300] if message else "")
    return f"{type(error).__name__}: {error}"[:300]


def describe_unreachable(error: BaseException, host: str) -> str:
    """One line for a request that got no answer from the API server at `host`: the cause urllib3
    gives (connection refused, name not resolved, TLS, timeout) without its retry wrapping."""
    reason = getattr(error, "reason", None) if isinstance(error, urllib3.exceptions.MaxRetryError) else None
    cause = reason if isinstance(reason, BaseException) else error
    text = str(cause).split("): ", 1)[-1].strip() or type(cause).__name__  # drop urllib3's "Conn(host=..., port=...)"
    return f"cannot reach the API server at {host}: {text}"[:300]


def error_body(error: BaseException) -> dict[str, Any]:
    """The Status object the API server sent with an error, or {}."""
    body = getattr(error, "body", None)
    if not body:
        return {}
    try:
        out = json.loads(body)
    except (TypeError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


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
        message = str(body.get("message") or getattr(error, "reason", None) or error).strip()
        super().__init__(f"{operation} failed ({cause}): {message}")
        self.operation = operation
        self.outcome = outcome
        self.cause = cause
        self.status = status_of(error)
        self.reason = str(body.get("reason") or "")


def retry_after(error: BaseException | None) -> float:
    """The server's Retry-After (seconds; 0 when it sent none)."""
    headers = getattr(error, "headers", None) or {}
    try:
        return max(0.0, float(headers.get("Retry-After") or 0))
    except (TypeError, ValueError):
        return 0.0
