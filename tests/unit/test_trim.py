"""What the informers keep of each object (kube.informer's trimmers): exactly the labels, annotations,
owners and spec fields some reader looks up, bounded where the tenant writes them; and that every
reader answers the same from a trimmed object as from the whole one (properties over tenant-sized
metadata, and the Tekton definitions of the corpus through image discovery)."""

from __future__ import annotations

import json

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.corpus import tekton_examples_dir
from controller.agents.core import POOL_TOLERATIONS_ANNOTATION
from controller.core.images import (
    TASKRUN_LABEL,
    image_fields,
    pipeline_spec,
    step_action_spec,
    task_spec,
)
from controller.intruders.core import MIRROR_POD_ANNOTATION, controller_owner, is_mirror_pod
from controller.core.model import (
    DECISION_ANNOTATION,
    NAMESPACE_POOLS_ANNOTATION,
    REVIEW_ANNOTATION,
    NamespaceState,
    NodeState,
    PodState,
)
from controller.kube.informer import (
    KEPT_ANNOTATIONS,
    KEPT_LABELS,
    MAX_KEPT_VALUE_CHARS,
    pools_api,
    run_trimmer,
    tekton,
    trim_metadata,
    trim_node,
    trim_pod,
    trimmer,
)

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
HUGE = "x" * 200_000  # a last-applied-configuration of a big object; the API server takes 256 KiB of annotations
TEKTON_LABELS = {  # what Tekton puts on a TaskRun's pod
    "app.kubernetes.io/managed-by": "tekton-pipelines",
    "tekton.dev/task": "build",
    "tekton.dev/taskRun": "build-run-1",
    "tekton.dev/taskRunUID": "8d3c1b0e-0000-4000-8000-000000000000",
    "tekton.dev/pipeline": "ci",
    "tekton.dev/pipelineRun": "ci-run-1",
    "tekton.dev/pipelineTask": "build",
}
NODE = NodeState(name="egress-1", labels={"egress": "yes"}, uid="node-uid")


def meta(**fields: Any) -> dict[str, Any]:
    return {"name": "x", "namespace": "team-a", "uid": "u-1", "resourceVersion": "7", **fields}


# -- tables: what is kept, what is dropped --------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "labels", "annotations", "kept_labels", "kept_annotations"),
    [
        pytest.param(
            "Pod", TEKTON_LABELS,
            {LAST_APPLIED: HUGE, "tekton.dev/ready": "READY", MIRROR_POD_ANNOTATION: "abc", REVIEW_ANNOTATION: "r-1"},
            {TASKRUN_LABEL: "build-run-1", "tekton.dev/pipelineRun": "ci-run-1"},
            {MIRROR_POD_ANNOTATION: "abc", REVIEW_ANNOTATION: "r-1"}, id="pod-tekton",
        ),
        pytest.param("Pod", {"app": "x"}, {"note": "hello"}, None, None, id="pod-nothing-read"),
        pytest.param(
            "TaskRun", TEKTON_LABELS, {LAST_APPLIED: HUGE, DECISION_ANNOTATION: '{"pool": "overseas"}'},
            None, {DECISION_ANNOTATION: '{"pool":"overseas"}'}, id="taskrun-decided",
        ),
        pytest.param("PipelineRun", {"a": "b"}, {LAST_APPLIED: HUGE}, None, None, id="pipelinerun-undecided"),
        pytest.param("PipelineRun", {"a": "b", "kueue.x-k8s.io/queue-name": "pipelines-queue"}, {}, {"kueue.x-k8s.io/queue-name": "pipelines-queue"},
                     None, id="pipelinerun-kueue-label"),
        pytest.param("TaskRun", {}, {LAST_APPLIED: HUGE, "egress-placer.io/queue": '{"pool":"p"}'},
                     None, {"egress-placer.io/queue": '{"pool":"p"}'}, id="taskrun-queued"),
        pytest.param("DaemonSet", {"app": "agent"}, {LAST_APPLIED: HUGE, POOL_TOLERATIONS_ANNOTATION: "patch"},
                     None, {POOL_TOLERATIONS_ANNOTATION: "patch"}, id="daemonset-opt-in"),
        pytest.param(
            "Namespace", {"team": "cdn", "kubernetes.io/metadata.name": "team-a"},
            {LAST_APPLIED: HUGE, NAMESPACE_POOLS_ANNOTATION: "overseas,lab", "owner": "someone"},
            {"team": "cdn", "kubernetes.io/metadata.name": "team-a"}, {NAMESPACE_POOLS_ANNOTATION: "overseas,lab"},
            id="namespace-labels-and-pools",
        ),
        pytest.param("Node", {"egress": "yes"}, {"node.alpha.kubernetes.io/ttl": "0"}, {"egress": "yes"}, None,
                     id="node-labels-no-annotations"),
        pytest.param("ConfigMap", {"a": "b"}, {LAST_APPLIED: HUGE}, None, None, id="configmap-no-metadata-maps"),
        pytest.param("Task", {"app.kubernetes.io/version": "0.7"}, {"tekton.dev/displayName": "Build"}, None, None,
                     id="task-no-metadata-maps"),
    ],
)
def test_metadata_keeps_exactly_the_keys_read(kind, labels, annotations, kept_labels, kept_annotations):
    out = trim_metadata(meta(labels=labels, annotations=annotations, managedFields=[{"manager": "kubectl"}]), kind)
    assert out.get("labels") == kept_labels
    assert out.get("annotations") == kept_annotations
    assert {k: out[k] for k in ("name", "namespace", "uid", "resourceVersion")} == {
        "name": "x", "namespace": "team-a", "uid": "u-1", "resourceVersion": "7"
    }
    assert "managedFields" not in out


