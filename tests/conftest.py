"""Test-wide wiring: the local cluster's pytest plugin (the session-scoped `devcluster` fixture) and
the fixtures every test on the cluster shares: `api`, the admin client (tests/kube.py, the tests' one
client for the API server), and a fresh namespace. Tests wait with `tests.waiting.wait_for`.

Tests that need the cluster carry the `cluster` marker; `pytest -m "not cluster"` runs the rest in seconds.
"""

from __future__ import annotations

import uuid
from typing import Callable, Iterator

import pytest
from hypothesis import settings

from devcluster.cluster import Cluster
from tests.kube import Api, api_for, namespace as namespace_path
from tests.waiting import wait_for

pytest_plugins = ["devcluster.pytest_plugin", "tests.e2e.harness"]

# Properties assert what holds, never how fast: hypothesis' per-example deadline (200 ms) is a timed
# test, and it failed a property once on this 2-core machine while other work ran. Speed is the
# benchmarks' (bench/).
settings.register_profile("egress-placer", deadline=None)
settings.load_profile("egress-placer")


@pytest.fixture(scope="session")
def api(devcluster: Cluster) -> Api:
    """The admin client for the session's cluster."""
    return api_for(devcluster.kubeconfig)


def _create_namespace(api: Api, name: str) -> str:
    """Create namespace `name` and wait for its `default` ServiceAccount (Tekton needs it)."""
    api.create(namespace_path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(
        f"ServiceAccount {name}/default",
        lambda: api.get(f"{namespace_path(name)}/serviceaccounts/default"),
    )
    return name


@pytest.fixture(scope="session")
def make_namespace(api: Api) -> Callable[[str], str]:
    """`make_namespace(name)`: create a namespace and wait for its `default` ServiceAccount; the caller deletes it."""
    return lambda name: _create_namespace(api, name)


@pytest.fixture
def namespace(api: Api) -> Iterator[str]:
    """A fresh namespace that has its `default` ServiceAccount (Tekton needs it); deleted afterwards."""
    name = _create_namespace(api, f"t-{uuid.uuid4().hex[:8]}")
    yield name
    api.delete(namespace_path(name))
