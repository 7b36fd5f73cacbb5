"""End to end, what a user sees of a decision and what Tekton's defaults keep: `kubectl describe` (the
local cluster's kubectl) of a placed TaskRun, of its pod and of a PipelineRun made with `generateName`
shows egress-placer's decision Event (Events name their object with its uid, which admission cannot
know); with a `default-pod-template` in Tekton's config-defaults ConfigMap, a placed run's pod carries
the default's toleration and the pool's (Tekton alone would drop the default's once the run has its own)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest
import yaml

from devcluster.cluster import Cluster
from devplacer.local_placer import kubectl
from tests.e2e.tekton_runs import (
    MATCHING_IMAGE,
    OTHER_IMAGE,
    POOL,
    POOL_NODES,
    POOL_TOLERATION,
    TEAM_CDN,
    Runs,
    decision_of,
    node_of,
    step,
    taskrun,
)
from tests.kube import Api, namespaced
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

TEKTON_NAMESPACE = "tekton-pipelines"
REPORTER = "egress-placer.io/controller"  # the Event's reportingController: kubectl's "From" column
DEFAULT_TOLERATION = {"key": "e2e.egress-placer.io/default", "operator": "Exists", "effect": "NoSchedule"}


def described(devcluster: Cluster, kind: str, namespace: str, name: str) -> str:
    return kubectl(devcluster, "describe", kind, name, "-n", namespace)


def shows_event(text: str, reason: str) -> bool:
    """Does `kubectl describe` output list an egress-placer Event with `reason`?"""
    _, _, events = text.partition("\nEvents:")
    return any(reason in line.split() and REPORTER in line for line in events.splitlines())


def test_kubectl_describe_shows_the_decision_on_a_placed_taskrun_and_its_pod(
    runs: Runs, devcluster: Cluster
) -> None:
    name = runs.name("described")
    # Nothing else runs on the pool (what the pod's answer below relies on): no pod of an earlier test
    # finishes between this TaskRun and its pod, which could leave another node less loaded.
    # (A DaemonSet's pods take no place: load.view.)
    wait_for("no run's pod running or pending on the pool", lambda: not [
        p for p in runs.api.items("/api/v1/pods")
        if (p.get("spec") or {}).get("nodeName") in POOL_NODES and (p.get("status") or {}).get("phase") in ("Pending", "Running")
        and not any(o.get("kind") in ("DaemonSet", "Node") for o in p["metadata"].get("ownerReferences") or ())
    ], timeout=60)
    created = runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    runs.wait_succeeded(TEAM_CDN, "taskruns", [name])

    text = wait_for(
        f"kubectl describe taskrun {name} to show the Placed Event",
        lambda: (t := described(devcluster, "taskrun", TEAM_CDN, name)) and shows_event(t, "Placed") and t,
        timeout=30,
    )
    assert f"Pool {POOL}, node egress-" in text
    [event] = [e for e in runs.events(TEAM_CDN, "Placed") if e["regarding"]["name"] == name]
    assert event["regarding"]["uid"] == created["metadata"]["uid"]
    pod = runs.pods_by_taskrun(TEAM_CDN)[name]
    text = wait_for(
        f"kubectl describe pod {pod['metadata']['name']} to show the Placed Event",
        lambda: (t := described(devcluster, "pod", TEAM_CDN, pod["metadata"]["name"])) and shows_event(t, "Placed") and t,
        timeout=30,
    )
    # Nothing else runs on the pool: the pod keeps its run's node, and Tekton's copy of the run's annotations
    # is all it needs (admission answered with no patch); its Event found it by the run's review token.
    run_annotations, pod_annotations = created["metadata"]["annotations"], pod["metadata"]["annotations"]
    assert pod_annotations["egress-placer.io/review"] == run_annotations["egress-placer.io/review"]
    assert decision_of(pod) == decision_of(created) and node_of(pod) == decision_of(created)["node"]
    assert run_annotations["karpenter.sh/do-not-disrupt"] == "true" and "karpenter.sh/do-not-disrupt: true" in text


def test_kubectl_describe_shows_the_decision_on_a_pipelinerun_made_with_generate_name(
    runs: Runs, devcluster: Cluster
) -> None:
    body = {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"generateName": runs.name("nightly") + "-"},
        "spec": {"pipelineSpec": {"tasks": [{"name": "upload", "taskSpec": {"steps": [step(MATCHING_IMAGE)]}}]}},
    }
    created = runs.create(TEAM_CDN, "pipelineruns", body)
    name = created["metadata"]["name"]
    assert name != body["metadata"]["generateName"]  # the API server named it after admission
    runs.wait_succeeded(TEAM_CDN, "pipelineruns", [name])

    text = wait_for(
        f"kubectl describe pipelinerun {name} to show the decision Event",
        lambda: (t := described(devcluster, "pipelinerun", TEAM_CDN, name)) and shows_event(t, "TasksDecided") and t,
        timeout=30,
    )
    assert f"upload -> {POOL} (image-match)" in text
    wait_for(
        f"kubectl describe taskrun {name}-upload to show the Placed Event",
        lambda: shows_event(described(devcluster, "taskrun", TEAM_CDN, f"{name}-upload"), "Placed"),
        timeout=30,
    )


@contextlib.contextmanager
def tekton_default_pod_template(api: Api, template: dict[str, Any]) -> Iterator[None]:
    """Tekton's config-defaults `default-pod-template` set to `template` for the block, then restored."""
    path = namespaced(TEKTON_NAMESPACE, "configmaps", "config-defaults")
    old = ((api.get(path) or {}).get("data") or {}).get("default-pod-template")
    api.merge_patch(path, {"data": {"default-pod-template": yaml.safe_dump(template)}})
    try:
        yield
    finally:  # None removes the key again
        api.merge_patch(path, {"data": {"default-pod-template": old}})


