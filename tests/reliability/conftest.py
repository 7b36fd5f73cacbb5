"""Fixtures of the reliability suite: the tenant namespaces, egress-placer running as in a cluster (one
replica, or two behind the webhook proxy: a module says which with `CONTROLLER = ControllerSpec(...)`),
per-test runs that are cleaned up, and `figures`, which records each test's measured outcome for
`docs/reliability.md` (see report.py).

Every test module here carries the markers `cluster` and `reliability`. They break the session's cluster on
purpose (kill etcd, the API server, the controller) and put it back; never point them at a cluster
someone else uses (`EGRESS_PLACER_DEVCLUSTER`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from devcluster.cluster import Cluster
from devplacer.local_placer import start_controller
from tests.e2e.running_controller import make_plain as make_plain_cluster
from tests.kube import Api, namespace
from tests.reliability.burst import RetryingRuns
from tests.reliability.cluster_view import Placer, delete_lease, quietly, taints_right
from tests.reliability.suite import FIGURES, FIGURES_ENV, POLICY_FILE, TENANTS, ControllerSpec, Figures
from tests.waiting import wait_for


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    return Figures(request.node.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = FIGURES.get(report.nodeid)
    if row is None:
        return
    if report.when == "call" or report.failed:
        row.setdefault("outcome", report.outcome)
        if hasattr(report, "wasxfail"):
            row["outcome"] = "xfailed" if report.skipped else "xpassed"
            row["failure"] = report.wasxfail
        elif report.failed:
            row["outcome"] = "failed"
            row["failure"] = report.longreprtext.strip().splitlines()[-1][:300] if report.longreprtext else ""
        row.setdefault("seconds", 0.0)
        row["seconds"] = round(row["seconds"] + report.duration, 1)


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(FIGURES_ENV)
    if target and FIGURES:
        Path(target).write_text(json.dumps(list(FIGURES.values()), indent=2) + "\n")


# -- the cluster's tenants and the controller ----------------------------------------------------------


@pytest.fixture(scope="session")
def tenants(api: Api, make_namespace: Callable[[str], str]) -> Iterator[tuple[str, ...]]:
    """TEAM_CDN (may use pool `overseas`), TEAM_OTHER and TEAM_CDN_EVIL (may not); deleted afterwards."""
    for name in TENANTS:
        wait_for(f"namespace {name} from an earlier run to be gone", lambda: api.get(namespace(name)) is None, timeout=120)
        make_namespace(name)
    yield TENANTS
    for name in TENANTS:
        api.delete(namespace(name))
    for name in TENANTS:
        wait_for(f"namespace {name} to be deleted", lambda: api.get(namespace(name)) is None, timeout=120)


def make_plain(api: Api, cluster: Cluster) -> None:
    """No controller, no webhook configuration, no pool taints, no leader Lease."""
    make_plain_cluster(api, cluster)
    delete_lease(api)


@pytest.fixture(scope="module")
def placer(
    request: pytest.FixtureRequest, devcluster: Cluster, api: Api, tenants: tuple[str, ...]
) -> Iterator[Placer]:
    """egress-placer as the module's `CONTROLLER` spec says, under its k8s/ identity, pool taints on;
    the cluster made plain again afterwards."""
    spec: ControllerSpec = getattr(request.module, "CONTROLLER", ControllerSpec())
    try:
        start_controller(devcluster, POLICY_FILE, replicas=spec.replicas, proxy=spec.proxy, env=dict(spec.env))
        wait_for("the pool taints", quietly(lambda: taints_right(api)), timeout=30, interval=0.1)
        yield Placer(devcluster)
    finally:
        make_plain(api, devcluster)


@pytest.fixture
def runs(api: Api, placer: Placer) -> Iterator[RetryingRuns]:
    """This test's runs and pods (labelled with the test's id), deleted afterwards."""
    made = RetryingRuns(api)
    yield made
    made.cleanup()
