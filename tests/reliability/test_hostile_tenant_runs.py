"""Reliability, a hostile tenant against the pool queue: the run-level attacks of issue 23.

The tenant is a ServiceAccount bound to the built-in `edit` ClusterRole in its own namespace, as most
clusters make one; the devcluster installs Tekton's aggregated ClusterRoles (`tekton-aggregate-edit`,
`-view`) as every Tekton release does, so `edit` may create, patch and delete TaskRuns and PipelineRuns
(the first test shows it with `kubectl auth can-i --as`). egress-placer runs with the run guard
(k8s/run-guard.yaml, controller/core/run_guard.py) and the queue policy policy-queue.yaml: pool `overseas`,
3 nodes x runsPerNode 1 = 3 slots, for rel-team-cdn only.

The pool is kept full all along (3 runs of rel-team-cdn lasting 15 minutes). Then the tenant of
rel-team-cdn, whose next run waits in the queue, tries to start it early:
(a) clearing `spec.status`; (b) emptying it; (c) rewriting its queue entry to name another pool, or an
older time; (d) creating a run pending itself and releasing it (not ours: its pod waits, with the schedulingGate
egress-placer.io/pool-slot, until a slot frees); and a tenant of rel-team-other, a namespace with no pool rights, (e) adds a queue
entry by UPDATE to its own runs. Each must not start a run early, nor give the pool a pod beyond its 3
slots. The tenant can still cancel and delete its held run, and another queue manager still releases a
run with no entry of ours. 200 forged queue annotations (at CREATE and by
UPDATE) add no metric series and no releases. (f) A Deployment of Tekton-looking pods gets no pool
placement (a pod is a run's only when its controller owner resolves by uid to a TaskRun carrying our
decision), (g) a forged entry stored while the webhook is unreachable is never released and adds no
series (the queue reads an entry only beside admission's decision naming its pool). (h) The tenant's own
pending TaskRun labelled `tekton.dev/pipelineRun` with the name of its PipelineRun the queue holds (and
owned by it, uid and all, as Tekton writes it), released onto the full pool: its pod still waits behind
the gate (Tekton copies a TaskRun's labels onto its pod: the label proves nothing; a held PipelineRun
has no TaskRuns yet). (i) The tenant removes egress-placer's schedulingGate from its own gated pod
(`edit` may patch pods): refused by the run guard. (j) Bare pods whose controller ownerReference names,
uid and all, a run of ours (a uid is no secret to its namespace): one still held (each such pod gated: a held
run has no pod yet), or one already running on the pool (no pool placement at all: its status, which `edit`
cannot write, names the pod Tekton made). (k) The fail-open window: the tenant's own pending run released
while the webhook does not answer starts ungated on the full pool; the leader reports it (Event
QueueOverCap, egress_placer_queue_over_cap_pods). (l) A review uid and generateName copied from the
tenant's stored run onto a TaskRun and bare pods move no assumed placement. (m) A bare TaskRun carrying
Tekton's affinity-assistant annotation and the pool's toleration and nodeSelector is an ordinary run (held;
or stripped of the pool), and (n) a pod with the assistant's label or annotation, or a StatefulSet of
assistant look-alikes, with the pool's toleration, keeps no pool placement.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import pytest
from kubernetes.client.exceptions import ApiException

from controller.queue.core import PENDING, POOL_SLOT_GATE, QUEUE_ANNOTATION, entry_annotation, format_time, read_entry
from controller.core.model import REVIEW_ANNOTATION
from controller.core.run_guard import RUN_GUARD_NAME
from devcluster.cluster import Cluster
from tests.e2e.harness import ControllerSpec, Placer, editor, service_account_user
from tests.e2e.tekton_runs import MATCHING_IMAGE, OTHER_IMAGE, POOL_NODES, TEST_LABEL, Runs, decision_of, node_of, step, succeeded, taskrun
from tests.kube import TEKTON, Api, namespaced, pods
from tests.reliability.suite import TEAM_CDN, TEAM_OTHER
from tests.reliability.test_webhook_unreachable import dead_webhook_url  # noqa: F401 - a fixture used below
from tests.waiting import holds_for, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

POLICY_FILE = Path(__file__).with_name("policy-queue.yaml")
CONTROLLER = ControllerSpec(policy=POLICY_FILE, run_guard=True)
SLOTS = 3  # 3 pool nodes x runsPerNode 1
LONG_RUN = {"devcluster.egress-placer.io/run-duration": "900s"}  # the blockers keep their slots all along
TENANT = "tenant"  # a ServiceAccount of TEAM_CDN (may use the pool) and of TEAM_OTHER (may not)
HOLD_SECONDS = 8.0  # how long the pool is watched for an early start after each attack
FORGED = 200


# -- the tenants and the full pool ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tenant(devcluster: Cluster, api: Api, egress_placer: Placer) -> Iterator[Api]:
    """The ServiceAccount `tenant` of TEAM_CDN with `edit` there (and, aggregated, Tekton's edit)."""
    with editor(devcluster, api, TEAM_CDN, TENANT, service_account=True) as client:
        wait_for("edit to aggregate Tekton's rights", lambda: can_i(devcluster, "patch", "taskruns.tekton.dev", TEAM_CDN), timeout=60)
        yield client


@pytest.fixture(scope="module")
def outsider(devcluster: Cluster, api: Api, egress_placer: Placer) -> Iterator[Api]:
    """The ServiceAccount `tenant` of TEAM_OTHER, a namespace with no pool rights, with `edit` there."""
    with editor(devcluster, api, TEAM_OTHER, TENANT, service_account=True) as client:
        wait_for("edit to aggregate Tekton's rights", lambda: can_i(devcluster, "patch", "taskruns.tekton.dev", TEAM_OTHER), timeout=60)
        yield client


def can_i(cluster: Cluster, verb: str, resource: str, namespace: str) -> bool:
    """`kubectl auth can-i VERB RESOURCE -n NAMESPACE --as=<the tenant's ServiceAccount>` (as admin)."""
    out = subprocess.run(
        [str(cluster.binary("kubectl")), f"--kubeconfig={cluster.kubeconfig}", "auth", "can-i", verb, resource,
         "-n", namespace, f"--as={service_account_user(namespace, TENANT)}"],
        capture_output=True, text=True, timeout=30,
    )
    return out.stdout.strip() == "yes"


def pool_pods(api: Api) -> list[dict[str, Any]]:
    """Tekton-labelled pods of the tenant namespaces bound to a pool node and not finished."""
    return [
        p for ns in (TEAM_CDN, TEAM_OTHER) for p in api.items(pods(ns))
        if node_of(p) in POOL_NODES and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


@pytest.fixture(scope="module")
def full_pool(api: Api, egress_placer: Placer) -> Iterator[list[str]]:
    """SLOTS runs of TEAM_CDN that keep the pool's slots for the whole module."""
    blockers = Runs(api)
    names = [blockers.name(f"blocker-{i}") for i in range(SLOTS)]
    for name in names:
        blockers.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE, annotations=LONG_RUN))
    wait_for("the pool to be full", lambda: len([p for p in pool_pods(api) if p["status"].get("phase") == "Running"]) == SLOTS, timeout=120)
    yield names
    blockers.cleanup()


