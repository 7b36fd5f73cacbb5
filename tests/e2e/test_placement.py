"""End to end, placement: with egress-placer running on the local cluster, Tekton runs whose images
match the policy go to pool `overseas` (spread over its nodes), others and other namespaces' runs stay
off it, pipeline tasks are placed one by one (or a coscheduled run as a whole), images are found
through taskRefs and param defaults, and the opt-in/opt-out annotation wins. Every assertion reads
the real cluster: pods' nodes, runs' conditions and decision annotations, Events."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Iterator

import pytest

from controller.core.model import PLACEMENT_ANNOTATION
from tests.e2e.tekton_runs import (
    MATCHING_IMAGE,
    ORDINARY_NODES,
    OTHER_IMAGE,
    POOL,
    POOL_NODES,
    TEAM_CDN,
    TEAM_OTHER,
    Runs,
    decision_of,
    node_of,
    step,
    taskrun,
)
from tests.kube import Api, namespaced, pods
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

BURST = 30
MAX_PER_POOL_NODE = 11  # 30 runs over 3 nodes: the balancer may be off by one
AFFINITY_ASSISTANT = "app.kubernetes.io/component=affinity-assistant"  # label selector of the assistant pods
AFFINITY_ASSISTANT_ANNOTATION = "pipeline.tekton.dev/affinity-assistant"  # on the TaskRuns it coschedules


def off_pool(nodes: dict[str, str | None]) -> dict[str, str | None]:
    return {run: node for run, node in nodes.items() if node not in POOL_NODES}


def on_pool(nodes: dict[str, str | None]) -> dict[str, str | None]:
    return {run: node for run, node in nodes.items() if node not in ORDINARY_NODES}


def test_a_burst_of_matching_taskruns_runs_on_the_pool_spread_over_its_nodes(runs: Runs) -> None:
    names = [runs.name(f"cdn-{i}") for i in range(BURST)]
    runs.create_all((TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE)) for name in names)

    done = runs.wait_succeeded(TEAM_CDN, "taskruns", names)
    nodes = runs.nodes_of(TEAM_CDN, names)
    assert off_pool(nodes) == {}
    per_node = Counter(nodes.values())
    assert max(per_node.values()) <= MAX_PER_POOL_NODE, per_node
    decisions = {name: decision_of(run) for name, run in done.items()}
    assert {(d.get("pool"), d.get("reason")) for d in decisions.values()} == {(POOL, "image-match")}, decisions

    def placed_taskruns() -> set[str]:
        return {e["regarding"]["name"] for e in runs.events(TEAM_CDN, "Placed") if e["regarding"]["kind"] == "TaskRun"}

    wait_for("a Placed Event regarding every TaskRun", lambda: set(names) <= placed_taskruns(), timeout=20)


def test_non_matching_runs_and_runs_of_other_namespaces_stay_off_the_pool(runs: Runs) -> None:
    builds = [runs.name(f"build-{i}") for i in range(BURST)]
    foreign = [runs.name(f"upload-{i}") for i in range(BURST)]
    runs.create_all(
        [(TEAM_CDN, "taskruns", taskrun(name, OTHER_IMAGE)) for name in builds]
        + [(TEAM_OTHER, "taskruns", taskrun(name, MATCHING_IMAGE)) for name in foreign]
    )

    done_builds = runs.wait_succeeded(TEAM_CDN, "taskruns", builds)
    done_foreign = runs.wait_succeeded(TEAM_OTHER, "taskruns", foreign)
    assert on_pool(runs.nodes_of(TEAM_CDN, builds)) == {}
    assert on_pool(runs.nodes_of(TEAM_OTHER, foreign)) == {}
    reasons = {(d.get("pool"), d.get("reason")) for d in map(decision_of, done_builds.values())}
    assert reasons == {(None, "no-match")}
    reasons = {(d.get("pool"), d.get("reason")) for d in map(decision_of, done_foreign.values())}
    assert reasons == {(None, "namespace-not-allowed")}


def two_task_pipelinerun(name: str, workspace: dict[str, Any] | None = None) -> dict[str, Any]:
    """upload (matching image), then build (not matching)."""
    uses = [{"name": "ws"}] if workspace else []
    tasks = [
        {"name": "upload", "workspaces": uses, "taskSpec": {"workspaces": uses, "steps": [step(MATCHING_IMAGE)]}},
        {
            "name": "build",
            "runAfter": ["upload"],
            "workspaces": uses,
            "taskSpec": {"workspaces": uses, "steps": [step(OTHER_IMAGE)]},
        },
    ]
    spec: dict[str, Any] = {"pipelineSpec": {"workspaces": uses, "tasks": tasks}}
    if workspace:
        spec["workspaces"] = [{"name": "ws", **workspace}]
    return {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {"name": name}, "spec": spec}


def test_a_pipelinerun_places_only_its_matching_task_on_the_pool(runs: Runs) -> None:
    name = runs.name("release")
    runs.create(TEAM_CDN, "pipelineruns", two_task_pipelinerun(name))

    runs.wait_succeeded(TEAM_CDN, "pipelineruns", [name])
    upload, build = f"{name}-upload", f"{name}-build"
    nodes = runs.nodes_of(TEAM_CDN, [upload, build])
    assert nodes[upload] in POOL_NODES, nodes
    assert nodes[build] in ORDINARY_NODES, nodes
    taskruns = runs.listed(TEAM_CDN, "taskruns")
    assert decision_of(taskruns[upload])["reason"] == "image-match"
    assert decision_of(taskruns[build])["reason"] == "no-match"


@contextlib.contextmanager
def tekton_coschedule(api: Api, mode: str) -> Iterator[None]:
    """Tekton's feature flag `coschedule` set to `mode` for the block, then restored."""
    flags = namespaced("tekton-pipelines", "configmaps", "feature-flags")
    old = (api.call("GET", flags).get("data") or {}).get("coschedule")
    api.merge_patch(flags, {"data": {"coschedule": mode}})
    try:
        yield
    finally:
        api.merge_patch(flags, {"data": {"coschedule": old}})