def test_a_placed_runs_pod_keeps_the_toleration_of_tektons_default_pod_template(
    runs: Runs, api: Api
) -> None:
    placed, ordinary = runs.name("placed-default"), runs.name("ordinary-default")
    with tekton_default_pod_template(api, {"tolerations": [DEFAULT_TOLERATION]}):

        def seen_by_egress_placer() -> bool:
            """A server-side dry run goes through the webhook: its answer shows when egress-placer saw the default."""
            admitted = runs.create(TEAM_CDN, "taskruns", taskrun(placed, MATCHING_IMAGE), dry_run=True)
            return DEFAULT_TOLERATION in admitted["spec"].get("podTemplate", {}).get("tolerations", [])

        wait_for("egress-placer to see Tekton's default pod template", seen_by_egress_placer, timeout=20)
        runs.create_all([(TEAM_CDN, "taskruns", taskrun(placed, MATCHING_IMAGE)), (TEAM_CDN, "taskruns", taskrun(ordinary, OTHER_IMAGE))])
        done = runs.wait_succeeded(TEAM_CDN, "taskruns", [placed, ordinary])

    assert decision_of(done[placed])["pool"] == POOL and decision_of(done[ordinary])["pool"] is None
    # An ordinary run's podTemplate is not ours: absent, or (with Tekton's webhook) Tekton's own default copied in.
    assert (done[ordinary]["spec"].get("podTemplate") or {}).get("tolerations", [DEFAULT_TOLERATION]) == [DEFAULT_TOLERATION]
    pods = runs.pods_by_taskrun(TEAM_CDN)
    tolerations = {name: pods[name]["spec"].get("tolerations") or [] for name in (placed, ordinary)}

    def has(name: str, toleration: dict[str, Any]) -> bool:
        return any({k: v for k, v in t.items() if v is not None} == toleration for t in tolerations[name])

    assert has(ordinary, DEFAULT_TOLERATION), tolerations  # Tekton applied the default (the setup works)
    assert has(placed, DEFAULT_TOLERATION) and has(placed, POOL_TOLERATION), tolerations
    assert node_of(pods[placed]) in POOL_NODES
