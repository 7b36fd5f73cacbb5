"""Issue 23, coscheduled runs: Tekton's affinity-assistant marks (the annotation
`pipeline.tekton.dev/affinity-assistant`, the label `app.kubernetes.io/component=affinity-assistant`) are
anyone's to write. A tenant (`edit` + Tekton's aggregated roles) must not get a run or a pod onto a queued
pool past its queue with them:

- route A: a bare TaskRun carrying the annotation and the pool's toleration is an ordinary run (decided,
  queued), not "placed by its PipelineRun"; its pod keeps no pool placement unless it is a run's pod Tekton's
  controller makes for a PipelineRun our admission moved whole to that pool;
- route B: a pod (or a StatefulSet's or Deployment's) with the assistant label and the pool's toleration
  keeps the pool only when it is `<name>-0` of the StatefulSet Tekton names after a running PipelineRun we
  moved whole to that pool.

And the real coscheduled runs keep working: Tekton's TaskRuns, pods and assistant of a moved run stay on it."""

from __future__ import annotations

from typing import Any

import pytest

from controller.queue.core import PENDING, QUEUE_ANNOTATION, entry_annotation, read_entry
from controller.queue.view import assistant_names
from tests.unit.test_admission_handlers import (
    EGRESS_TOLERATION,
    TEKTON_USER,
    WHOLE_OWNER,
    Env,
    moved_whole,
    plain_pod,
    taskrun,
    tekton_pod,
)
from tests.unit.test_queue_admission import queued_env

AA = "pipeline.tekton.dev/affinity-assistant"
TENANT = "system:serviceaccount:team-ci:tenant"
ASSISTANT = assistant_names(WHOLE_OWNER["name"], [{"name": "source"}])[1]  # Tekton's name for workspace `source`


def full_queue() -> Env:
    """A queued pool (egress, queue) with a coscheduled PipelineRun moved whole to it and released."""
    env = queued_env()
    moved_whole(env, entry=entry_annotation("egress", "PipelineRun", 1.0))
    return env


def abusive_taskrun(name: str = "sneak", owner: dict | None = None, image_task: str = "kaniko") -> dict[str, Any]:
    run = taskrun(image_task, name=name, annotations={AA: "affinity-assistant-0123456789"},
                  pod_template={"tolerations": [EGRESS_TOLERATION], "nodeSelector": {"egress-placer.io/pool": "egress"}})
    if owner is not None:
        run["metadata"]["ownerReferences"] = [owner]
    return run


@pytest.mark.parametrize("owner", [None, WHOLE_OWNER], ids=["bare", "claiming-its-own-moved-pipelinerun"])
@pytest.mark.parametrize("user", ["", TENANT])
def test_route_a_a_tenants_annotated_taskrun_is_queued_like_any(owner: dict | None, user: str) -> None:
    env = full_queue()
    _, patched, _ = env.review(abusive_taskrun(owner=owner), user=user)
    assert patched["spec"]["status"] == PENDING["TaskRun"]  # held in the queue, not "placed by its PipelineRun"
    mark = read_entry(patched["metadata"]["annotations"][QUEUE_ANNOTATION], "TaskRun")
    assert mark is not None and mark.pool == "egress"


def test_route_a_an_annotated_taskrun_needing_no_pool_loses_the_pool() -> None:
    env = full_queue()
    _, patched, _ = env.review(abusive_taskrun(image_task="git-clone"), user=TENANT)
    template = patched["spec"].get("podTemplate", {})
    assert EGRESS_TOLERATION not in template.get("tolerations", []) and "status" not in patched["spec"]


@pytest.mark.parametrize(
    "user, owner, moved, kept",
    [
        pytest.param(TEKTON_USER, WHOLE_OWNER, True, True, id="tekton's-taskrun-of-a-moved-run-kept"),
        pytest.param(TEKTON_USER, {**WHOLE_OWNER, "uid": "made-up"}, True, False, id="a-made-up-uid-stripped"),
        pytest.param(TEKTON_USER, None, True, False, id="no-pipelinerun-stripped"),
        pytest.param(TEKTON_USER, WHOLE_OWNER, False, False, id="a-pipelinerun-not-moved-stripped"),
    ],
)
def test_route_a_a_pod_with_the_annotation_keeps_only_its_moved_runs_pool(user: str, owner: dict | None, moved: bool, kept: bool) -> None:
    """At Pod CREATE: a run's pod (its TaskRun by uid) made by Tekton's controller, whose PipelineRun we moved
    whole to the pool, keeps it; any other annotated pod loses every pool placement."""
    env = full_queue() if moved else queued_env()
    if not moved:
        moved_whole(env, pool=None)
    env.add_taskrun("team-ci", "sneak", "uid-sneak", owner=owner)
    pod = tekton_pod(name="sneak-pod", taskrun_name="sneak", annotations={AA: "aa-1"},
                     spec_extra={"tolerations": [EGRESS_TOLERATION]})
    _, patched, _ = env.review(pod, user=user)
    assert (EGRESS_TOLERATION in (patched["spec"].get("tolerations") or [])) is kept


