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


def _queues(api: Api, ns: str, quota: int, **more: int) -> str:
    """The ResourceFlavor (shared), a ClusterQueue `cq-NS` taking `quota` PipelineRuns at a time (and `more`
    of other resources: name -> nominal quota) and the default LocalQueue in `ns`; the ClusterQueue's name."""
    cluster_queue = f"cq-{ns}"
    for doc in kueue.queue_manifests(cluster_queue, ns, quota={kueue.PIPELINERUN_RESOURCE: quota, **more}):
        plural = doc["kind"].lower() + "s"
        path = namespaced(ns, plural, group=KUEUE) if doc["kind"] == "LocalQueue" else f"{KUEUE}/{plural}"
        if api.get(f"{path}/{doc['metadata']['name']}") is None:
            api.create(path, doc)
    return cluster_queue


def test_kueue_holds_pipelineruns_and_admits_them_one_at_a_time(
    kueue_cluster: Cluster, coexist_api: Api, coexist_namespace: str
) -> None:
    api, ns = coexist_api, coexist_namespace
    cluster_queue = _queues(api, ns, quota=1)
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


def test_a_run_released_behind_kueues_back_is_stopped(kueue_cluster: Cluster, coexist_api: Api, coexist_namespace: str) -> None:
    """What a second queue must never do (issue #25: "a run that Kueue holds is never released by us"): a run
    Kueue holds (quota 0), whose `spec.status` someone else clears, is not let run: tekton-kueue's controller
    finds an active job without an admitted Workload and stops it (`StoppedRunFinally`), and the run fails.
    Tekton may have started its first TaskRun in between (seen in one run of three): the stop races Tekton.
    A pipeline Kueue holds is thus not egress-placer's to release, even with a free pool slot."""
    api, ns = coexist_api, coexist_namespace
    cluster_queue = _queues(api, ns, quota=0)
    try:
        runs = namespaced(ns, "pipelineruns", group=TEKTON)
        assert api.create(runs, pipelinerun("held"))["spec"]["status"] == "PipelineRunPending"
        wait_for("Kueue's Workload for the run", lambda: api.items(namespaced(ns, "workloads", group=KUEUE)))
        api.json_patch(f"{runs}/held", [{"op": "remove", "path": "/spec/status"}])  # a release Kueue did not give

        stopped = wait_for("the run stopped by tekton-kueue", lambda: succeeded(r := api.get(f"{runs}/held") or {}) and r)
        assert stopped["spec"]["status"] == "StoppedRunFinally"
        assert succeeded(stopped) == "False"
    finally:
        api.delete(f"{KUEUE}/clusterqueues/{cluster_queue}")
