"""Image discovery: every source of images of TaskRuns, PipelineRuns and pods, param substitution at
both levels of a pipeline, StepActions, and each cause of an image being reported unresolved."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.cluster_resolver import TEKTON_DEFAULTS
from controller.core.images import (
    MAX_IMAGE_CHARS,
    MAX_IMAGES,
    WHOLE_RUN,
    Fanout,
    Unknown,
    is_tekton_pod,
    pipelinerun_images,
    pod_images,
    substitute,
    taskrun_images,
)
from controller.tekton.core import TektonObjects
from controller.core.model import ImageSet


def params(**values: Any) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def task(name: str, spec: dict[str, Any], namespace: str = "ci", api: str = "tekton.dev/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": "Task", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def step_action(name: str, spec: dict[str, Any], namespace: str = "ci") -> dict[str, Any]:
    return {"apiVersion": "tekton.dev/v1beta1", "kind": "StepAction", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def pipeline(name: str, spec: dict[str, Any], namespace: str = "ci") -> dict[str, Any]:
    return {"apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def taskrun(spec: dict[str, Any], namespace: str = "ci", api: str = "tekton.dev/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": "TaskRun", "metadata": {"name": "tr", "namespace": namespace}, "spec": spec}


def pipelinerun(spec: dict[str, Any], namespace: str = "ci") -> dict[str, Any]:
    return {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {"name": "pr", "namespace": namespace}, "spec": spec}


def index(*objs: dict[str, Any]) -> TektonObjects:
    """The objects, with Tekton's cluster resolver configured as Tekton ships it."""
    objects = TektonObjects(TEKTON_DEFAULTS)
    for obj in objs:
        objects.put(obj)
    return objects


BUILD = task(
    "build",
    {
        "params": [
            {"name": "BUILDER_IMAGE", "default": "gcr.io/kaniko-project/executor:v1.5.1"},
            {"name": "TAG", "default": "3.19"},
            {"name": "IMAGE"},
            {"name": "PLATFORMS", "type": "array", "default": ["linux/amd64", "linux/arm64"]},
            {"name": "TOOLS", "type": "object", "default": {"shell": "bash:5", "vcs": "git:2"}},
            {"name": "DERIVED", "default": "mirror.example.com/alpine:$(params.TAG)"},
        ],
        "stepTemplate": {"image": "busybox:1.36"},
        "steps": [
            {"name": "build", "image": "$(params.BUILDER_IMAGE)"},
            {"name": "templated", "script": "echo"},
            {"name": "alpine", "image": 'docker.io/library/alpine:$(params["TAG"])'},
        ],
        "sidecars": [{"name": "registry", "image": "registry:2"}],
    },
)
SINGLE = {"name": "s", "image": "x"}


