"""Smoke test of the optional devcluster components `kueue` and `tekton-kueue` (`up --with tekton-kueue`):
tekton-kueue's webhook creates every new PipelineRun `PipelineRunPending` with its LocalQueue label, and Kueue
admits the runs through a ClusterQueue that takes one PipelineRun at a time (`tekton.dev/pipelineruns`
quota 1): one runs while the other is held, then the other, and both Succeed; a bare TaskRun is never held.
Nothing of egress-placer runs."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster import kueue
from devcluster.cluster import Cluster
from tests.e2e.tekton_runs import step, succeeded, taskrun
from tests.kube import TEKTON, Api, namespaced
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.coexist]

KUEUE = f"/apis/{kueue.KUEUE_GROUP}/v1beta1"
RUN_DURATION = "devcluster.egress-placer.io/run-duration"  # kwok-stages.yaml: how long the run's pod runs


def pipelinerun(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": name, "annotations": {RUN_DURATION: "4s"}},
        "spec": {"pipelineSpec": {"tasks": [{"name": "main", "taskSpec": {"steps": [step("busybox")]}}]}},
    }


def _create(api: Api, path: str, body: dict[str, Any]) -> None:
    if api.get(f"{path}/{body['metadata']['name']}") is None:
        api.create(path, body)


def test_kueue_holds_pipelineruns_and_admits_them_one_at_a_time(
    kueue_cluster: Cluster, coexist_api: Api, coexist_namespace: str
) -> None:
    api, ns = coexist_api, coexist_namespace
    cluster_queue = f"cq-{ns}"
    for doc in kueue.queue_manifests(cluster_queue, ns, quota={kueue.PIPELINERUN_RESOURCE: 1}):
        plural = doc["kind"].lower() + "s"
        _create(api, namespaced(ns, plural, group=KUEUE) if doc["kind"] == "LocalQueue" else f"{KUEUE}/{plural}", doc)
    try:
        runs = namespaced(ns, "pipelineruns", group=TEKTON)
        created = [api.create(runs, pipelinerun(name)) for name in ("first", "second")]
        for run in created:  # tekton-kueue's webhook: held, in the namespace's default LocalQueue
            assert run["spec"].get("status") == "PipelineRunPending"
            assert run["metadata"]["labels"][kueue.QUEUE_LABEL] == kueue.DEFAULT_QUEUE

        samples: list[tuple[int, int]] = []  # (released and unfinished, held) at each look

        def finished() -> bool:
            listed = api.items(runs)
            released = [r for r in listed if r["spec"].get("status") != "PipelineRunPending"]
            running = [r for r in released if succeeded(r) is None]
            samples.append((len(running), len(listed) - len(released)))
            return len(listed) == 2 and all(succeeded(r) == "True" for r in listed)

        wait_for("both PipelineRuns Succeeded, one admitted at a time", finished, timeout=180, interval=0.25)
        assert max(running for running, _ in samples) == 1, samples  # never two at once
        assert (1, 1) in samples, samples  # one ran while Kueue held the other
        workloads = api.items(namespaced(ns, "workloads", group=KUEUE))
        assert len(workloads) == 2
        assert {w["status"]["admission"]["clusterQueue"] for w in workloads} == {cluster_queue}
    finally:
        api.delete(f"{KUEUE}/clusterqueues/{cluster_queue}")


def test_tekton_kueue_never_holds_a_bare_taskrun(kueue_cluster: Cluster, coexist_api: Api, coexist_namespace: str) -> None:
    """TEP-0164 queues PipelineRuns only: a TaskRun of its own is created as it is, and runs, with no LocalQueue."""
    runs = namespaced(coexist_namespace, "taskruns", group=TEKTON)
    created = coexist_api.create(runs, taskrun("bare", "busybox"))
    assert "status" not in created["spec"] and kueue.QUEUE_LABEL not in created["metadata"].get("labels", {})
    wait_for("the bare TaskRun Succeeded", lambda: succeeded(coexist_api.get(f"{runs}/bare") or {}) == "True", timeout=60)
