"""The API client, and raw JSON access through it.

`make_api_client` configures the pinned `kubernetes` client (kubeconfig or in-cluster credentials).
`KubeApi` sends requests through that client's `ApiClient` (authentication, TLS, connection pool,
token refresh) but reads and writes plain JSON: no pydantic models, which are too slow and too big
for tens of thousands of pods. Errors are the client's own `ApiException` (with `.status`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import urllib3
from kubernetes import config
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from controller.settings import Settings

# Informers hold one long-lived watch connection each; writers, events and the lease need more.
CONNECTION_POOL_SIZE = 32

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def make_api_client(settings: Settings) -> ApiClient:
    """An ApiClient for `settings.kubeconfig`, or for the pod's ServiceAccount when it is empty."""
    configuration = Configuration()
    if settings.kubeconfig:
        config.load_kube_config(config_file=settings.kubeconfig, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
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
    ) -> Any:
        query_params = [(k, v) for k, v in (query or {}).items() if v is not None]
        headers = {"Accept": JSON}
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
        return json.loads(data) if data else {}

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