@pytest.mark.parametrize(
    ("kind", "key"),
    # a decision keeps its pool and node alone: test_a_runs_decision_keeps_its_pool_however_long
    [(k, key) for k, keys in KEPT_ANNOTATIONS.items() for key in sorted(keys)
     if not (k in ("TaskRun", "PipelineRun", "Pod") and key == DECISION_ANNOTATION)],
)
def test_a_kept_annotation_too_long_is_kept_empty(kind, key):
    """Presence still reads (a mirror pod, a decided run); an empty pools list gives no pool."""
    out = trim_metadata(meta(annotations={key: "y" * (MAX_KEPT_VALUE_CHARS + 1)}), kind)
    assert out["annotations"] == {key: ""}
    out = trim_metadata(meta(annotations={key: "y" * MAX_KEPT_VALUE_CHARS}), kind)
    assert out["annotations"] == {key: "y" * MAX_KEPT_VALUE_CHARS}


@pytest.mark.parametrize("kind", ["TaskRun", "PipelineRun", "Pod"])
@pytest.mark.parametrize(
    ("value", "kept"),
    [
        pytest.param(json.dumps({"pool": "overseas", "images": ["i" * 300] * 20, "message": "m" * 2000}), '{"pool":"overseas"}', id="long-record"),
        pytest.param(json.dumps({"pool": "overseas", "node": "n-1", "images": ["i" * 300] * 20}), '{"pool":"overseas","node":"n-1"}',
                     id="node"),
        pytest.param('{"pool":null,"node":"n-1"}', "", id="node-without-pool"),
        pytest.param('{"pool":null,"reason":"no-match"}', "", id="no-pool"),
        pytest.param("y" * (MAX_KEPT_VALUE_CHARS + 1), "", id="not-a-record"),
        pytest.param("[1]", "", id="not-an-object"),
    ],
)
def test_a_runs_decision_keeps_its_pool_however_long(kind: str, value: str, kept: str) -> None:
    """The queue reads an entry only beside admission's decision naming its pool (queue.core.admitted_entry):
    the pool is kept from the whole record, which may pass MAX_KEPT_VALUE_CHARS; presence still reads."""
    assert trim_metadata(meta(annotations={DECISION_ANNOTATION: value}), kind)["annotations"] == {DECISION_ANNOTATION: kept}


