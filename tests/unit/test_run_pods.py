"""Only real Tekton pods are treated as Tekton pods (issue 23): a pod is a run's pod only when its
controller ownerReference resolves by uid to a TaskRun of its namespace carrying our decision
(`queue.core.is_run_pod`). Admission places only those on a pool (a look-alike is stripped like any
other pod), the queue counts only those in a pool's slots, and a TaskRun the cache does not have yet is
read off the event loop, bounded (`OwnerReadNeeded`), so real Tekton pods keep their placement."""

from __future__ import annotations

import base64
import copy
import json
import threading
from typing import Any

import jsonpatch
import pytest
import requests

from controller.admission import server as server_module
from controller.admission.handlers import Admission, OwnerReadNeeded, ReadOwner
from controller.core.model import DECISION_ANNOTATION, POOL_SLOT_GATE, OwnerRef
from controller.queue.core import (
    QUEUE_ANNOTATION,
    QueueEntry,
    QueueSetting,
    claimed_pipelinerun,
    claimed_taskrun,
    entry_annotation,
    held_by_queue,
    is_run_pod,
)
from tests.unit.test_admission_handlers import EGRESS_TOLERATION, Env, decision_of, tekton_pod
from tests.unit.test_admission_server import Running, review, running  # noqa: F401 - the fixture

TEKTON = OwnerRef("tekton.dev/v1", "TaskRun", "build-1", "uid-build-1", controller=True)


@pytest.mark.parametrize(
    "owners, claimed",
    [
        pytest.param((TEKTON,), TEKTON, id="tekton's-own"),
        pytest.param((OwnerRef("tekton.dev/v1beta1", "TaskRun", "build-1", "u", True),), OwnerRef("tekton.dev/v1beta1", "TaskRun", "build-1", "u", True), id="v1beta1"),
        pytest.param((OwnerRef("tekton.dev/v1", "TaskRun", "build-1", "u", False),), None, id="not-the-controller"),
        pytest.param((OwnerRef("example.com/v1", "TaskRun", "build-1", "u", True),), None, id="another-group"),
        pytest.param((OwnerRef("tekton.dev/v1", "PipelineRun", "build-1", "u", True),), None, id="another-kind"),
        pytest.param((OwnerRef("tekton.dev/v1", "TaskRun", "build-1", "", True),), None, id="no-uid"),
        pytest.param((OwnerRef("tekton.dev/v1", "TaskRun", "", "u", True),), None, id="no-name"),
        pytest.param((), None, id="none"),
    ],
)
def test_the_taskrun_a_pod_claims(owners: tuple[OwnerRef, ...], claimed: OwnerRef | None) -> None:
    assert claimed_taskrun(owners) == claimed


@pytest.mark.parametrize(
    "owner, uid, decided, pod_name, run_pod_name, expected",
    [
        pytest.param(TEKTON, "uid-build-1", True, "build-1-pod", "", True, id="resolved-and-decided-pod-not-named-yet"),
        pytest.param(TEKTON, "uid-build-1", True, "build-1-pod", "build-1-pod", True, id="the-pod-its-status-names"),
        pytest.param(TEKTON, "uid-build-1", True, "build-1-pod-retry1", "build-1-pod-retry1", True, id="a-retry's-pod"),
        pytest.param(TEKTON, "uid-build-1", True, "squat", "build-1-pod", False, id="another-pod-claiming-a-run-with-its-pod"),
        pytest.param(TEKTON, "uid-build-1", True, "", "build-1-pod", False, id="a-generated-name-claiming-a-run-with-its-pod"),
        pytest.param(TEKTON, "uid-build-1", False, "build-1-pod", "", False, id="admitted-without-our-decision"),
        pytest.param(TEKTON, "uid-other", True, "build-1-pod", "build-1-pod", False, id="a-made-up-or-copied-uid"),
        pytest.param(TEKTON, None, True, "build-1-pod", "", False, id="no-such-taskrun"),
        pytest.param(TEKTON, "", True, "build-1-pod", "", False, id="no-uid-known"),
        pytest.param(None, "uid-build-1", True, "build-1-pod", "build-1-pod", False, id="no-claim"),
    ],
)
def test_a_pod_is_a_runs_pod_only_when_its_claim_resolves(
    owner: OwnerRef | None, uid: str | None, decided: bool, pod_name: str, run_pod_name: str, expected: bool
) -> None:
    """Owner uid, our decision, and the name Tekton's controller wrote in the run's status (a subresource
    `edit` cannot write, dropped at CREATE) once it wrote one."""
    assert is_run_pod(owner, uid, decided, pod_name, run_pod_name) is expected


