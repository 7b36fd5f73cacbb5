"""The platform components egress-placer must coexist with (issue #25): Karpenter with its KWOK provider,
Kueue and tekton-kueue, on a local cluster of their own.

`coexist_cluster` (session) brings up one cluster (`devcluster`, core plus `COEXIST`) running every one of
them that is built, in the binary cache: `make coexist` builds them all first; `make test` (CI) does not
build them (a cold build is ~25-35 min), so there these tests run only when a cache holds them, and skip,
saying which and how to build it, when it does not. `karpenter_cluster` and `kueue_cluster` skip unless that
cluster runs the component. The session's ordinary cluster (`devcluster`) never runs them: tekton-kueue
holds every new PipelineRun, which the rest of the suite does not expect.

Every test module here carries the markers `cluster` and `coexist` (`pytest -m coexist`).
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from typing import Iterator

import pytest

from devcluster import build, karpenter, kueue
from devcluster.cluster import Cluster
from devcluster.pytest_plugin import brought_up, reporter
from tests.kube import Api, api_for, namespace as namespace_path
from tests.waiting import wait_for

COEXIST = (karpenter.NAME, kueue.TEKTON_KUEUE)  # tekton-kueue implies kueue


def not_built(names: tuple[str, ...]) -> list[str]:
    """Of `names` and what they imply, those not in the binary cache."""
    return [name for name in build.with_implied(names) if build.find_optional(name) is None]


def skip_reason(missing: list[str]) -> str:
    """Which components are not built, and how to build them."""
    flags = " ".join(f"--with {name}" for name in missing)
    cold = ", ".join(f"{name} {build.OPTIONAL_COMPONENTS[name].why.split(': ')[-1]}" for name in missing)
    return f"not built: {', '.join(missing)}; `make coexist` builds them (python -m devcluster build {flags}: {cold})"


@pytest.fixture(scope="session")
def coexist_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster of its own running every component of `COEXIST` that is built (skips when none is)."""
    built = tuple(name for name in COEXIST if not not_built((name,)))
    if not built:
        pytest.skip(skip_reason(not_built(COEXIST)))
    cluster = Cluster(tmp_path_factory.mktemp("coexist"), log=reporter(request.config), optional=built)
    with brought_up(cluster) as running:
        yield running


def _running(cluster: Cluster, name: str) -> Cluster:
    if not cluster.runs_with(name):
        pytest.skip(skip_reason(not_built((name,))) if not_built((name,)) else f"{name} does not run")
    return cluster


@pytest.fixture(scope="session")
def karpenter_cluster(coexist_cluster: Cluster) -> Cluster:
    return _running(coexist_cluster, karpenter.NAME)


@pytest.fixture(scope="session")
def kueue_cluster(coexist_cluster: Cluster) -> Cluster:
    """The cluster running Kueue and tekton-kueue."""
    return _running(coexist_cluster, kueue.TEKTON_KUEUE)


@pytest.fixture(scope="session")
def coexist_api(coexist_cluster: Cluster) -> Api:
    return api_for(coexist_cluster.kubeconfig)


@contextmanager
def fresh_namespace(api: Api) -> Iterator[str]:
    """A fresh namespace of the coexistence cluster with its `default` ServiceAccount; deleted afterwards."""
    name = f"c-{uuid.uuid4().hex[:8]}"
    api.create(namespace_path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(f"ServiceAccount {name}/default", lambda: api.get(f"{namespace_path(name)}/serviceaccounts/default"))
    try:
        yield name
    finally:
        api.delete(namespace_path(name))


@pytest.fixture
def coexist_namespace(coexist_api: Api) -> Iterator[str]:
    """A fresh namespace of the coexistence cluster with its `default` ServiceAccount; deleted afterwards."""
    with fresh_namespace(coexist_api) as name:
        yield name


@pytest.fixture
def other_namespace(coexist_api: Api) -> Iterator[str]:
    """A second fresh namespace (a tenant that may not use the pool under test)."""
    with fresh_namespace(coexist_api) as name:
        yield name