def test_the_allow_lists_name_only_what_a_reader_reads():
    """The one place others extend: a new key needs a reader (and a row above)."""
    assert {k: v for k, v in KEPT_LABELS.items() if v is not None} == {
        "Pod": frozenset({TASKRUN_LABEL, "tekton.dev/pipelineRun"}),
        "PipelineRun": frozenset({"kueue.x-k8s.io/queue-name"}),  # queue.core.held_by_kueue
    }
    assert KEPT_ANNOTATIONS == {
        "Namespace": frozenset({NAMESPACE_POOLS_ANNOTATION}),
        "Pod": frozenset({MIRROR_POD_ANNOTATION, REVIEW_ANNOTATION, DECISION_ANNOTATION, "egress-placer.io/budgets"}),  # budgets.view
        "TaskRun": frozenset({DECISION_ANNOTATION, REVIEW_ANNOTATION, "egress-placer.io/queue"}),
        "PipelineRun": frozenset({DECISION_ANNOTATION, REVIEW_ANNOTATION, "egress-placer.io/queue"}),
        "DaemonSet": frozenset({POOL_TOLERATIONS_ANNOTATION}),
        "Node": frozenset(),  # only the policy's egressAddress.annotation keys, set by keep_node_annotations (test_budgets_view)
    }


OWNER_RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": True,
            "blockOwnerDeletion": True}
OWNER_DS = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "ds-uid"}
OWNER_NODE = {"apiVersion": "v1", "kind": "Node", "name": "egress-1", "uid": "node-uid", "controller": True}
OWNER_CM = {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "cm-uid"}


@pytest.mark.parametrize(
    ("owners", "kept"),
    [
        pytest.param([OWNER_RS], [OWNER_RS], id="controller"),
        pytest.param([OWNER_CM] * 1000 + [OWNER_RS], [OWNER_RS], id="controller-after-1000-others"),
        pytest.param([OWNER_CM, OWNER_DS, OWNER_DS, OWNER_NODE], [OWNER_NODE, OWNER_DS], id="controller-and-daemonset"),
        pytest.param([{**OWNER_DS, "controller": True}], [{**OWNER_DS, "controller": True}], id="daemonset-controller"),
        pytest.param([OWNER_CM, "not an object"], None, id="neither"),
        pytest.param("not a list", None, id="malformed"),
    ],
)
def test_pod_owners_kept_are_the_controller_and_a_daemonset(owners, kept):
    out = trim_metadata(meta(ownerReferences=owners), "Pod")
    strip = [{k: v for k, v in o.items() if k != "blockOwnerDeletion"} for o in kept] if kept else None
    assert out.get("ownerReferences") == strip


OWNER_PR = {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "name": "ci-1", "uid": "ci-uid", "controller": True,
            "blockOwnerDeletion": True}


@pytest.mark.parametrize(("kind", "kept"), [("TaskRun", True), ("PipelineRun", False), ("Task", False)])
def test_a_taskrun_keeps_its_controller_owner(kind: str, kept: bool) -> None:
    """The queue finds a coscheduled PipelineRun's TaskRuns by the uid their controller owner names
    (queue.core.claimed_pipelinerun), never by a label: at most two of however many were written."""
    out = trim_metadata(meta(ownerReferences=[OWNER_CM] * 1000 + [OWNER_PR]), kind)
    expected = [{k: v for k, v in OWNER_PR.items() if k != "blockOwnerDeletion"}] if kept else None
    assert out.get("ownerReferences") == expected


