"""Admission's whole-member JSON patches (core.patches.json_patch) make the same objects as the minimal
diffs it answered with before (`jsonpatch.make_patch` of the re-rendered template): the same reviews
answered by two Admissions over identical states, one of them building its patches the old way, give
patched objects that are exactly the same JSON (1, 1.0 and true told apart), on the admission
benchmark's whole request mix (1,024 reviews: TaskRuns and their pods, half placed) and on
generated TaskRuns and pods carrying any mix of pool and user tolerations, node selectors, node
affinity and nodeName."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import controller.admission.handlers as handlers_module
import controller.admission.review as review_module
from controller.admission.handlers import Admission
from controller.core.json_wire import decode
from controller.core.patches import PREFERRED, REQUIRED
from controller.metrics import Metrics
from controller.settings import Settings
from controller.state import ClusterState

from bench.admission import POOL_NODES
from bench.servers import ORDINARY_NODES
from bench.workload import NoEvents, admission_policy, fill, inventory, request_mix
from tests.unit.test_admission_handlers import EGRESS_TOLERATION, LAB_TOLERATION, POOL_EXISTS, Env, plain_pod, taskrun, tekton_pod


def diff_patch(old: Any, new: Any, base: str) -> list[dict[str, Any]]:
    """The patch as admission built it before whole-member operations: jsonpatch's diff, at `base`."""
    if old is None:
        return [{"op": "add", "path": base, "value": copy.deepcopy(new)}]
    ops = jsonpatch.make_patch(old, new).patch
    return [{**op, **{k: base + op[k] for k in ("path", "from") if k in op}} for op in ops]


def diffing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers_module, "json_patch", diff_patch)
    monkeypatch.setattr(review_module, "json_patch", diff_patch)


def patched(body: dict, answer: dict) -> str:
    """The admitted object with the answer's patch applied, as exact JSON text."""
    obj = body["request"]["object"]
    raw = answer["response"].get("patch")
    out = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(raw))) if raw else obj
    return json.dumps(out, sort_keys=True)


def bench_admission() -> Admission:
    state = ClusterState(admission_policy(), clock=lambda: 1000.0)
    fill(state.apply, inventory(POOL_NODES, ORDINARY_NODES, 5))
    return Admission(state, Metrics(), NoEvents(), Settings(), clock=lambda: 0.0, wall=lambda: 1000.0)


