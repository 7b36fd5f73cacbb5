"""End to end, beside Tekton's own webhook (the session cluster runs it, as every Tekton install does):
a v1beta1 TaskRun is converted and placed, Tekton refuses a later change to a placed run's
podTemplate, and placement survives Tekton's defaulting, which runs after egress-placer's webhook
(k8s/README.md, "Beside Tekton's webhook"). Every assertion reads the real cluster."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from kubernetes.client.exceptions import ApiException

from devcluster import tekton_webhook
from devcluster.cluster import TEKTON_NAMESPACE, Cluster
from devplacer.local_placer import WEBHOOK_CONFIG
from tests.e2e.tekton_runs import (
    MATCHING_IMAGE,
    ORDINARY_NODES,
    OTHER_IMAGE,
    POOL,
    POOL_NODES,
    POOL_TOLERATION,
    TEAM_CDN,
    Runs,
    decision_of,
    step,
    taskrun,
)
from tests.kube import TEKTON, Api, namespaced
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

GROUP = "tekton.dev"
ADMISSION = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
STARTED_RUN_REFUSED = "Once the TaskRun has started, only status and statusMessage updates are allowed"
CI_TOLERATION = {"key": "example.com/ci", "operator": "Exists", "effect": "NoSchedule"}
LINUX = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}  # every node of the cluster
# A default pod template with placement fields of its own: what Tekton's defaulting merges in.
DEFAULT_POD_TEMPLATE = {
    "tolerations": [CI_TOLERATION],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [LINUX]}]}
        }
    },
}


@pytest.fixture(scope="module", autouse=True)
def tekton_webhook_runs(devcluster: Cluster) -> None:
    if not devcluster.runs_with(tekton_webhook.NAME):
        pytest.skip(
            "this cluster runs without Tekton's webhook (EGRESS_PLACER_DEVCLUSTER_WITH, or "
            "EGRESS_PLACER_DEVCLUSTER naming a cluster brought up without `--with tekton-webhook`)"
        )


def pool_tolerations(template: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [t for t in (template or {}).get("tolerations") or [] if t.get("key") == POOL_TOLERATION["key"]]


def test_egress_placer_mutates_before_tekton_and_is_not_reinvoked(api: Api, egress_placer: object) -> None:
    """The order k8s/README.md states: the API server calls mutating webhook configurations sorted by
    name, so `egress-placer` before Tekton's `webhook.pipeline.tekton.dev`; ours on runs is never
    reinvoked (on pods and DaemonSets it is: docs/coexistence.md), Tekton's is (IfNeeded) if a later
    webhook changes the object."""
    ours = api.call("GET", f"{ADMISSION}/{WEBHOOK_CONFIG}")
    tekton = api.call("GET", f"{ADMISSION}/{tekton_webhook.ADMISSION_CONTROLLER_NAME}")
    assert sorted([tekton["metadata"]["name"], ours["metadata"]["name"]])[0] == ours["metadata"]["name"]
    runs = [w for w in ours["webhooks"] if w["name"].startswith(("taskruns.", "pipelineruns."))]
    assert {w["reinvocationPolicy"] for w in runs} == {"Never"}
    assert {w["reinvocationPolicy"] for w in tekton["webhooks"]} == {"IfNeeded"}
    rules = [r for w in tekton["webhooks"] for r in w["rules"]]
    for resource in ("taskruns", "pipelineruns"):
        assert any(GROUP in r["apiGroups"] and resource in r["resources"] and "CREATE" in r["operations"] for r in rules)


def test_a_v1beta1_taskrun_is_converted_and_placed(runs: Runs) -> None:
    name = runs.name("beta")
    body = {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "TaskRun",
        "metadata": {"name": name},
        "spec": {"taskSpec": {"steps": [step(MATCHING_IMAGE)]}},
    }

    admitted = runs.create(TEAM_CDN, "taskruns", body, version="v1beta1")

    assert admitted["apiVersion"] == f"{GROUP}/v1beta1"
    assert pool_tolerations(admitted["spec"].get("podTemplate")) == [POOL_TOLERATION]
    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name])[name]  # read as v1: converted by Tekton's webhook
    assert done["apiVersion"] == f"{GROUP}/v1"
    assert pool_tolerations(done["spec"].get("podTemplate")) == [POOL_TOLERATION]
    assert (decision_of(done).get("pool"), decision_of(done).get("reason")) == (POOL, "image-match")
    assert runs.nodes_of(TEAM_CDN, [name])[name] in POOL_NODES
    as_beta = runs.api.call("GET", namespaced(TEAM_CDN, "taskruns", name, group=f"/apis/{GROUP}/v1beta1"))
    assert as_beta["apiVersion"] == f"{GROUP}/v1beta1"
    assert pool_tolerations(as_beta["spec"].get("podTemplate")) == [POOL_TOLERATION]


def test_a_v1beta1_pipelinerun_is_converted_and_places_its_matching_task(runs: Runs) -> None:
    name = runs.name("beta-release")
    tasks = [
        {"name": "upload", "taskSpec": {"steps": [step(MATCHING_IMAGE)]}},
        {"name": "build", "runAfter": ["upload"], "taskSpec": {"steps": [step(OTHER_IMAGE)]}},
    ]
    body = {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "PipelineRun",
        "metadata": {"name": name},
        "spec": {"pipelineSpec": {"tasks": tasks}},
    }

    runs.create(TEAM_CDN, "pipelineruns", body, version="v1beta1")

    done = runs.wait_succeeded(TEAM_CDN, "pipelineruns", [name])[name]  # read as v1: converted
    assert done["apiVersion"] == f"{GROUP}/v1"
    upload, build = f"{name}-upload", f"{name}-build"
    nodes = runs.nodes_of(TEAM_CDN, [upload, build])
    assert nodes[upload] in POOL_NODES, nodes
    assert nodes[build] in ORDINARY_NODES, nodes
    taskruns = runs.listed(TEAM_CDN, "taskruns")
    assert decision_of(taskruns[upload])["reason"] == "image-match"
    assert decision_of(taskruns[build])["reason"] == "no-match"


def test_tekton_refuses_a_change_to_a_placed_runs_pod_template(runs: Runs) -> None:
    name = runs.name("placed")
    runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    wait_for("the run's pod", lambda: runs.pods_by_taskrun(TEAM_CDN).get(name))
    placed = runs.get(TEAM_CDN, "taskruns", name)["spec"]["podTemplate"]
    assert pool_tolerations(placed) == [POOL_TOLERATION]

    path = namespaced(TEAM_CDN, "taskruns", name, group=TEKTON)
    with pytest.raises(ApiException) as refused:
        runs.api.json_patch(path, [{"op": "remove", "path": "/spec/podTemplate/tolerations"}])

    assert refused.value.status == 400
    message = json.loads(refused.value.body)["message"]
    assert f'admission webhook "validation.{tekton_webhook.ADMISSION_CONTROLLER_NAME}" denied the request' in message
    assert STARTED_RUN_REFUSED in message
    assert runs.get(TEAM_CDN, "taskruns", name)["spec"]["podTemplate"] == placed
    # The refusal is about the podTemplate, not every update: cancelling (a spec.status change) is allowed.
    cancelled = runs.api.merge_patch(path, {"spec": {"status": "TaskRunCancelled"}})
    assert cancelled["spec"]["status"] == "TaskRunCancelled"
    assert cancelled["spec"]["podTemplate"] == placed


@pytest.fixture
def default_pod_template(api: Api, runs: Runs) -> Iterator[dict[str, Any]]:
    """Tekton's `config-defaults` with DEFAULT_POD_TEMPLATE, in force in Tekton's webhook; restored after."""
    defaults = namespaced(TEKTON_NAMESPACE, "configmaps", "config-defaults")
    before = api.call("GET", defaults).get("data")
    probe = taskrun(runs.name("defaults-probe"), OTHER_IMAGE)

    def defaulted_template() -> dict[str, Any] | None:
        return runs.create(TEAM_CDN, "taskruns", probe, dry_run=True)["spec"].get("podTemplate")

    api.merge_patch(defaults, {"data": {"default-pod-template": json.dumps(DEFAULT_POD_TEMPLATE)}})
    try:
        wait_for(
            "Tekton's webhook to apply the new default pod template",
            lambda: defaulted_template() == DEFAULT_POD_TEMPLATE,
            timeout=30,
        )
        yield DEFAULT_POD_TEMPLATE
    finally:
        current = api.call("GET", defaults)
        current["data"] = before
        api.call("PUT", defaults, body=current)
        wait_for("Tekton's webhook to drop the default pod template", lambda: defaulted_template() is None, timeout=30)


def test_placement_survives_tekton_defaulting(runs: Runs, default_pod_template: dict[str, Any]) -> None:
    """Tekton merges the default pod template under the run's own fields, and keeps a field the run
    has whole. egress-placer, called first, places on top of the default's tolerations and affinity,
    so the placed run keeps both; a run egress-placer leaves alone gets the default's (so the
    defaulting really ran)."""
    placed, plain = runs.name("cdn"), runs.name("build")
    runs.create_all(
        [(TEAM_CDN, "taskruns", taskrun(placed, MATCHING_IMAGE)), (TEAM_CDN, "taskruns", taskrun(plain, OTHER_IMAGE))]
    )

    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [placed, plain])
    nodes = runs.nodes_of(TEAM_CDN, [placed, plain])
    assert nodes[placed] in POOL_NODES
    assert nodes[plain] in ORDINARY_NODES
    assert done[plain]["spec"]["podTemplate"] == default_pod_template
    template = done[placed]["spec"]["podTemplate"]
    assert pool_tolerations(template) == [POOL_TOLERATION]
    assert CI_TOLERATION in template["tolerations"]  # the default's, kept beside the pool's
    terms = template["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms and all(LINUX in term["matchExpressions"] for term in terms)  # the default's requirement, ANDed
    assert (decision_of(done[placed]).get("pool"), decision_of(done[placed]).get("reason")) == (POOL, "image-match")
    # Defaults of Tekton's webhook on the same object: it ran after egress-placer, on the placed run.
    assert done[placed]["spec"]["serviceAccountName"] == "default"
    assert done[placed]["spec"]["timeout"] == "1h0m0s"