def with_step(image: str, **extra: Any) -> dict[str, Any]:
    return {"taskSpec": {"params": BUILD["spec"]["params"], "steps": [{"name": "s", "image": image}]}, **extra}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # literal images, stepTemplate, sidecars, defaults
        ({"taskRef": {"name": "build"}},
         ImageSet(images=("busybox:1.36", "docker.io/library/alpine:3.19", "gcr.io/kaniko-project/executor:v1.5.1", "registry:2"))),
        # run params win over Task defaults
        ({"taskRef": {"name": "build"}, "params": params(BUILDER_IMAGE="ghcr.io/acme/builder:2", TAG="3.20")},
         ImageSet(images=("busybox:1.36", "docker.io/library/alpine:3.20", "ghcr.io/acme/builder:2", "registry:2"))),
        # the three param syntaxes
        (with_step("$(params.TAG)"), ImageSet(images=("3.19",))),
        (with_step('$(params["TAG"])'), ImageSet(images=("3.19",))),
        (with_step("$(params['TAG'])"), ImageSet(images=("3.19",))),
        (with_step("a:$(params.TAG)-$(params.TAG)"), ImageSet(images=("a:3.19-3.19",))),
        # array element and object key
        (with_step("x/$(params.PLATFORMS[1])"), ImageSet(images=("x/linux/arm64",))),
        (with_step("$(params.TOOLS.shell)"), ImageSet(images=("bash:5",))),
        # a default that refers to another param's default
        (with_step("$(params.DERIVED)"), ImageSet(images=("mirror.example.com/alpine:3.19",))),
        # ... a run param for the referenced one does not change it (Tekton resolves defaults among defaults)
        (with_step("$(params.DERIVED)", params=params(TAG="9")), ImageSet(images=("mirror.example.com/alpine:3.19",))),
        # run params reach an inline spec even when not declared (propagated params)
        ({"taskSpec": {"steps": [{"name": "s", "image": "$(params.img)"}]}, "params": params(img="alpine:3")},
         ImageSet(images=("alpine:3",))),
        # unresolved: each cause, never guessed
        (with_step("$(params.IMAGE)"), ImageSet(unresolved=("step s: param IMAGE has no value",))),
        (with_step("$(params.NOPE)"), ImageSet(unresolved=("step s: param NOPE has no value",))),
        (with_step("$(params.PLATFORMS[*])"),
         ImageSet(unresolved=("step s: param PLATFORMS is an array: $(params.PLATFORMS[*]) is a list, not one image",))),
        (with_step("$(params.PLATFORMS)"),
         ImageSet(unresolved=("step s: param PLATFORMS is an array: $(params.PLATFORMS) is a list, not one image",))),
        (with_step("$(params.PLATFORMS[5])"), ImageSet(unresolved=("step s: param PLATFORMS has no element [5]",))),
        (with_step("$(params.TOOLS)"), ImageSet(unresolved=("step s: param TOOLS is an object: $(params.TOOLS) is not one image",))),
        (with_step("$(params.TOOLS.nope)"), ImageSet(unresolved=("step s: param TOOLS has no key nope",))),
        (with_step("$(context.taskRun.name)"),
         ImageSet(unresolved=("step s: $(context.taskRun.name) is a context variable, known only at run time",))),
        (with_step("$(steps.a.results.img)"),
         ImageSet(unresolved=("step s: $(steps.a.results.img) is a step result, known only at run time",))),
        (with_step("$(workspaces.src.path)"),
         ImageSet(unresolved=("step s: $(workspaces.src.path) is a workspace variable, known only at run time",))),
        (with_step("$(params.TAG)", params=params(TAG="$(context.taskRun.uid)")),
         ImageSet(unresolved=("step s: image '$(context.taskRun.uid)' still holds a variable after substitution",))),
        (with_step("$(params.TAG)", params=params(TAG="")), ImageSet(unresolved=("step s: the image is empty after substitution",))),
        ({"taskSpec": {"steps": [{"name": "s"}]}}, ImageSet(unresolved=("step s has no image",))),
        ({"taskSpec": {"steps": [{"image": "a"}, {"image": "b"}, {}]}}, ImageSet(images=("a", "b"), unresolved=("step unnamed-2 has no image",))),
        ({"taskRef": {"name": "missing"}}, ImageSet(unresolved=("Task ci/missing not found",))),
        ({"taskRef": {"name": "build", "kind": "ClusterTask"}},
         ImageSet(unresolved=("ClusterTask build cannot be used: ClusterTask was removed in Tekton v1.0.0",))),
        ({"taskRef": {"apiVersion": "example.dev/v1", "kind": "Wait", "name": "w"}},
         ImageSet(unresolved=("custom task example.dev/v1/Wait: Tekton makes no pod for it",))),
        ({"taskRef": {"resolver": "git", "params": params(url="https://x", pathInRepo="t.yaml")}},
         ImageSet(unresolved=("Task comes from the git resolver, known only when Tekton resolves it",))),
        ({"taskRef": {"resolver": "bundles", "params": params(bundle="r/b:1", name="t", kind="task")}},
         ImageSet(unresolved=("Task comes from the bundles resolver, known only when Tekton resolves it",))),
        ({"taskRef": {"resolver": "hub", "params": params(name="git-clone")}},
         ImageSet(unresolved=("Task comes from the hub resolver, known only when Tekton resolves it",))),
        ({"taskRef": {"resolver": "http", "params": params(url="https://x/t.yaml")}},
         ImageSet(unresolved=("Task comes from the http resolver, known only when Tekton resolves it",))),
        ({}, ImageSet(unresolved=("the TaskRun has neither taskRef nor taskSpec",))),
        # cluster resolver: another namespace
        ({"taskRef": {"resolver": "cluster", "params": params(kind="task", name="shared", namespace="tekton-tasks")}},
         ImageSet(images=("shared:1",))),
        ({"taskRef": {"resolver": "cluster", "params": params(name="shared", namespace="tekton-tasks")}},
         ImageSet(images=("shared:1",))),
        ({"taskRef": {"resolver": "cluster", "params": params(name="shared")}},
         ImageSet(unresolved=("cluster resolver reference to Task shared: missing required cluster resolver params: namespace",))),
        ({"taskRef": {"resolver": "cluster", "params": params(kind="pipeline", name="shared", namespace="tekton-tasks")}},
         ImageSet(unresolved=("cluster resolver kind 'pipeline' where a Task is expected",))),
        ({"taskRef": {"resolver": "cluster", "params": params(name="gone", namespace="tekton-tasks")}},
         ImageSet(unresolved=("Task tekton-tasks/gone not found",))),
    ],
)
def test_taskrun_images(spec: dict[str, Any], expected: ImageSet) -> None:
    objects = index(BUILD, task("shared", {"steps": [{"image": "shared:1"}]}, namespace="tekton-tasks"))
    assert taskrun_images(taskrun(spec), objects) == expected