def test_a_coscheduled_pipelinerun_runs_whole_on_the_pool_and_every_pod_is_scheduled(
    runs: Runs, api: Api
) -> None:
    # The local cluster has no storage provisioner and its controller-manager runs no volume binder,
    # so a volumeClaimTemplate's PVC stays Pending and the scheduler refuses every pod of such a run
    # ("pod has unbound immediate PersistentVolumeClaims"). Tekton's `coschedule: pipelineruns`
    # makes the affinity assistant coschedule the run without a PVC instead.
    name = runs.name("coscheduled")
    body = two_task_pipelinerun(name, {"emptyDir": {}})
    with tekton_coschedule(api, "pipelineruns"):

        def seen_as_coscheduled() -> bool:
            """A server-side dry run goes through the webhook: its answer shows when egress-placer saw the flag."""
            return "coscheduled" in decision_of(runs.create(TEAM_CDN, "pipelineruns", body, dry_run=True))["message"]

        wait_for("egress-placer to see coschedule=pipelineruns", seen_as_coscheduled, timeout=20)
        runs.create(TEAM_CDN, "pipelineruns", body)
        assistants: dict[str, str | None] = {}

        def finished() -> bool:
            """Record the assistant pods' nodes (they are deleted with the run); True once the run is done."""
            for pod in api.items(pods(TEAM_CDN), labelSelector=AFFINITY_ASSISTANT):
                if node_of(pod) or pod["metadata"]["name"] not in assistants:
                    assistants[pod["metadata"]["name"]] = node_of(pod)
            return bool(runs.listed(TEAM_CDN, "pipelineruns")[name].get("status", {}).get("completionTime"))

        wait_for(f"PipelineRun {name} to finish", finished, timeout=90)
        run = runs.wait_succeeded(TEAM_CDN, "pipelineruns", [name], timeout=5)[name]

    taskruns = runs.listed(TEAM_CDN, "taskruns")
    assert set(taskruns) == {f"{name}-upload", f"{name}-build"}
    assert all(AFFINITY_ASSISTANT_ANNOTATION in t["metadata"].get("annotations", {}) for t in taskruns.values()), taskruns
    decision = decision_of(run)
    assert decision["pool"] == POOL, decision
    assert decision["tasks"]["upload"]["reason"] == "image-match"
    nodes = runs.nodes_of(TEAM_CDN, [f"{name}-upload", f"{name}-build"])
    assert off_pool(nodes) == {}
    assert assistants, "the affinity assistant pod was never seen"
    assert set(assistants.values()) <= POOL_NODES, assistants


def test_images_from_a_referenced_task_and_from_a_param_default_are_placed(runs: Runs) -> None:
    task = runs.name("cdn-sync")
    runs.create(
        TEAM_CDN,
        "tasks",
        {"apiVersion": "tekton.dev/v1", "kind": "Task", "metadata": {"name": task}, "spec": {"steps": [step(MATCHING_IMAGE)]}},
    )
    by_ref = taskrun(runs.name("by-ref"), spec={"taskRef": {"name": task}})
    wait_for(
        "egress-placer's cache to hold the Task",
        lambda: decision_of(runs.create(TEAM_CDN, "taskruns", by_ref, dry_run=True)).get("reason") == "image-match",
        timeout=20,
    )
    by_param = taskrun(
        runs.name("by-param"),
        spec={
            "taskSpec": {
                "params": [{"name": "uploader", "type": "string", "default": MATCHING_IMAGE}],
                "steps": [step("$(params.uploader)")],
            }
        },
    )
    names = [by_ref["metadata"]["name"], by_param["metadata"]["name"]]
    runs.create_all([(TEAM_CDN, "taskruns", by_ref), (TEAM_CDN, "taskruns", by_param)])

    done = runs.wait_succeeded(TEAM_CDN, "taskruns", names)
    assert off_pool(runs.nodes_of(TEAM_CDN, names)) == {}
    for run in done.values():
        decision = decision_of(run)
        assert (decision["pool"], decision["reason"], decision["images"]) == (POOL, "image-match", [MATCHING_IMAGE])


@pytest.mark.parametrize(
    ("image", "annotation", "reason", "expected_nodes"),
    [
        (MATCHING_IMAGE, "none", "opt-out", ORDINARY_NODES),
        (OTHER_IMAGE, POOL, "opt-in", POOL_NODES),
    ],
    ids=["opt-out", "opt-in"],
)
def test_the_placement_annotation_overrides_the_images(
    runs: Runs, image: str, annotation: str, reason: str, expected_nodes: frozenset[str]
) -> None:
    name = runs.name(reason)
    runs.create(TEAM_CDN, "taskruns", taskrun(name, image, annotations={PLACEMENT_ANNOTATION: annotation}))

    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name])
    assert runs.nodes_of(TEAM_CDN, [name])[name] in expected_nodes
    assert decision_of(done[name])["reason"] == reason
