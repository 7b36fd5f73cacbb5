"""Fixtures of the end-to-end tests beyond the shared harness (tests/e2e/harness.py: `egress_placer`,
`runs`): the e2e policy, and the tenant namespaces team-cdn (may use pool `overseas`) and team-other
(may not), made per module. At module teardown the harness makes the cluster plain again: the
controller stopped, its webhook configuration deleted, its taints removed; the namespaces go too."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.e2e.harness import POLICY_FILE, tenant_namespaces
from tests.e2e.tekton_runs import TEAM_CDN, TEAM_OTHER
from tests.kube import Api


@pytest.fixture(scope="session")
def suite_policy() -> Path:
    """The policy `egress_placer` starts with unless the module's CONTROLLER names another."""
    return POLICY_FILE


@pytest.fixture(scope="module")
def tenants(api: Api, make_namespace: Callable[[str], str]) -> Iterator[tuple[str, ...]]:
    """team-cdn and team-other, each with its `default` ServiceAccount; deleted (and gone) afterwards."""
    with tenant_namespaces(api, make_namespace, (TEAM_CDN, TEAM_OTHER), timeout=90) as names:
        yield names
