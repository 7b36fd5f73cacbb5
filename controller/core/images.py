"""Image discovery: the container images a TaskRun, each task of a PipelineRun, or a Tekton pod will use.

Runs are plain dicts as the API serves them (tekton.dev/v1 or v1beta1). Referenced Tasks, StepActions
and Pipelines come from a `tekton.core.TektonObjects` index that the informers (or `explain`) keep up to date.
Params are substituted the way Tekton does it (pkg/reconciler/{taskrun,pipelinerun}/resources/apply.go):

- TaskRun: Task defaults (a default may refer to another default), then every run param on top.
- PipelineRun: Pipeline defaults, then the run params, give the pipeline scope; a pipeline task's
  params are substituted in that scope, then play the TaskRun params' part for its Task. An embedded
  `taskSpec` also sees the pipeline scope (Tekton "propagated params"). `matrix` params fan out.
- StepAction: the step's params (substituted in the Task scope) over the StepAction's defaults.

Whatever cannot be known before Tekton runs (remote resolvers, results, context variables, missing
objects, custom tasks, array/object params used whole) is reported in `ImageSet.unresolved`, one
cause per image, never guessed.

Bounded work for any input: a tenant writes the params, and Tekton's substitution lets a few hundred
bytes of defaults that each repeat the previous one twice make a string of gigabytes. Every string
substitution would build is measured before it is built, and the caps below (config/settings.md,
"Bounds of image discovery") turn what lies past them into an `unresolved` cause instead: one image
string, one substituted value, the images of one run, the matrix combinations, and the total work
of one run (`Budget`). The caps are far above what real Tasks and Pipelines use; a run past one is
placed at Pod CREATE instead, from the images Tekton finally writes.
"""

from __future__ import annotations

import json
import re
from collections import ChainMap
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import product
from typing import TYPE_CHECKING, Any

from controller.core import cluster_resolver
from controller.core.model import ImageSet

if TYPE_CHECKING:
    from controller.tekton.core import TektonObjects

WHOLE_RUN = ""  # key of the single entry of `pipelinerun_images` when the Pipeline itself is unknown

# -- bounds ---------------------------------------------------------------------------------------
# An image reference is at most about 530 characters (a 255-character name, a 128-character tag, a
# sha512 digest); the Tekton catalog's longest is 153, Tekton's examples' 134.
MAX_IMAGE_CHARS = 1024
# A param value built by substitution (it may be a script passed through, not only an image); the
# catalog's longest param value is 183 characters. Longer values become unknown, which matters only
# when an image uses them.
MAX_VALUE_CHARS = 16 * 1024
# Distinct images of one TaskRun or pipeline task (every step and sidecar, every matrix instance);
# the catalog's largest Task has 5 steps.
MAX_IMAGES = 1024
# Matrix instances of one pipeline task, and values one string takes across them. Tekton refuses more
# than `default-max-matrix-combinations-count` (256 unless the cluster's config-defaults raise it).
MAX_MATRIX_COMBINATIONS = 1024
# Tasks and finally tasks of one Pipeline; the catalog's largest has 9, Tekton's examples 11. Past it,
# the PipelineRun is unresolved as a whole and each of its TaskRuns is placed when Tekton creates it.
MAX_PIPELINE_TASKS = 1024
# Work of one run: characters read and written by substitution, each param, step, variable and
# array element counting as WORK_PER_ITEM more (about what handling one costs next to a character).
# The heaviest run of the catalog and Tekton's examples (buildpacks' PipelineRun) needs 27 KB of it; a
# Task's defaults count once per run however many pipeline tasks use it.
MAX_SUBSTITUTION_WORK = 2 * 1024 * 1024
WORK_PER_ITEM = 256
CLIP_CHARS = 80  # of a tenant's text quoted in a cause