def test_v1beta1_taskrun_with_bundle_is_unresolved_and_v1beta1_task_is_read() -> None:
    objects = index(task("old", {"steps": [{"name": "s", "image": "old:1"}]}, api="tekton.dev/v1beta1"))
    assert taskrun_images(taskrun({"taskRef": {"name": "old"}}, api="tekton.dev/v1beta1"), objects).images == ("old:1",)
    bundled = taskrun({"taskRef": {"name": "t", "bundle": "reg/b:1"}}, api="tekton.dev/v1beta1")
    assert taskrun_images(bundled, objects).unresolved == ("Task t comes from the bundle reg/b:1, known only when Tekton resolves it",)


def test_a_task_in_another_namespace_is_not_found_without_the_cluster_resolver() -> None:
    objects = index(task("build", {"steps": [{"image": "a"}]}, namespace="other"))
    assert taskrun_images(taskrun({"taskRef": {"name": "build"}}), objects).unresolved == ("Task ci/build not found",)


GIT_CLONE_ACTION = step_action(
    "git-clone",
    {
        "params": [
            {"name": "url"},
            {"name": "gitInitImage", "default": "ghcr.io/tektoncd/git-init:v0.40.2"},
            {"name": "registry", "default": "ghcr.io"},
            {"name": "mirror", "default": "$(params.registry)/mirror/git:1"},
        ],
        "image": "$(params.gitInitImage)",
    },
)


def action_step(ref: dict[str, Any], **step_params: Any) -> dict[str, Any]:
    return {"name": "clone", "ref": ref, "params": params(**step_params)}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"taskSpec": {"steps": [action_step({"name": "git-clone"}, url="u")]}}, ("ghcr.io/tektoncd/git-init:v0.40.2",)),
        # the step's params win over the StepAction's defaults
        ({"taskSpec": {"steps": [action_step({"name": "git-clone"}, gitInitImage="my/git:2")]}}, ("my/git:2",)),
        # a step param may be a param of the Task, whose value comes from the run
        ({"taskSpec": {"params": [{"name": "img", "default": "d/git:1"}],
                       "steps": [action_step({"name": "git-clone"}, gitInitImage="$(params.img)")]},
          "params": params(img="run/git:3")}, ("run/git:3",)),
        ({"taskSpec": {"params": [{"name": "img", "default": "d/git:1"}],
                       "steps": [action_step({"name": "git-clone"}, gitInitImage="$(params.img)")]}}, ("d/git:1",)),
        ({"taskSpec": {"steps": [action_step({"name": "git-clone"}, registry="quay.io")]}}, ("ghcr.io/tektoncd/git-init:v0.40.2",)),
        ({"taskSpec": {"steps": [action_step({"resolver": "cluster", "params": params(kind="stepaction", name="git-clone", namespace="ci")})]}},
         ("ghcr.io/tektoncd/git-init:v0.40.2",)),
    ],
)
def test_step_action_images(spec: dict[str, Any], expected: tuple[str, ...]) -> None:
    assert taskrun_images(taskrun(spec), index(GIT_CLONE_ACTION)) == ImageSet(images=expected)