def run_path(namespace: str, name: str, plural: str = "taskruns") -> str:
    return namespaced(namespace, plural, name, group=TEKTON)


def held_run(runs: Runs, tenant: Api, prefix: str) -> str:
    """A run of the tenant's that the queue holds (the pool is full): created pending with our entry."""
    name = runs.name(prefix)
    made = runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE), api=tenant)
    assert made["spec"].get("status") == PENDING["TaskRun"], made["spec"]
    assert read_entry(made["metadata"]["annotations"].get(QUEUE_ANNOTATION), "TaskRun") is not None
    return name


def refused(call: Any) -> str:
    """Run the tenant's `call`; the API server's refusal message (the test fails if it was accepted)."""
    try:
        call()
    except ApiException as error:
        assert error.status in (403, 422), error
        return str(error.body)
    pytest.fail("the API server accepted the change")


def still_held(api: Api, name: str) -> None:
    """For HOLD_SECONDS: the run stays pending with its entry, and the pool never has a pod beyond its slots."""
    def held() -> bool:
        run = api.call("GET", run_path(TEAM_CDN, name))
        return run["spec"].get("status") == PENDING["TaskRun"] and len(pool_pods(api)) <= SLOTS
    holds_for(f"{name} held and at most {SLOTS} pool pods", held, seconds=HOLD_SECONDS)


# -- the tenant's rights -----------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["create", "patch", "update", "delete"])
@pytest.mark.parametrize("resource", ["taskruns.tekton.dev", "pipelineruns.tekton.dev"])
def test_the_tenant_may_write_runs(devcluster: Cluster, tenant: Api, verb: str, resource: str) -> None:
    """Tekton's `tekton-aggregate-edit` reaches every `edit` user: the attacks below are a tenant's."""
    assert can_i(devcluster, verb, resource, TEAM_CDN)


# -- starting a held run early -----------------------------------------------------------------------------