class Budget:
    """The substitution work one run may still do (see MAX_SUBSTITUTION_WORK). Shared by everything
    that substitutes for the run; once spent, every further substitution is `exhausted`."""

    EXHAUSTED_CAUSE = (
        f"substituting the run's params needs more than {MAX_SUBSTITUTION_WORK} characters of work, the cap"
    )

    def __init__(self, work: int = MAX_SUBSTITUTION_WORK) -> None:
        self.left = work
        # the defaults of each Task already resolved for this run, by the identity of its params
        self.task_defaults: dict[int, tuple[tuple[Any, ...], Mapping[str, Any]]] = {}

    def task_scope(self, params: tuple[Any, ...]) -> Mapping[str, Any]:
        """`_scope(params, {})`, worked out once per run for each Task (pipelines reuse Tasks)."""
        known = self.task_defaults.get(id(params))
        if known is None or known[0] is not params:
            known = self.task_defaults[id(params)] = (params, _scope(params, {}, self))
        return known[1]

    def spend(self, work: int) -> bool:
        """Take `work` from the budget: False (and the budget spent) when there is not that much left."""
        self.left -= work
        return self.left >= 0

    @property
    def spent(self) -> bool:
        return self.left < 0

    @property
    def exhausted(self) -> "Unknown":
        return Unknown(self.EXHAUSTED_CAUSE)


def _clip(text: str) -> str:
    """A tenant's text short enough to quote in a cause."""
    return text if len(text) <= CLIP_CHARS else f"{text[:CLIP_CHARS]}... ({len(text)} characters)"


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


def substitute(
    text: str, scope: Scope, budget: Budget | None = None, max_chars: int = MAX_VALUE_CHARS
) -> tuple[str, ...] | Unknown:
    """Every value `text` takes once its `$(params...)` are replaced (several only for matrix fan-outs).

    Unknown, before anything is built, when a value it builds would be longer than `max_chars` (a text
    without variables is returned as it is, whatever its length), when there would
    be more than MAX_MATRIX_COMBINATIONS values, or when `budget` has not enough work left."""
    budget = budget if budget is not None else Budget()
    if not budget.spend(WORK_PER_ITEM + len(text)):
        return budget.exhausted
    if "$(" not in text:
        return (text,)
    results = [""]
    end = 0
    for match in _VARIABLE.finditer(text):
        if not budget.spend(WORK_PER_ITEM):
            return budget.exhausted
        values = _variable(match.group(1), scope)
        if isinstance(values, Unknown):
            return values
        if not values:  # an empty matrix fan-out: no instance, no value
            return ()
        literal = text[end : match.start()]
        if len(results) * len(values) > MAX_MATRIX_COMBINATIONS:
            return Unknown(
                f"{_clip(text)!r} takes more than {MAX_MATRIX_COMBINATIONS} values across matrix instances, the cap"
            )
        longest = max(map(len, results)) + len(literal) + max(map(len, values))
        if longest > max_chars:
            return Unknown(f"{_clip(text)!r} becomes {longest} characters or more, over the cap of {max_chars}")
        built = sum(map(len, results)) * len(values) + (len(literal) * len(values) + sum(map(len, values))) * len(results)
        if not budget.spend(built):
            return budget.exhausted
        results = [done + literal + value for done, value in product(results, values)]
        end = match.end()
    tail = text[end:]
    if max(map(len, results)) + len(tail) > max_chars:
        return Unknown(f"{_clip(text)!r} becomes more than {max_chars} characters, the cap")
    if not budget.spend(sum(map(len, results)) + len(tail) * len(results)):
        return budget.exhausted
    return tuple(dict.fromkeys(done + tail for done in results))


