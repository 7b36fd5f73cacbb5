"""Fixtures for tests on the local cluster: a Kubernetes API client and a fresh namespace per test."""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Iterator, TypeVar

import pytest
from kubernetes import client, config

from devcluster.cluster import Cluster

T = TypeVar("T")


Waiter = Callable[..., Any]


def _wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.25) -> T:
    """Poll `probe` until it returns something truthy; fail the test with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture(scope="session")
def wait_for() -> Waiter:
    """`wait_for(what, probe, timeout=60)`: poll until `probe()` is truthy, return it, or fail."""
    return _wait_for


@pytest.fixture(scope="session")
def kube(devcluster: Cluster) -> Iterator[client.ApiClient]:
    """An admin API client for the session's cluster."""
    api = config.new_client_from_config(config_file=str(devcluster.kubeconfig))
    yield api
    api.close()


@pytest.fixture
def namespace(kube: client.ApiClient) -> Iterator[str]:
    """A fresh namespace that has its `default` ServiceAccount (Tekton needs it); deleted afterwards."""
    core = client.CoreV1Api(kube)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    _wait_for(
        f"ServiceAccount {name}/default",
        lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items),
    )
    yield name
    core.delete_namespace(name)