STATUS_ATTACKS = {
    "a-clear-spec-status": [{"op": "remove", "path": "/spec/status"}],
    "b-empty-spec-status": [{"op": "replace", "path": "/spec/status", "value": ""}],
    "b-not-a-cancel-value": [{"op": "replace", "path": "/spec/status", "value": "Cancelled"}],  # a PipelineRun's
}


@pytest.mark.parametrize("attack", sorted(STATUS_ATTACKS))
def test_spec_status_of_a_held_run(api: Api, runs: Runs, tenant: Api, full_pool: list[str], attack: str) -> None:
    name = held_run(runs, tenant, attack[:1] + "-held")
    message = refused(lambda: tenant.json_patch(run_path(TEAM_CDN, name), STATUS_ATTACKS[attack]))
    assert RUN_GUARD_NAME in message and "TaskRunCancelled" in message, message
    still_held(api, name)


@pytest.mark.parametrize("pool, at", [("elsewhere", 1.0), ("overseas", 1.0)], ids=["another-pool", "an-older-time"])
def test_c_rewriting_the_entry(api: Api, runs: Runs, tenant: Api, full_pool: list[str], pool: str, at: float) -> None:
    name = held_run(runs, tenant, "c-held")
    forged = entry_annotation(pool, "TaskRun", at)
    patch = [{"op": "replace", "path": "/metadata/annotations/" + QUEUE_ANNOTATION.replace("/", "~1"), "value": forged}]
    message = refused(lambda: tenant.json_patch(run_path(TEAM_CDN, name), patch))
    assert RUN_GUARD_NAME in message, message
    removing = [{"op": "remove", "path": "/metadata/annotations/" + QUEUE_ANNOTATION.replace("/", "~1")}]
    assert RUN_GUARD_NAME in refused(lambda: tenant.json_patch(run_path(TEAM_CDN, name), removing))
    still_held(api, name)


def test_d_a_run_created_pending_by_its_owner_and_released(api: Api, runs: Runs, tenant: Api, full_pool: list[str]) -> None:
    name = runs.name("d-own-pending")
    body = taskrun(name, MATCHING_IMAGE)
    body["spec"]["status"] = PENDING["TaskRun"]
    made = runs.create(TEAM_CDN, "taskruns", body, api=tenant)
    assert QUEUE_ANNOTATION not in (made["metadata"].get("annotations") or {})  # not ours: the user's pending
    tenant.json_patch(run_path(TEAM_CDN, name), [{"op": "remove", "path": "/spec/status"}])  # allowed: no entry of ours
    pod = wait_for(f"the pod of {name}", lambda: runs.pods_by_taskrun(TEAM_CDN).get(name), timeout=60)
    assert {"name": POOL_SLOT_GATE} in (pod["spec"].get("schedulingGates") or []), pod["spec"]  # it waits for a slot
    holds_for(f"at most {SLOTS} pool pods", lambda: len(pool_pods(api)) <= SLOTS, seconds=HOLD_SECONDS)


def test_i_removing_the_gate_of_its_own_gated_pod(api: Api, runs: Runs, tenant: Api, full_pool: list[str]) -> None:
    """`edit` may patch pods, and the API server lets any updater remove a schedulingGate: the run guard
    lets only egress-placer remove egress-placer.io/pool-slot (other gates stay their managers')."""
    name = runs.name("i-own-pending")
    body = taskrun(name, MATCHING_IMAGE)
    body["spec"]["status"] = PENDING["TaskRun"]
    runs.create(TEAM_CDN, "taskruns", body, api=tenant)
    tenant.json_patch(run_path(TEAM_CDN, name), [{"op": "remove", "path": "/spec/status"}])
    pod = wait_for(f"the gated pod of {name}", lambda: runs.pods_by_taskrun(TEAM_CDN).get(name), timeout=60)
    gates = pod["spec"].get("schedulingGates") or []
    assert {"name": POOL_SLOT_GATE} in gates, gates
    path = pods(TEAM_CDN) + "/" + pod["metadata"]["name"]
    ungate = [{"op": "test", "path": "/spec/schedulingGates", "value": gates},
              {"op": "replace", "path": "/spec/schedulingGates", "value": [g for g in gates if g["name"] != POOL_SLOT_GATE]}]
    message = refused(lambda: tenant.json_patch(path, ungate))
    assert RUN_GUARD_NAME in message and POOL_SLOT_GATE in message, message
    holds_for(f"{name}'s pod gated and at most {SLOTS} pool pods",
              lambda: {"name": POOL_SLOT_GATE} in (api.call("GET", path)["spec"].get("schedulingGates") or [])
              and len(pool_pods(api)) <= SLOTS, seconds=HOLD_SECONDS)


