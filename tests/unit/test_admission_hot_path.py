"""The admission handler's hot path does no work it does not need: each decision's debug line is built
only when the log level lets it out (no per-review `logger.bind` otherwise), and the pure steps it
repeats for every review (image discovery, `decide`, the placed template) are memoised, keyed on
everything they read, in bounded memos (controller/admission/memo.py): a changed input gives a new answer."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from loguru import logger

import controller.admission.handlers as handlers_module
from controller.core.policy import load_policy
from controller.admission.memo import MAX_KEY_BYTES, Memo, json_key
from controller.admission.review import ops_at
from tests.unit.test_admission_handlers import DATA, Env, decision_of, preferred_node, taskrun, tekton_pod


@pytest.mark.parametrize(("level", "lines"), [("INFO", 0), ("DEBUG", 2)])
def test_a_decisions_debug_line_only_at_debug_level(level: str, lines: int, monkeypatch: pytest.MonkeyPatch) -> None:
    env = Env(log_level=level)
    bound: list[dict[str, Any]] = []
    real_bind = logger.bind

    def bind(**extra: Any) -> Any:
        bound.append(extra)
        return real_bind(**extra)

    monkeypatch.setattr(handlers_module.logger, "bind", bind)
    seen: list[str] = []
    sink = logger.add(lambda message: seen.append(message.record["message"]), level="DEBUG")
    try:
        env.review(taskrun())
        env.review(tekton_pod())
    finally:
        logger.remove(sink)
    assert len(bound) == lines and len([m for m in seen if m.startswith("image-match")]) == lines


# --- the memos -------------------------------------------------------------------------------------

KANIKO_LIKE = "gcr.io/kaniko-project/fetch:v1"  # the egress pool's image glob


def curl_run(image: str | None = None, name: str = "fetch-1", namespace: str = "team-ci", **kw: Any) -> dict:
    params = [{"name": "url", "value": "https://example.com"}] + ([{"name": "curl-image", "value": image}] if image else [])
    return taskrun("curl", namespace, name, params=params, **kw)


def placed(env: Env, obj: dict) -> tuple[str | None, str | None]:
    _, admitted, _ = env.review(copy.deepcopy(obj))
    record = decision_of(admitted)
    return record["pool"], record["node"]


def test_the_same_run_is_answered_alike_from_the_memos() -> None:
    env = Env()
    first = placed(env, curl_run(KANIKO_LIKE))
    assert first[0] == "egress"
    assert len(env.admission._images) == len(env.admission._decisions) == 1
    assert placed(env, curl_run(KANIKO_LIKE, name="fetch-2"))[0] == "egress"
    assert len(env.admission._images) == len(env.admission._decisions) == 1


def test_a_changed_param_is_a_new_answer() -> None:
    env = Env()
    assert placed(env, curl_run(KANIKO_LIKE))[0] == "egress"
    assert placed(env, curl_run("docker.io/curlimages/curl:8"))[0] is None
    assert placed(env, curl_run(KANIKO_LIKE, name="fetch-3"))[0] == "egress"


def test_a_changed_task_is_a_new_answer() -> None:
    """Image discovery is keyed by a generation of Tekton's objects: a Task changed since is read again."""
    env = Env()
    assert placed(env, curl_run())[0] is None  # curl's default image is no pool's
    env._tekton({"apiVersion": "tekton.dev/v1", "kind": "Task", "metadata": {"name": "curl"},
                 "spec": {"steps": [{"name": "fetch", "image": KANIKO_LIKE}]}}, "team-ci")
    assert placed(env, curl_run(name="fetch-2"))[0] == "egress"
    env.state.apply("Task", "DELETED", {"metadata": {"name": "curl", "namespace": "team-ci"}})
    answer, admitted, _ = env.review(curl_run(name="fetch-3"))
    assert decision_of(admitted)["reason"] == "unresolved"


def test_a_changed_cluster_resolver_config_is_a_new_answer() -> None:
    env = Env()
    tekton = env.state.tekton
    before = tekton.generation
    tekton.cluster_resolver = tekton.cluster_resolver.with_settings({"default-namespace": "team-ci"})
    assert tekton.generation is not before


