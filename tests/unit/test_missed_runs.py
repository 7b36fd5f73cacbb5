"""The report of runs created while the webhook was not called: which runs, how many, what is said.

Fed through the real ClusterState (as the run informers feed it) and a recording event sink.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.core.model import DECISION_ANNOTATION
from controller.core.policy import PlacementPolicy
from controller.missed_runs.reconcile import NOT_ADMITTED_NOTE, report_missed_runs
from controller.state import ClusterState


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, Any], str, str, str]] = []

    def emit(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "") -> None:
        self.sent.append((regarding, type, reason, note))


def run(kind: str, name: str, decided: bool, namespace: str = "team-cdn") -> dict[str, Any]:
    annotations = {DECISION_ANNOTATION: "{}"} if decided else {"other": "x"}
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "annotations": annotations}
    return {"kind": kind, "metadata": meta}


@pytest.fixture
def state() -> ClusterState:
    return ClusterState(PlacementPolicy.empty(), clock=lambda: 0.0)


def test_only_runs_without_a_decision_are_reported(state):
    state.replace("TaskRun", [run("TaskRun", "admitted", True), run("TaskRun", "missed", False)])
    state.apply("PipelineRun", "ADDED", run("PipelineRun", "missed-pipeline", False))
    sink = Sink()
    reported = report_missed_runs(state.missed_runs, sink)
    assert reported == [("PipelineRun", "team-cdn", "missed-pipeline"), ("TaskRun", "team-cdn", "missed")]
    assert [(r["kind"], r["name"], t, reason) for r, t, reason, _ in sink.sent] == [
        ("PipelineRun", "missed-pipeline", "Warning", "NotAdmitted"),
        ("TaskRun", "missed", "Warning", "NotAdmitted"),
    ]
    assert all(note == NOT_ADMITTED_NOTE for *_, note in sink.sent)
    assert [r["uid"] for r, *_ in sink.sent] == ["uid-missed-pipeline", "uid-missed"]  # kubectl describe matches by uid


def test_a_run_admitted_later_or_deleted_is_not_reported(state):
    state.apply("TaskRun", "ADDED", run("TaskRun", "a", False))
    state.apply("TaskRun", "MODIFIED", run("TaskRun", "a", True))
    state.apply("TaskRun", "ADDED", run("TaskRun", "b", False))
    state.apply("TaskRun", "DELETED", run("TaskRun", "b", False))
    sink = Sink()
    assert report_missed_runs(state.missed_runs, sink) == []
    assert sink.sent == []


def test_the_report_is_bounded(state):
    state.replace("TaskRun", [run("TaskRun", f"r-{i:03d}", False) for i in range(250)])
    sink = Sink()
    assert len(report_missed_runs(state.missed_runs, sink, limit=100)) == 100
    assert len(sink.sent) == 100