@pytest.mark.parametrize("pending", [True, False], ids=["own-pending-run", "plain-run"])
def test_e_a_namespace_without_pool_rights_adds_an_entry(api: Api, runs: Runs, outsider: Api, full_pool: list[str], pending: bool) -> None:
    """An entry added by UPDATE to any run would take a slot (released, no pod) or jump the line."""
    name = runs.name("e-outsider")
    body = taskrun(name, OTHER_IMAGE)
    if pending:
        body["spec"]["status"] = PENDING["TaskRun"]
    runs.create(TEAM_OTHER, "taskruns", body, api=outsider)
    entry = entry_annotation("overseas", "TaskRun", 1.0)
    patch = [{"op": "add", "path": "/metadata/annotations", "value": {QUEUE_ANNOTATION: entry}}]
    made = api.call("GET", run_path(TEAM_OTHER, name))
    if made["metadata"].get("annotations"):
        patch = [{"op": "add", "path": "/metadata/annotations/" + QUEUE_ANNOTATION.replace("/", "~1"), "value": entry}]
    message = refused(lambda: outsider.json_patch(run_path(TEAM_OTHER, name), patch))
    assert RUN_GUARD_NAME in message and "only egress-placer adds a queue entry" in message, message
    assert QUEUE_ANNOTATION not in (api.call("GET", run_path(TEAM_OTHER, name))["metadata"].get("annotations") or {})


# -- what the tenant may still do -------------------------------------------------------------------------


def test_the_tenant_cancels_its_held_run(api: Api, runs: Runs, tenant: Api, full_pool: list[str]) -> None:
    name = held_run(runs, tenant, "cancel-held")
    tenant.json_patch(run_path(TEAM_CDN, name), [{"op": "replace", "path": "/spec/status", "value": "TaskRunCancelled"}])
    wait_for(f"{name} cancelled", lambda: succeeded(api.call("GET", run_path(TEAM_CDN, name))) == "False", timeout=60)
    assert runs.nodes_of(TEAM_CDN, [name])[name] is None  # it never had a pod


def test_a_run_with_no_entry_of_ours_is_released_by_its_own_queue_manager(api: Api, runs: Runs, outsider: Api, full_pool: list[str]) -> None:
    """tekton-kueue, Pipelines-as-Code (here: a ServiceAccount with `edit`) create runs pending and clear
    `spec.status` themselves: the run guard leaves runs without our entry alone."""
    name = runs.name("other-queue")
    body = taskrun(name, OTHER_IMAGE)
    body["spec"]["status"] = PENDING["TaskRun"]
    runs.create(TEAM_OTHER, "taskruns", body, api=outsider)
    outsider.json_patch(run_path(TEAM_OTHER, name), [{"op": "remove", "path": "/spec/status"}])
    runs.wait_succeeded(TEAM_OTHER, "taskruns", [name], timeout=60)


def test_the_tenant_deletes_its_held_run(api: Api, runs: Runs, tenant: Api, full_pool: list[str]) -> None:
    name = held_run(runs, tenant, "delete-held")
    tenant.delete(run_path(TEAM_CDN, name))
    wait_for(f"{name} gone", lambda: api.get(run_path(TEAM_CDN, name)) is None, timeout=60)


# -- forged entries add nothing ---------------------------------------------------------------------------


def test_200_forged_entries_add_no_series_and_no_releases(
    api: Api, runs: Runs, tenant: Api, egress_placer: Placer, full_pool: list[str]
) -> None:
    """FORGED pending runs of the tenant, each created with an entry naming a made-up pool (admission
    removes it: its own decision is the record), then each given one by UPDATE (the run guard refuses)."""
    names = [runs.name(f"forged-{i:03d}") for i in range(FORGED)]

    def create(i: int) -> dict[str, Any]:
        body = taskrun(names[i], OTHER_IMAGE, annotations={QUEUE_ANNOTATION: entry_annotation(f"made-up-{i}", "TaskRun", 1.0)})
        body["spec"]["status"] = PENDING["TaskRun"]
        return runs.create(TEAM_CDN, "taskruns", body, api=tenant)

    def update(i: int) -> str:
        entry = json.dumps({"pool": f"made-up-{i}", "kind": "TaskRun", "time": format_time(1.0)})
        path = "/metadata/annotations/" + QUEUE_ANNOTATION.replace("/", "~1")
        return refused(lambda: tenant.json_patch(run_path(TEAM_CDN, names[i]), [{"op": "add", "path": path, "value": entry}]))

    with ThreadPoolExecutor(max_workers=8) as workers:
        made = list(workers.map(create, range(FORGED)))
        assert all(QUEUE_ANNOTATION not in (m["metadata"].get("annotations") or {}) for m in made)
        messages = list(workers.map(update, range(FORGED)))
    assert all(RUN_GUARD_NAME in m for m in messages), messages[0]

    def nothing_added() -> bool:
        listed = runs.listed(TEAM_CDN, "taskruns")
        forged = [listed[n] for n in names if n in listed]
        return (len(forged) == FORGED and all(r["spec"].get("status") == PENDING["TaskRun"] for r in forged)
                and "made-up-" not in egress_placer.metrics_text())
    holds_for(f"{FORGED} forged runs still pending, no made-up pool in /metrics", nothing_added, seconds=HOLD_SECONDS, interval=1.0)