def test_pod_keeps_where_it_runs_not_its_containers_or_tolerations():
    pod = {
        "metadata": meta(labels=TEKTON_LABELS),
        "spec": {
            "nodeName": "egress-1",
            "terminationGracePeriodSeconds": 5,
            "tolerations": [{"operator": "Exists"}] * 1000,
            "containers": [{"name": "step-a", "image": "alpine", "env": [{"name": "A", "value": HUGE}]}],
            "volumes": [{"name": "v", "emptyDir": {}}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready"}], "containerStatuses": [{"name": "step-a"}]},
    }
    out = trim_pod(pod)
    assert out["spec"] == {"nodeName": "egress-1", "terminationGracePeriodSeconds": 5}
    assert out["status"] == {"phase": "Running"}


def test_node_keeps_taints_readiness_and_allocatable_pods_only():
    node = {
        "metadata": meta(labels={"egress": "yes"}, annotations={"volumes.kubernetes.io/controller-managed-attach-detach": "true"}),
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
        "status": {"conditions": [{"type": "Ready", "status": "True", "message": "kubelet is posting"},
                                  {"type": "MemoryPressure", "status": "False"}],
                   "allocatable": {"pods": "110", "cpu": "4"}, "images": [{"names": ["a"]}] * 50},
    }
    out = trim_node(node)
    assert out["spec"] == {"taints": [{"key": "k", "effect": "NoSchedule"}], "unschedulable": False}
    assert out["status"] == {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"pods": "110"}}
    assert "annotations" not in out["metadata"]


@pytest.mark.parametrize("kind", ["Pod", "TaskRun", "PipelineRun", "Node", "Namespace"])
def test_only_pods_and_runs_keep_their_creation_time(kind):
    """The pool status counts the runs' pods created in the last hour (controller/pool_status/reconcile.py);
    a decision record counts for a while after its object's creation (load.view). PodState does not keep
    it, so the cache does not grow with it."""
    out = trim_metadata(meta(creationTimestamp="2026-07-01T12:00:00Z", generateName="x-"), kind)
    kept = kind in ("Pod", "TaskRun", "PipelineRun")
    assert out.get("creationTimestamp") == ("2026-07-01T12:00:00Z" if kept else None)
    assert out.get("generateName") == ("x-" if kept else None)


def test_pools_api_objects_keep_spec_status_and_generation_not_managed_fields():
    trim = pools_api("EgressPool", "egresspools", "egress-placer.io/v1alpha1").trim
    obj = {
        "metadata": {"name": "overseas", "uid": "u", "resourceVersion": "9", "generation": 4, "managedFields": [{"m": 1}]},
        "spec": {"nodes": ["egress-1"]},
        "status": {"nodes": 1},
    }
    assert trim(obj) == {
        "apiVersion": "egress-placer.io/v1alpha1",
        "kind": "EgressPool",
        "metadata": {"name": "overseas", "uid": "u", "resourceVersion": "9", "generation": 4},
        "spec": {"nodes": ["egress-1"]},
        "status": {"nodes": 1},
    }


def test_configmap_data_is_kept():
    out = trimmer("v1", "ConfigMap", ("data",))({"metadata": meta(), "data": {"coschedule": "workspaces"}})
    assert out["data"] == {"coschedule": "workspaces"}


def test_task_keeps_what_image_discovery_reads_not_scripts():
    task = {
        "metadata": meta(),
        "spec": {
            "description": HUGE,
            "params": [{"name": "image", "default": "alpine", "description": "d", "type": "string"}],
            "workspaces": [{"name": "source"}],
            "results": [{"name": "digest"}],
            "stepTemplate": {"image": "busybox", "env": [{"name": "A", "value": "b"}]},
            "steps": [
                {"name": "build", "image": "$(params.image)", "script": HUGE, "env": [{"name": "E"}], "args": ["x"]},
                {"name": "use", "ref": {"name": "action", "params": [{"name": "p", "value": "v"}]},
                 "params": [{"name": "q", "value": "w"}], "workingDir": "/w"},
            ],
            "sidecars": [{"name": "docker", "image": "docker:dind", "securityContext": {"privileged": True}}],
            "volumes": [{"name": "v", "emptyDir": {}}],
        },
    }
    out = tekton("Task").trim(task)
    assert out["spec"] == {
        "params": [{"name": "image", "default": "alpine"}],
        "stepTemplate": {"image": "busybox"},
        "steps": [
            {"name": "build", "image": "$(params.image)"},
            {"name": "use", "ref": {"name": "action", "params": [{"name": "p", "value": "v"}]},
             "params": [{"name": "q", "value": "w"}]},
        ],
        "sidecars": [{"name": "docker", "image": "docker:dind"}],
    }
    assert task_spec(out["spec"]) == task_spec(task["spec"])


def test_pipeline_keeps_tasks_refs_params_and_matrix():
    pipeline = {
        "params": [{"name": "images", "type": "array", "default": ["a", "b"]}],
        "workspaces": [{"name": "w"}],
        "tasks": [
            {"name": "fan", "taskRef": {"name": "build", "kind": "Task"}, "runAfter": ["x"],
             "matrix": {"params": [{"name": "image", "value": ["$(params.images[*])"]}],
                        "include": [{"name": "extra", "params": [{"name": "image", "value": "c"}]}]},
             "workspaces": [{"name": "w", "workspace": "w"}], "when": [{"input": "a", "operator": "in", "values": ["a"]}]},
            {"name": "inline", "taskSpec": {"steps": [{"image": "alpine", "script": HUGE}]}},
            {"name": "custom", "taskSpec": {"apiVersion": "example.dev/v1", "kind": "Wait", "spec": {"a": HUGE}}},
            {"name": "nested", "pipelineRef": {"name": "other"}},
        ],
        "finally": [{"name": "notify", "taskRef": {"resolver": "git", "params": [{"name": "url", "value": "u"}]}}],
        "results": [{"name": "r", "value": "$(tasks.fan.results.digest)"}],
    }
    out = image_fields("Pipeline", pipeline)
    assert out["tasks"][0] == {
        "name": "fan", "taskRef": {"name": "build", "kind": "Task"},
        "matrix": {"params": [{"name": "image", "value": ["$(params.images[*])"]}],
                   "include": [{"params": [{"name": "image", "value": "c"}]}]},
    }
    assert out["tasks"][1] == {"name": "inline", "taskSpec": {"steps": [{"image": "alpine"}]}}
    assert out["tasks"][2] == {"name": "custom", "taskSpec": {"apiVersion": "example.dev/v1", "kind": "Wait"}}
    assert out["tasks"][3] == {"name": "nested", "pipelineRef": True}
    assert "results" not in out and "workspaces" not in out
    assert pipeline_spec(out) == pipeline_spec(pipeline)


# -- every reader answers the same from the trimmed object ---------------------------------------

TEXT = st.text(alphabet="abcxyz./-", max_size=12)
KEY = st.sampled_from([TASKRUN_LABEL, MIRROR_POD_ANNOTATION, DECISION_ANNOTATION, NAMESPACE_POOLS_ANNOTATION,
                       LAST_APPLIED, "app", "team", "tekton.dev/pipelineRun"]) | TEXT
VALUE = TEXT | st.sampled_from(["", HUGE[: MAX_KEPT_VALUE_CHARS + 1], "overseas,lab"])
OWNER = st.fixed_dictionaries(
    {"apiVersion": st.sampled_from(["v1", "apps/v1", "tekton.dev/v1"]),
     "kind": st.sampled_from(["Node", "DaemonSet", "ReplicaSet", "TaskRun", "ConfigMap"]),
     "name": st.sampled_from(["egress-1", "ds", "x"]), "uid": st.sampled_from(["node-uid", "ds-uid", "u"])},
    optional={"controller": st.booleans()},
)
OWNERS = st.lists(OWNER, max_size=6).filter(lambda os: sum(o.get("controller") is True for o in os) <= 1)  # API server


@st.composite
def pods(draw) -> dict[str, Any]:
    metadata = meta(
        labels=draw(st.dictionaries(KEY, VALUE, max_size=5)),
        annotations=draw(st.dictionaries(KEY, VALUE, max_size=5)),
        ownerReferences=draw(OWNERS),
    )
    if draw(st.booleans()):
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        metadata["deletionGracePeriodSeconds"] = draw(st.integers(0, 100))
    return {
        "metadata": metadata,
        "spec": {"nodeName": draw(st.sampled_from([None, "egress-1", "node-1"])),
                 "terminationGracePeriodSeconds": draw(st.sampled_from([None, 0, 30, 86400])),
                 "tolerations": [{"operator": "Exists"}],
                 **({"schedulingGates": [{"name": "egress-placer.io/pool-slot"}]} if draw(st.booleans()) else {})},
        "status": {"phase": draw(st.sampled_from(["Pending", "Running", "Succeeded", "Failed", None]))},
    }


def pod_answers(pod: PodState) -> tuple[Any, ...]:
    """What each reader of a PodState reads: ClusterState (taskRun label, DaemonSet owners, phase),
    intruders.core (controller owner, mirror annotation, grace, uid, deletion)."""
    return (
        pod.namespace, pod.name, pod.uid, pod.node_name, pod.phase, pod.active, pod.on_node, pod.finished,
        pod.deleting, pod.grace_seconds, pod.labels.get(TASKRUN_LABEL) or None,
        "DaemonSet" in pod.owner_kinds, controller_owner(pod.owners),
        is_mirror_pod(pod.annotations, pod.owners, pod.node_name, NODE), pod.gates, pod.tolerated,
    )


@settings(max_examples=300, deadline=None)
@given(pods())
def test_every_pod_reader_answers_the_same_from_the_trimmed_pod(pod):
    whole, trimmed = PodState.from_pod(pod), PodState.from_pod(trim_pod(pod))
    assert pod_answers(trimmed) == pod_answers(whole)
    assert set(trimmed.labels) <= KEPT_LABELS["Pod"] and set(trimmed.annotations) <= KEPT_ANNOTATIONS["Pod"]
    assert len(trimmed.owners) <= 2


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEY, VALUE, max_size=6), st.dictionaries(KEY, VALUE, max_size=6))
def test_a_namespace_allows_the_same_pools_trimmed(labels, annotations):
    from controller.core.policy import load_policy

    policy = load_policy(
        """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - {name: overseas, nodes: [egress-1], namespaceSelector: {matchExpressions: [{key: team, operator: DoesNotExist}]}}
  - {name: lab, nodes: [lab-1], namespaces: []}
  - {name: cdn, nodes: [cdn-1], namespaceSelector: {matchLabels: {app: ""}}}
"""
    )
    namespace = {"metadata": meta(name="team-a", labels=labels, annotations=annotations)}
    whole = NamespaceState.from_namespace(namespace)
    trimmed = NamespaceState.from_namespace(trimmer("v1", "Namespace")(namespace))
    pools_value = annotations.get(NAMESPACE_POOLS_ANNOTATION, "")
    if len(pools_value) <= MAX_KEPT_VALUE_CHARS:
        assert [p.allows(trimmed) for p in policy.pools] == [p.allows(whole) for p in policy.pools]
    else:  # too long to keep: never more rights than the whole value gives
        assert all(p.allows(whole) for p in policy.pools if p.allows(trimmed))


