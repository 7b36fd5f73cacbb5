"""Image discovery does bounded work for any input: each cap of controller/core/images.py at and just
past its value (param doubling, matrix combinations, images per run, pipeline tasks, the work budget,
defaults chained or cyclic, long tenant text in causes), Tekton's substitution kept below the caps,
and properties over generated params and matrices: the core never raises and stays within every cap,
and substitution accounts for every character it builds before building it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.hostile import (
    MATCHING_PREFIX,
    chain_taskrun,
    doubling_image_chars,
    doubling_taskrun,
    matrix_bomb_pipelinerun,
)
from controller.core.images import (
    CLIP_CHARS,
    MAX_IMAGE_CHARS,
    MAX_IMAGES,
    MAX_MATRIX_COMBINATIONS,
    MAX_PIPELINE_TASKS,
    MAX_SUBSTITUTION_WORK,
    MAX_VALUE_CHARS,
    WHOLE_RUN,
    Budget,
    Fanout,
    Unknown,
    pipelinerun_images,
    pod_images,
    substitute,
    taskrun_images,
)
from controller.tekton.core import TektonObjects
from controller.core.model import ImageSet

# A cause names what failed and quotes at most CLIP_CHARS of the tenant's text (twice at most).
MAX_CAUSE_CHARS = 4 * CLIP_CHARS + 300


def taskrun(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "metadata": {"name": "tr", "namespace": "ci"}, "spec": spec}


def pipelinerun(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {"name": "pr", "namespace": "ci"}, "spec": spec}


def steps(*images: str) -> list[dict[str, Any]]:
    return [{"name": f"s{i}", "image": image} for i, image in enumerate(images)]


def within_caps(found: ImageSet) -> None:
    assert len(found.images) <= MAX_IMAGES
    assert all(len(image) <= MAX_IMAGE_CHARS for image in found.images)
    assert len(found.unresolved) <= MAX_IMAGES + 1
    assert all(len(cause) <= MAX_CAUSE_CHARS for cause in found.unresolved), max(found.unresolved, key=len)


# -- param doubling: each default is the previous one twice -----------------------------------------


@pytest.mark.parametrize(
    ("levels", "cause"),
    [
        (0, None),
        (3, None),  # 537 characters: resolved as Tekton resolves it
        (4, f"becomes {doubling_image_chars(4)} characters or more, over the cap of {MAX_IMAGE_CHARS}"),  # just past
        (8, f"becomes {doubling_image_chars(8)} characters or more, over the cap of {MAX_IMAGE_CHARS}"),
        (9, f"param p9: '$(params.p8)$(params.p8)' becomes 32768 characters or more, over the cap of {MAX_VALUE_CHARS}"),
        (16, f"param p9: '$(params.p8)$(params.p8)' becomes 32768 characters or more, over the cap of {MAX_VALUE_CHARS}"),
        (200, f"param p9: '$(params.p8)$(params.p8)' becomes 32768 characters or more, over the cap of {MAX_VALUE_CHARS}"),
    ],
)
def test_param_doubling_resolves_below_the_caps_and_is_unresolved_past_them(levels: int, cause: str | None) -> None:
    found = taskrun_images(doubling_taskrun("d", levels), TektonObjects())
    if cause is None:
        assert found == ImageSet(images=(MATCHING_PREFIX + "a" * (64 * 2**levels),))
    else:
        assert found.images == ()
        assert len(found.unresolved) == 1 and found.unresolved[0].startswith("step upload: ")
        assert cause in found.unresolved[0]


def test_an_image_of_exactly_the_cap_is_resolved() -> None:
    image = "r/" + "x" * (MAX_IMAGE_CHARS - 2)
    spec = {"params": [{"name": "img", "value": image}], "taskSpec": {"steps": steps("$(params.img)")}}
    assert taskrun_images(taskrun(spec), TektonObjects()) == ImageSet(images=(image,))
    spec = {"params": [{"name": "img", "value": image + "y"}], "taskSpec": {"steps": steps("$(params.img)")}}
    assert taskrun_images(taskrun(spec), TektonObjects()).unresolved == (
        f"step s0: '$(params.img)' becomes {MAX_IMAGE_CHARS + 1} characters or more, over the cap of {MAX_IMAGE_CHARS}",
    )


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("r/" + "x" * (MAX_IMAGE_CHARS - 2), ImageSet(images=("r/" + "x" * (MAX_IMAGE_CHARS - 2),))),
        ("r/" + "x" * MAX_IMAGE_CHARS, ImageSet(unresolved=(
            f"step s0: the image is {MAX_IMAGE_CHARS + 2} characters long, over the {MAX_IMAGE_CHARS} cap",))),
    ],
)
def test_a_literal_image_longer_than_the_cap_is_unresolved(image: str, expected: ImageSet) -> None:
    assert taskrun_images(taskrun({"taskSpec": {"steps": steps(image)}}), TektonObjects()) == expected


def test_pod_images_have_the_same_length_cap() -> None:
    long = "r/" + "x" * MAX_IMAGE_CHARS
    pod = {"spec": {"containers": [{"name": "step-a", "image": long}, {"name": "step-b", "image": "alpine:3"}]}}
    assert pod_images(pod) == ImageSet(
        images=("alpine:3",),
        unresolved=(f"container step-a: the image is {len(long)} characters long, over the {MAX_IMAGE_CHARS} cap",),
    )


# -- matrix -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "values", "images", "cause"),
    [
        (2, 32, 1024, None),  # exactly MAX_MATRIX_COMBINATIONS: every instance's image
        (2, 33, 0, f"the matrix has more than {MAX_MATRIX_COMBINATIONS} combinations, the cap"),
        (4, 64, 0, f"the matrix has more than {MAX_MATRIX_COMBINATIONS} combinations, the cap"),
        (40, 2, 0, f"the matrix has more than {MAX_MATRIX_COMBINATIONS} combinations, the cap"),
    ],
)
def test_matrix_combinations_are_capped(params: int, values: int, images: int, cause: str | None) -> None:
    assert MAX_MATRIX_COMBINATIONS == 1024 and MAX_IMAGES >= 1024
    [(task, found)] = pipelinerun_images(matrix_bomb_pipelinerun("m", params, values), TektonObjects())
    assert task == "bomb" and len(found.images) == images
    assert found.unresolved == (() if cause is None else (cause,))


def test_fan_outs_multiplied_in_one_string_are_capped_before_they_are_built() -> None:
    scope = {"a": Fanout(tuple(f"a{i}" for i in range(64))), "b": Fanout(tuple(f"b{i}" for i in range(64)))}
    assert len(substitute("$(params.a)-$(params.b)", {"a": scope["a"], "b": Fanout(("x",) * 1)})) == 64
    assert substitute("$(params.a)-$(params.b)", scope) == Unknown(
        f"'$(params.a)-$(params.b)' takes more than {MAX_MATRIX_COMBINATIONS} values across matrix instances, the cap"
    )


def test_matrix_include_values_count_towards_the_combinations_of_a_string() -> None:
    include = [{"params": [{"name": "tag", "value": f"t{i}"}]} for i in range(40)]
    spec = {"pipelineSpec": {"tasks": [{
        "name": "t",
        "matrix": {"params": [{"name": "os", "value": [f"os{i}" for i in range(40)]}], "include": include},
        "taskSpec": {"params": [{"name": "os"}, {"name": "tag", "default": "latest"}],
                     "steps": steps("r/$(params.os):$(params.tag)")},
    }]}}
    [(_, found)] = pipelinerun_images(pipelinerun(spec), TektonObjects())
    assert found.images == () and found.unresolved[0].endswith(
        f"takes more than {MAX_MATRIX_COMBINATIONS} values across matrix instances, the cap")


# -- images per run, pipeline tasks -------------------------------------------------------------------


def test_distinct_images_per_run_are_capped() -> None:
    found = taskrun_images(taskrun({"taskSpec": {"steps": steps(*(f"r/i:{i}" for i in range(MAX_IMAGES + 5)))}}), TektonObjects())
    assert len(found.images) == MAX_IMAGES
    assert found.unresolved == (f"more than {MAX_IMAGES} distinct images, the cap",)
    same = taskrun_images(taskrun({"taskSpec": {"steps": steps(*["r/i:1"] * (MAX_IMAGES + 5))}}), TektonObjects())
    assert same == ImageSet(images=("r/i:1",))


@pytest.mark.parametrize(("tasks", "finally_tasks"), [(MAX_PIPELINE_TASKS + 1, 0), (MAX_PIPELINE_TASKS, 1)])
def test_pipelines_with_more_tasks_than_the_cap_are_unresolved_as_a_whole(tasks: int, finally_tasks: int) -> None:
    def named(prefix: str, n: int) -> list[dict[str, Any]]:
        return [{"name": f"{prefix}{i}", "taskSpec": {"steps": steps("r/i:1")}} for i in range(n)]

    spec = {"pipelineSpec": {"tasks": named("t", tasks), "finally": named("f", finally_tasks)}}
    cause = f"the Pipeline has more than {MAX_PIPELINE_TASKS} tasks, the cap: each TaskRun is placed when created"
    assert pipelinerun_images(pipelinerun(spec), TektonObjects()) == [(WHOLE_RUN, ImageSet(unresolved=(cause,)))]
    objects = TektonObjects()
    objects.put({"kind": "Pipeline", "metadata": {"name": "big", "namespace": "ci"}, "spec": spec["pipelineSpec"]})
    assert pipelinerun_images(pipelinerun({"pipelineRef": {"name": "big"}}), objects) == [(WHOLE_RUN, ImageSet(unresolved=(cause,)))]
    spec = {"pipelineSpec": {"tasks": named("t", MAX_PIPELINE_TASKS)}}
    assert len(pipelinerun_images(pipelinerun(spec), TektonObjects())) == MAX_PIPELINE_TASKS


# -- the work budget ---------------------------------------------------------------------------------


def test_a_long_chain_of_defaults_resolves_in_dependency_order_until_the_budget_is_spent() -> None:
    assert taskrun_images(chain_taskrun("c", 100), TektonObjects()) == ImageSet(images=(MATCHING_PREFIX + "x",))
    assert taskrun_images(chain_taskrun("c", 50_000), TektonObjects()) == ImageSet(unresolved=(Budget.EXHAUSTED_CAUSE,))


def test_once_the_budget_is_spent_every_further_step_and_task_is_unresolved_at_once() -> None:
    many = steps(*["r/i:$(params.a)"] * 20_000)
    found = taskrun_images(taskrun({"params": [{"name": "a", "value": "1"}], "taskSpec": {"steps": many}}), TektonObjects())
    assert found.images == ("r/i:1",)
    assert found.unresolved[-1] == Budget.EXHAUSTED_CAUSE and all(Budget.EXHAUSTED_CAUSE in c for c in found.unresolved)
    # a Pipeline shares one budget among its tasks: a heavy first task leaves the others unresolved
    heavy = {"name": "heavy", "taskSpec": {"steps": many}}
    light = {"name": "light", "taskSpec": {"steps": steps("r/light:1")}}
    spec = {"params": [{"name": "a", "value": "1"}], "pipelineSpec": {"tasks": [heavy, light]}}
    assert pipelinerun_images(pipelinerun(spec), TektonObjects())[1] == ("light", ImageSet(unresolved=(Budget.EXHAUSTED_CAUSE,)))


def test_a_task_used_by_many_pipeline_tasks_resolves_its_defaults_once() -> None:
    objects = TektonObjects()
    params = [{"name": f"p{i}", "default": "$(params.base)"} for i in range(200)]
    objects.put({"kind": "Task", "metadata": {"name": "t", "namespace": "ci"},
                 "spec": {"params": [{"name": "base", "default": "r/base:1"}, *params], "steps": steps("$(params.p0)")}})
    spec = {"pipelineSpec": {"tasks": [{"name": f"t{i}", "taskRef": {"name": "t"}} for i in range(MAX_PIPELINE_TASKS)]}}
    found = pipelinerun_images(pipelinerun(spec), objects)
    assert {images for _, images in found} == {ImageSet(images=("r/base:1",))}


def test_the_budget_counts_every_character_built() -> None:
    budget = Budget(work=20_000)
    assert substitute("$(params.a)$(params.a)", {"a": "x" * 3000}, budget) == ("x" * 6000,)
    assert budget.left <= 20_000 - 6000
    assert substitute("$(params.a)$(params.a)", {"a": "x" * 3000}, budget) == budget.exhausted
    assert budget.spent
    # the literal after the last variable, once per matrix value
    budget = Budget(work=100_000)
    found = substitute("$(params.a)" + "t" * 1000, {"a": Fanout(tuple(f"v{i}" for i in range(60)))}, budget)
    assert isinstance(found, tuple) and len(found) == 60
    assert budget.left <= 100_000 - 60 * 1000


def test_defaults_that_refer_to_each_other_stay_unresolved() -> None:
    spec = {"taskSpec": {"params": [{"name": "a", "default": "$(params.b)"}, {"name": "b", "default": "$(params.a)"},
                                    {"name": "c", "default": "$(params.a)x"}, {"name": "d", "default": "r/d:1"}],
                         "steps": steps("$(params.c)", "$(params.d)")}}
    assert taskrun_images(taskrun(spec), TektonObjects()) == ImageSet(
        images=("r/d:1",), unresolved=("step s0: param c: its default refers to itself through other params",))


def test_causes_quote_a_tenants_long_text_clipped() -> None:
    name = "n" * 100_000
    spec = {"taskSpec": {"steps": [{"name": name, "image": f"$(params.{name})"}, {"name": "x", "image": "$(" + "y" * 100_000 + ")"}]}}
    found = taskrun_images(taskrun(spec), TektonObjects())
    assert len(found.unresolved) == 2
    within_caps(found)


# -- properties --------------------------------------------------------------------------------------

NAMES = [f"p{i}" for i in range(6)]
chunk = st.one_of(
    st.text(alphabet="ab/:.-", max_size=8),
    st.integers(1, 3000).map(lambda n: "c" * n),  # long literals
    st.sampled_from(NAMES).map(lambda n: f"$(params.{n})"),
    st.sampled_from(NAMES).map(lambda n: f"$(params.{n})$(params.{n})$(params.{n})"),  # growth by repetition
    st.sampled_from(["$(params.p0[0])", "$(params.p1.k)", "$(context.taskRun.name)", "$(params.missing)", "$("]),
)
text = st.lists(chunk, max_size=5).map("".join)
value = st.one_of(text, st.lists(text, max_size=4), st.dictionaries(st.just("k"), text, max_size=1))
matrix_values = st.lists(st.text(alphabet="xyz", min_size=1, max_size=3), min_size=0, max_size=40)


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    specs = [{"name": n, **({"default": draw(value)} if draw(st.booleans()) else {})} for n in draw(st.permutations(NAMES))]
    task_spec = {"params": specs, "steps": [{"name": f"s{i}", "image": draw(text)} for i in range(draw(st.integers(1, 3)))]}
    run_params = [{"name": n, "value": draw(value)} for n in draw(st.lists(st.sampled_from(NAMES), max_size=3))]
    if draw(st.booleans()):
        return taskrun({"params": run_params, "taskSpec": task_spec})
    matrix = [{"name": n, "value": draw(matrix_values)} for n in draw(st.lists(st.sampled_from(NAMES), max_size=4, unique=True))]
    include = [{"params": [{"name": draw(st.sampled_from(NAMES)), "value": draw(text)}]} for _ in range(draw(st.integers(0, 3)))]
    task = {"name": "t", "taskSpec": task_spec, "params": [{"name": n, "value": draw(value)} for n in draw(st.lists(st.sampled_from(NAMES), max_size=2))],
            "matrix": {"params": matrix, "include": include}}
    return pipelinerun({"params": run_params, "pipelineSpec": {"params": [{"name": n} for n in NAMES[:2]], "tasks": [task] * draw(st.integers(1, 3))}})


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(runs())
def test_any_params_and_matrix_give_images_within_the_caps_and_never_raise(run: dict[str, Any]) -> None:
    if run["kind"] == "TaskRun":
        within_caps(taskrun_images(run, TektonObjects()))
    else:
        for _, found in pipelinerun_images(run, TektonObjects()):
            within_caps(found)


@settings(deadline=None, max_examples=300)
@given(text, st.dictionaries(st.sampled_from(NAMES), st.one_of(text, matrix_values.map(lambda v: Fanout(tuple(v))))),
       st.integers(0, 20_000), st.integers(1, MAX_VALUE_CHARS))
def test_substitution_spends_the_budget_before_building(template: str, scope: dict[str, Any], work: int, max_chars: int) -> None:
    budget = Budget(work=work)
    found = substitute(template, scope, budget, max_chars)
    if isinstance(found, Unknown):
        assert len(found.cause) <= MAX_CAUSE_CHARS
        return
    assert not budget.spent
    assert len(found) <= MAX_MATRIX_COMBINATIONS
    if "$(" not in template:
        assert found == (template,)  # nothing to build: a literal is what it is (an image's own cap applies later)
        return
    assert all(len(v) <= max_chars for v in found)
    assert sum(map(len, found)) <= work - budget.left  # every character it built was paid for first


def test_the_budget_defaults_to_the_documented_cap() -> None:
    assert Budget().left == MAX_SUBSTITUTION_WORK
