"""End to end, which namespaces the webhooks see (k8s/webhook.yaml, registered by the e2e controller as
k8s/ has it but for the URL), through server-side dry runs: the webhooks say sideEffects NoneOnDryRun,
so the API server calls them for a dry run and the admitted object comes back, nothing created.

A run in a tenant namespace is decided (the control); a run in kube-system or in the controller's own
namespace is not seen, the latter also once its `egress-placer.io/webhook=skip` label is gone (it is
left out by `kubernetes.io/metadata.name`, which only the API server sets). kube-system's DaemonSets
still reach the DaemonSet webhook: tests/e2e/test_daemonset_agents.py."""

from __future__ import annotations

from typing import Iterator

import pytest

from devplacer.local_placer import NAMESPACE
from tests.e2e.harness import Placer
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL, TEAM_CDN, Runs, decision_of, taskrun
from tests.kube import Api, namespace

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

SKIP_LABEL = "egress-placer.io/webhook"


@pytest.fixture
def own_namespace_unlabelled(api: Api, egress_placer: Placer) -> Iterator[str]:
    """The controller's namespace without its skip label (as after someone's `kubectl label ... -`); put back after."""
    labels = api.call("GET", namespace(NAMESPACE))["metadata"]["labels"]
    assert labels.get(SKIP_LABEL) == "skip"
    api.merge_patch(namespace(NAMESPACE), {"metadata": {"labels": {SKIP_LABEL: None}}})
    try:
        yield NAMESPACE
    finally:
        api.merge_patch(namespace(NAMESPACE), {"metadata": {"labels": {SKIP_LABEL: "skip"}}})


def admitted(runs: Runs, where: str) -> dict[str, object]:
    """The decision on a matching TaskRun created (dry run) in namespace `where`; {} when no webhook saw it."""
    return decision_of(runs.create(where, "taskruns", taskrun(runs.name("scope"), MATCHING_IMAGE), dry_run=True))


def test_a_dry_run_in_a_tenant_namespace_is_decided(runs: Runs) -> None:
    assert admitted(runs, TEAM_CDN).get("pool") == POOL


def test_runs_in_kube_system_are_not_seen(runs: Runs) -> None:
    assert admitted(runs, "kube-system") == {}


def test_runs_in_the_controller_s_namespace_are_not_seen_even_without_the_skip_label(
    runs: Runs, own_namespace_unlabelled: str
) -> None:
    assert admitted(runs, own_namespace_unlabelled) == {}