def corpus_definitions() -> list[tuple[str, Any]]:
    roots = [Path(__file__).parents[1] / "data" / "tekton"]
    examples = tekton_examples_dir()
    if examples is not None:
        roots.append(examples)
    out = []
    for root in roots:
        for path in sorted(root.rglob("*.yaml")):
            try:
                docs = list(yaml.safe_load_all(path.read_text()))
            except yaml.YAMLError:
                continue
            out += [(d["kind"], d.get("spec")) for d in docs
                    if isinstance(d, dict) and d.get("kind") in ("Task", "Pipeline", "StepAction")]
    return out


PARSE = {"Task": task_spec, "Pipeline": pipeline_spec, "StepAction": step_action_spec}


def test_image_discovery_reads_the_same_from_every_trimmed_definition_of_the_corpus():
    definitions = corpus_definitions()
    assert len(definitions) >= 4
    for kind, spec in definitions:
        assert PARSE[kind](image_fields(kind, spec)) == PARSE[kind](spec), (kind, spec)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2) | TEXT,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["name", "image", "value", "default", "params", "ref", "steps", "kind",
                                       "apiVersion", "resolver", "bundle", "script", "matrix", "include",
                                       "taskSpec", "taskRef", "pipelineRef", "pipelineSpec", "tasks", "finally",
                                       "sidecars", "stepTemplate"]), inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(PARSE)), JSONISH)
def test_image_discovery_reads_the_same_from_any_trimmed_spec(kind, spec):
    assert PARSE[kind](image_fields(kind, spec)) == PARSE[kind](spec)


@pytest.mark.parametrize(("kind", "kept"), [("TaskRun", {"podName": "build-1-pod"}), ("PipelineRun", None)])
def test_a_taskrun_keeps_the_pod_name_tekton_wrote(kind: str, kept: dict | None) -> None:
    """A pod is a run's pod only when it is the one the TaskRun's status names (queue.core.is_run_pod):
    status is Tekton's controller's to write (a subresource), so the informer keeps that name, and only it."""
    run = {"metadata": meta(), "status": {"podName": "build-1-pod", "steps": [{"name": "x" * 1000}] * 100}}
    assert run_trimmer("tekton.dev/v1", kind)(run).get("status") == kept
