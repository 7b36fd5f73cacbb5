"""Image discovery: the container images a TaskRun, each task of a PipelineRun, or a Tekton pod will use.

Runs are plain dicts as the API serves them (tekton.dev/v1 or v1beta1). Referenced Tasks, StepActions
and Pipelines come from a `TektonObjects` index that the informers (or `explain`) keep up to date.
Params are substituted the way Tekton does it (pkg/reconciler/{taskrun,pipelinerun}/resources/apply.go):

- TaskRun: Task defaults (a default may refer to another default), then every run param on top.
- PipelineRun: Pipeline defaults, then the run params, give the pipeline scope; a pipeline task's
  params are substituted in that scope, then play the TaskRun params' part for its Task. An embedded
  `taskSpec` also sees the pipeline scope (Tekton "propagated params"). `matrix` params fan out.
- StepAction: the step's params (substituted in the Task scope) over the StepAction's defaults.

Whatever cannot be known before Tekton runs (remote resolvers, results, context variables, missing
objects, custom tasks, array/object params used whole) is reported in `ImageSet.unresolved`, one
cause per image, never guessed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from itertools import product
from typing import Any, Iterable, Mapping

from controller.core.model import ImageSet

WHOLE_RUN = ""  # key of the single entry of `pipelinerun_images` when the Pipeline itself is unknown


# -- param values ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unknown:
    """A value that cannot be known before the run, and why."""

    cause: str


@dataclass(frozen=True)
class Fanout:
    """A string param that takes each of several values, one per `matrix` instance."""

    values: tuple[str, ...]


# A param value: a string, an array, an object, a matrix fan-out, or the reason it is unknown.
Value = str | tuple[str, ...] | Mapping[str, str] | Fanout | Unknown
Scope = Mapping[str, Value]

_VARIABLE = re.compile(r"\$\(([^()]*)\)")
_PARAM = re.compile(
    r"""(?:inputs\.)?params(?:\.(?P<dot>[^\[\]"']+)|\["(?P<dq>[^"]+)"\]|\['(?P<sq>[^']+)'\])"""
    r"""(?:\[(?P<index>\d+|\*)\])?"""
)


def substitute(text: str, scope: Scope) -> tuple[str, ...] | Unknown:
    """Every value `text` takes once its `$(params...)` are replaced (several only for matrix fan-outs)."""
    if "$(" not in text:
        return (text,)
    results = [""]
    end = 0
    for match in _VARIABLE.finditer(text):
        values = _variable(match.group(1), scope)
        if isinstance(values, Unknown):
            return values
        literal = text[end : match.start()]
        results = [done + literal + value for done, value in product(results, values)]
        end = match.end()
    return tuple(dict.fromkeys(done + text[end:] for done in results))


def _variable(expression: str, scope: Scope) -> tuple[str, ...] | Unknown:
    match = _PARAM.fullmatch(expression)
    if match is None:
        return Unknown(_why_not_a_param(expression))
    name = match["dq"] or match["sq"] or match["dot"]
    key = None
    if match["dot"] and name not in scope and "." in name:
        name, key = name.split(".", 1)
    index = match["index"]
    value = scope.get(name, Unknown(f"param {name} has no value"))
    if isinstance(value, Unknown):
        return value
    if isinstance(value, Fanout) and index is None and key is None:
        return value.values
    if isinstance(value, str) and index is None and key is None:
        return (value,)
    if isinstance(value, tuple):
        if index is not None and index != "*":
            position = int(index)
            if position < len(value):
                return (value[position],)
            return Unknown(f"param {name} has no element [{position}]")
        return Unknown(f"param {name} is an array: $({expression}) is a list, not one image")
    if isinstance(value, Mapping):
        if key is not None and index is None and key in value:
            return (value[key],)
        if key is not None:
            return Unknown(f"param {name} has no key {key}")
        return Unknown(f"param {name} is an object: $({expression}) is not one image")
    return Unknown(f"param {name} is a string: $({expression}) does not apply to it")


def _why_not_a_param(expression: str) -> str:
    if expression.startswith("tasks.") and ".results." in expression:
        return f"$({expression}) is a result of another task, known only at run time"
    if expression.startswith("steps.") and ".results." in expression:
        return f"$({expression}) is a step result, known only at run time"
    if expression.startswith("context."):
        return f"$({expression}) is a context variable, known only at run time"
    if expression.startswith("workspaces."):
        return f"$({expression}) is a workspace variable, known only at run time"
    return f"$({expression}) is not a param reference"


def resolve(value: Value, scope: Scope) -> Value:
    """A param value with the `$(params...)` in it replaced from `scope` (one pass, as Tekton does)."""
    if isinstance(value, str):
        found = substitute(value, scope)
        if isinstance(found, Unknown):
            return found
        return found[0] if len(found) == 1 else Fanout(found)
    if isinstance(value, tuple):
        items: list[str] = []
        for item in value:
            whole = _VARIABLE.fullmatch(item)
            spliced = _splice(whole.group(1), scope) if whole else None
            if spliced is not None:
                if isinstance(spliced, Unknown):
                    return spliced
                items.extend(spliced)
                continue
            found = substitute(item, scope)
            if isinstance(found, Unknown):
                return found
            if len(found) != 1:
                return Unknown(f"array element {item!r} fans out with the matrix")
            items.append(found[0])
        return tuple(items)
    if isinstance(value, Fanout):
        return value
    if isinstance(value, Mapping):
        out: dict[str, str] = {}
        for key, item in value.items():
            found = resolve(item, scope)
            if not isinstance(found, str):
                return found if isinstance(found, Unknown) else Unknown(f"object key {key} is not a string")
            out[key] = found
        return out
    return value


def _splice(expression: str, scope: Scope) -> tuple[str, ...] | Unknown | None:
    """The elements of an array param used whole inside an array (`"$(params.X)"` or `[*]`), else None."""
    match = _PARAM.fullmatch(expression)
    if match is None or match["index"] not in (None, "*"):
        return None
    value = scope.get(match["dq"] or match["sq"] or match["dot"] or "")
    if isinstance(value, tuple | Unknown):
        return value
    return None


# -- trimmed Tekton objects -----------------------------------------------------------------------


@dataclass(frozen=True)
class ParamSpec:
    name: str
    default: Value | None  # None: no default


@dataclass(frozen=True)
class Ref:
    """A taskRef, pipelineRef or step ref."""

    name: str = ""
    kind: str = ""
    api_version: str = ""
    resolver: str = ""
    params: Mapping[str, Value] = field(default_factory=dict)
    bundle: str = ""


@dataclass(frozen=True)
class Step:
    """A step or a sidecar: its image, or the StepAction it refers to with the params it passes."""

    name: str
    image: str = ""
    ref: Ref | None = None
    params: Mapping[str, Value] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSpec:
    params: tuple[ParamSpec, ...] = ()
    steps: tuple[Step, ...] = ()
    sidecars: tuple[Step, ...] = ()
    template_image: str = ""


@dataclass(frozen=True)
class StepActionSpec:
    params: tuple[ParamSpec, ...] = ()
    image: str = ""


@dataclass(frozen=True)
class PipelineTask:
    name: str
    ref: Ref | None = None
    spec: TaskSpec | None = None
    params: Mapping[str, Value] = field(default_factory=dict)
    matrix: Mapping[str, Value] = field(default_factory=dict)  # matrix.params: arrays to fan out
    matrix_include: Mapping[str, tuple[Value, ...]] = field(default_factory=dict)
    problem: str = ""  # why its images cannot be known at all (custom task, nested pipeline)


@dataclass(frozen=True)
class PipelineSpec:
    params: tuple[ParamSpec, ...] = ()
    tasks: tuple[PipelineTask, ...] = ()
    finally_tasks: tuple[PipelineTask, ...] = ()


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _value(raw: Any) -> Value:
    if isinstance(raw, list):
        return tuple(_str(item) for item in raw)
    if isinstance(raw, Mapping):
        return {str(k): _str(v) for k, v in raw.items()}
    return _str(raw)


def _params(raw: Any) -> dict[str, Value]:
    """`[{name, value}, ...]` as a dict (a later duplicate wins)."""
    return {str(p["name"]): _value(p.get("value")) for p in _list(raw) if isinstance(p, Mapping) and "name" in p}


def _param_specs(raw: Any) -> tuple[ParamSpec, ...]:
    return tuple(
        ParamSpec(name=str(p["name"]), default=_value(p["default"]) if "default" in p else None)
        for p in _list(raw)
        if isinstance(p, Mapping) and "name" in p
    )


def _ref(raw: Any) -> Ref | None:
    if not isinstance(raw, Mapping):
        return None
    return Ref(
        name=_str(raw.get("name")),
        kind=_str(raw.get("kind")),
        api_version=_str(raw.get("apiVersion")),
        resolver=_str(raw.get("resolver")),
        params=_params(raw.get("params")),
        bundle=_str(raw.get("bundle")),
    )


def _custom_spec(raw: Mapping[str, Any]) -> str:
    """Why an embedded spec is not a Task spec ("" when it is one)."""
    if raw.get("apiVersion") and raw.get("kind"):
        return f"custom task {raw['apiVersion']}/{raw['kind']}: Tekton makes no pod for it"
    return ""


def _steps(raw: Any, prefix: str) -> tuple[Step, ...]:
    steps = []
    for i, s in enumerate(_list(raw)):
        s = _dict(s)
        steps.append(
            Step(
                name=_str(s.get("name")) or f"{prefix}-{i}",
                image=_str(s.get("image")),
                ref=_ref(s.get("ref")),
                params=_params(s.get("params")),
            )
        )
    return tuple(steps)


def task_spec(raw: Any) -> TaskSpec:
    """The parts of a Task spec that decide images."""
    raw = _dict(raw)
    return TaskSpec(
        params=_param_specs(raw.get("params")),
        steps=_steps(raw.get("steps"), "unnamed"),
        sidecars=_steps(raw.get("sidecars"), "unnamed-sidecar"),
        template_image=_str(_dict(raw.get("stepTemplate")).get("image")),
    )


def step_action_spec(raw: Any) -> StepActionSpec:
    raw = _dict(raw)
    return StepActionSpec(params=_param_specs(raw.get("params")), image=_str(raw.get("image")))


def _pipeline_task(raw: Any, index: int) -> PipelineTask:
    raw = _dict(raw)
    name = _str(raw.get("name")) or f"task-{index}"
    matrix = _dict(raw.get("matrix"))
    include: dict[str, list[Value]] = {}
    for entry in _list(matrix.get("include")):
        for pname, pvalue in _params(_dict(entry).get("params")).items():
            include.setdefault(pname, []).append(pvalue)
    common = dict(
        name=name,
        params=_params(raw.get("params")),
        matrix=_params(matrix.get("params")),
        matrix_include={k: tuple(v) for k, v in include.items()},
    )
    if isinstance(raw.get("taskSpec"), Mapping):
        problem = _custom_spec(raw["taskSpec"])
        return PipelineTask(**common, spec=None if problem else task_spec(raw["taskSpec"]), problem=problem)
    if isinstance(raw.get("taskRef"), Mapping):
        return PipelineTask(**common, ref=_ref(raw["taskRef"]))
    if raw.get("pipelineRef") or raw.get("pipelineSpec"):
        return PipelineTask(**common, problem="a Pipeline inside a Pipeline is not followed")
    return PipelineTask(**common, problem="the pipeline task has neither taskRef nor taskSpec")


def pipeline_spec(raw: Any) -> PipelineSpec:
    raw = _dict(raw)
    tasks = _list(raw.get("tasks"))
    return PipelineSpec(
        params=_param_specs(raw.get("params")),
        tasks=tuple(_pipeline_task(t, i) for i, t in enumerate(tasks)),
        finally_tasks=tuple(_pipeline_task(t, len(tasks) + i) for i, t in enumerate(_list(raw.get("finally")))),
    )


class TektonObjects:
    """Tasks, StepActions and Pipelines by namespace and name, trimmed to what decides images.

    `put` and `remove` cost one object's parse; nothing else is kept of the objects."""

    KINDS = ("Task", "StepAction", "Pipeline")

    def __init__(self) -> None:
        self._tasks: dict[tuple[str, str], TaskSpec] = {}
        self._step_actions: dict[tuple[str, str], StepActionSpec] = {}
        self._pipelines: dict[tuple[str, str], PipelineSpec] = {}

    def _table(self, kind: str) -> dict[tuple[str, str], Any] | None:
        return {"Task": self._tasks, "StepAction": self._step_actions, "Pipeline": self._pipelines}.get(kind)

    def put(self, obj: Mapping[str, Any], kind: str | None = None) -> bool:
        """Add or replace one object (kind from `obj`, or given when list items lack it). False if ignored."""
        kind = kind or _str(obj.get("kind"))
        table = self._table(kind)
        meta = _dict(obj.get("metadata"))
        name = _str(meta.get("name"))
        if table is None or not name:
            return False
        spec = obj.get("spec")
        parsed = {"Task": task_spec, "StepAction": step_action_spec, "Pipeline": pipeline_spec}[kind](spec)
        table[(_str(meta.get("namespace")) or "default", name)] = parsed
        return True

    def remove(self, kind: str, namespace: str, name: str) -> None:
        table = self._table(kind)
        if table is not None:
            table.pop((namespace, name), None)

    def replace_kind(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """All objects of `kind` become exactly `objs` (a relist)."""
        table = self._table(kind)
        if table is None:
            return
        table.clear()
        for obj in objs:
            self.put(obj, kind)

    def task(self, namespace: str, name: str) -> TaskSpec | None:
        return self._tasks.get((namespace, name))

    def step_action(self, namespace: str, name: str) -> StepActionSpec | None:
        return self._step_actions.get((namespace, name))

    def pipeline(self, namespace: str, name: str) -> PipelineSpec | None:
        return self._pipelines.get((namespace, name))

    def __len__(self) -> int:
        return len(self._tasks) + len(self._step_actions) + len(self._pipelines)


# -- finding referenced objects -------------------------------------------------------------------


def _find(
    kind: str, ref: Ref, namespace: str, scope: Scope, objects: TektonObjects
) -> TaskSpec | StepActionSpec | PipelineSpec | str:
    """The object `ref` points to, or a string saying why it cannot be known now."""
    if ref.api_version and ref.kind:
        return f"custom task {ref.api_version}/{ref.kind}: Tekton makes no pod for it"
    if ref.kind == "ClusterTask":
        return f"ClusterTask {ref.name} cannot be used: ClusterTask was removed in Tekton v1.0.0"
    if ref.bundle:
        return f"{kind} {ref.name} comes from the bundle {ref.bundle}, known only when Tekton resolves it"
    if ref.resolver == "cluster":
        params: dict[str, str] = {}
        for label, default in (("kind", "task"), ("name", ""), ("namespace", "")):
            value = resolve(ref.params.get(label, default), scope)
            if isinstance(value, Unknown):
                return f"cluster resolver param {label}: {value.cause}"
            if not isinstance(value, str):
                return f"cluster resolver param {label} is not a string"
            params[label] = value
        name, namespace = params["name"], params["namespace"]
        if params["kind"].lower() != kind.lower():
            return f"cluster resolver kind {params['kind']!r} where a {kind} is expected"
        if not namespace.strip():
            return f"cluster resolver reference to {kind} {name} names no namespace"
    elif ref.resolver:
        return f"{kind} comes from the {ref.resolver} resolver, known only when Tekton resolves it"
    else:
        name = ref.name
    if not name:
        return f"the {kind} reference has no name"
    found = {"Task": objects.task, "StepAction": objects.step_action, "Pipeline": objects.pipeline}[kind](
        namespace, name
    )
    return found if found is not None else f"{kind} {namespace}/{name} not found"


# -- collecting images ----------------------------------------------------------------------------


class _Images:
    def __init__(self) -> None:
        self.images: set[str] = set()
        self.causes: dict[str, None] = {}

    def fail(self, cause: str) -> None:
        self.causes[cause] = None

    def add(self, what: str, text: str, scope: Scope) -> None:
        if not text:
            self.fail(f"{what} has no image")
            return
        found = substitute(text, scope)
        if isinstance(found, Unknown):
            self.fail(f"{what}: {found.cause}")
            return
        for image in found:
            if "$(" in image:
                self.fail(f"{what}: image {image!r} still holds a variable after substitution")
            elif not image.strip():
                self.fail(f"{what}: the image is empty after substitution")
            else:
                self.images.add(image)

    def result(self) -> ImageSet:
        return ImageSet(images=tuple(sorted(self.images)), unresolved=tuple(self.causes))


def _scope(specs: Iterable[ParamSpec], given: Scope) -> dict[str, Value]:
    """Declared params: the given value, else the default (which may refer to other params), else Unknown."""
    values: dict[str, Value] = {}
    pending: dict[str, Value] = {}
    for spec in specs:
        if spec.name in given:
            values[spec.name] = given[spec.name]
        elif spec.default is None:
            values[spec.name] = Unknown(f"param {spec.name} has no value")
        elif _referenced_params(spec.default):
            pending[spec.name] = spec.default
        else:
            values[spec.name] = spec.default
    while pending:
        ready = [name for name, default in pending.items() if not _referenced_params(default) & pending.keys()]
        if not ready:  # defaults that refer to each other
            for name in pending:
                values[name] = Unknown(f"param {name}: its default refers to itself through other params")
            break
        for name in ready:
            values[name] = resolve(pending.pop(name), values)
    return values


def _referenced_params(value: Value) -> set[str]:
    """Names of the params a value refers to."""
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, tuple):
        texts = list(value)
    elif isinstance(value, Mapping):
        texts = list(value.values())
    else:
        return set()
    names = set()
    for text in texts:
        for variable in _VARIABLE.finditer(text):
            match = _PARAM.fullmatch(variable.group(1))
            if match is not None:
                name = match["dq"] or match["sq"] or match["dot"]
                names.update({name, name.split(".", 1)[0]})
    return names


def _task_images(task: TaskSpec, scope: Scope, namespace: str, objects: TektonObjects, out: _Images) -> None:
    for step in task.steps:
        what = f"step {step.name}"
        if step.ref is None:
            out.add(what, step.image or task.template_image, scope)
            continue
        action = _find("StepAction", step.ref, namespace, scope, objects)
        if isinstance(action, str):
            out.fail(f"{what}: {action}")
            continue
        given = {k: resolve(v, scope) for k, v in step.params.items()}
        out.add(what, action.image or task.template_image, {**scope, **_scope(action.params, given)})
    for sidecar in task.sidecars:
        out.add(f"sidecar {sidecar.name}", sidecar.image, scope)


def taskrun_images(taskrun: Mapping[str, Any], objects: TektonObjects) -> ImageSet:
    """The images of a TaskRun's pod, as far as they can be known at TaskRun CREATE."""
    namespace = _str(_dict(taskrun.get("metadata")).get("namespace")) or "default"
    spec = _dict(taskrun.get("spec"))
    run_params = _params(spec.get("params"))
    out = _Images()
    if isinstance(spec.get("taskSpec"), Mapping):
        problem = _custom_spec(spec["taskSpec"])
        task: Any = problem or task_spec(spec["taskSpec"])
    elif isinstance(spec.get("taskRef"), Mapping):
        task = _find("Task", _ref(spec["taskRef"]) or Ref(), namespace, run_params, objects)
    else:
        task = "the TaskRun has neither taskRef nor taskSpec"
    if isinstance(task, str):
        out.fail(task)
    else:
        _task_images(task, {**_scope(task.params, {}), **run_params}, namespace, objects, out)
    return out.result()


def pipelinerun_images(pipelinerun: Mapping[str, Any], objects: TektonObjects) -> list[tuple[str, ImageSet]]:
    """The images of each pipeline task, then each finally task, keyed by pipeline task name.

    When the Pipeline itself cannot be known, one entry keyed `WHOLE_RUN` says why."""
    namespace = _str(_dict(pipelinerun.get("metadata")).get("namespace")) or "default"
    spec = _dict(pipelinerun.get("spec"))
    run_params = _params(spec.get("params"))
    if isinstance(spec.get("pipelineSpec"), Mapping):
        pipeline: Any = pipeline_spec(spec["pipelineSpec"])
    elif isinstance(spec.get("pipelineRef"), Mapping):
        pipeline = _find("Pipeline", _ref(spec["pipelineRef"]) or Ref(), namespace, run_params, objects)
    else:
        pipeline = "the PipelineRun has neither pipelineRef nor pipelineSpec"
    if isinstance(pipeline, str):
        return [(WHOLE_RUN, ImageSet(unresolved=(pipeline,)))]
    scope = {**_scope(pipeline.params, {}), **run_params}
    return [
        (task.name, _pipeline_task_images(task, scope, namespace, objects))
        for task in pipeline.tasks + pipeline.finally_tasks
    ]


def _pipeline_task_images(
    task: PipelineTask, pipeline_scope: Scope, namespace: str, objects: TektonObjects
) -> ImageSet:
    out = _Images()
    if task.problem:
        out.fail(task.problem)
        return out.result()
    given: dict[str, Value] = {k: resolve(v, pipeline_scope) for k, v in task.params.items()}
    for name, values in task.matrix.items():
        found = resolve(values if isinstance(values, tuple) else (values,), pipeline_scope)
        given[name] = Fanout(found) if isinstance(found, tuple) else found
    if task.spec is not None:
        spec: Any = task.spec
        scope = {**_scope(spec.params, {}), **pipeline_scope, **given}  # params propagate into embedded specs
    else:
        spec = _find("Task", task.ref or Ref(), namespace, pipeline_scope, objects)
        if isinstance(spec, str):
            out.fail(spec)
            return out.result()
        scope = {**_scope(spec.params, {}), **given}
    for name, extra in task.matrix_include.items():
        scope[name] = _fan_in(scope.get(name), [resolve(v, pipeline_scope) for v in extra])
    _task_images(spec, scope, namespace, objects, out)
    return out.result()


def _fan_in(base: Value | None, extra: list[Value]) -> Value:
    """A param that `matrix.include` sets in some instances: every value it may take."""
    values: list[str] = []
    for value in extra:
        if isinstance(value, Unknown):
            return value
        values.extend(value.values if isinstance(value, Fanout) else [value] if isinstance(value, str) else [])
    if isinstance(base, str):
        values.append(base)
    elif isinstance(base, Fanout):
        values.extend(base.values)
    values = list(dict.fromkeys(values))
    if not values:
        return base if base is not None else Unknown("matrix include gives no string value")
    return values[0] if len(values) == 1 else Fanout(tuple(values))


def pod_images(pod: Mapping[str, Any]) -> ImageSet:
    """The images of a Tekton pod's step and sidecar containers (not init containers, not others)."""
    out = _Images()
    for container in _list(_dict(pod.get("spec")).get("containers")):
        container = _dict(container)
        name = _str(container.get("name"))
        if name.startswith(("step-", "sidecar-")):
            image = _str(container.get("image"))
            if image:
                out.images.add(image)
            else:
                out.fail(f"container {name} has no image")
    return out.result()


TASKRUN_LABEL = "tekton.dev/taskRun"


def is_tekton_pod(pod: Mapping[str, Any]) -> bool:
    """A pod Tekton made for a TaskRun: labelled `tekton.dev/taskRun` or owned by a tekton.dev TaskRun,
    with containers named step-*. Whatever `app.kubernetes.io/managed-by` says: Pipelines-as-Code and
    installs with another `default-managed-by-label-value` write something else there.

    Every one of these fields is the pod creator's to write, so this only says which code path judges
    the pod; what it may get is decided by its namespace (the request's, which it cannot forge)."""
    meta = _dict(pod.get("metadata"))
    made_for_a_taskrun = bool(_str(_dict(meta.get("labels")).get(TASKRUN_LABEL))) or any(
        _dict(o).get("kind") == "TaskRun" and _str(_dict(o).get("apiVersion")).startswith("tekton.dev/")
        for o in _list(meta.get("ownerReferences"))
    )
    return made_for_a_taskrun and any(
        _str(_dict(c).get("name")).startswith("step-") for c in _list(_dict(pod.get("spec")).get("containers"))
    )
