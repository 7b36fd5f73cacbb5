"""Fixtures of the reliability suite beyond the shared harness (tests/e2e/harness.py: `egress_placer`,
one replica or two behind the webhook proxy as the module's `CONTROLLER = ControllerSpec(...)` says, and
`runs`): the suite's policy and tenant namespaces, and `figures`, which records each test's measured
outcome for `docs/reliability.md` (see report.py).

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

from tests.e2e.harness import tenant_namespaces
from tests.kube import Api
from tests.reliability.suite import FIGURES, FIGURES_ENV, POLICY_FILE, TENANTS, Figures


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


# -- the suite's policy and tenants ----------------------------------------------------------------


@pytest.fixture(scope="session")
def suite_policy() -> Path:
    """The policy `egress_placer` starts with unless the module's CONTROLLER names another."""
    return POLICY_FILE


@pytest.fixture(scope="session")
def tenants(api: Api, make_namespace: Callable[[str], str]) -> Iterator[tuple[str, ...]]:
    """TEAM_CDN (may use pool `overseas`), TEAM_OTHER and TEAM_CDN_EVIL (may not); deleted afterwards."""
    with tenant_namespaces(api, make_namespace, TENANTS, timeout=120) as names:
        yield names