# -- the queue-state fixes -----------------------------------------------------------------------------


def test_f_a_deployment_of_tekton_looking_pods(api: Api, runs: Runs, tenant: Api, full_pool: list[str]) -> None:
    name = runs.name("f-lookalike")
    labels = {"app": name, TEST_LABEL: runs.id, "tekton.dev/taskRun": name}
    body = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": {TEST_LABEL: runs.id}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": labels, "annotations": LONG_RUN},
                         "spec": {"containers": [{"name": "step-upload", "image": MATCHING_IMAGE, "command": ["sleep", "infinity"]}]}},
        },
    }
    deployments = namespaced(TEAM_CDN, "deployments", group="/apis/apps/v1")
    tenant.create(deployments, body)
    try:
        bound = wait_for("the look-alike pods bound", lambda: [
            p for p in api.items(pods(TEAM_CDN), labelSelector=f"app={name}") if node_of(p)] or None, timeout=60)
        assert not [node_of(p) for p in bound if node_of(p) in POOL_NODES], "a look-alike pod was placed on the pool"
    finally:
        api.delete(f"{deployments}/{name}")
        api.delete(pods(TEAM_CDN), labelSelector=f"app={name}", gracePeriodSeconds=0)


def test_g_a_forged_entry_while_the_webhook_is_unreachable(
    api: Api, runs: Runs, tenant: Api, egress_placer: Placer, full_pool: list[str], dead_webhook_url: str
) -> None:
    name = runs.name("g-unreachable")
    body = taskrun(name, OTHER_IMAGE, annotations={QUEUE_ANNOTATION: entry_annotation("made-up-ghost", "TaskRun", 1.0)})
    body["spec"]["status"] = PENDING["TaskRun"]
    made = runs.create(TEAM_CDN, "taskruns", body, api=tenant)
    assert QUEUE_ANNOTATION in made["metadata"]["annotations"]  # no webhook answered: stored as forged

    def still_pending() -> bool:
        run = api.call("GET", run_path(TEAM_CDN, name))
        return run["spec"].get("status") == PENDING["TaskRun"] and "made-up-ghost" not in egress_placer.metrics_text()
    holds_for(f"{name} not released, no made-up pool series", still_pending, seconds=HOLD_SECONDS)


def held_pipelinerun(runs: Runs, tenant: Api, prefix: str) -> dict[str, Any]:
    """A coscheduled PipelineRun of the tenant's that the queue holds whole (a volumeClaimTemplate workspace:
    Tekton's default `coschedule: workspaces`); held, Tekton makes no PVC and no TaskRun for it."""
    uses = [{"name": "ws"}]
    claim = {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}}
    body = {
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {"name": runs.name(prefix)},
        "spec": {"pipelineSpec": {"workspaces": uses, "tasks": [
                     {"name": "upload", "workspaces": uses, "taskSpec": {"workspaces": uses, "steps": [step(MATCHING_IMAGE)]}}]},
                 "workspaces": [{"name": "ws", "volumeClaimTemplate": claim}]},
    }
    made = runs.create(TEAM_CDN, "pipelineruns", body, api=tenant)
    assert made["spec"].get("status") == PENDING["PipelineRun"], made["spec"]
    assert read_entry(made["metadata"]["annotations"].get(QUEUE_ANNOTATION), "PipelineRun") is not None
    return made