def test_step_action_default_referring_to_another_param() -> None:
    action = step_action("mirror", {"params": GIT_CLONE_ACTION["spec"]["params"], "image": "$(params.mirror)"})
    spec = {"taskSpec": {"steps": [action_step({"name": "mirror"}, registry="quay.io")]}}
    assert taskrun_images(taskrun(spec), index(action)).images == ("quay.io/mirror/git:1",)
    # a step param is substituted in the Task's scope, not in the StepAction's
    spec = {"taskSpec": {"steps": [action_step({"name": "git-clone"}, gitInitImage="$(params.mirror)")]}}
    assert taskrun_images(taskrun(spec), index(GIT_CLONE_ACTION)).unresolved == ("step clone: param mirror has no value",)


@pytest.mark.parametrize(
    ("ref", "cause"),
    [
        ({"name": "nope"}, "step clone: StepAction ci/nope not found"),
        ({"resolver": "git", "params": params(url="u")}, "step clone: StepAction comes from the git resolver, known only when Tekton resolves it"),
        ({"resolver": "cluster", "params": params(kind="stepaction", name="git-clone")},
         "step clone: cluster resolver reference to StepAction git-clone: missing required cluster resolver params: namespace"),
    ],
)
def test_unresolved_step_actions(ref: dict[str, Any], cause: str) -> None:
    spec = {"taskSpec": {"steps": [action_step(ref), {"name": "other", "image": "alpine:3"}]}}
    assert taskrun_images(taskrun(spec), index(GIT_CLONE_ACTION)) == ImageSet(images=("alpine:3",), unresolved=(cause,))


def test_step_template_image_does_not_apply_to_sidecars() -> None:
    spec = {"taskSpec": {"stepTemplate": {"image": "tmpl:1"}, "steps": [{"name": "a"}], "sidecars": [{"name": "db"}]}}
    assert taskrun_images(taskrun(spec), TektonObjects()) == ImageSet(images=("tmpl:1",), unresolved=("sidecar db has no image",))


# -- pipelines ------------------------------------------------------------------------------------

RELEASE = pipeline(
    "release",
    {
        "params": [
            {"name": "builder", "default": "gcr.io/kaniko-project/executor:v1.9"},
            {"name": "uploader", "default": "ghcr.io/acme/uploader:1"},
            {"name": "no-default"},
        ],
        "tasks": [
            {"name": "clone", "taskRef": {"name": "build"}, "params": params(BUILDER_IMAGE="alpine/git:2", TAG="$(params.builder)")},
            {"name": "build", "taskRef": {"name": "build"}, "params": params(BUILDER_IMAGE="$(params.builder)")},
            {"name": "upload", "taskSpec": {"params": [{"name": "uploader", "default": "ignored:1"}],
                                            "steps": [{"name": "up", "image": "$(params.uploader)"}]}},
            {"name": "own", "taskSpec": {"params": [{"name": "local", "default": "local:1"}],
                                         "steps": [{"name": "s", "image": "$(params.local)"}]}},
            {"name": "by-result", "taskRef": {"name": "build"}, "params": params(BUILDER_IMAGE="$(tasks.build.results.IMAGE_URL)")},
            {"name": "no-value", "taskRef": {"name": "build"}, "params": params(BUILDER_IMAGE="$(params.no-default)")},
            {"name": "wait", "taskRef": {"apiVersion": "custom.dev/v1", "kind": "Wait"}},
            {"name": "gone", "taskRef": {"name": "gone"}},
        ],
        "finally": [{"name": "notify", "taskSpec": {"steps": [{"name": "n", "image": "curlimages/curl:8"}]}}],
    },
)
BUILD_DEFAULT_IMAGES = {"busybox:1.36", "docker.io/library/alpine:3.19", "registry:2"}