def test_route_a_a_bare_pod_with_the_annotation_is_stripped() -> None:
    env = full_queue()
    _, patched, _ = env.review(plain_pod("team-ci", annotations={AA: "aa-1"}, tolerations=[EGRESS_TOLERATION]), user=TENANT)
    assert "tolerations" not in patched["spec"]


def assistant_pod(name: str, owner: str | None, run: str = WHOLE_OWNER["name"]) -> dict[str, Any]:
    pod = plain_pod("team-ci", labels={"app.kubernetes.io/component": "affinity-assistant", "tekton.dev/pipelineRun": run},
                    tolerations=[EGRESS_TOLERATION])
    pod["metadata"].pop("generateName")
    pod["metadata"]["name"] = name
    if owner is not None:
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": owner, "uid": "ss", "controller": True}]
    return pod


@pytest.mark.parametrize(
    "pod, kept",
    [
        pytest.param(assistant_pod(f"{ASSISTANT}-0", ASSISTANT), True, id="tekton's-assistant-of-a-moved-run-kept"),
        pytest.param(assistant_pod(f"{ASSISTANT}-1", ASSISTANT), False, id="a-second-replica-stripped"),
        pytest.param(assistant_pod("web-0", "web"), False, id="a-statefulset-of-its-own-stripped"),
        pytest.param(assistant_pod(f"{ASSISTANT}-0", None), False, id="a-bare-pod-stripped"),
        pytest.param(assistant_pod("x-abc12", None), False, id="a-deployment-pod-stripped"),
        pytest.param(assistant_pod("affinity-assistant-0000000000-0", "affinity-assistant-0000000000"), False,
                     id="a-made-up-assistant-name-stripped"),
    ],
)
def test_route_b_an_assistant_labelled_pod_keeps_the_pool_only_as_a_moved_runs_assistant(pod: dict, kept: bool) -> None:
    env = full_queue()
    env.state.apply("PipelineRun", "MODIFIED", {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {
        "namespace": "team-ci", "name": WHOLE_OWNER["name"], "uid": WHOLE_OWNER["uid"], "annotations": {
            QUEUE_ANNOTATION: entry_annotation("egress", "PipelineRun", 1.0), "egress-placer.io/decision": '{"pool":"egress"}'}},
        "spec": {"workspaces": [{"name": "source", "volumeClaimTemplate": {}}]}})
    _, patched, _ = env.review(pod, user=TENANT)
    assert (EGRESS_TOLERATION in (patched["spec"].get("tolerations") or [])) is kept


@pytest.mark.parametrize("status", [PENDING["PipelineRun"], "done"])
def test_route_b_no_assistant_pod_on_the_pool_for_a_held_or_finished_run(status: str) -> None:
    env = queued_env()
    obj: dict[str, Any] = {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {
        "namespace": "team-ci", "name": WHOLE_OWNER["name"], "uid": WHOLE_OWNER["uid"], "annotations": {
            QUEUE_ANNOTATION: entry_annotation("egress", "PipelineRun", 1.0), "egress-placer.io/decision": '{"pool":"egress"}'}},
        "spec": {"workspaces": [{"name": "source", "volumeClaimTemplate": {}}]}}
    if status == "done":
        obj["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    else:
        obj["spec"]["status"] = status
    env.state.apply("PipelineRun", "ADDED", obj)
    _, patched, _ = env.review(assistant_pod(f"{ASSISTANT}-0", ASSISTANT), user=TENANT)
    assert "tolerations" not in patched["spec"]


def test_assistant_names_follow_tekton() -> None:
    """GetAffinityAssistantName("", "pr") and ("ws", "pr"): sha256 of workspace + run, 10 hex digits."""
    import hashlib

    assert assistant_names("pr", [{"name": "ws"}]) == (
        "affinity-assistant-" + hashlib.sha256(b"pr").hexdigest()[:10],
        "affinity-assistant-" + hashlib.sha256(b"wspr").hexdigest()[:10],
    )


def test_a_coscheduled_pipelinerun_not_moved_keeps_no_pool_its_tenant_wrote() -> None:
    """A coscheduled PipelineRun whose tasks need no pool, with the pool's toleration in its TaskRuns' template:
    stripped, and its decision record names no pool (nothing downstream takes it as moved whole)."""
    from tests.unit.test_admission_handlers import decision_of, mixed_pipelinerun

    env = Env()
    run = mixed_pipelinerun()
    run["spec"]["pipelineRef"] = {"name": "no-such-pipeline"}
    run["spec"]["taskRunTemplate"] = {"podTemplate": {"tolerations": [EGRESS_TOLERATION]}}
    _, patched, _ = env.review(run)
    template = (patched["spec"].get("taskRunTemplate") or {}).get("podTemplate") or {}
    assert EGRESS_TOLERATION not in (template.get("tolerations") or [])
    assert decision_of(patched)["pool"] is None
