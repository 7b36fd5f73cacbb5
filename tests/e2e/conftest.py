"""Fixtures of the end-to-end tests: the e2e policy in force, the tenant namespaces team-cdn (may use
pool `overseas`) and team-other (may not), egress-placer running as in a cluster, and a per-test
`Runs` that deletes what the test made. At module teardown the cluster is made plain again: the
controller stopped, its webhook configuration deleted, its taints removed, the namespaces gone."""

from __future__ import annotations

from typing import Callable, Iterator

import pytest

from devcluster.cluster import Cluster
from devplacer.local_placer import start_controller
from tests.e2e.running_controller import POLICY_FILE, EgressPlacer, make_plain
from tests.e2e.tekton_runs import TEAM_CDN, TEAM_OTHER, Runs
from tests.kube import Api, namespace
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def tenants(api: Api, make_namespace: Callable[[str], str]) -> Iterator[tuple[str, str]]:
    """team-cdn and team-other, each with its `default` ServiceAccount; deleted (and gone) afterwards."""
    for name in (TEAM_CDN, TEAM_OTHER):
        wait_for(f"namespace {name} from an earlier module to be gone", lambda: api.get(namespace(name)) is None, timeout=90)
        make_namespace(name)
    yield TEAM_CDN, TEAM_OTHER
    for name in (TEAM_CDN, TEAM_OTHER):
        api.delete(namespace(name))
    for name in (TEAM_CDN, TEAM_OTHER):
        wait_for(f"namespace {name} to be deleted", lambda: api.get(namespace(name)) is None, timeout=90)


@pytest.fixture(scope="module")
def egress_placer(devcluster: Cluster, api: Api, tenants: tuple[str, str]) -> Iterator[EgressPlacer]:
    """egress-placer started with the e2e policy under its `k8s/` identity; the cluster made plain after."""
    try:
        start_controller(devcluster, POLICY_FILE)
        yield EgressPlacer(devcluster)
    finally:
        make_plain(api, devcluster)


@pytest.fixture
def runs(api: Api, egress_placer: EgressPlacer) -> Iterator[Runs]:
    """Creates this test's runs and pods (labelled with the test's id) and deletes them afterwards."""
    made = Runs(api)
    yield made
    made.cleanup()