def test_pipelinerun_images_per_pipeline_task_then_finally() -> None:
    run = pipelinerun({"pipelineRef": {"name": "release"}, "params": params(uploader="ghcr.io/acme/uploader:2")})
    found = dict(pipelinerun_images(run, index(BUILD, RELEASE)))
    assert list(found) == ["clone", "build", "upload", "own", "by-result", "no-value", "wait", "gone", "notify"]
    assert set(found["clone"].images) == {"busybox:1.36", "alpine/git:2", "docker.io/library/alpine:gcr.io/kaniko-project/executor:v1.9", "registry:2"}
    assert set(found["build"].images) == BUILD_DEFAULT_IMAGES | {"gcr.io/kaniko-project/executor:v1.9"}
    assert found["upload"] == ImageSet(images=("ghcr.io/acme/uploader:2",))  # run param over Pipeline default, propagated
    assert found["own"] == ImageSet(images=("local:1",))
    assert found["by-result"].unresolved == (
        "step build: $(tasks.build.results.IMAGE_URL) is a result of another task, known only at run time",
    )
    assert set(found["by-result"].images) == BUILD_DEFAULT_IMAGES
    assert found["no-value"].unresolved == ("step build: param no-default has no value",)
    assert found["wait"] == ImageSet(unresolved=("custom task custom.dev/v1/Wait: Tekton makes no pod for it",))
    assert found["gone"] == ImageSet(unresolved=("Task ci/gone not found",))
    assert found["notify"] == ImageSet(images=("curlimages/curl:8",))


def test_pipeline_defaults_apply_without_run_params() -> None:
    found = dict(pipelinerun_images(pipelinerun({"pipelineRef": {"name": "release"}}), index(BUILD, RELEASE)))
    assert found["upload"] == ImageSet(images=("ghcr.io/acme/uploader:1",))


def test_inline_pipeline_spec_and_pipeline_task_param_overriding_propagation() -> None:
    spec = {
        "params": params(img="run:1"),
        "pipelineSpec": {
            "params": [{"name": "img"}],
            "tasks": [
                {"name": "a", "taskSpec": {"steps": [{"name": "s", "image": "$(params.img)"}]}},
                {"name": "b", "params": params(img="task:1"), "taskSpec": {"steps": [{"name": "s", "image": "$(params.img)"}]}},
            ],
        },
    }
    assert pipelinerun_images(pipelinerun(spec), TektonObjects()) == [
        ("a", ImageSet(images=("run:1",))),
        ("b", ImageSet(images=("task:1",))),
    ]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"pipelineRef": {"name": "missing"}}, [(WHOLE_RUN, ImageSet(unresolved=("Pipeline ci/missing not found",)))]),
        ({"pipelineRef": {"resolver": "git", "params": params(url="u")}},
         [(WHOLE_RUN, ImageSet(unresolved=("Pipeline comes from the git resolver, known only when Tekton resolves it",)))]),
        ({"pipelineRef": {"resolver": "cluster", "params": params(kind="pipeline", name="release", namespace="ci")}, "params": params(builder="b:1")},
         None),
        ({}, [(WHOLE_RUN, ImageSet(unresolved=("the PipelineRun has neither pipelineRef nor pipelineSpec",)))]),
        ({"pipelineSpec": {"tasks": [{"name": "nested", "pipelineRef": {"name": "x"}}]}},
         [("nested", ImageSet(unresolved=("a Pipeline inside a Pipeline is not followed",)))]),
        ({"pipelineSpec": {"tasks": [{"name": "c", "taskSpec": {"apiVersion": "custom.dev/v1", "kind": "Wait", "spec": {}}}]}},
         [("c", ImageSet(unresolved=("custom task custom.dev/v1/Wait: Tekton makes no pod for it",)))]),
    ],
)
def test_pipelinerun_sources(spec: dict[str, Any], expected: list | None) -> None:
    found = pipelinerun_images(pipelinerun(spec), index(BUILD, RELEASE))
    if expected is None:  # found through the cluster resolver
        assert dict(found)["build"].images == tuple(sorted(BUILD_DEFAULT_IMAGES | {"b:1"}))
    else:
        assert found == expected


def test_array_params_pass_through_a_pipeline_and_used_whole_stay_unresolved() -> None:
    spec = {
        "params": params(ARGS=["a", "b"]),
        "pipelineSpec": {
            "params": [{"name": "ARGS", "type": "array"}],
            "tasks": [{"name": "t", "params": [{"name": "X", "value": ["$(params.ARGS[*])"]}],
                       "taskSpec": {"params": [{"name": "X", "type": "array"}],
                                    "steps": [{"name": "one", "image": "img:$(params.X[1])"}, {"name": "all", "image": "$(params.X[*])"}]}}],
        },
    }
    assert pipelinerun_images(pipelinerun(spec), TektonObjects()) == [
        ("t", ImageSet(images=("img:b",), unresolved=("step all: param X is an array: $(params.X[*]) is a list, not one image",)))
    ]


