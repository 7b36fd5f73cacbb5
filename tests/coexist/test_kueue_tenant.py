"""A tenant against egress-placer's Kueue hold (issue #25), beside Kueue and tekton-kueue: the tenant is a
ServiceAccount with the built-in `edit` in its namespace (and, aggregated, Tekton's edit), so it writes its
runs' labels and ownerReferences at will. Pool `overseas` (egress-1..3, runsPerNode 1: 3 slots, all free),
our queue (`governedBy: egress-placer`, coschedule=pipelineruns, so that a PipelineRun carries our entry on
the `spec.status` tekton-kueue holds it by) and the run guard. The namespace's ClusterQueue admits no
PipelineRun (quota 0) until the end.

- The tenant cannot write Kueue's objects: creating a Workload (one "admitted", owned by its held run) and
  writing a Workload's status are refused (`kubectl auth can-i` says no, and the API server refuses).
- It removes tekton-kueue's label from its held PipelineRun, to have us take it for ours: its Workload still
  holds it. Nor may the tenant clear its `spec.status` (run guard).
- Its bare TaskRun, labelled for Kueue and with an ownerReference forged to that Workload, skips nothing:
  it is created pending in our queue and released by us into a free slot (TEP-0164 holds no TaskRun), and
  Succeeds on the pool. That release is a pass which had the held PipelineRun before it, with 2 more slots
  free: the PipelineRun is still pending afterwards, with no Released Event, and not stopped.
- The ClusterQueue then admits one: Kueue admits the PipelineRun, we release it (our Released after its
  Workload's Admitted), and it Succeeds on the pool."""

from __future__ import annotations

import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from controller.queue.core import KUEUE_QUEUE_LABEL, PENDING, QUEUE_ANNOTATION, read_entry
from devcluster import kueue
from devcluster.cluster import Cluster
from tests.coexist.test_kueue_placement import _admitted_at, _policy, _upload
from tests.coexist.test_kueue_smoke import KUEUE, _queues
from tests.e2e.harness import editor, running_placer, service_account_user
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL_NODES, Runs, succeeded, taskrun
from tests.e2e.test_placement import tekton_coschedule
from tests.kube import TEKTON, Api, namespaced
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.coexist]

TENANT = "tenant"