def test_a_changed_namespace_is_a_new_answer() -> None:
    """`decide` is keyed by the state's namespace object: a namespace given the pool by annotation since
    is decided again."""
    env = Env()
    run = curl_run(KANIKO_LIKE, namespace="team-other")
    assert placed(env, run)[0] is None
    env.state.apply("Namespace", "MODIFIED", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "team-other", "annotations": {"egress-placer.io/pools": "egress"}}})
    assert placed(env, curl_run(KANIKO_LIKE, name="fetch-2", namespace="team-other"))[0] == "egress"


def test_a_changed_placement_annotation_is_a_new_answer() -> None:
    env = Env()
    assert placed(env, curl_run(KANIKO_LIKE))[0] == "egress"
    assert placed(env, curl_run(KANIKO_LIKE, name="fetch-2", annotations={"egress-placer.io/placement": "none"}))[0] is None
    assert placed(env, curl_run(KANIKO_LIKE, name="fetch-3", annotations={"egress-placer.io/placement": "lab"}))[0] == "lab"


def test_a_changed_policy_is_a_new_answer() -> None:
    env = Env()
    assert placed(env, curl_run(KANIKO_LIKE))[0] == "egress"
    text = (DATA / "policy.yaml").read_text().replace('images: ["gcr.io/kaniko-project/*"]', 'images: ["nothing/*"]')
    env.state.set_policy(load_policy(text, "policy.yaml"))
    assert placed(env, curl_run(KANIKO_LIKE, name="fetch-2"))[0] is None


def test_a_changed_default_pod_template_is_a_new_template() -> None:
    """The placed template is keyed by the template, pool and node, under Tekton's default pod template
    (dry runs: nothing assumed, the same node chosen)."""
    env = Env()
    _, first, _ = env.review(curl_run(KANIKO_LIKE), dry_run=True)
    gpu = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    env.state.tekton.set_default_pod_template({"tolerations": [gpu]})
    _, second, _ = env.review(curl_run(KANIKO_LIKE), dry_run=True)
    assert preferred_node(first["spec"]["podTemplate"]) == preferred_node(second["spec"]["podTemplate"])
    assert gpu not in first["spec"]["podTemplate"]["tolerations"]
    assert gpu in second["spec"]["podTemplate"]["tolerations"]


def test_a_shared_template_goes_into_a_patch_as_is_and_no_review_changes_it() -> None:
    """A patch's values are the shared template's own members (no copy: #24), so nothing a review does
    may change them before the patch is serialized: after placing runs and their pods on that template, it
    is as it was, and a patch made of it is the patch a copy of it makes."""
    env = Env()
    policy = env.state.policy
    template = env.admission._template(None, policy, None, policy.pool("egress"), "egress-1")
    assert env.admission._template(None, policy, None, policy.pool("egress"), "egress-1") is template  # shared
    before = copy.deepcopy(template)
    for obj in ({"spec": {}}, {"spec": {"podTemplate": {}}}, {"spec": {"podTemplate": {"tolerations": []}}}):
        assert ops_at(obj, ("spec", "podTemplate"), template) == ops_at(obj, ("spec", "podTemplate"), before)
    placed = []
    for i in range(3):
        _, run, _ = env.review(curl_run(KANIKO_LIKE, name=f"fetch-{i}"), dry_run=True)
        _, pod, _ = env.review(tekton_pod(KANIKO_LIKE, name=f"fetch-{i}-pod"), dry_run=True)
        placed.append(preferred_node(run["spec"]["podTemplate"]))
    assert "egress-1" in placed  # one of them was answered with `template` (a dry run's node goes by its name)
    assert env.admission._template(None, policy, None, policy.pool("egress"), "egress-1") is template
    assert template == before