def test_matrix_fans_out_to_every_image() -> None:
    spec = {
        "params": params(versions=["3.11", "3.12"]),
        "pipelineSpec": {
            "params": [{"name": "versions", "type": "array"}],
            "tasks": [{
                "name": "test",
                "matrix": {"params": [{"name": "version", "value": "$(params.versions)"}, {"name": "os", "value": ["slim", "alpine"]}],
                           "include": [{"name": "extra", "params": params(version="3.13", os="bookworm")}]},
                "taskSpec": {"params": [{"name": "version"}, {"name": "os"}],
                             "steps": [{"name": "py", "image": "python:$(params.version)-$(params.os)"}]},
            }],
        },
    }
    [(name, found)] = pipelinerun_images(pipelinerun(spec), TektonObjects())
    assert name == "test" and found.unresolved == ()
    assert {"python:3.11-slim", "python:3.11-alpine", "python:3.12-slim", "python:3.12-alpine", "python:3.13-bookworm"} <= set(found.images)


# -- pods -----------------------------------------------------------------------------------------


def test_pod_images_are_step_and_sidecar_containers_only() -> None:
    pod = {
        "kind": "Pod",
        "spec": {
            "initContainers": [{"name": "prepare", "image": "tekton/entrypoint:1"}, {"name": "step-init", "image": "init:1"}],
            "containers": [
                {"name": "step-build", "image": "kaniko:1"},
                {"name": "step-push", "image": "crane:1"},
                {"name": "step-again", "image": "kaniko:1"},
                {"name": "sidecar-registry", "image": "registry:2"},
                {"name": "istio-proxy", "image": "istio/proxyv2:1"},
                {"name": "step-empty"},
            ],
        },
    }
    assert pod_images(pod) == ImageSet(images=("crane:1", "kaniko:1", "registry:2"), unresolved=("container step-empty has no image",))
    assert not is_tekton_pod(pod), "step containers alone do not make a pod Tekton's"
    assert not is_tekton_pod({"spec": {"containers": [{"name": "nginx", "image": "nginx"}]}})
    assert pod_images({}) == ImageSet()


def test_a_pods_images_past_the_caps_are_named_as_causes() -> None:
    many = [{"name": f"step-{i}", "image": f"img-{i}:1"} for i in range(MAX_IMAGES + 2)]
    long = {"name": "step-long", "image": "r/" + "x" * MAX_IMAGE_CHARS}
    again = {"name": "step-again", "image": "img-0:1"}  # already kept: no cause
    found = pod_images({"spec": {"containers": [*many, long, again]}})
    assert len(found.images) == MAX_IMAGES and "img-0:1" in found.images
    assert found.unresolved == (
        f"more than {MAX_IMAGES} distinct images, the cap",
        f"container step-long: the image is {MAX_IMAGE_CHARS + 2} characters long, over the {MAX_IMAGE_CHARS} cap",
    )