@pytest.mark.parametrize("owned", [False, True], ids=["label", "label-and-owner-uid"])
def test_h_a_taskrun_claiming_a_held_pipelinerun(api: Api, runs: Runs, tenant: Api, full_pool: list[str], owned: bool) -> None:
    whole = held_pipelinerun(runs, tenant, "h-whole")
    name = runs.name("h-claim")
    body = taskrun(name, MATCHING_IMAGE)
    body["metadata"]["labels"] = {"tekton.dev/pipelineRun": whole["metadata"]["name"]}
    if owned:
        body["metadata"]["ownerReferences"] = [{"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "name": whole["metadata"]["name"],
                                                "uid": whole["metadata"]["uid"], "controller": True}]
    body["spec"]["status"] = PENDING["TaskRun"]
    runs.create(TEAM_CDN, "taskruns", body, api=tenant)
    tenant.json_patch(run_path(TEAM_CDN, name), [{"op": "remove", "path": "/spec/status"}])  # allowed: no entry of ours
    pod = wait_for(f"the pod of {name}", lambda: runs.pods_by_taskrun(TEAM_CDN).get(name), timeout=60)
    assert pod["metadata"]["labels"].get("tekton.dev/pipelineRun") == whole["metadata"]["name"]  # Tekton copied it
    assert {"name": POOL_SLOT_GATE} in (pod["spec"].get("schedulingGates") or []), pod["spec"]  # it waits for a slot

    def held() -> bool:
        run = api.call("GET", run_path(TEAM_CDN, whole["metadata"]["name"], "pipelineruns"))
        return run["spec"].get("status") == PENDING["PipelineRun"] and len(pool_pods(api)) <= SLOTS
    holds_for(f"{whole['metadata']['name']} held and at most {SLOTS} pool pods", held, seconds=HOLD_SECONDS)


@pytest.mark.parametrize("claimed", ["a-running-run", "a-held-run"])
def test_j_bare_pods_claiming_a_run_of_ours(api: Api, runs: Runs, tenant: Api, full_pool: list[str], claimed: str) -> None:
    owner = full_pool[0] if claimed == "a-running-run" else held_run(runs, tenant, "j-held")
    run = tenant.call("GET", run_path(TEAM_CDN, owner))
    made = []
    for i in range(2):
        body = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": runs.name(f"j-bare-{claimed[2:6]}-{i}"), "annotations": LONG_RUN,
                         "ownerReferences": [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": owner,
                                              "uid": run["metadata"]["uid"], "controller": True}]},
            "spec": {"containers": [{"name": "step-main", "image": MATCHING_IMAGE}]},
        }
        made.append(runs.create_pod(TEAM_CDN, body, api=tenant))
    if claimed == "a-running-run":
        # Its status names the pod Tekton made (status is a subresource: `edit` cannot write it): no other
        # pod is its pod, so these get no pool placement at all (stripped like any pod) and take no slot.
        assert run["status"].get("podName") and all(m["metadata"]["name"] != run["status"]["podName"] for m in made)
        assert not [m["spec"] for m in made if m["spec"].get("schedulingGates") or decision_of(m)], [m["spec"] for m in made]
        def nodes() -> list[str | None] | None:
            found = [node_of(api.call("GET", f"{pods(TEAM_CDN)}/{m['metadata']['name']}")) for m in made]
            return found if all(found) else None
        bound = wait_for("the bare pods bound", nodes, timeout=60)
        assert not set(bound) & set(POOL_NODES), bound
    else:  # a held run has no pod yet: each waits for a slot
        assert all({"name": POOL_SLOT_GATE} in (m["spec"].get("schedulingGates") or []) for m in made), [m["spec"] for m in made]
    holds_for(f"at most {SLOTS} pool pods", lambda: len(pool_pods(api)) <= SLOTS, seconds=HOLD_SECONDS)


# -- the webhook away, and a copied review uid ----------------------------------------------------------


@pytest.fixture
def own_pending_run(runs: Runs, tenant: Api, full_pool: list[str]) -> Iterator[str]:
    """A run the tenant created pending itself (not ours: no entry), admitted while the webhook answers: its
    pod template tolerates the pool. Deleted, pod and all, afterwards (the later tests count pool pods)."""
    name = runs.name("k-own-pending")
    body = taskrun(name, MATCHING_IMAGE, annotations=LONG_RUN)
    body["spec"]["status"] = PENDING["TaskRun"]
    made = runs.create(TEAM_CDN, "taskruns", body, api=tenant)
    assert decision_of(made).get("pool") == "overseas" and QUEUE_ANNOTATION not in made["metadata"]["annotations"]
    yield name
    runs.api.delete(run_path(TEAM_CDN, name))
    runs.api.delete(pods(TEAM_CDN), labelSelector=f"tekton.dev/taskRun={name}", gracePeriodSeconds=0)
    wait_for(f"the pod of {name} gone", lambda: name not in runs.pods_by_taskrun(TEAM_CDN), timeout=60)


