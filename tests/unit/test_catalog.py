"""Image discovery on the real Tekton catalog (../shared/catalog beside the repository or
$EGRESS_PLACER_CATALOG, never edited; the module is skipped, saying why, where neither exists).

Every Task, StepAction and Pipeline, and every run of the catalog's tests and samples, is checked:
its images are found, or reported unresolved with the right cause. Expectations come from a small
independent oracle written here (literal images, `$(params.X)` with the Task's default or the run's
value) and, for a handful of definitions, from hand-written exact results. Runs see the catalog's
definitions plus the documents of their own folder, as a user would pass them to `explain`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

import pytest
import yaml

from bench.corpus import catalog_absent_reason, catalog_dir
from controller.core.images import WHOLE_RUN, pipelinerun_images, taskrun_images
from controller.tekton.core import TektonObjects
from controller.core.model import ImageSet

# The catalog sits in shared/ beside the repository on the project's machines and in CI; a user's
# clone has nothing beside it.
if catalog_dir() is None:
    pytest.skip(catalog_absent_reason(), allow_module_level=True)
CATALOG: Path = catalog_dir()  # type: ignore[assignment]


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def definition_files(kind: str) -> list[Path]:
    """`<kinds>/NAME/VERSION/NAME.yaml` holding a `kind` object."""
    return sorted(
        p for p in CATALOG.glob("*/*/*/*.yaml") if p.stem == p.parts[-3] and any(d.get("kind") == kind for d in documents(p))
    )


def run_files() -> list[Path]:
    return sorted(
        p for p in CATALOG.glob("*/*/*/*/*.yaml")
        if p.parent.name in ("tests", "samples") and any(d.get("kind") in ("TaskRun", "PipelineRun") for d in documents(p))
    )


def ids(paths: Iterable[Path]) -> list[str]:
    return [str(p.relative_to(CATALOG)) for p in paths]


TASKS, STEP_ACTIONS, PIPELINES, RUNS = (
    definition_files("Task"), definition_files("StepAction"), definition_files("Pipeline"), run_files()
)
DEFINITIONS = [d for p in TASKS + STEP_ACTIONS + PIPELINES for d in documents(p)]


def catalog_objects(*extra: dict[str, Any]) -> TektonObjects:
    objects = TektonObjects()
    for doc in [*DEFINITIONS, *extra]:
        objects.put(doc)
    return objects


def test_the_catalog_gives_every_kind_of_input() -> None:
    """Whatever copy of the catalog is given, it holds each kind this module checks (counts vary by copy)."""
    assert TASKS and STEP_ACTIONS and PIPELINES and RUNS, (len(TASKS), len(STEP_ACTIONS), len(PIPELINES), len(RUNS))
    assert all(p.is_relative_to(CATALOG / "tasks") for p in TASKS)


# -- the oracle -----------------------------------------------------------------------------------

PARAM = re.compile(r"\$\(params\.([A-Za-z0-9_.-]+)\)")


class CannotSay(Exception):
    """The oracle is too simple for this case (it is then covered by the hand-written tests)."""


def oracle(task_spec: dict[str, Any], given: dict[str, str | None]) -> tuple[set[str], list[str]]:
    """Images of a Task spec and the params whose lack of value leaves an image unknown."""
    values: dict[str, str | None] = {}
    for p in task_spec.get("params") or []:
        default = p.get("default")
        values[p["name"]] = default if isinstance(default, str) and "$(" not in default else None
    values.update(given)
    template = (task_spec.get("stepTemplate") or {}).get("image")
    containers = [s.get("image") or template for s in task_spec.get("steps") or []]
    if any("ref" in s for s in task_spec.get("steps") or []):
        raise CannotSay("StepAction")
    containers += [s.get("image") for s in task_spec.get("sidecars") or []]
    images: set[str] = set()
    missing: list[str] = []
    for image in containers:
        if not isinstance(image, str) or PARAM.sub("", image).count("$("):
            raise CannotSay(str(image))
        lacking = [n for n in PARAM.findall(image) if values.get(n) is None]
        if lacking:
            missing.append(lacking[0])
        else:
            images.add(PARAM.sub(lambda m: str(values[m.group(1)]), image))
    return images, missing


def naive(value: Any, scope: dict[str, str | None]) -> str | None:
    """A pipeline task param value: a literal, or made of pipeline params (None when unknown)."""
    if not isinstance(value, str):
        return None
    if PARAM.sub("", value).count("$("):
        return None
    if any(scope.get(n) is None for n in PARAM.findall(value)):
        return None
    return PARAM.sub(lambda m: str(scope[m.group(1)]), value)


def check(found: ImageSet, images: set[str], missing: list[str]) -> None:
    assert set(found.images) == images
    assert len(found.unresolved) == len(set(missing)) or len(found.unresolved) == len(missing)
    for name in missing:
        assert any(f"param {name} has no value" in cause for cause in found.unresolved), (name, found.unresolved)


# -- every definition -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", TASKS, ids=ids(TASKS))
def test_every_task_as_a_taskrun_without_params(path: Path) -> None:
    [task] = [d for d in documents(path) if d["kind"] == "Task"]
    namespace = task["metadata"].get("namespace") or "default"
    run = {"kind": "TaskRun", "metadata": {"name": "r", "namespace": namespace}, "spec": {"taskRef": {"name": task["metadata"]["name"]}}}
    found = taskrun_images(run, catalog_objects())
    images, missing = oracle(task["spec"], {})
    check(found, images, missing)
    assert all("$(" not in image for image in found.images)


@pytest.mark.parametrize("path", STEP_ACTIONS, ids=ids(STEP_ACTIONS))
def test_every_step_action_in_a_task(path: Path) -> None:
    [action] = [d for d in documents(path) if d["kind"] == "StepAction"]
    spec = {"taskSpec": {"steps": [{"name": "use", "ref": {"name": action["metadata"]["name"]}}]}}
    found = taskrun_images({"kind": "TaskRun", "metadata": {"name": "r"}, "spec": spec}, catalog_objects())
    images, missing = oracle({"params": action["spec"].get("params"), "steps": [{"image": action["spec"]["image"]}]}, {})
    check(found, images, missing)


@pytest.mark.parametrize("path", PIPELINES, ids=ids(PIPELINES))
def test_every_pipeline_as_a_pipelinerun_without_params(path: Path) -> None:
    [pipe] = [d for d in documents(path) if d["kind"] == "Pipeline"]
    run = {"kind": "PipelineRun", "metadata": {"name": "r"}, "spec": {"pipelineRef": {"name": pipe["metadata"]["name"]}}}
    found = dict(pipelinerun_images(run, catalog_objects()))
    pipeline_scope = {p["name"]: p.get("default") if isinstance(p.get("default"), str) else None for p in pipe["spec"].get("params") or []}
    assert list(found) == [t["name"] for t in pipe["spec"]["tasks"] + (pipe["spec"].get("finally") or [])]
    for pipeline_task in pipe["spec"]["tasks"]:
        task = next((d for d in DEFINITIONS if d["kind"] == "Task" and d["metadata"]["name"] == pipeline_task["taskRef"]["name"]), None)
        if task is None:
            assert found[pipeline_task["name"]] == ImageSet(unresolved=(f"Task default/{pipeline_task['taskRef']['name']} not found",))
            continue
        given = {p["name"]: naive(p["value"], pipeline_scope) for p in pipeline_task.get("params") or []}
        images, missing = oracle(task["spec"], given)
        # a param given from a pipeline param without a default is unknown, not the Task's default
        check(found[pipeline_task["name"]], images, missing)


# -- every test and sample run --------------------------------------------------------------------

KNOWN_CAUSES = re.compile(
    r"(step|sidecar) \S+: param \S+ has no value"
    r"|(Task|Pipeline|StepAction) \S+/\S+ not found"
)


@pytest.mark.parametrize("path", RUNS, ids=ids(RUNS))
def test_every_catalog_run(path: Path) -> None:
    folder = [d for p in sorted(path.parent.glob("*.yaml")) for d in documents(p)]
    objects = catalog_objects(*folder)
    runs = [d for d in documents(path) if d["kind"] in ("TaskRun", "PipelineRun")]
    local = {(d["kind"], d["metadata"]["name"]): d for d in [*DEFINITIONS, *folder] if d["kind"] in ("Task", "Pipeline")}
    checked = 0
    for run in runs:
        given = {p["name"]: p["value"] if isinstance(p["value"], str) else None for p in run["spec"].get("params") or []}
        if run["kind"] == "TaskRun":
            results = [(None, taskrun_images(run, objects), run["spec"].get("taskSpec") or local.get(("Task", run["spec"].get("taskRef", {}).get("name")), {}).get("spec"), given)]
        else:
            results = []
            spec = run["spec"].get("pipelineSpec") or local.get(("Pipeline", run["spec"]["pipelineRef"]["name"]), {}).get("spec")
            found = pipelinerun_images(run, objects)
            if spec is None:
                assert found == [(WHOLE_RUN, ImageSet(unresolved=(f"Pipeline default/{run['spec']['pipelineRef']['name']} not found",)))]
                continue
            scope = {p["name"]: p.get("default") if isinstance(p.get("default"), str) else None for p in spec.get("params") or []}
            scope.update(given)
            tasks = spec["tasks"] + (spec.get("finally") or [])
            assert [name for name, _ in found] == [t["name"] for t in tasks]
            for pipeline_task, (_, images) in zip(tasks, found):
                task_params = {p["name"]: naive(p["value"], scope) for p in pipeline_task.get("params") or []}
                if "taskSpec" in pipeline_task:
                    results.append((pipeline_task["name"], images, pipeline_task["taskSpec"], {**scope, **task_params}))
                else:
                    task = local.get(("Task", pipeline_task["taskRef"]["name"]))
                    results.append((pipeline_task["name"], images, task and task["spec"], task_params))
        for name, images, task_spec, task_given in results:
            assert images.images or images.unresolved, name
            assert all("$(" not in image for image in images.images)
            for cause in images.unresolved:
                assert KNOWN_CAUSES.fullmatch(cause), cause
            if task_spec is None:
                assert len(images.unresolved) == 1 and images.unresolved[0].endswith("not found")
                checked += 1
                continue
            try:
                expected, missing = oracle(task_spec, task_given)
            except CannotSay:
                continue
            check(images, expected, missing)
            checked += 1
    assert checked or path.parent.parent.parent.name == "git-clone"  # StepAction runs are pinned below


# -- hand-written expectations --------------------------------------------------------------------

KANIKO = "gcr.io/kaniko-project/executor:v1.5.1@sha256:c6166717f7fe0b7da44908c986137ecfeab21f31ec3992f6e128fff8a94be8a5"
KANIKO_WRITER = "docker.io/library/bash:5.1.4@sha256:c523c636b722339f41b6a431b44588ab2f762c5de5ec3bd7964420ff982fb1d9"
BASH = "docker.io/library/bash:5.1.4@sha256:b208215a4655538be652b2769d82e576bc4d0a2bb132144c060efc5be8c3f5d6"
GIT_INIT = "ghcr.io/tektoncd/github.com/tektoncd/pipeline/cmd/git-init:v0.40.2"


@pytest.mark.parametrize(
    ("task", "namespace", "params", "expected"),
    [
        ("git-clone", "default", {}, ImageSet(images=("ghcr.io/tektoncd-catalog/git-clone:v1.1.0",))),
        ("kaniko", "default", {}, ImageSet(images=(KANIKO_WRITER, KANIKO))),
        ("kaniko", "default", {"BUILDER_IMAGE": "gcr.io/kaniko-project/executor:v1.23.0"},
         ImageSet(images=(KANIKO_WRITER, "gcr.io/kaniko-project/executor:v1.23.0"))),
        ("gcs-upload", "default", {}, ImageSet(images=(
            "gcr.io/google.com/cloudsdktool/cloud-sdk:379.0.0-slim@sha256:d844877c7aaa06a0072979230c68417ddb0f27087277f29747c7169d6ed0d2b9",))),
        ("buildpacks", "default", {}, ImageSet(images=(BASH,), unresolved=("step create: param BUILDER_IMAGE has no value",))),
        ("buildpacks", "default", {"BUILDER_IMAGE": "paketobuildpacks/builder:base"}, ImageSet(images=(BASH, "paketobuildpacks/builder:base"))),
        ("docker-build", "default", {}, ImageSet(images=(
            "docker.io/library/docker:stable@sha256:18ff92d3d31725b53fa6633d60bed323effb6d5d4588be7b547078d384e0d4bf", "docker:dind"))),
        ("golang-build", "default", {"version": "1.22"}, ImageSet(images=("docker.io/library/golang:1.22",))),
        ("buildah-manifest-create", "default", {}, ImageSet(images=("quay.io/buildah/stable:v1",))),
        ("argocd-task-connect-repo", "argocd", {}, ImageSet(images=("quay.io/argoproj/argocd:v2.3.4",))),
        ("argocd-task-connect-repo", "default", {}, ImageSet(unresolved=("Task default/argocd-task-connect-repo not found",))),
    ],
)
def test_pinned_tasks(task: str, namespace: str, params: dict[str, str], expected: ImageSet) -> None:
    run = {"kind": "TaskRun", "metadata": {"name": "r", "namespace": namespace},
           "spec": {"taskRef": {"name": task}, "params": [{"name": k, "value": v} for k, v in params.items()]}}
    assert taskrun_images(run, catalog_objects()) == expected


def run_results(relative: str) -> list[tuple[str | None, ImageSet]]:
    path = CATALOG / relative
    objects = catalog_objects(*[d for p in sorted(path.parent.glob("*.yaml")) for d in documents(p)])
    out: list[tuple[str | None, ImageSet]] = []
    for run in documents(path):
        if run["kind"] == "TaskRun":
            out.append((None, taskrun_images(run, objects)))
        elif run["kind"] == "PipelineRun":
            out.extend(pipelinerun_images(run, objects))
    return out


def test_pinned_step_action_runs() -> None:
    assert run_results("stepactions/git-clone/0.2/tests/run.yaml") == [(None, ImageSet(images=(GIT_INIT,)))] * 10
    assert run_results("stepactions/git-clone/0.2/samples/using-git-clone-result.yaml") == [
        (None, ImageSet(images=(GIT_INIT, "zshusers/zsh:4.3.15")))
    ]
    [(_, commit)] = run_results("stepactions/git-clone/0.2/samples/git-clone-checking-out-a-commit.yaml")
    assert commit.complete and "alpine/git:v2.24.3" in commit.images and len(commit.images) == 2


def test_pinned_pipeline_runs() -> None:
    assert run_results("pipelines/buildpacks/0.2/tests/run.yaml") == [
        ("fetch-from-git", ImageSet(images=("ghcr.io/tektoncd-catalog/git-clone:v1.1.0",))),
        ("build-trusted", ImageSet(images=(
            "docker.io/cnbs/sample-builder:bionic@sha256:6c03dd604503b59820fd15adbc65c0a077a47e31d404a3dcad190f3179e920b5", BASH))),
        ("build-untrusted", ImageSet(unresolved=("Task default/buildpacks-phases not found",))),
    ]
    kaniko = dict(run_results("tasks/kaniko/0.7/tests/run.yaml"))
    assert kaniko["kaniko"] == ImageSet(images=(KANIKO_WRITER, KANIKO))
    assert kaniko["verify-digest"] == ImageSet(images=("ubuntu",))
    yq = run_results("tasks/yq/0.5/tests/run.yaml")
    assert [name for name, _ in yq] == ["fetch-repository", "yq-replace", "display-results"]  # finally last
    assert yq[2][1] == ImageSet(images=(BASH,))
    # an array param passed whole does not disturb the image
    [(name, grype)] = run_results("tasks/grype/0.1/tests/run-daemon.yaml")
    assert name == "grype-scan-local-image" and grype.complete and grype.images[0].startswith("docker.io/anchore/grype@sha256:")