STEPS = {"containers": [{"name": "step-build", "image": "kaniko:1"}]}
TASKRUN_OWNER = {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": "r", "uid": "u", "controller": True}


@pytest.mark.parametrize(
    ("metadata", "spec", "expected"),
    [
        ({"labels": {"tekton.dev/taskRun": "r", "app.kubernetes.io/managed-by": "tekton-pipelines"}}, STEPS, True),
        ({"labels": {"tekton.dev/taskRun": "r", "app.kubernetes.io/managed-by": "pipelinesascode.tekton.dev"}}, STEPS, True),
        ({"labels": {"tekton.dev/taskRun": "r"}}, STEPS, True),  # any managed-by value, or none
        ({"ownerReferences": [TASKRUN_OWNER]}, STEPS, True),
        ({"ownerReferences": [{**TASKRUN_OWNER, "apiVersion": "example.com/v1"}]}, STEPS, False),
        ({"labels": {"app.kubernetes.io/managed-by": "tekton-pipelines"}}, STEPS, False),  # no run named
        ({"labels": {"tekton.dev/taskRun": ""}}, STEPS, False),
        ({"labels": {"tekton.dev/taskRun": "r"}}, {"containers": [{"name": "web", "image": "nginx"}]}, False),
    ],
)
def test_tekton_pods_are_known_by_what_tekton_sets(metadata: dict, spec: dict, expected: bool) -> None:
    assert is_tekton_pod({"metadata": metadata, "spec": spec}) is expected


# -- the index ------------------------------------------------------------------------------------


def test_objects_index_put_replace_remove() -> None:
    objects = TektonObjects()
    assert objects.put(task("t", {"steps": [{"name": "s", "image": "a:1", "script": "x" * 10_000}]}))
    assert objects.task("ci", "t").steps[0].image == "a:1"
    assert not hasattr(objects.task("ci", "t").steps[0], "script")  # only what decides images is kept
    objects.put(task("t", {"steps": [{"name": "s", "image": "a:2"}]}))
    assert objects.task("ci", "t").steps[0].image == "a:2"
    objects.put({"metadata": {"name": "t2"}, "spec": {"steps": []}}, kind="Task")  # list items may lack kind
    assert objects.task("default", "t2") is not None
    assert not objects.put({"kind": "ConfigMap", "metadata": {"name": "c"}})
    assert not objects.put({"kind": "Task", "metadata": {}})
    objects.put(step_action("sa", {"image": "x"}))
    objects.put(pipeline("p", {"tasks": []}))
    assert len(objects) == 4
    objects.remove("Task", "ci", "t")
    objects.remove("Task", "ci", "absent")
    assert objects.task("ci", "t") is None and objects.step_action("ci", "sa") and objects.pipeline("ci", "p")
    objects.replace_kind("Pipeline", [pipeline("q", {})])
    assert objects.pipeline("ci", "p") is None and objects.pipeline("ci", "q") is not None


@pytest.mark.parametrize(
    "odd",
    [
        {},
        {"spec": None},
        {"spec": {"taskSpec": {"steps": "not a list"}}},
        {"spec": {"taskSpec": {"steps": [None, 3, {"image": 5}]}, "params": [None, {"value": 1}, {"name": "x"}]}},
        {"spec": {"taskRef": "build"}},
        {"spec": {"taskRef": {"resolver": "cluster", "params": [{"name": "name", "value": ["a"]}]}}},
        {"metadata": None, "spec": {"taskSpec": {"params": [{"name": "a", "default": "$(params.a)"}], "steps": [{"image": "$(params.a)"}]}}},
    ],
)
def test_odd_runs_never_raise(odd: dict[str, Any]) -> None:
    assert isinstance(taskrun_images(odd, index(BUILD)), ImageSet)
    assert isinstance(pipelinerun_images(odd, index(BUILD)), list)
    assert isinstance(pod_images(odd), ImageSet)


# -- properties -----------------------------------------------------------------------------------

texts = st.text(alphabet=st.characters(blacklist_characters="$"), max_size=20)
names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_-]{0,8}", fullmatch=True)


@settings(deadline=None)
@given(texts)
def test_text_without_variables_is_unchanged(text: str) -> None:
    assert substitute(text, {}) == (text,)


@settings(deadline=None)
@given(st.dictionaries(names, texts, min_size=1), st.data())
def test_substitution_replaces_a_known_param(values: dict[str, str], data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(values)))
    prefix, suffix = data.draw(texts), data.draw(texts)
    assert substitute(f"{prefix}$(params.{name}){suffix}", values) == (f"{prefix}{values[name]}{suffix}",)
    assert substitute(f'$(params["{name}"])', values) == (values[name],)


@settings(deadline=None)
@given(st.lists(st.text(alphabet="abc:/.", min_size=1, max_size=6), min_size=1, max_size=8))
def test_images_are_sorted_and_unique(images: list[str]) -> None:
    spec = {"taskSpec": {"steps": [{"name": f"s{i}", "image": image} for i, image in enumerate(images)]}}
    found = taskrun_images(taskrun(spec), TektonObjects())
    assert found.images == tuple(sorted(set(images))) and found.complete


def test_fanout_and_unknown_values() -> None:
    assert substitute("p:$(params.v)", {"v": Fanout(("1", "2"))}) == ("p:1", "p:2")
    assert substitute("p:$(params.v)", {"v": Unknown("why")}) == Unknown("why")