def test_k_a_released_runs_pod_made_while_the_webhook_is_unreachable(
    api: Api, runs: Runs, tenant: Api, egress_placer: Placer, full_pool: list[str], own_pending_run: str, dead_webhook_url: str
) -> None:
    """The fail-open window: the tenant releases its own pending run while the webhook does not answer
    (failurePolicy Ignore). Tekton's pod of it is not gated, and its TaskRun's pod template (admission's, at
    CREATE) already tolerates the pool: it starts on the full pool, a 4th pod on 3 slots. No admission
    policy can tell it from a run the queue released (a policy sees no webhook's answer), so the leader
    reports it: a Warning Event QueueOverCap on the pod, and egress_placer_queue_over_cap_pods{pool} 1.
    Before: nothing showed it (the pod ran unseen)."""
    name = own_pending_run
    tenant.json_patch(run_path(TEAM_CDN, name), [{"op": "remove", "path": "/spec/status"}])  # allowed: no entry of ours

    def escaped() -> dict[str, Any] | None:
        pod = runs.pods_by_taskrun(TEAM_CDN).get(name)
        return pod if node_of(pod) in POOL_NODES else None
    pod = wait_for(f"the pod of {name} on the pool", escaped, timeout=60)
    assert not pod["spec"].get("schedulingGates"), pod["spec"]  # no webhook answered: not gated
    pod_name = pod["metadata"]["name"]
    reported = wait_for(f"a QueueOverCap Event on {pod_name}", lambda: [
        e for e in runs.events(TEAM_CDN, "QueueOverCap") if (e.get("regarding") or {}).get("name") == pod_name] or None, timeout=30)
    assert reported[0]["type"] == "Warning" and "beyond its 3 slot(s)" in reported[0]["note"], reported[0]
    wait_for("queue_over_cap_pods 1", lambda: egress_placer.metric("egress_placer_queue_over_cap_pods", {"pool": "overseas"}) == 1,
             timeout=30)


def test_l_a_copied_review_uid_and_generate_name(api: Api, runs: Runs, tenant: Api, egress_placer: Placer, full_pool: list[str]) -> None:
    """Admission assumes a run created with generateName under generateName + its review's uid (no name yet);
    the stored run naming that uid settles it. The tenant copies the uid and the generateName of its own
    stored run onto a TaskRun (admission writes its own review uid over it) and onto bare pods (stored as
    forged): the pool's assumed placements stay where they were. The copy comes after the real run in every
    watch (the uid shows only once the run is stored), so it finds nothing left to settle; this held before
    the #23 changes too (tests/unit/test_shared_load.py has the replica's view of it)."""
    prefix = runs.name("l-gen") + "-"
    body = taskrun("unused", MATCHING_IMAGE)
    body["metadata"].pop("name")
    body["metadata"]["generateName"] = prefix
    real = runs.create(TEAM_CDN, "taskruns", body, api=tenant)
    review = real["metadata"]["annotations"][REVIEW_ANNOTATION]
    before = egress_placer.metric("egress_placer_pool_node_load", {"pool": "overseas", "state": "assumed"})
    copy = json.loads(json.dumps(body))
    copy["metadata"]["annotations"] = {REVIEW_ANNOTATION: review}
    stored = runs.create(TEAM_CDN, "taskruns", copy, api=tenant)
    assert stored["metadata"]["annotations"][REVIEW_ANNOTATION] != review  # admission's own uid, not the copy
    for _ in range(2):
        made = runs.create_pod(TEAM_CDN, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": prefix, "annotations": {REVIEW_ANNOTATION: review, **LONG_RUN}},
            "spec": {"containers": [{"name": "main", "image": OTHER_IMAGE}]}}, api=tenant)
        assert made["metadata"]["annotations"][REVIEW_ANNOTATION] == review  # a bare pod keeps it
    holds_for("the pool's assumed placements unchanged", lambda: egress_placer.metric(
        "egress_placer_pool_node_load", {"pool": "overseas", "state": "assumed"}) == before, seconds=HOLD_SECONDS)


# -- Tekton's affinity-assistant marks (the annotation, the label): anyone's to write -----------------------

AFFINITY_ASSISTANT = "pipeline.tekton.dev/affinity-assistant"
ASSISTANT_LABEL = {"app.kubernetes.io/component": "affinity-assistant"}
POOL_TOLERATION = {"key": "egress-placer.io/pool", "operator": "Equal", "value": "overseas", "effect": "NoSchedule"}
POOL_SELECTOR = {"egress-placer.io/pool": "overseas"}


