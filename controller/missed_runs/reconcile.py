"""Runs created while no replica's webhook was called (egress-placer down, or not yet installed).

Tekton refuses spec changes once a run exists, so such a run can no longer be placed: the leader
reports them once per process, after its caches synced. One log line per run (its identity bound)
and a Warning Event `NotAdmitted` on each, at most `limit` of them, plus one summary line.
"""

from __future__ import annotations

from loguru import logger

from controller.event_sink import EventSink
from controller.missed_runs.view import MissedRuns
from controller.queue.view import RunKey

MAX_REPORTED_RUNS = 100
NOT_ADMITTED_NOTE = (
    "created while the egress-placer webhook was not called (controller down or not installed): "
    "not placed, and its placement cannot change after creation"
)


def report_missed_runs(runs: MissedRuns, events: EventSink, limit: int = MAX_REPORTED_RUNS) -> list[RunKey]:
    """Log and emit an Event for each run without a decision annotation; the runs reported."""
    missed = runs.runs_without_decision()
    if not missed:
        return []
    logger.bind(count=len(missed)).warning(
        "{} run(s) were created without egress-placer's admission: not placed", len(missed)
    )
    reported = missed[:limit]
    for kind, namespace, name in reported:
        logger.bind(kind=kind, namespace=namespace, name=name).warning("run not admitted: {}", NOT_ADMITTED_NOTE)
        uid = runs.run_uid((kind, namespace, name))  # `kubectl describe` shows only Events that name it
        regarding = {"apiVersion": "tekton.dev/v1", "kind": kind, "namespace": namespace, "name": name, "uid": uid}
        events.emit(regarding, "Warning", "NotAdmitted", NOT_ADMITTED_NOTE, action="Report")
    return reported
