"""Test-wide wiring: the local cluster's pytest plugin (the session-scoped `devcluster` fixture) and
the fixtures every test on the cluster shares: an admin API client and a fresh namespace. Tests wait
with `tests.waiting.wait_for`.

Tests that need the cluster carry the `cluster` marker; `pytest -m "not cluster"` runs the rest in seconds.
"""

from __future__ import annotations

import uuid
from typing import Callable, Iterator

import pytest
from kubernetes import client, config

from devcluster.cluster import Cluster
from tests.waiting import wait_for

pytest_plugins = ["devcluster.pytest_plugin"]


@pytest.fixture(scope="session")
def kube(devcluster: Cluster) -> Iterator[client.ApiClient]:
    """An admin API client for the session's cluster."""
    api = config.new_client_from_config(config_file=str(devcluster.kubeconfig))
    yield api
    api.close()


def _create_namespace(kube: client.ApiClient, name: str) -> str:
    """Create namespace `name` and wait for its `default` ServiceAccount (Tekton needs it)."""
    core = client.CoreV1Api(kube)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(
        f"ServiceAccount {name}/default",
        lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items),
    )
    return name


@pytest.fixture(scope="session")
def make_namespace(kube: client.ApiClient) -> Callable[[str], str]:
    """`make_namespace(name)`: create a namespace and wait for its `default` ServiceAccount; the caller deletes it."""
    return lambda name: _create_namespace(kube, name)


@pytest.fixture
def namespace(kube: client.ApiClient) -> Iterator[str]:
    """A fresh namespace that has its `default` ServiceAccount (Tekton needs it); deleted afterwards."""
    name = _create_namespace(kube, f"t-{uuid.uuid4().hex[:8]}")
    yield name
    client.CoreV1Api(kube).delete_namespace(name)