def test_a_pod_claiming_a_run_whose_status_names_another_pod_gets_no_pool() -> None:
    env = Env()
    env.add_taskrun("team-ci", "build-1", "uid-build-1", pod_name="build-1-pod")
    squat = tekton_pod(name="build-1-squat")
    squat["spec"]["tolerations"] = [EGRESS_TOLERATION]
    _, patched, _ = env.review(squat)
    assert not _placed(patched) and DECISION_ANNOTATION not in (patched["metadata"].get("annotations") or {})
    _, patched, _ = env.review(tekton_pod())  # the pod Tekton made again, named as before
    assert _placed(patched)


@pytest.mark.parametrize("status, placed", [({}, True), ({"podName": "build-1-pod"}, False)],
                         ids=["a-retry-the-cache-lags-behind", "another-pod-named-in-the-read-too"])
def test_a_cache_naming_another_pod_is_read_again(status: dict, placed: bool) -> None:
    """Tekton clears status.podName before a retry's pod: a cache still naming the old pod is read again
    (bounded, as for an uncached TaskRun), so a real retry's pod keeps its placement and a squat gets none."""
    env = Env()
    env.add_taskrun("team-ci", "build-1", "uid-build-1", pod_name="build-1-pod")
    reads = _reading(env, {**copy.deepcopy(TASKRUN), "status": status})
    retry = tekton_pod(name="build-1-pod-retry1")
    with pytest.raises(OwnerReadNeeded):
        env.review(retry)
    owner = env.admission.read_owner("team-ci", "build-1")
    assert reads == [("team-ci", "build-1")]
    assert _placed(_apply(copy.deepcopy(retry), env.admission.review(_review_body(retry), owner))) is placed


def _placed(patched: dict) -> bool:
    return EGRESS_TOLERATION in (patched["spec"].get("tolerations") or [])


def _without_owner(pod: dict) -> dict:
    pod["metadata"].pop("ownerReferences")
    return pod


def _owner(pod: dict, **changes: Any) -> dict:
    pod["metadata"]["ownerReferences"][0].update(changes)
    return pod


@pytest.mark.parametrize(
    "make, cache",
    [
        pytest.param(lambda: _without_owner(tekton_pod()), None, id="label-and-step-containers-only"),
        pytest.param(lambda: _owner(tekton_pod(), uid="made-up"), ("build-1", "uid-build-1", True), id="a-made-up-uid"),
        pytest.param(lambda: _owner(tekton_pod(), controller=False), ("build-1", "uid-build-1", True), id="not-the-controller"),
        pytest.param(lambda: tekton_pod(), ("build-1", "uid-build-1", False), id="a-taskrun-without-our-decision"),
        pytest.param(lambda: tekton_pod(namespace="team-other"), ("build-1", "uid-build-1", True), id="a-taskrun-of-another-namespace"),
    ],
)
def test_a_look_alike_pod_gets_no_pool(make: Any, cache: tuple[str, str, bool] | None) -> None:
    env = Env()
    if cache is not None:
        env.add_taskrun("team-ci", cache[0], cache[1], decided=cache[2])
    pod = make()
    pod["spec"]["tolerations"] = [EGRESS_TOLERATION]  # copied from a real run's pod
    _, patched, _ = env.review(pod, owner_cached=False)
    assert not _placed(patched) and DECISION_ANNOTATION not in (patched["metadata"].get("annotations") or {})
    assert env.events.sent == []


