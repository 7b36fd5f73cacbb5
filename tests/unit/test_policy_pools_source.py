"""The policy source in pools API mode when the API cannot be read before its first list (no CRD:
404; no RBAC: 403): no policy is found, said at once (the start does not wait for a sync that cannot
come), and the policy in force stays. tests/integration/test_policy_pools.py covers the objects on the
real API server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from controller.app import PolicyTracker
from controller.core.policy import PlacementPolicy
from controller.kube.policy_source import PolicySource
from controller.retry import RetryPolicy
from controller.metrics import Metrics
from controller.runner import Runner
from controller.settings import Settings
from controller.state import ClusterState
from tests.waiting import wait_for


class Unreadable:
    """A KubeApi whose every request fails with `status`."""

    timeout = 1.0

    def __init__(self, status: int) -> None:
        self.status = status
        self.calls = 0
        self.lock = threading.Lock()

    def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        with self.lock:
            self.calls += 1
        raise ApiException(status=self.status, reason="Not Found" if self.status == 404 else "Forbidden")

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no watch before a list")


@pytest.mark.parametrize(("status", "says"), [(404, "its CRDs are not installed: k8s/crds/"), (403, "HTTP 403 Forbidden")])
def test_an_unreadable_pools_api_is_no_policy_found_at_once(status: int, says: str) -> None:
    api = Unreadable(status)
    state = ClusterState(PlacementPolicy.empty(), clock=time.time)
    tracker = PolicyTracker(state, on_policy=lambda policy: None)
    source = PolicySource(
        Settings(kubeconfig="unused", policy_source="pools"),
        tracker,
        Metrics(),
        api=api,  # type: ignore[arg-type]
        on_refused=tracker.refused,
        backoff=RetryPolicy(attempts=None, initial=0.05, maximum=0.1, jitter=0.01),
    )
    runner = Runner()
    source.start(runner)
    try:
        assert source.synced.wait(5)
        assert not tracker.loaded.is_set()
        assert tracker.refusal is not None and "no policy found: the pools API (egress-placer.io) cannot be read" in tracker.refusal
        assert says in tracker.refusal
        assert "nothing is placed on a pool, the pool taints stay" in (tracker.problem() or "")
        calls = api.calls
        # the informers keep trying: a CRD installed later is picked up
        wait_for("the informers to try again", lambda: api.calls > calls, timeout=5, interval=0.02)
    finally:
        runner.stop()