def test_a_memo_is_bounded_and_starts_again_under_another_scope() -> None:
    memo: Memo[int] = Memo(3)
    calls: list[int] = []

    def step(n: int) -> Any:
        return lambda: calls.append(n) or n * 10

    policy, other = object(), object()
    assert [memo.get(n, step(n), (policy,)) for n in (1, 2, 1, 3, 4, 1)] == [10, 20, 10, 30, 40, 10]
    assert calls == [1, 2, 3, 4, 1] and len(memo) == 3  # 1 was the oldest when 4 came
    assert memo.get(4, step(4), (other,)) == 40 and calls[-1] == 4 and len(memo) == 1  # another scope: empty
    assert memo.get(None, step(5), (other,)) == 50 and memo.get(None, step(5), (other,)) == 50 and calls[-2:] == [5, 5]


def test_an_answer_computed_while_the_scope_changed_is_not_kept() -> None:
    memo: Memo[str] = Memo(8)
    old, new = object(), object()
    assert memo.get("k", lambda: memo.get("j", lambda: "new", (new,)) and "old", (old,)) == "old"
    assert memo.get("k", lambda: "again", (new,)) == "again"


@pytest.mark.parametrize(("value", "keyed"), [
    ([1, 1.0, True, None, "x"], True), ({"a": [1]}, True), (float("nan"), False), ([None, float("inf")], False),
    ("x" * (MAX_KEY_BYTES + 1), False), (2**70, False), ({1: "a"}, False),
])
def test_json_keys_are_exact_json(value: Any, keyed: bool) -> None:
    key = json_key(value)
    assert (key is not None) == keyed
    assert json_key(1) != json_key(1.0) != json_key(True)


def test_a_tenants_same_named_task_does_not_answer_for_another_namespace() -> None:
    """Image discovery is keyed by the run's namespace: team-other's own `curl` Task (a pool image) is
    memoised for team-other's runs only; team-ci's run of the same spec reads team-ci's Task."""
    env = Env()
    env._tekton({"apiVersion": "tekton.dev/v1", "kind": "Task", "metadata": {"name": "curl"},
                 "spec": {"steps": [{"name": "fetch", "image": KANIKO_LIKE}]}}, "team-other")
    _, theirs, _ = env.review(curl_run(namespace="team-other"))
    assert decision_of(theirs)["images"] == [KANIKO_LIKE]
    _, ours, _ = env.review(curl_run(namespace="team-ci"))
    assert KANIKO_LIKE not in decision_of(ours)["images"] and decision_of(ours)["pool"] is None


SPEC_TOLERATION = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
SPEC_AFFINITY = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]},
    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}


@pytest.mark.parametrize(
    "template",
    [
        pytest.param({}, id="empty"),
        pytest.param({"containers": [{"name": "step", "args": ["run-1"]}], "volumes": [{"name": "v"}]}, id="no-placement-fields"),
        pytest.param({"containers": [{"name": "s"}], "tolerations": [SPEC_TOLERATION], "restartPolicy": "Never"}, id="a-toleration-between"),
        pytest.param({"affinity": SPEC_AFFINITY, "containers": [{"name": "s"}], "nodeSelector": {"disk": "ssd"}}, id="affinity-and-selector"),
        pytest.param({"tolerations": None, "affinity": None, "containers": []}, id="null-fields"),
        pytest.param({"nodeSelector": {"egress-placer.io/pool": "other"}, "containers": []}, id="another-pools-selector"),
    ],
)
@pytest.mark.parametrize("default", [None, {"tolerations": [SPEC_TOLERATION]}, {"nodeSelector": {"disk": "hdd"}}], ids=["no-default", "default-toleration", "default-selector"])
@pytest.mark.parametrize("placed", [True, False], ids=["placed", "unplaced"])
def test_a_template_placed_from_its_placement_fields_is_the_whole_template_placed(template: dict, default: dict | None, placed: bool) -> None:
    """#24: the memo is keyed on the fields placement reads (a pod's spec is each run's own): placing those
    alone and putting them back gives the very template, in the same order, that placing the whole does."""
    from controller.core.patches import over_default, place, placement_fields, unplace, with_placement

    policy = Env().state.policy
    pool = policy.pool("egress")
    assert pool is not None

    def change(t: dict) -> dict:
        return place(unplace(t, policy, keep_pool=pool.name), pool, "egress-1") if placed else unplace(t, policy)

    whole = over_default(copy.deepcopy(template), default, change)
    parts = with_placement(template, over_default(placement_fields(template), default, change))
    assert parts == whole and list(parts) == list(whole)


