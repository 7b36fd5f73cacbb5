"""Feature detection (controller/compat, issue #29): Tekton's version and the API server's discovery decide what is
turned off, each with its reason; the rest works as before, and admission never holds a TaskRun that Tekton cannot."""

from __future__ import annotations

import pytest

from controller.compat import core as compat
from controller.core.model import POOL_SLOT_GATE
from controller.queue.core import QUEUE_ANNOTATION
from controller.tekton.view import TektonView
from tests.unit.test_admission_handlers import EGRESS_TOLERATION, decision_of, kaniko_pipelinerun, taskrun, tekton_pod
from tests.unit.test_queue_admission import queued_env

ADMISSION_RESOURCES = ["mutatingwebhookconfigurations", "validatingadmissionpolicies", "validatingadmissionpolicybindings"]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("v1.9.2", (1, 9, 2)), ("1.15.0", (1, 15, 0)), ("v1.16.0-rc.1", (1, 16, 0)), ("devel", None), ("", None),
     (None, None), ("v1.9", None), ("v1.9.2 ", (1, 9, 2))],
)
def test_versions_parse(text, parsed) -> None:
    assert compat.parse_version(text) == parsed


@pytest.mark.parametrize(
    ("version", "unreadable", "taskrun_queue", "reason"),
    [
        ("v1.9.2", None, False, "Tekton v1.9.2 has no TaskRunPending (since v1.11.0, tektoncd/pipeline#9464)"),
        ("v1.10.0", None, False, "Tekton v1.10.0 has no TaskRunPending"),
        ("v1.11.0", None, True, ""),
        ("v1.12.0", None, True, ""),
        ("v1.15.0", None, True, ""),
        ("v1.16.0", None, True, ""),
        ("v2.0.0", None, True, ""),
        ("devel", None, False, "Tekton's version is unknown (its version is 'devel')"),
        (None, None, False, "Tekton's version is unknown (ConfigMap pipelines-info absent or without a version)"),
        (None, "ConfigMap pipelines-info unreadable: 403", False, "unknown (ConfigMap pipelines-info unreadable: 403)"),
    ],
)
def test_taskrun_queueing_needs_a_tekton_with_taskrunpending(version, unreadable, taskrun_queue, reason) -> None:
    support = compat.assess(version, unreadable)
    assert support.taskrun_pending is taskrun_queue
    assert support.supports(compat.POOL_GUARD)
    if taskrun_queue:
        assert support.problem() is None
    else:
        assert support.problem().startswith("taskrun-queue off: ") and reason in support.problem()
        assert "slot gate" in support.problem()  # says what happens instead


@pytest.mark.parametrize(
    ("discovery", "guard"),
    [
        ({"resources": [{"name": n} for n in ADMISSION_RESOURCES]}, True),
        ({"resources": [{"name": "mutatingwebhookconfigurations"}]}, False),  # before Kubernetes 1.30
        (None, False),  # the group version is not served at all
        ({"resources": "garbage"}, False),
    ],
)
def test_the_pool_guard_needs_validating_admission_policies(discovery, guard) -> None:
    limits = compat.kubernetes_limitations(compat.served_resources(discovery))
    support = compat.assess("v1.15.0", None, limits)
    assert support.supports(compat.POOL_GUARD) is guard
    assert support.taskrun_pending
    assert (support.problem() is None) is guard


@pytest.mark.parametrize(
    ("configmap", "version"),
    [({"data": {"version": "v1.9.2"}}, "v1.9.2"), ({"data": {}}, None), ({}, None), (None, None), ({"data": "x"}, None)],
)
def test_the_version_comes_from_pipelines_info(configmap, version) -> None:
    assert compat.version_of(configmap) == version


def test_the_view_turns_nothing_off_before_the_version_is_read() -> None:
    view = TektonView()
    assert view.support == compat.UNREAD and view.support.taskrun_pending and not view.version_read.is_set()
    view.set_kubernetes_limitations(compat.kubernetes_limitations(None))
    assert view.support.taskrun_pending and not view.support.supports(compat.POOL_GUARD)
    view.set_tekton_version("v1.9.2")
    assert not view.support.taskrun_pending and not view.support.supports(compat.POOL_GUARD) and view.version_read.is_set()
    view.set_kubernetes_limitations([])
    view.set_tekton_version("v1.15.0")
    assert view.support.problem() is None and view.support.tekton_version == "v1.15.0"


@pytest.mark.parametrize(("tekton", "held"), [("v1.15.0", True), ("v1.11.0", True), ("v1.9.2", False), ("devel", False)])
def test_a_taskrun_of_a_queued_pool_is_held_only_where_tekton_can(tekton, held) -> None:
    """Never misplaced either way: placed on the pool; where Tekton cannot hold it, created as it is and its pod
    waits for a slot behind the pool's gate."""
    env = queued_env()
    env.state.tekton.set_tekton_version(tekton)
    _, patched, _ = env.review(taskrun())
    assert ("status" in patched["spec"]) is held
    assert (QUEUE_ANNOTATION in patched["metadata"].get("annotations", {})) is held
    assert EGRESS_TOLERATION in patched["spec"]["podTemplate"]["tolerations"]
    assert decision_of(patched)["pool"] == "egress"
    _, pod, _ = env.review(tekton_pod())  # its TaskRun carries no entry of ours
    assert EGRESS_TOLERATION in pod["spec"]["tolerations"]
    assert pod["spec"]["schedulingGates"] == [{"name": POOL_SLOT_GATE}]


def test_a_pipelinerun_is_queued_whatever_the_tekton() -> None:
    """PipelineRunPending is older than every Tekton the matrix runs: a coscheduled PipelineRun is queued whole."""
    env = queued_env()
    env.state.tekton.set_tekton_version("v1.9.2")
    _, patched, _ = env.review(kaniko_pipelinerun())
    assert patched["spec"]["status"] == "PipelineRunPending"


def test_the_informer_reads_tekton_s_version_and_an_unreadable_one_turns_taskrun_queueing_off() -> None:
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    from controller.kube.informer import cluster_informers  # noqa: PLC0415
    from controller.metrics import Metrics  # noqa: PLC0415
    from controller.settings import Settings  # noqa: PLC0415
    from tests.unit.test_cluster_resolver import Sink  # noqa: PLC0415

    sink = Sink()
    informers = {i.resource.name: i for i in cluster_informers(None, sink, Settings(), Metrics())}  # type: ignore[arg-type]
    info = informers["configmap tekton-pipelines/pipelines-info"]
    assert not info.required and sink.tekton.support.taskrun_pending  # not read yet: nothing off
    info.on_error(ApiException(status=403, reason="Forbidden"))
    assert "pipelines-info unreadable: HTTP 403 Forbidden" in sink.tekton.support.problem()
    info.on_replace([{"data": {"version": "v1.15.0"}}])
    assert sink.tekton.support.problem() is None
    info.on_event("MODIFIED", {"data": {"version": "v1.10.2"}})
    assert not sink.tekton.support.taskrun_pending
    info.on_event("DELETED", {"data": {}})
    assert "absent or without a version" in sink.tekton.support.problem()