def _can_i(cluster: Cluster, ns: str, verb: str, resource: str) -> bool:
    """`kubectl auth can-i VERB RESOURCE -n NS --as=<the tenant>`, what an admin would ask."""
    out = subprocess.run([str(cluster.binary("kubectl")), f"--kubeconfig={cluster.kubeconfig}", "auth", "can-i", verb, resource,
                          "-n", ns, f"--as={service_account_user(ns, TENANT)}"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() == "yes"


def _refused(call: Any) -> int:
    try:
        call()
    except ApiException as error:
        assert error.status in (403, 422), error
        return int(error.status)
    pytest.fail("the API server accepted the tenant's change")


def _when(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event.get("eventTime")).replace("Z", "+00:00")).timestamp()


def test_a_tenant_cannot_have_a_run_kueue_holds_released_nor_skip_our_queue_with_kueues_label(
    kueue_cluster: Cluster, coexist_api: Api, coexist_namespace: str, tmp_path: Path
) -> None:
    api, ns = coexist_api, coexist_namespace
    cluster_queue = _queues(api, ns, 0)  # Kueue admits nothing for now
    admin_runs = Runs(api)
    workloads = namespaced(ns, "workloads", group=KUEUE)
    try:
        with running_placer(kueue_cluster, api, _policy(tmp_path / "policy.yaml", ns, "egress-placer"), run_guard=True), \
                tekton_coschedule(api, "pipelineruns"), editor(kueue_cluster, api, ns, TENANT, service_account=True) as tenant:
            wait_for("edit to aggregate Tekton's rights", lambda: _can_i(kueue_cluster, ns, "patch", "pipelineruns.tekton.dev"), timeout=60)
            assert not _can_i(kueue_cluster, ns, "create", "workloads.kueue.x-k8s.io")
            assert not _can_i(kueue_cluster, ns, "patch", "workloads.kueue.x-k8s.io/status")
            probe = _upload(admin_runs.name("probe"))
            wait_for("egress-placer to see coschedule=pipelineruns", lambda: "coscheduled" in str(
                (admin_runs.create(ns, "pipelineruns", probe, dry_run=True)["metadata"].get("annotations") or {}).get("egress-placer.io/decision")),
                timeout=30)

            held = admin_runs.name("held")
            made = admin_runs.create(ns, "pipelineruns", _upload(held), api=tenant)
            assert made["spec"].get("status") == PENDING["PipelineRun"]
            assert read_entry(made["metadata"]["annotations"].get(QUEUE_ANNOTATION), "PipelineRun") is not None  # ours too
            assert made["metadata"]["labels"][KUEUE_QUEUE_LABEL] == kueue.DEFAULT_QUEUE  # and Kueue's
            path = namespaced(ns, "pipelineruns", held, group=TEKTON)
            workload = wait_for("Kueue's Workload for the run", lambda: next(iter(api.items(workloads)), None))
            assert not _admitted_at(workload)

            # Kueue's objects are not the tenant's.
            forged = {"apiVersion": f"{kueue.KUEUE_GROUP}/v1beta1", "kind": "Workload",
                      "metadata": {"name": "forged", "ownerReferences": [{
                          "apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "name": held, "uid": made["metadata"]["uid"],
                          "controller": True}]},
                      "spec": {"queueName": kueue.DEFAULT_QUEUE, "podSets": [{"name": "main", "count": 1, "template": {
                          "spec": {"containers": [{"name": "c", "image": "busybox"}], "restartPolicy": "Never"}}}]}}
            assert _refused(lambda: tenant.create(workloads, forged)) == 403
            assert _refused(lambda: tenant.merge_patch(f"{workloads}/{workload['metadata']['name']}/status", {"status": {"conditions": [
                {"type": "Admitted", "status": "True", "reason": "Forged", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})) == 403

            # Its label, its own to remove: the Workload still holds the run. Its status: the run guard's.
            tenant.json_patch(path, [{"op": "remove", "path": "/metadata/labels/" + KUEUE_QUEUE_LABEL.replace("/", "~1")}])
            _refused(lambda: tenant.json_patch(path, [{"op": "remove", "path": "/spec/status"}]))

            # A bare TaskRun dressed as Kueue's: labelled, and owned (not as controller: Tekton's controller owner
            # is what the queue reads) by the Workload. Queued by us, released by us, run on the pool.
            bare = admin_runs.name("bare")
            body = taskrun(bare, MATCHING_IMAGE)
            body["metadata"]["labels"] = {KUEUE_QUEUE_LABEL: kueue.DEFAULT_QUEUE}
            body["metadata"]["ownerReferences"] = [{"apiVersion": f"{kueue.KUEUE_GROUP}/v1beta1", "kind": "Workload",
                                                    "name": workload["metadata"]["name"], "uid": workload["metadata"]["uid"]}]
            made = admin_runs.create(ns, "taskruns", body, api=tenant)
            assert made["spec"].get("status") == PENDING["TaskRun"] and QUEUE_ANNOTATION in made["metadata"]["annotations"]
            admin_runs.wait_succeeded(ns, "taskruns", [bare], timeout=120)
            assert set(admin_runs.nodes_of(ns, [bare]).values()) <= set(POOL_NODES)
            released = {(e.get("regarding") or {}).get("name") for e in admin_runs.events(ns, "Released")}
            assert bare in released and held not in released, released

            run = api.call("GET", path)
            assert run["spec"].get("status") == PENDING["PipelineRun"] and succeeded(run) is None, run["spec"].get("status")

            # Kueue admits it: then, and only then, ours to release.
            api.merge_patch(f"{KUEUE}/clusterqueues/{cluster_queue}", {"spec": {"resourceGroups": [{
                "coveredResources": [kueue.PIPELINERUN_RESOURCE], "flavors": [{"name": "default-flavor", "resources": [
                    {"name": kueue.PIPELINERUN_RESOURCE, "nominalQuota": 1}]}]}]}})
            admin_runs.wait_succeeded(ns, "pipelineruns", [held], timeout=180)
            assert set(admin_runs.nodes_of(ns, [f"{held}-upload"]).values()) <= set(POOL_NODES)
            (event,) = [e for e in admin_runs.events(ns, "Released") if (e.get("regarding") or {}).get("name") == held]
            admitted = _admitted_at(api.call("GET", f"{workloads}/{workload['metadata']['name']}"))
            assert admitted is not None and _when(event) + 1.0 >= admitted, (_when(event), admitted)  # seconds in the condition
    finally:
        admin_runs.cleanup()
        api.delete(f"{KUEUE}/clusterqueues/{cluster_queue}")
