"""QuietEvents: admission's Events held until admission is quiet, never longer than max_delay."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from controller.admission.events import QuietEvents


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
    q = QuietEvents(sink, quiet=0.01, max_delay=0.5)
    q.start()
    try:
        _emit(q, "a")
        _emit(q, "b", "NotPlaced")
        assert sink.done.wait(5.0)
        assert sink.sent == [("a", "Placed"), ("b", "NotPlaced")]
    finally:
        q.stop()


def test_stop_hands_on_what_is_held() -> None:
    sink = Recorder()
    q = QuietEvents(sink, quiet=60.0, max_delay=60.0)
    q.start()
    _emit(q, "a")
    q.stop()
    assert sink.sent == [("a", "Placed")]
    _emit(q, "late")  # after stop: handed on by the next stop, not lost
    q.stop()
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