def _preferred_on(node: str, *others: dict) -> dict:
    """A pod's affinity as Tekton copies it from its TaskRun: the user's preferences and the preferred-node
    term admission wrote for `node`."""
    from controller.core.patches import node_preference

    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [*others, node_preference(node)]}}


ZONE_PREFERENCE = {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
NOT_OURS = {"weight": 100, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}}


@pytest.mark.parametrize(
    ("first", "second", "same_key"),
    [
        pytest.param({"affinity": _preferred_on("egress-1")}, {"affinity": _preferred_on("egress-2")}, True, id="only-our-term"),
        pytest.param({"affinity": _preferred_on("egress-1", ZONE_PREFERENCE), "tolerations": [SPEC_TOLERATION]},
                     {"affinity": _preferred_on("egress-3", ZONE_PREFERENCE), "tolerations": [SPEC_TOLERATION]}, True, id="beside-the-users"),
        pytest.param({"affinity": _preferred_on("egress-1")}, {"affinity": _preferred_on("egress-1", ZONE_PREFERENCE)}, False, id="the-users-differ"),
        pytest.param({"affinity": _preferred_on("egress-1", NOT_OURS)}, {"affinity": _preferred_on("egress-2", {**NOT_OURS, "weight": 99})}, False,
                     id="a-look-alike-is-the-users"),
        pytest.param({"affinity": _preferred_on("egress-1")}, {"affinity": {"nodeAffinity": {}}}, False, id="term-or-none"),
    ],
)
@pytest.mark.parametrize("default", [None, {"affinity": SPEC_AFFINITY}], ids=["no-default", "default-affinity"])
@pytest.mark.parametrize("placed", [True, False], ids=["placed", "unplaced"])
def test_the_memo_key_leaves_out_the_node_the_taskrun_was_preferred_on(first: dict, second: dict, same_key: bool, default: dict | None, placed: bool) -> None:
    """#24: a Tekton pod carries its TaskRun's preferred-node term, one node of the pool per run, so a key with
    that node in it seldom repeats. `placement_key` leaves the node out; what placement gives from the key is
    what it gives from the whole template (place and unplace drop the term by its shape, whatever node)."""
    from controller.core.patches import over_default, place, placement_key, unplace, with_placement

    policy = Env().state.policy
    pool = policy.pool("egress")
    assert pool is not None

    def change(t: dict) -> dict:
        return place(unplace(t, policy, keep_pool=pool.name), pool, "egress-2") if placed else unplace(t, policy)

    for template in (first, second):
        template = {"containers": [{"name": "step"}], **template}
        whole = over_default(copy.deepcopy(template), default, change)
        parts = with_placement(template, over_default(placement_key(template), default, change))
        assert parts == whole  # members' order aside: a field unplace empties comes back last (no meaning in JSON)
    assert (json_key(placement_key(first)) == json_key(placement_key(second))) is same_key


def test_pods_of_different_runs_share_one_placed_template(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two Tekton pods whose specs differ only outside the placement fields (each run's own args and
    volumes) are placed by one computation: the memo's key is what placement reads (#24)."""
    calls: list[Any] = []
    real = handlers_module.over_default
    monkeypatch.setattr(handlers_module, "over_default", lambda *a: calls.append(a) or real(*a))
    env = Env()
    policy = env.state.policy
    pool = policy.pool("egress")
    # Each its run's own volumes, and the node its TaskRun was preferred on (Tekton copies the term).
    specs = [{**tekton_pod()["spec"], "volumes": [{"name": f"run-{i}", "emptyDir": {}}], "affinity": _preferred_on(f"egress-{i + 1}")}
             for i in range(2)]
    placed = [env.admission._template(spec, policy, None, pool, "egress-1") for spec in specs]
    assert len(calls) == 1
    assert [p["volumes"] for p in placed] == [s["volumes"] for s in specs]  # each keeps its own spec
    assert placed[0]["affinity"] == placed[1]["affinity"] and placed[0]["tolerations"] == placed[1]["tolerations"]