def _variable(expression: str, scope: Scope) -> tuple[str, ...] | Unknown:
    match = _PARAM.fullmatch(expression)
    if match is None:
        return Unknown(_why_not_a_param(expression))
    name = match["dq"] or match["sq"] or match["dot"]
    key = None
    if match["dot"] and name not in scope and "." in name:
        name, key = name.split(".", 1)
    index = match["index"]
    value = scope.get(name, Unknown(f"param {_clip(name)} has no value"))
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
            return Unknown(f"param {_clip(name)} has no element [{position}]")
        return Unknown(f"param {_clip(name)} is an array: $({_clip(expression)}) is a list, not one image")
    if isinstance(value, Mapping):
        if key is not None and index is None and key in value:
            return (value[key],)
        if key is not None:
            return Unknown(f"param {_clip(name)} has no key {_clip(key)}")
        return Unknown(f"param {_clip(name)} is an object: $({_clip(expression)}) is not one image")
    return Unknown(f"param {_clip(name)} is a string: $({_clip(expression)}) does not apply to it")


def _why_not_a_param(expression: str) -> str:
    if expression.startswith("tasks.") and ".results." in expression:
        return f"$({_clip(expression)}) is a result of another task, known only at run time"
    if expression.startswith("steps.") and ".results." in expression:
        return f"$({_clip(expression)}) is a step result, known only at run time"
    if expression.startswith("context."):
        return f"$({_clip(expression)}) is a context variable, known only at run time"
    if expression.startswith("workspaces."):
        return f"$({_clip(expression)}) is a workspace variable, known only at run time"
    return f"$({_clip(expression)}) is not a param reference"


def resolve(value: Value, scope: Scope, budget: Budget | None = None) -> Value:
    """A param value with the `$(params...)` in it replaced from `scope` (one pass, as Tekton does),
    within the caps of `substitute`."""
    budget = budget if budget is not None else Budget()
    if isinstance(value, str):
        found = substitute(value, scope, budget)
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
                if not budget.spend(WORK_PER_ITEM * (1 + len(spliced))):
                    return budget.exhausted
                items.extend(spliced)
                continue
            found = substitute(item, scope, budget)
            if isinstance(found, Unknown):
                return found
            if len(found) != 1:
                return Unknown(f"array element {_clip(item)!r} fans out with the matrix")
            items.append(found[0])
        return tuple(items)
    if isinstance(value, Fanout):
        return value
    if isinstance(value, Mapping):
        out: dict[str, str] = {}
        for key, item in value.items():
            found = resolve(item, scope, budget)
            if not isinstance(found, str):
                return found if isinstance(found, Unknown) else Unknown(f"object key {_clip(key)} is not a string")
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


def _is_mapping(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)  # the first test is 50 times faster


def _dict(value: Any) -> Mapping[str, Any]:
    return value if _is_mapping(value) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _value(raw: Any) -> Value:
    if type(raw) is str:
        return raw
    if isinstance(raw, list):
        return tuple(_str(item) for item in raw)
    if _is_mapping(raw):
        return {str(k): _str(v) for k, v in raw.items()}
    return _str(raw)


def _params(raw: Any) -> dict[str, Value]:
    """`[{name, value}, ...]` as a dict (a later duplicate wins)."""
    return {str(p["name"]): _value(p.get("value")) for p in _list(raw) if _is_mapping(p) and "name" in p}


def _param_specs(raw: Any) -> tuple[ParamSpec, ...]:
    return tuple(
        ParamSpec(name=str(p["name"]), default=_value(p["default"]) if "default" in p else None)
        for p in _list(raw)
        if _is_mapping(p) and "name" in p
    )


def _ref(raw: Any) -> Ref | None:
    if not _is_mapping(raw):
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
    if _is_mapping(raw.get("taskSpec")):
        problem = _custom_spec(raw["taskSpec"])
        return PipelineTask(**common, spec=None if problem else task_spec(raw["taskSpec"]), problem=problem)
    if _is_mapping(raw.get("taskRef")):
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


# -- what image discovery reads of a definition ---------------------------------------------------

_REF_FIELDS = ("name", "kind", "apiVersion", "resolver", "bundle")