def never_on_the_pool(api: Api, names: list[str]) -> None:
    """For HOLD_SECONDS: none of the tenant's pods `names` is bound to a pool node, and the pool has at most SLOTS pods."""
    def off() -> bool:
        bound = {p["metadata"]["name"]: node_of(p) for p in api.items(pods(TEAM_CDN))}
        return not [n for n in names if bound.get(n) in POOL_NODES] and len(pool_pods(api)) <= SLOTS
    holds_for(f"{names} off the pool and at most {SLOTS} pool pods", off, seconds=HOLD_SECONDS)


@pytest.mark.parametrize("image", [MATCHING_IMAGE, OTHER_IMAGE], ids=["a-pool-image", "no-pool-image"])
def test_m_a_bare_taskrun_claiming_coscheduling(api: Api, runs: Runs, tenant: Api, full_pool: list[str], image: str) -> None:
    """Route A: the annotation and the pool's toleration and nodeSelector in its pod template. It is no
    coscheduled run's TaskRun (Tekton's controller did not make it): an ordinary run, held while the pool is
    full (a pool image), or stripped of the pool (no pool image)."""
    name = runs.name("m-annotated")
    body = taskrun(name, image, annotations={AFFINITY_ASSISTANT: "affinity-assistant-0123456789", **LONG_RUN},
                   pod_template={"tolerations": [POOL_TOLERATION], "nodeSelector": POOL_SELECTOR})
    made = runs.create(TEAM_CDN, "taskruns", body, api=tenant)
    if image == MATCHING_IMAGE:
        assert made["spec"].get("status") == PENDING["TaskRun"], made["spec"]
        still_held(api, name)
    else:
        assert POOL_TOLERATION not in (made["spec"].get("podTemplate") or {}).get("tolerations", []), made["spec"]
        pod = wait_for(f"the pod of {name}", lambda: runs.pods_by_taskrun(TEAM_CDN).get(name), timeout=60)
        assert POOL_TOLERATION not in (pod["spec"].get("tolerations") or []), pod["spec"]
        never_on_the_pool(api, [pod["metadata"]["name"]])


@pytest.mark.parametrize("mark", ["label", "annotation"])
def test_n_a_pod_claiming_to_be_an_affinity_assistant(api: Api, runs: Runs, tenant: Api, full_pool: list[str], mark: str) -> None:
    """Route B: a bare pod with the assistant's label (or a coscheduled pod's annotation) and the pool's
    toleration: no PipelineRun we moved whole to the pool is behind it, so it keeps no pool placement."""
    name = runs.name(f"n-{mark}")
    meta: dict[str, Any] = {"name": name, "annotations": dict(LONG_RUN)}
    if mark == "label":
        meta["labels"] = dict(ASSISTANT_LABEL)
    else:
        meta["annotations"][AFFINITY_ASSISTANT] = "affinity-assistant-0123456789"
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"tolerations": [POOL_TOLERATION], "containers": [{"name": "main", "image": MATCHING_IMAGE, "command": ["sleep", "infinity"]}]}}
    made = runs.create_pod(TEAM_CDN, body, api=tenant)
    assert POOL_TOLERATION not in (made["spec"].get("tolerations") or []), made["spec"]
    never_on_the_pool(api, [name])


def test_n_a_statefulset_of_affinity_assistant_look_alikes(api: Api, runs: Runs, tenant: Api, full_pool: list[str]) -> None:
    """Route B through a controller: the tenant's StatefulSet, named like an assistant, whose pod template
    carries the assistant's label and the pool's toleration: its pods keep no pool placement."""
    name = "affinity-assistant-" + runs.id[-10:].rjust(10, "0").lower()
    labels = {**ASSISTANT_LABEL, "app": name, TEST_LABEL: runs.id}
    body = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "labels": {TEST_LABEL: runs.id}},
        "spec": {
            "replicas": 2, "serviceName": name, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": labels, "annotations": LONG_RUN},
                         "spec": {"tolerations": [POOL_TOLERATION],
                                  "containers": [{"name": "main", "image": MATCHING_IMAGE, "command": ["sleep", "infinity"]}]}},
        },
    }
    sets = namespaced(TEAM_CDN, "statefulsets", group="/apis/apps/v1")
    tenant.create(sets, body)
    try:
        made = wait_for("the look-alike assistant's pods", lambda: [
            p for p in api.items(pods(TEAM_CDN), labelSelector=f"app={name}")] or None, timeout=60)
        assert not [p["spec"] for p in made if POOL_TOLERATION in (p["spec"].get("tolerations") or [])], [p["spec"] for p in made]
        never_on_the_pool(api, [p["metadata"]["name"] for p in made])
    finally:
        api.delete(f"{sets}/{name}")
        api.delete(pods(TEAM_CDN), labelSelector=f"app={name}", gracePeriodSeconds=0)
