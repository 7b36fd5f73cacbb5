"""End to end, tekton-kueue's LocalQueue label on a cluster without Kueue (issue #25), written by a tenant: a
ServiceAccount with `edit` in team-cdn (and, aggregated, Tekton's edit). Pool `overseas` queues
(tests/data/e2e/policy-queue.yaml: 6 slots, all free), coschedule=pipelineruns (a PipelineRun is queued whole,
on the `spec.status` tekton-kueue would hold it by), run guard on, and a Workload wait of 5 s
(EGRESS_PLACER_KUEUE_WORKLOAD_WAIT_SECONDS; 60 by default).

- The tenant labels its PipelineRun `kueue.x-k8s.io/queue-name`: created pending with our entry, and, as no
  Workload ever owns it (no Kueue here: what tekton-kueue not installed, or not handling the namespace, looks
  like), held: egress-placer never releases a run Kueue may hold. It takes no slot: the tenant's TaskRun,
  labelled too and created after it, is queued, released at once (TEP-0164 holds no TaskRun: the label on a
  TaskRun is nothing) and Succeeds on the pool.
- Past the wait the held run gets one Warning Event, KueueWorkloadMissing, which `kubectl get events` shows;
  `egress-placer status` lists it as held for Kueue. The tenant cannot release it itself (run guard).
- The tenant removes the label: the next pass releases it, and it Succeeds on the pool."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from controller.queue.core import KUEUE_QUEUE_LABEL, PENDING, QUEUE_ANNOTATION
from devcluster.cluster import Cluster
from devplacer.local_placer import kubectl
from tests.e2e.harness import DATA, ControllerSpec, editor, egress_placer_command, tekton_holds_taskruns, tekton_version
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL_NODES, TEAM_CDN, Runs, step, taskrun
from tests.e2e.test_placement import tekton_coschedule
from tests.kube import TEKTON, Api, namespaced
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

WAIT_SECONDS = 5
CONTROLLER = ControllerSpec(policy=DATA / "policy-queue.yaml", run_guard=True,
                            env=(("EGRESS_PLACER_KUEUE_WORKLOAD_WAIT_SECONDS", str(WAIT_SECONDS)),))
MISSING = "KueueWorkloadMissing"


def _upload(name: str) -> dict[str, Any]:
    return {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
            "metadata": {"name": name, "labels": {KUEUE_QUEUE_LABEL: "pipelines-queue"}},
            "spec": {"pipelineSpec": {"tasks": [{"name": "upload", "taskSpec": {"steps": [step(MATCHING_IMAGE)]}}]}}}


def _about(runs: Runs, reason: str, name: str) -> list[dict[str, Any]]:
    return [e for e in runs.events(TEAM_CDN, reason) if (e.get("regarding") or {}).get("name") == name]


def test_a_run_labelled_for_kueue_with_no_workload_is_held_told_and_released_once_unlabelled(
    devcluster: Cluster, api: Api, runs: Runs
) -> None:
    if not tekton_holds_taskruns(devcluster):
        pytest.skip(f"Tekton {tekton_version(devcluster)} has no TaskRunPending: egress-placer queues no TaskRun there")
    with tekton_coschedule(api, "pipelineruns"), editor(devcluster, api, TEAM_CDN, "tenant", service_account=True) as tenant:
        wait_for("edit to aggregate Tekton's rights", lambda: _may_list(tenant), timeout=60)
        wait_for("egress-placer to see coschedule=pipelineruns", lambda: "coscheduled" in str(
            (runs.create(TEAM_CDN, "pipelineruns", _upload(runs.name("probe")), dry_run=True)["metadata"].get("annotations") or {})
            .get("egress-placer.io/decision")), timeout=30)
        held = runs.name("held")
        made = runs.create(TEAM_CDN, "pipelineruns", _upload(held), api=tenant)
        assert made["spec"].get("status") == PENDING["PipelineRun"] and QUEUE_ANNOTATION in made["metadata"]["annotations"]
        path = namespaced(TEAM_CDN, "pipelineruns", held, group=TEKTON)

        task = runs.name("task")
        body = taskrun(task, MATCHING_IMAGE)
        body["metadata"]["labels"] = {KUEUE_QUEUE_LABEL: "pipelines-queue"}
        made = runs.create(TEAM_CDN, "taskruns", body, api=tenant)
        assert made["spec"].get("status") == PENDING["TaskRun"]  # queued like any other, and released
        runs.wait_succeeded(TEAM_CDN, "taskruns", [task], timeout=120)
        assert set(runs.nodes_of(TEAM_CDN, [task]).values()) <= set(POOL_NODES)

        (warning,) = wait_for(f"the {MISSING} Warning", lambda: _about(runs, MISSING, held), timeout=WAIT_SECONDS + 30)
        assert warning["type"] == "Warning" and KUEUE_QUEUE_LABEL in warning["note"], warning
        assert MISSING in kubectl(devcluster, "get", "events", "-n", TEAM_CDN, "--field-selector", f"reason={MISSING}")
        status = egress_placer_command(devcluster, "status", "--policy", str(CONTROLLER.policy))
        assert f"PipelineRun {TEAM_CDN}/{held}, held" in status.stdout, status.stdout + status.stderr
        assert api.call("GET", path)["spec"].get("status") == PENDING["PipelineRun"]
        assert not _about(runs, "Released", held)
        with pytest.raises(ApiException) as refused:
            tenant.json_patch(path, [{"op": "remove", "path": "/spec/status"}])
        assert refused.value.status in (403, 422)

        tenant.json_patch(path, [{"op": "remove", "path": "/metadata/labels/" + KUEUE_QUEUE_LABEL.replace("/", "~1")}])
        runs.wait_succeeded(TEAM_CDN, "pipelineruns", [held], timeout=120)
        assert _about(runs, "Released", held)
        assert set(runs.nodes_of(TEAM_CDN, [f"{held}-upload"]).values()) <= set(POOL_NODES)
        assert len(_about(runs, MISSING, held)) == 1


def _may_list(tenant: Api) -> bool:
    try:
        tenant.items(namespaced(TEAM_CDN, "pipelineruns", group=TEKTON))
    except ApiException:
        return False
    return True