def _pick(raw: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    return {k: raw[k] for k in keys if k in raw}


def _params_fields(raw: Any, value: str) -> list[Any]:
    """`[{name, value}]` (or `default` for param specs): what _params and _param_specs read."""
    return [_pick(p, ("name", value)) for p in _list(raw) if _is_mapping(p) and "name" in p]


def _ref_fields(raw: Any) -> Any:
    if not _is_mapping(raw):
        return None
    out = _pick(raw, _REF_FIELDS)
    if "params" in raw:
        out["params"] = _params_fields(raw["params"], "value")
    return out


def _step_fields(raw: Any) -> dict[str, Any]:
    step = _dict(raw)
    out = _pick(step, ("name", "image"))
    if "ref" in step:
        out["ref"] = _ref_fields(step["ref"])
    if "params" in step:
        out["params"] = _params_fields(step["params"], "value")
    return out  # a step that is not an object keeps its place (its default name counts)


def _task_fields(raw: Any) -> dict[str, Any]:
    spec = _dict(raw)
    out: dict[str, Any] = _pick(spec, ("apiVersion", "kind"))  # a custom task's spec says so
    if "params" in spec:
        out["params"] = _params_fields(spec["params"], "default")
    for key in ("steps", "sidecars"):
        if key in spec:
            out[key] = [_step_fields(s) for s in _list(spec[key])]
    template = _dict(spec.get("stepTemplate"))
    if "image" in template:
        out["stepTemplate"] = {"image": template["image"]}
    return out


def _pipeline_task_fields(raw: Any) -> dict[str, Any]:
    task = _dict(raw)
    out = _pick(task, ("name",))
    if "params" in task:
        out["params"] = _params_fields(task["params"], "value")
    if "matrix" in task:
        matrix = _dict(task["matrix"])
        out["matrix"] = {"params": _params_fields(matrix.get("params"), "value"),
                         "include": [{"params": _params_fields(_dict(i).get("params"), "value")}
                                     for i in _list(matrix.get("include"))]}
    if "taskSpec" in task:
        out["taskSpec"] = _task_fields(task["taskSpec"]) if _is_mapping(task["taskSpec"]) else None
    if "taskRef" in task:
        out["taskRef"] = _ref_fields(task["taskRef"])
    for key in ("pipelineRef", "pipelineSpec"):  # only whether there is one
        if task.get(key):
            out[key] = True
    return out


def image_fields(kind: str, spec: Any) -> Any:
    """The parts of a Task, Pipeline or StepAction spec image discovery reads (task_spec, pipeline_spec,
    step_action_spec give the same answer for both): no scripts, env, volumes, workspaces or results,
    which can be most of a definition. What the informer keeps of each definition until it is parsed."""
    if not _is_mapping(spec):
        return None
    if kind == "StepAction":
        out = _pick(spec, ("image",))
        if "params" in spec:
            out["params"] = _params_fields(spec["params"], "default")
        return out
    if kind == "Pipeline":
        out = {}
        if "params" in spec:
            out["params"] = _params_fields(spec["params"], "default")
        for key in ("tasks", "finally"):
            if key in spec:
                out[key] = [_pipeline_task_fields(t) for t in _list(spec[key])]
        return out
    return _task_fields(spec)


# -- finding referenced objects -------------------------------------------------------------------


def _find(
    kind: str, ref: Ref, namespace: str, scope: Scope, objects: TektonObjects, budget: Budget
) -> TaskSpec | StepActionSpec | PipelineSpec | str:
    """The object `ref` points to, or a string saying why it cannot be known now."""
    if ref.api_version and ref.kind:
        return f"custom task {_clip(ref.api_version)}/{_clip(ref.kind)}: Tekton makes no pod for it"
    if ref.kind == "ClusterTask":
        return f"ClusterTask {_clip(ref.name)} cannot be used: ClusterTask was removed in Tekton v1.0.0"
    if ref.bundle:
        return f"{kind} {_clip(ref.name)} comes from the bundle {_clip(ref.bundle)}, known only when Tekton resolves it"
    if ref.resolver == "cluster":
        params: dict[str, str] = {}
        for label in ("kind", "name", "namespace"):
            if label not in ref.params:
                continue
            value = resolve(ref.params[label], scope, budget)
            if isinstance(value, Unknown):
                return f"cluster resolver param {label}: {value.cause}"
            if not isinstance(value, str):
                return f"cluster resolver param {label} is not a string"
            params[label] = value
        found_target = cluster_resolver.target(params, objects.cluster_resolver)
        if isinstance(found_target, str):
            return f"cluster resolver reference to {kind} {_clip(params.get('name', ''))}: {found_target}"
        if found_target.kind != kind.lower():
            return f"cluster resolver kind {_clip(found_target.kind)!r} where a {kind} is expected"
        name, namespace = found_target.name, found_target.namespace
    elif ref.resolver:
        return f"{kind} comes from the {_clip(ref.resolver)} resolver, known only when Tekton resolves it"
    else:
        name = ref.name
    if not name:
        return f"the {kind} reference has no name"
    found = {"Task": objects.task, "StepAction": objects.step_action, "Pipeline": objects.pipeline}[kind](
        namespace, name
    )
    return found if found is not None else f"{kind} {_clip(namespace)}/{_clip(name)} not found"


# -- collecting images ----------------------------------------------------------------------------


class _Images:
    """The images of one TaskRun, pipeline task or pod, and the causes of those that cannot be known:
    at most MAX_IMAGES of each, every image at most MAX_IMAGE_CHARS long."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.images: set[str] = set()
        self.causes: dict[str, None] = {}

    def fail(self, cause: str) -> None:
        if len(self.causes) < MAX_IMAGES:
            self.causes[cause] = None
        else:
            self.causes[f"more than {MAX_IMAGES} causes, the cap: the others are not listed"] = None

    def add(self, what: str, text: str, scope: Scope) -> None:
        if not text:
            self.fail(f"{what} has no image")
            return
        found = substitute(text, scope, self.budget, MAX_IMAGE_CHARS)
        if isinstance(found, Unknown):
            self.fail(f"{what}: {found.cause}")
            return
        for image in found:
            if "$(" in image:
                self.fail(f"{what}: image {_clip(image)!r} still holds a variable after substitution")
            elif not image.strip():
                self.fail(f"{what}: the image is empty after substitution")
            else:
                self.add_image(what, image)

    def fits(self, image: str) -> bool:
        """Would `add_image` keep `image` (within the caps)? Then its cause's text need not be written."""
        return len(image) <= MAX_IMAGE_CHARS and (len(self.images) < MAX_IMAGES or image in self.images)

    def add_image(self, what: str, image: str) -> None:
        """One final image (no variable left in it), within the caps."""
        if self.fits(image):
            self.images.add(image)
        elif len(image) > MAX_IMAGE_CHARS:
            self.fail(f"{what}: the image is {len(image)} characters long, over the {MAX_IMAGE_CHARS} cap")
        else:
            self.fail(f"more than {MAX_IMAGES} distinct images, the cap")

    def result(self) -> ImageSet:
        return ImageSet(images=tuple(sorted(self.images)), unresolved=tuple(self.causes))


def _scope(specs: Iterable[ParamSpec], given: Scope, budget: Budget) -> Mapping[str, Value]:
    """Declared params: the given value, else the default (which may refer to other params), else Unknown.

    Defaults that refer to other params are resolved after those (in dependency order, each once:
    linear in the number of params and references); defaults that refer to each other stay Unknown."""
    specs = tuple(specs)
    values: dict[str, Value] = {}
    pending: dict[str, set[str]] = {}  # param -> the params its default refers to
    for spec in specs:
        values.pop(spec.name, None)  # a later declaration of the same name wins
        pending.pop(spec.name, None)
        if not budget.spend(WORK_PER_ITEM):
            return _ExhaustedScope(budget.exhausted)
        elif spec.name in given:
            values[spec.name] = given[spec.name]
        elif spec.default is None:
            values[spec.name] = Unknown(f"param {_clip(spec.name)} has no value")
        else:
            referenced = _referenced_params(spec.default, budget)
            if referenced:
                pending[spec.name] = referenced
            else:
                values[spec.name] = spec.default
    defaults = {spec.name: spec.default for spec in specs if spec.name in pending}
    waiting_on = {name: referenced & pending.keys() for name, referenced in pending.items()}
    dependents: dict[str, list[str]] = {}
    for name, needs in waiting_on.items():
        for needed in needs:
            dependents.setdefault(needed, []).append(name)
    ready = [name for name, needs in waiting_on.items() if not needs]
    while ready:
        name = ready.pop()
        default = defaults[name]
        found = resolve(default, values, budget) if default is not None else Unknown("")
        if isinstance(found, Unknown) and not found.cause.startswith("param "):  # name the param where it failed
            found = Unknown(f"param {_clip(name)}: {found.cause}")
        values[name] = found
        for waiting in dependents.get(name, ()):
            waiting_on[waiting].discard(name)
            if not waiting_on[waiting]:
                ready.append(waiting)
    for name, needs in waiting_on.items():
        if needs:  # defaults that refer to each other, or to one that does
            values[name] = Unknown(f"param {_clip(name)}: its default refers to itself through other params")
    return values


class _ExhaustedScope(Mapping[str, Value]):
    """The scope once the budget is spent: every param is unknown for that reason (and none is
    looked at one by one)."""

    def __init__(self, exhausted: Unknown) -> None:
        self.exhausted = exhausted

    def __getitem__(self, name: str) -> Value:
        return self.exhausted

    def __contains__(self, name: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _referenced_params(value: Value, budget: Budget) -> set[str]:
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
        if not budget.spend(WORK_PER_ITEM + len(text)) or "$(" not in text:
            continue
        for variable in _VARIABLE.finditer(text):
            match = _PARAM.fullmatch(variable.group(1))
            if match is not None:
                name = match["dq"] or match["sq"] or match["dot"]
                names.update({name, name.split(".", 1)[0]})
    return names


def _task_images(task: TaskSpec, scope: Scope, namespace: str, objects: TektonObjects, out: _Images) -> None:
    budget = out.budget
    for step in task.steps:
        if budget.spent:
            out.fail(budget.EXHAUSTED_CAUSE)
            return
        what = f"step {_clip(step.name)}"
        if step.ref is None:
            out.add(what, step.image or task.template_image, scope)
            continue
        action = _find("StepAction", step.ref, namespace, scope, objects, budget)
        if isinstance(action, str):
            out.fail(f"{what}: {action}")
            continue
        given = {k: resolve(v, scope, budget) for k, v in step.params.items()}
        out.add(what, action.image or task.template_image, ChainMap(_scope(action.params, given, budget), scope))
    for sidecar in task.sidecars:
        if budget.spent:
            out.fail(budget.EXHAUSTED_CAUSE)
            return
        out.add(f"sidecar {_clip(sidecar.name)}", sidecar.image, scope)


def taskrun_images(taskrun: Mapping[str, Any], objects: TektonObjects) -> ImageSet:
    """The images of a TaskRun's pod, as far as they can be known at TaskRun CREATE."""
    namespace = _str(_dict(taskrun.get("metadata")).get("namespace")) or "default"
    spec = _dict(taskrun.get("spec"))
    run_params = _params(spec.get("params"))
    out = _Images(Budget())
    if isinstance(spec.get("taskSpec"), Mapping):
        problem = _custom_spec(spec["taskSpec"])
        task: Any = problem or task_spec(spec["taskSpec"])
    elif isinstance(spec.get("taskRef"), Mapping):
        task = _find("Task", _ref(spec["taskRef"]) or Ref(), namespace, run_params, objects, out.budget)
    else:
        task = "the TaskRun has neither taskRef nor taskSpec"
    if isinstance(task, str):
        out.fail(task)
    else:
        _task_images(task, ChainMap(run_params, _scope(task.params, {}, out.budget)), namespace, objects, out)
    return out.result()


def pipelinerun_images(pipelinerun: Mapping[str, Any], objects: TektonObjects) -> list[tuple[str, ImageSet]]:
    """The images of each pipeline task, then each finally task, keyed by pipeline task name.

    When the Pipeline itself cannot be known, one entry keyed `WHOLE_RUN` says why. All the tasks
    share one `Budget`: once it is spent, every further task is unresolved at once."""
    namespace = _str(_dict(pipelinerun.get("metadata")).get("namespace")) or "default"
    spec = _dict(pipelinerun.get("spec"))
    run_params = _params(spec.get("params"))
    budget = Budget()
    if isinstance(spec.get("pipelineSpec"), Mapping):
        raw = spec["pipelineSpec"]
        if len(_list(raw.get("tasks"))) + len(_list(raw.get("finally"))) > MAX_PIPELINE_TASKS:
            return [(WHOLE_RUN, ImageSet(unresolved=(_TOO_MANY_TASKS,)))]
        pipeline: Any = pipeline_spec(raw)
    elif isinstance(spec.get("pipelineRef"), Mapping):
        pipeline = _find("Pipeline", _ref(spec["pipelineRef"]) or Ref(), namespace, run_params, objects, budget)
    else:
        pipeline = "the PipelineRun has neither pipelineRef nor pipelineSpec"
    if isinstance(pipeline, str):
        return [(WHOLE_RUN, ImageSet(unresolved=(pipeline,)))]
    if len(pipeline.tasks) + len(pipeline.finally_tasks) > MAX_PIPELINE_TASKS:
        return [(WHOLE_RUN, ImageSet(unresolved=(_TOO_MANY_TASKS,)))]
    scope = ChainMap(run_params, _scope(pipeline.params, {}, budget))
    return [
        (task.name, _pipeline_task_images(task, scope, namespace, objects, budget))
        for task in pipeline.tasks + pipeline.finally_tasks
    ]


_TOO_MANY_TASKS = f"the Pipeline has more than {MAX_PIPELINE_TASKS} tasks, the cap: each TaskRun is placed when created"


def _pipeline_task_images(
    task: PipelineTask, pipeline_scope: Scope, namespace: str, objects: TektonObjects, budget: Budget
) -> ImageSet:
    out = _Images(budget)
    if task.problem:
        out.fail(task.problem)
        return out.result()
    if not budget.spend(WORK_PER_ITEM):
        out.fail(budget.EXHAUSTED_CAUSE)
        return out.result()
    given: dict[str, Value] = {k: resolve(v, pipeline_scope, budget) for k, v in task.params.items()}
    combinations = 1
    for name, values in task.matrix.items():
        found = resolve(values if isinstance(values, tuple) else (values,), pipeline_scope, budget)
        given[name] = Fanout(found) if isinstance(found, tuple) else found
        combinations *= max(len(found), 1) if isinstance(found, tuple) else 1
        if combinations > MAX_MATRIX_COMBINATIONS:
            out.fail(f"the matrix has more than {MAX_MATRIX_COMBINATIONS} combinations, the cap")
            return out.result()
    if task.spec is not None:
        spec: Any = task.spec
        # params propagate into embedded specs
        scope = ChainMap({}, given, pipeline_scope, budget.task_scope(spec.params))
    else:
        spec = _find("Task", task.ref or Ref(), namespace, pipeline_scope, objects, budget)
        if isinstance(spec, str):
            out.fail(spec)
            return out.result()
        scope = ChainMap({}, given, budget.task_scope(spec.params))
    for name, extra in task.matrix_include.items():
        scope[name] = _fan_in(scope.get(name), [resolve(v, pipeline_scope, budget) for v in extra])
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
    out = _Images(Budget())
    for container in _list(_dict(pod.get("spec")).get("containers")):
        container = _dict(container)
        name = _str(container.get("name"))
        if name.startswith(("step-", "sidecar-")):
            image = _str(container.get("image"))
            if not image:
                out.fail(f"container {_clip(name)} has no image")
            elif not out.fits(image):
                out.add_image(f"container {_clip(name)}", image)  # the cause, named
            else:
                out.images.add(image)
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