def test_the_bench_mix_is_patched_as_the_diffs_patched_it(monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = [json.loads(b) for b in request_mix(bench_admission().review, 512).bodies]
    assert len(bodies) == 1024
    ours = bench_admission()
    answers = [ours.review(copy.deepcopy(b)) for b in bodies]
    diffing(monkeypatch)
    theirs = bench_admission()
    placed = 0
    for body, answer in zip(bodies, answers):
        before = theirs.review(copy.deepcopy(body))
        assert patched(body, answer) == patched(body, before), body["request"]["uid"]
        placed += "egress-placer.io/pool" in patched(body, answer)
    assert placed > 300  # the mix places half of its reviews: the patches compared are not all alike


# --- generated runs and pods ----------------------------------------------------------------------

USER_TOLERATION = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
EVERYTHING = {"operator": "Exists"}
TOLERATIONS = st.lists(st.sampled_from([EGRESS_TOLERATION, LAB_TOLERATION, POOL_EXISTS, USER_TOLERATION, EVERYTHING]), max_size=3)
SELECTORS = st.dictionaries(st.sampled_from(["egress-placer.io/egress", "zone", "kubernetes.io/arch"]), st.sampled_from(["fast", "a"]), max_size=2)
EXPRESSIONS = st.lists(
    st.builds(lambda key, op, value: {"key": key, "operator": op, "values": [value]},
              st.sampled_from(["egress-placer.io/egress", "zone"]), st.sampled_from(["In", "NotIn"]), st.sampled_from(["fast", "a"])),
    min_size=1, max_size=2,
)
FIELDS = st.builds(lambda node: [{"key": "metadata.name", "operator": "In", "values": [node]}],
                   st.sampled_from(["lab-1", "egress-1", "plain-1"]))
TERMS = st.lists(st.fixed_dictionaries({}, optional={"matchExpressions": EXPRESSIONS, "matchFields": FIELDS}), max_size=2)
AFFINITY = st.fixed_dictionaries({}, optional={"nodeAffinity": st.fixed_dictionaries({}, optional={
    REQUIRED: st.builds(lambda terms: {"nodeSelectorTerms": terms}, TERMS),
    PREFERRED: st.lists(st.builds(lambda w, t: {"weight": w, "preference": t}, st.sampled_from([1, 50, 100]),
                                  st.fixed_dictionaries({}, optional={"matchExpressions": EXPRESSIONS, "matchFields": FIELDS})), max_size=2),
})})
TEMPLATES = st.fixed_dictionaries({}, optional={"tolerations": TOLERATIONS, "nodeSelector": SELECTORS, "affinity": AFFINITY,
                                                "serviceAccountName": st.just("builder")})
IMAGES = st.sampled_from(["gcr.io/kaniko-project/executor:v1.5.1", "docker.io/library/golang:1.22", "nginx:1.27"])
NAMESPACES = st.sampled_from(["team-ci", "team-other", "team-web"])


@st.composite
def objects(draw: st.DrawFn) -> dict:
    kind = draw(st.sampled_from(["taskrun", "tekton-pod", "plain-pod"]))
    template = draw(TEMPLATES)
    namespace = draw(NAMESPACES)
    if kind == "taskrun":
        task = draw(st.sampled_from(["kaniko", "git-clone", "golang-build", "curl"]))
        return taskrun(task, namespace, pod_template=template if draw(st.booleans()) else None)
    if kind == "tekton-pod":
        extra = {k: v for k, v in template.items() if k != "serviceAccountName"}
        return tekton_pod(draw(IMAGES), namespace, spec_extra=extra)
    return plain_pod(namespace, tolerations=template.get("tolerations"), affinity=template.get("affinity"),
                     node_name=draw(st.sampled_from([None, "lab-1", "egress-2", "plain-1"])))


# Both see the same reviews in the same order, so their states (assumed placements) stay the same.
OURS, THEIRS = Env(), Env()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(obj=objects())
def test_generated_runs_and_pods_are_patched_as_the_diffs_patched_them(obj: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    _, mine, _ = OURS.review(copy.deepcopy(obj))
    with monkeypatch.context() as m:
        diffing(m)
        _, before, _ = THEIRS.review(copy.deepcopy(obj))
    assert json.dumps(mine, sort_keys=True) == json.dumps(before, sort_keys=True)


# --- the decision annotation's JSON --------------------------------------------------------------


@pytest.mark.parametrize("message", ["Placed in pool 'egress'", "café ünïcode", "lone \ud800 surrogate", 'quote " and \\ and \n'])
def test_the_decision_annotation_is_compact_json_of_the_record_in_its_order(message: str) -> None:
    """orjson writes it (UTF-8 where the standard library wrote \\u escapes); what orjson refuses (a lone
    surrogate a tenant's image name may carry) is written by the standard library: the same JSON either way."""
    record = {"pool": "egress", "reason": "image-match", "node": None, "images": ["a", message], "message": message, "moreNodes": 3}
    text = handlers_module._compact(record)
    assert json.loads(text) == record and list(json.loads(text)) == list(record)
    assert text == json.dumps(record, separators=(",", ":"), ensure_ascii=False) or "\ud800" in message


# --- the wire's JSON (admission bodies, the API server's answers, watch lines) ------------------


@pytest.mark.parametrize("text", [
    '{"type":"ADDED","object":{"metadata":{"name":"a"}}}', '{"n": NaN}', '{"max": 18446744073709551615}',
    '{"s": "lone \\ud800"}', '{"u": "caf\\u00e9"}',
])
def test_the_wire_decodes_as_the_standard_library_does(text: str) -> None:
    """orjson where it can, the standard library for what it refuses: the same values either way, from
    bytes (a body) and from text (a watch line)."""
    expected = json.loads(text)
    for raw in (text, text.encode()):
        got = decode(raw)
        assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    with pytest.raises(ValueError):
        decode(b"{not json")
    assert decode(b"[123456789012345678901234567890]") == [1.2345678901234568e29]  # beyond 64 bits: a float
