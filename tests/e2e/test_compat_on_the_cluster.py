"""End to end, feature detection (controller/compat, issue #29) on the cluster's own Tekton: what users see.

On a Tekton with TaskRunPending (v1.11.0+, the default pair) nothing is turned off: /readyz is 200 and its body
says nothing of it, no `FeatureUnsupported` Event. On an older one (the matrix's v1.9.2 cell) the controller is
ready all the same, /readyz's body says `taskrun-queue off` and why, a Warning Event `FeatureUnsupported` on Tekton's
pipelines-info ConfigMap says the same, and a TaskRun of a queued pool is created as it is (not pending: Tekton
would refuse or ignore it), placed on the pool, and runs there. PipelineRuns are queued on both."""

from __future__ import annotations

import pytest
import requests

from controller.queue.core import QUEUE_ANNOTATION
from devcluster.cluster import Cluster
from tests.e2e.harness import DATA, ControllerSpec, Placer, tekton_holds_taskruns, tekton_version
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL_NODES, TEAM_CDN, Runs, decision_of, events, taskrun
from tests.kube import Api
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

CONTROLLER = ControllerSpec(policy=DATA / "policy-queue.yaml")


def unsupported_events(api: Api) -> list[dict]:
    return events(api, "tekton-pipelines", "FeatureUnsupported")


def test_readyz_and_events_say_what_this_tekton_cannot_carry(api: Api, devcluster: Cluster, egress_placer: Placer) -> None:
    version = tekton_version(devcluster)
    assert egress_placer.ready()
    pipelines_info = api.get("/api/v1/namespaces/tekton-pipelines/configmaps/pipelines-info")
    assert pipelines_info is not None and pipelines_info["data"]["version"] == version  # stamped as a release is
    body = requests.get(egress_placer.replica.health_url + "/readyz", timeout=5).text
    if tekton_holds_taskruns(devcluster):
        assert "taskrun-queue" not in body, body
        assert not unsupported_events(api)
        return
    assert f"taskrun-queue off: Tekton {version} has no TaskRunPending" in body, body
    events = wait_for("the FeatureUnsupported Event", lambda: unsupported_events(api), timeout=30)
    assert events[0]["type"] == "Warning" and "taskrun-queue off" in events[0]["note"]
    assert events[0]["regarding"]["name"] == "pipelines-info"


def test_a_taskrun_of_a_queued_pool_is_held_only_where_tekton_can(devcluster: Cluster, runs: Runs) -> None:
    name = runs.name("queued")
    made = runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    held = tekton_holds_taskruns(devcluster)
    assert (made["spec"].get("status") == "TaskRunPending") is held, made["spec"]
    assert (QUEUE_ANNOTATION in made["metadata"].get("annotations", {})) is held
    assert decision_of(made)["pool"] == "overseas"
    runs.wait_succeeded(TEAM_CDN, "taskruns", [name], timeout=120)
    assert set(runs.nodes_of(TEAM_CDN, [name]).values()) <= POOL_NODES