def test_a_real_tekton_pod_is_placed() -> None:
    env = Env()
    _, patched, _ = env.review(tekton_pod())
    assert _placed(patched) and decision_of(patched)["pool"] == "egress"


def _reading(env: Env, found: dict | None | Exception) -> list[tuple[str, str]]:
    reads: list[tuple[str, str]] = []

    def read(namespace: str, name: str) -> dict | None:
        reads.append((namespace, name))
        if isinstance(found, Exception):
            raise found
        return found

    env.admission = Admission(env.state, env.metrics, env.events, env.admission.settings, read_taskrun=read)
    return reads


TASKRUN = {"apiVersion": "tekton.dev/v1", "kind": "TaskRun",
           "metadata": {"namespace": "team-ci", "name": "build-1", "uid": "uid-build-1", "annotations": {DECISION_ANNOTATION: "{}"}}}


def test_a_taskrun_not_in_the_cache_yet_is_read_before_any_side_effect() -> None:
    env = Env()
    reads = _reading(env, copy.deepcopy(TASKRUN))
    with pytest.raises(OwnerReadNeeded) as needed:
        env.review(tekton_pod(), owner_cached=False)
    assert (needed.value.namespace, needed.value.name) == ("team-ci", "build-1")
    assert env.events.sent == [] and len(env.state.load.ledger) == 0 and reads == []  # the server reads
    owner = env.admission.read_owner("team-ci", "build-1")
    assert reads == [("team-ci", "build-1")] and owner.record is not None
    body = _review_body(tekton_pod())
    patched = _apply(tekton_pod(), env.admission.review(body, owner))
    assert _placed(patched)


@pytest.mark.parametrize(
    "found",
    [
        pytest.param(None, id="not-found"),
        pytest.param(RuntimeError("the API server is away"), id="the-read-fails"),
        pytest.param({**TASKRUN, "metadata": {**TASKRUN["metadata"], "uid": "another"}}, id="another-uid"),
        pytest.param({**TASKRUN, "metadata": {**TASKRUN["metadata"], "annotations": {}}}, id="no-decision"),
    ],
)
def test_a_pod_whose_taskrun_read_proves_nothing_is_no_runs_pod(found: Any) -> None:
    """Fail closed: a forger gets no pool; a real pod whose read fails is placed as any other pod."""
    env = Env()
    _reading(env, found)
    owner = env.admission.read_owner("team-ci", "build-1")
    pod = tekton_pod()
    pod["spec"]["tolerations"] = [EGRESS_TOLERATION]
    patched = _apply(copy.deepcopy(pod), env.admission.review(_review_body(pod), owner))
    assert not _placed(patched)


def _review_body(obj: dict) -> dict:
    body = review(obj)
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "pods"}
    return body


def _apply(obj: dict, answer: dict) -> dict:
    response = answer["response"]
    patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return jsonpatch.apply_patch(obj, patch)


