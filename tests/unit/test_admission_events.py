"""Admission's Events: CreationEvents holds each until the informers see its object (then it carries
the object's name and uid); QuietEvents holds them until admission is quiet, never longer than max_delay."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from controller.admission.events import CreationEvents, QuietEvents
from controller.core.model import REVIEW_ANNOTATION
from controller.runner import Runner
from tests.waiting import wait_for


class Recorder:
    def __init__(self, expected: int = 0) -> None:
        self.sent: list[tuple[str, str]] = []
        self.done = threading.Event()
        self.expected = expected

    def emit(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "") -> None:
        self.sent.append((regarding["name"], reason))
        if len(self.sent) >= self.expected:
            self.done.set()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _emit(q: QuietEvents, name: str, reason: str = "Placed") -> None:
    q.emit({"kind": "TaskRun", "namespace": "ns", "name": name}, "Normal", reason, "note", "Admit")


def test_held_while_admission_is_busy_then_all_sent_in_order() -> None:
    sink, clock = Recorder(), Clock()
    q = QuietEvents(sink, quiet=0.05, max_delay=1.0, clock=clock)
    assert q.due_in(clock()) is None
    _emit(q, "a")
    clock.now += 0.03
    _emit(q, "b")  # another admission before a's quiet period ended: a waits too
    clock.now += 0.03
    assert q.take_due(clock()) == []
    assert q.due_in(clock()) == pytest.approx(0.05 - 0.03)
    clock.now += 0.021
    q.forward(q.take_due(clock()))
    assert sink.sent == [("a", "Placed"), ("b", "Placed")]
    assert q.due_in(clock()) is None


def test_steady_traffic_does_not_hold_events_longer_than_max_delay() -> None:
    sink, clock = Recorder(), Clock()
    q = QuietEvents(sink, quiet=0.05, max_delay=0.2, clock=clock)
    for i in range(10):  # one every 30 ms: never quiet for 50 ms
        _emit(q, f"r{i}")
        q.forward(q.take_due(clock()))
        clock.now += 0.03
    # 0.2 s after the first: everything held so far went out together, the rest is still held
    assert sink.sent == [(f"r{i}", "Placed") for i in range(8)]
    assert q.due_in(clock()) is not None


def test_the_thread_forwards_once_quiet() -> None:
    sink = Recorder(expected=2)
    q, runner = QuietEvents(sink, quiet=0.01, max_delay=0.5), Runner()
    runner.start("admission events", q.run, on_stop=q.wake)
    try:
        _emit(q, "a")
        _emit(q, "b", "NotPlaced")
        assert sink.done.wait(5.0)
        assert sink.sent == [("a", "Placed"), ("b", "NotPlaced")]
    finally:
        runner.stop()


def test_stop_hands_on_what_is_held() -> None:
    sink = Recorder()
    q, runner = QuietEvents(sink, quiet=60.0, max_delay=60.0), Runner()
    runner.start("admission events", q.run, on_stop=q.wake)
    _emit(q, "a")
    runner.stop()
    assert sink.sent == [("a", "Placed")]
    _emit(q, "late")  # after stop: handed on by the next stop, not lost
    runner.start("admission events", q.run, on_stop=q.wake)
    runner.stop()
    assert sink.sent == [("a", "Placed"), ("late", "Placed")]


def test_a_raising_sink_does_not_lose_the_others() -> None:
    class Flaky(Recorder):
        def emit(self, regarding: dict[str, Any], *args: Any) -> None:
            if regarding["name"] == "bad":
                raise RuntimeError("boom")
            super().emit(regarding, *args)

    sink, clock = Flaky(), Clock()
    q = QuietEvents(sink, quiet=0.0, max_delay=1.0, clock=clock)
    _emit(q, "bad")
    _emit(q, "good")
    q.forward(q.take_due(clock()))
    assert sink.sent == [("good", "Placed")]


# --- CreationEvents ---------------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, Any], str, str]] = []

    def emit(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "") -> None:
        self.sent.append((regarding, type, reason))


def regarding(kind: str = "TaskRun", namespace: str = "team-ci", name: str = "build-1") -> dict[str, Any]:
    return {"apiVersion": "tekton.dev/v1" if kind != "Pod" else "v1", "kind": kind, "namespace": namespace, "name": name}


def seen(name: str, token: str | None, namespace: str = "team-ci", uid: str = "u-1") -> dict[str, Any]:
    """An object as the informers hand it on (trimmed metadata)."""
    annotations = {REVIEW_ANNOTATION: token} if token else {}
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations}}


def test_an_event_waits_for_its_object_and_then_names_it_with_its_uid() -> None:
    sink = Sink()
    events = CreationEvents(sink)
    events.hold("review-1", regarding(), "Normal", "Placed", "pool egress", "Admit")
    events.apply("TaskRun", "ADDED", seen("other", "review-2"))
    assert sink.sent == [] and events.held == 1
    events.apply("TaskRun", "ADDED", seen("build-1", "review-1", uid="abc"))
    assert sink.sent == [({**regarding(), "uid": "abc"}, "Normal", "Placed")]
    assert events.held == 0
    events.apply("TaskRun", "MODIFIED", seen("build-1", "review-1", uid="abc"))
    assert len(sink.sent) == 1  # sent once


def test_generate_name_is_matched_by_the_token_and_the_prefix() -> None:
    sink = Sink()
    events = CreationEvents(sink)
    events.hold("review-1", regarding("PipelineRun", name=""), "Normal", "TasksDecided", "n", generate_name="nightly-")
    events.apply("PipelineRun", "ADDED", seen("weekly-x7k2p", "review-1"))  # the token, not the prefix
    assert sink.sent == []
    events.apply("PipelineRun", "ADDED", seen("nightly-x7k2p", "review-1", uid="u-9"))
    [(sent, _, _)] = sink.sent
    assert (sent["name"], sent["uid"], sent["kind"]) == ("nightly-x7k2p", "u-9", "PipelineRun")


@pytest.mark.parametrize(
    "kind, obj",
    [
        pytest.param("TaskRun", seen("build-1", "review-1", namespace="team-other"), id="token-copied-to-another-namespace"),
        pytest.param("Pod", seen("build-1", "review-1"), id="another-kind"),
        pytest.param("TaskRun", seen("build-2", "review-1"), id="another-name"),
        pytest.param("TaskRun", seen("build-1", None), id="no-token"),
        pytest.param("TaskRun", {"metadata": {"name": "build-1", "namespace": "team-ci",
                                              "annotations": {REVIEW_ANNOTATION: "review-1"}}}, id="no-uid"),
        pytest.param("Node", seen("build-1", "review-1"), id="not-a-kind-admission-reports-on"),
    ],
)
def test_objects_that_are_not_the_admitted_one_release_nothing(kind: str, obj: dict[str, Any]) -> None:
    sink = Sink()
    events = CreationEvents(sink)
    events.hold("review-1", regarding(), "Normal", "Placed", "n")
    events.apply(kind, "ADDED", obj)
    assert sink.sent == [] and events.held == 1


def test_a_relist_releases_too_and_a_deleted_object_still_gets_its_event() -> None:
    sink = Sink()
    events = CreationEvents(sink)
    events.hold("r-1", regarding(name="a"), "Normal", "Placed", "n")
    events.hold("r-2", regarding(name="b"), "Normal", "Placed", "n")
    events.replace("TaskRun", [seen("x", None), seen("a", "r-1", uid="ua")])
    events.apply("TaskRun", "DELETED", seen("b", "r-2", uid="ub"))
    assert [(r["name"], r["uid"]) for r, _, _ in sink.sent] == [("a", "ua"), ("b", "ub")]


def test_a_reinvoked_review_replaces_the_held_event() -> None:
    sink = Sink()
    events = CreationEvents(sink)
    events.hold("r-1", regarding(), "Normal", "NotPlaced", "first")
    events.hold("r-1", regarding(), "Normal", "Placed", "second")
    events.apply("TaskRun", "ADDED", seen("build-1", "r-1"))
    assert [reason for _, _, reason in sink.sent] == ["Placed"]


def test_an_event_whose_object_never_appears_is_dropped_after_the_ttl() -> None:
    sink, clock = Sink(), Clock()
    events = CreationEvents(sink, ttl=60.0, clock=clock)
    events.hold("r-1", regarding(name="refused"), "Normal", "Placed", "n")
    clock.now += 30.0
    events.hold("r-2", regarding(name="late"), "Normal", "Placed", "n")
    clock.now += 29.0
    assert events.sweep() == 0
    clock.now += 1.0
    assert events.sweep() == 1 and events.held == 1
    events.apply("TaskRun", "ADDED", seen("refused", "r-1"))  # too late: dropped already
    events.apply("TaskRun", "ADDED", seen("late", "r-2"))
    assert [r["name"] for r, _, _ in sink.sent] == ["late"]


def test_the_oldest_is_dropped_beyond_max_held() -> None:
    sink = Sink()
    events = CreationEvents(sink, max_held=2)
    for i in range(3):
        events.hold(f"r-{i}", regarding(name=f"run-{i}"), "Normal", "Placed", "n")
    events.replace("TaskRun", [seen(f"run-{i}", f"r-{i}", uid=f"u{i}") for i in range(3)])
    assert [r["name"] for r, _, _ in sink.sent] == ["run-1", "run-2"]


def test_the_sweeper_thread_drops_expired_events() -> None:
    sink = Sink()
    events, runner = CreationEvents(sink, ttl=0.02), Runner()
    runner.start("creation events", events.run)
    try:
        events.hold("r-1", regarding(), "Normal", "Placed", "n")
        wait_for("the held Event to expire", lambda: events.held == 0, timeout=5.0)
        assert sink.sent == []
    finally:
        runner.stop()


def test_a_raising_sink_does_not_stop_the_informer_or_the_other_events() -> None:
    class Flaky(Sink):
        def emit(self, regarding: dict[str, Any], *args: Any) -> None:
            if regarding["name"] == "bad":
                raise RuntimeError("boom")
            super().emit(regarding, *args)

    sink = Flaky()
    events = CreationEvents(sink)
    events.hold("r-1", regarding(name="bad"), "Normal", "Placed", "n")
    events.hold("r-2", regarding(name="good"), "Normal", "Placed", "n")
    events.replace("TaskRun", [seen("bad", "r-1"), seen("good", "r-2")])
    assert [r["name"] for r, _, _ in sink.sent] == ["good"]
