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
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))  # the e2e helpers: tekton_runs, running_controller

from burst import RetryingRuns  # noqa: E402
from cluster_view import Placer, delete_lease, elapsed_until, taints_right  # noqa: E402
from running_controller import make_plain as make_plain_cluster, namespace_exists  # noqa: E402
from tekton_runs import Waiter  # noqa: E402

from devcluster.cluster import Cluster  # noqa: E402
from devplacer.controller import start_controller  # noqa: E402

FIGURES_ENV = "EGRESS_PLACER_RELIABILITY_FIGURES"  # where the figures go (JSON); report.py sets it
POLICY_FILE = Path(__file__).with_name("policy.yaml")
# The suite's own tenants (not the e2e tests' team-cdn/team-other, so the two never wait on each other).
TEAM_CDN = "rel-team-cdn"  # may use pool `overseas`
TEAM_OTHER = "rel-team-other"  # may not
TEAM_CDN_EVIL = "rel-team-cdn-evil"  # a "renamed" rel-team-cdn: matches no namespace glob of the policy
TENANTS = (TEAM_CDN, TEAM_OTHER, TEAM_CDN_EVIL)


# -- figures for docs/reliability.md -----------------------------------------------------------------

_FIGURES: dict[str, dict[str, Any]] = {}


class Figures:
    """One test's row(s) of the report. `fault(...)` for the main table, `attempt(...)` for the table
    of ways onto the pool; `set(key, value)` adds a measured figure as soon as it is known, so a
    failing test still shows what it measured."""

    def __init__(self, nodeid: str) -> None:
        self.row = _FIGURES.setdefault(nodeid, {"nodeid": nodeid, "figures": {}, "attempts": []})

    def fault(self, fault: str, load: str, expected: str) -> None:
        self.row.update(fault=fault, load=load, expected=expected)

    def set(self, key: str, value: Any) -> None:
        self.row["figures"][key] = value

    def measured(self, text: str, lost_or_misplaced: int) -> None:
        self.row.update(measured=text, lost=lost_or_misplaced)

    def attempt(self, attempt: str, outcome: str, seconds: float | None, stopped: bool) -> None:
        self.row["attempts"].append({"attempt": attempt, "outcome": outcome, "seconds": seconds, "stopped": stopped})


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    return Figures(request.node.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = _FIGURES.get(report.nodeid)
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
    if target and _FIGURES:
        Path(target).write_text(json.dumps(list(_FIGURES.values()), indent=2) + "\n")


# -- the cluster's tenants and the controller ----------------------------------------------------------


@pytest.fixture(scope="session")
def tenants(kube: client.ApiClient, make_namespace: Callable[[str], str], wait_for: Waiter) -> Iterator[tuple[str, ...]]:
    """TEAM_CDN (may use pool `overseas`), TEAM_OTHER and TEAM_CDN_EVIL (may not); deleted afterwards."""
    core = client.CoreV1Api(kube)
    for name in TENANTS:
        wait_for(f"namespace {name} from an earlier run to be gone", lambda: not namespace_exists(core, name), timeout=120)
        make_namespace(name)
    yield TENANTS
    for name in TENANTS:
        core.delete_namespace(name)
    for name in TENANTS:
        wait_for(f"namespace {name} to be deleted", lambda: not namespace_exists(core, name), timeout=120)


@dataclass(frozen=True)
class ControllerSpec:
    replicas: int = 1
    proxy: bool = False
    env: tuple[tuple[str, str], ...] = ()  # settings for this module's controller (EGRESS_PLACER_*)


def make_plain(kube: client.ApiClient, cluster: Cluster) -> None:
    """No controller, no webhook configuration, no pool taints, no leader Lease."""
    make_plain_cluster(kube, cluster)
    delete_lease(kube)


@pytest.fixture(scope="module")
def placer(
    request: pytest.FixtureRequest, devcluster: Cluster, kube: client.ApiClient, tenants: tuple[str, ...]
) -> Iterator[Placer]:
    """egress-placer as the module's `CONTROLLER` spec says, under its k8s/ identity, pool taints on;
    the cluster made plain again afterwards."""
    spec: ControllerSpec = getattr(request.module, "CONTROLLER", ControllerSpec())
    try:
        start_controller(devcluster, POLICY_FILE, replicas=spec.replicas, proxy=spec.proxy, env=dict(spec.env))
        elapsed_until("the pool taints", lambda: taints_right(client.CoreV1Api(kube)), timeout=30)
        yield Placer(devcluster)
    finally:
        make_plain(kube, devcluster)


@pytest.fixture
def runs(kube: client.ApiClient, wait_for: Waiter, placer: Placer) -> Iterator[RetryingRuns]:
    """This test's runs and pods (labelled with the test's id), deleted afterwards."""
    made = RetryingRuns(kube, wait_for)
    yield made
    made.cleanup()