def test_pool_slots_count_only_runs_pods() -> None:
    env = Env()
    pool = env.state.policy.pool("egress")
    assert pool is not None
    node = sorted(env.state.load.pool_names("egress"))[0]
    pods = {
        "real": ("build-1", "uid-build-1"),
        "forged-uid": ("build-1", "made-up"),
        "no-owner": None,
    }
    env.add_taskrun("team-ci", "build-1", "uid-build-1", pod_name="real")
    pods["a-second-pod-with-the-uid"] = ("build-1", "uid-build-1")
    for name, owner in pods.items():
        meta: dict[str, Any] = {"namespace": "team-ci", "name": name, "labels": {"tekton.dev/taskRun": "build-1"}}
        if owner:
            meta["ownerReferences"] = [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": owner[0], "uid": owner[1], "controller": True}]
        env.state.apply("Pod", "ADDED", {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": "Running"}})
    assert env.state.queue.is_run_pod("team-ci", (TEKTON,), "real")
    assert not env.state.queue.is_run_pod("team-ci", (TEKTON,), "a-second-pod-with-the-uid")
    queued = pool.model_copy(update={"queue": QueueSetting(runs_per_node=1)})
    picture = env.state.queue.pool_queue(queued)
    assert picture is not None and dict(picture.pods_by_namespace) == {"team-ci": 1}


def test_the_server_reads_an_uncached_taskrun_off_the_event_loop(running: Running, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The read runs in a thread; past OWNER_READ_SECONDS the pod is answered as no run's pod, and
    meanwhile /healthz is answered."""
    monkeypatch.setattr(server_module, "OWNER_READ_SECONDS", 0.5)
    release = threading.Event()
    answers = {"fast": {**TASKRUN, "metadata": {**TASKRUN["metadata"], "name": "fast", "uid": "uid-fast"}}}

    def read(namespace: str, name: str) -> dict | None:
        if name == "slow":
            release.wait(10)
        return answers.get(name)

    running.server.admission = Admission(running.state, running.metrics, running.events, running.settings, read_taskrun=read)

    def reads(outcome: str) -> float:
        return running.metrics.registry.get_sample_value("egress_placer_admission_owner_reads_total", {"outcome": outcome}) or 0.0

    try:
        for name, placed, outcome in (("fast", True, "found"), ("gone", False, "absent"), ("slow", False, "timeout")):
            before = reads(outcome)
            pod = tekton_pod(taskrun_name=name, annotations={})
            answer = requests.post(running.webhook + "/mutate", json=review(pod), verify=running.ca_file, timeout=10)
            assert answer.status_code == 200
            assert _placed(_apply(copy.deepcopy(pod), answer.json())) is placed, name
            assert reads(outcome) == before + 1, name  # egress_placer_admission_owner_reads_total{outcome}
            assert requests.get(running.health + "/healthz", timeout=5).status_code == 200
    finally:
        release.set()


@pytest.mark.parametrize(
    ("owner_uid", "has_pod"),
    [
        pytest.param("uid-build-1", True, id="the-run's-own-pod"),
        pytest.param("made-up", False, id="a-made-up-uid"),
        pytest.param(None, False, id="only-the-label"),
    ],
)
def test_a_released_run_has_a_pod_only_by_its_owner_uid(owner_uid: str | None, has_pod: bool) -> None:
    """A pod labelled with a released run's name, on any node, does not free the run's slot."""
    env = Env()
    run = {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "metadata": {
        "namespace": "team-ci", "name": "build-1", "uid": "uid-build-1",
        "annotations": {QUEUE_ANNOTATION: entry_annotation("egress", "TaskRun", 1.0), DECISION_ANNOTATION: '{"pool":"egress"}'}}}
    env.state.apply("TaskRun", "ADDED", run)
    meta: dict[str, Any] = {"namespace": "team-ci", "name": "p", "labels": {"tekton.dev/taskRun": "build-1"}}
    if owner_uid:
        meta["ownerReferences"] = [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": "build-1", "uid": owner_uid, "controller": True}]
    env.state.apply("Pod", "ADDED", {"metadata": meta, "spec": {"nodeName": "node-1"}, "status": {"phase": "Running"}})
    [entry] = env.state.queue.queue_entries()
    assert entry.has_pod is has_pod


# -- a PipelineRun's pods: by the TaskRun's controller owner, uid to uid, never by the pod's labels ------

PIPELINE = OwnerRef("tekton.dev/v1", "PipelineRun", "ci-1", "uid-ci-1", controller=True)


@pytest.mark.parametrize(
    "owners, claimed",
    [
        pytest.param((PIPELINE,), PIPELINE, id="tekton's-own"),
        pytest.param((OwnerRef("tekton.dev/v1", "PipelineRun", "ci-1", "u", False),), None, id="not-the-controller"),
        pytest.param((OwnerRef("example.com/v1", "PipelineRun", "ci-1", "u", True),), None, id="another-group"),
        pytest.param((TEKTON,), None, id="another-kind"),
        pytest.param((OwnerRef("tekton.dev/v1", "PipelineRun", "ci-1", "", True),), None, id="no-uid"),
        pytest.param((), None, id="none"),
    ],
)
def test_the_pipelinerun_a_taskrun_claims(owners: tuple[OwnerRef, ...], claimed: OwnerRef | None) -> None:
    assert claimed_pipelinerun(owners) == claimed


def _entry(pending: bool = False, done: bool = False, kind: str = "PipelineRun") -> QueueEntry:
    return QueueEntry(kind, "team-ci", "ci-1", "egress", 1.0, pending, done, uid="uid-ci-1")


@pytest.mark.parametrize(
    "own_entry, claim, uid, whole, held",
    [
        pytest.param(_entry(kind="TaskRun"), None, None, None, True, id="the-taskrun-carries-our-entry"),
        pytest.param(_entry(pending=True, kind="TaskRun"), None, None, None, False, id="its-taskrun-still-held"),
        pytest.param(_entry(done=True, kind="TaskRun"), None, None, None, False, id="its-taskrun-finished"),
        pytest.param(None, PIPELINE, "uid-ci-1", _entry(), True, id="owned-by-our-released-pipelinerun"),
        pytest.param(None, None, "uid-ci-1", _entry(), False, id="no-owner:-a-label-naming-it-proves-nothing"),
        pytest.param(None, PIPELINE, "uid-other", _entry(), False, id="a-made-up-or-copied-uid"),
        pytest.param(None, PIPELINE, None, None, False, id="no-such-pipelinerun"),
        pytest.param(None, PIPELINE, "uid-ci-1", None, False, id="a-pipelinerun-not-queued-by-us"),
        pytest.param(None, PIPELINE, "uid-ci-1", _entry(pending=True), False, id="still-held:-it-has-no-taskruns-yet"),
        pytest.param(None, PIPELINE, "uid-ci-1", _entry(done=True), False, id="finished:-it-makes-no-more-taskruns"),
    ],
)
def test_a_runs_pod_is_held_by_our_queue_only_by_uid(
    own_entry: QueueEntry | None, claim: OwnerRef | None, uid: str | None, whole: QueueEntry | None, held: bool
) -> None:
    assert held_by_queue(own_entry, claim, uid, whole) is held
    assert held_by_queue(own_entry, claim, uid, whole, another_pod=True) is False  # one pod at a time


@pytest.mark.parametrize(
    "status, existing, gated",
    [
        pytest.param("", None, False, id="the-run's-first-pod"),
        pytest.param("", "build-1-pod", True, id="a-second-pod-while-its-pod-is-active"),
        pytest.param("", "build-1-pod-retry1", True, id="a-second-pod-of-another-name"),
        pytest.param("TaskRunPending", None, True, id="a-pod-of-a-run-still-held"),
    ],
)
def test_a_bare_pod_claiming_a_run_of_ours_gets_no_slot_of_its_own(status: str, existing: str | None, gated: bool) -> None:
    """A run's uid is no secret to its namespace: a bare pod whose controller owner is a run of ours (by
    its real uid) is placed as the run's, but passes the gate only as the released run's one pod."""
    from tests.unit.test_queue_admission import queued_env, run_obj

    env = queued_env()
    env.state.apply("TaskRun", "ADDED", run_obj("TaskRun", "team-ci", "build-1", entry_annotation("egress", "TaskRun", 1.0), status))
    owner = {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": "build-1", "uid": "uid-build-1", "controller": True}
    if existing:
        env.state.apply("Pod", "ADDED", {"metadata": {"namespace": "team-ci", "name": existing, "uid": "u", "ownerReferences": [owner]},
                                         "spec": {"nodeName": "egress-1"}, "status": {"phase": "Running"}})
    _, patched, _ = env.review(tekton_pod(name="forged"))
    assert _placed(patched)
    assert (patched["spec"].get("schedulingGates") == [{"name": POOL_SLOT_GATE}]) is gated


def _pipelinerun(env: Env, status: str = "") -> None:
    """A coscheduled PipelineRun our queue holds (`status` pending) or released (""), in the cache."""
    env.state.apply("PipelineRun", "ADDED", {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {
        "namespace": "team-ci", "name": "ci-1", "uid": "uid-ci-1",
        "annotations": {QUEUE_ANNOTATION: entry_annotation("egress", "PipelineRun", 1.0), DECISION_ANNOTATION: '{"pool":"egress"}'}},
        "spec": {"status": status} if status else {}})


def _child(env: Env, name: str, owner: dict | None) -> None:
    """A decided TaskRun (admitted with our decision), owned by `owner` (an ownerReference) or by none."""
    meta: dict[str, Any] = {"namespace": "team-ci", "name": name, "uid": f"uid-{name}", "annotations": {DECISION_ANNOTATION: "{}"},
                            "labels": {"tekton.dev/pipelineRun": "ci-1"}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    env.state.apply("TaskRun", "ADDED", {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "metadata": meta})


OWNED = {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "name": "ci-1", "uid": "uid-ci-1", "controller": True}


@pytest.mark.parametrize(
    "status, owner, gated",
    [
        pytest.param("", None, True, id="label-only:-a-tenant's-own-taskrun"),
        pytest.param("", {**OWNED, "uid": "made-up"}, True, id="a-made-up-uid"),
        pytest.param("PipelineRunPending", OWNED, True, id="claims-a-pipelinerun-still-held"),
        pytest.param("", OWNED, False, id="a-child-of-our-released-pipelinerun"),
    ],
)
def test_a_pipelinerun_label_does_not_let_a_pod_past_the_gate(status: str, owner: dict | None, gated: bool) -> None:
    """Tekton copies a TaskRun's labels onto its pod: a tenant's own pending TaskRun labelled
    `tekton.dev/pipelineRun: <a PipelineRun our queue holds>`, released onto the full pool, gets the gate."""
    from tests.unit.test_queue_admission import queued_env

    env = queued_env()
    _pipelinerun(env, status)
    _child(env, "own", owner)
    pod = tekton_pod(taskrun_name="own")
    pod["metadata"]["ownerReferences"][0]["uid"] = "uid-own"
    pod["metadata"]["labels"]["tekton.dev/pipelineRun"] = "ci-1"
    _, patched, _ = env.review(pod)
    assert _placed(patched)
    assert (patched["spec"].get("schedulingGates") == [{"name": POOL_SLOT_GATE}]) is gated


@pytest.mark.parametrize(
    "child_owner, pod_owner_uid, has_pod",
    [
        pytest.param(OWNED, "uid-child", True, id="its-taskrun's-own-pod"),
        pytest.param(None, None, False, id="a-pod-labelled-with-its-name"),
        pytest.param(None, "uid-child", False, id="a-taskrun-that-does-not-claim-it"),
        pytest.param({**OWNED, "uid": "made-up"}, "uid-child", False, id="a-taskrun-claiming-a-made-up-uid"),
        pytest.param(OWNED, "made-up", False, id="a-pod-claiming-a-made-up-taskrun-uid"),
    ],
)
def test_a_released_pipelinerun_has_a_pod_only_through_its_taskruns_uids(child_owner: dict | None, pod_owner_uid: str | None, has_pod: bool) -> None:
    """A released coscheduled PipelineRun without a bound pod holds a slot; a pod labelled with its name
    (on any node) must not free that slot."""
    env = Env()
    _pipelinerun(env)
    _child(env, "child", child_owner)
    meta: dict[str, Any] = {"namespace": "team-ci", "name": "p", "labels": {"tekton.dev/pipelineRun": "ci-1", "tekton.dev/taskRun": "child"}}
    if pod_owner_uid:
        meta["ownerReferences"] = [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": "child", "uid": pod_owner_uid, "controller": True}]
    env.state.apply("Pod", "ADDED", {"metadata": meta, "spec": {"nodeName": "node-1"}, "status": {"phase": "Running"}})
    [entry] = env.state.queue.queue_entries()
    assert entry.kind == "PipelineRun" and entry.has_pod is has_pod
