"""The reads egress-placer makes outside its informers, and the one way every request is sent:
`KubeReader.call`, with the one retry policy (`controller.retry`, at least the server's Retry-After) and the
one error classification (`client.classify`); what fails raises `ApiError`. The writes are
`writer.KubeClient`'s, a reader too (as controller-runtime's Client is a Reader and a Writer).
"""

from __future__ import annotations

import base64
import time
from typing import Any, Callable, TypeVar

import tenacity
from loguru import logger

from controller.kube.client import ApiError, KubeApi, Outcome, classify, retry_after
from controller.retry import WRITES, RetryPolicy, retrying
from controller.metrics import Metrics

T = TypeVar("T")


class KubeReader:
    def __init__(
        self, api: KubeApi, metrics: Metrics, *, retry: RetryPolicy = WRITES, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.api = api
        self.metrics = metrics
        self._sleep = sleep
        self._not_before = 0.0  # monotonic: a request given up on a Retry-After holds the next one back
        # Exponential backoff with jitter, but never less than the server's Retry-After.
        self._retrying = retrying(retry, lambda e: classify(e)[0] is Outcome.RETRY, sleep=sleep, at_least=retry_after)

    def call(self, operation: str, fn: Callable[[], T]) -> T:
        """Run `fn` (one API request) with retries on transient errors; any other outcome raises ApiError."""

        def count(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            cause = classify(error)[1] if error else "unknown"
            self.metrics.api_write_retries.labels(operation=operation, cause=cause).inc()
            logger.bind(operation=operation, cause=cause, attempt=state.attempt_number).debug("write retried")

        if (wait := self._not_before - time.monotonic()) > 0:  # the server's Retry-After holds across passes too
            self._sleep(wait)
        try:
            return self._retrying.copy(before_sleep=count)(fn)
        except Exception as e:
            outcome, cause = classify(e)
            if (after := retry_after(e)) > 0:
                self._not_before = time.monotonic() + after
            raise ApiError(operation, outcome, cause, e) from e

    def get(self, operation: str, path: str) -> dict[str, Any] | None:
        """The object at `path`, None when it does not exist."""
        try:
            return self.call(operation, lambda: self.api.call("GET", path))
        except ApiError as e:
            if e.outcome is Outcome.NOT_FOUND:
                return None
            raise

    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        """(data, resourceVersion) of a Secret, None when it does not exist."""
        secret = self.get("read-secret", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if secret is None:
            return None
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        return data, secret["metadata"]["resourceVersion"]

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, None when it does not exist."""
        return self.get("read-configmap", f"/api/v1/namespaces/{namespace}/configmaps/{name}")

