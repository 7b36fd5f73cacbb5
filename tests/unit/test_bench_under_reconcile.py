"""The parts of bench/under_reconcile.py that run without a load generator: the reconcilers over the
bench's state (every one passes, writing nowhere), the heartbeats, the lock measure's shape, the row,
its target and its merge into latest.json."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from bench import schema
from bench.report import targets
from bench.under_reconcile import Heartbeats, build_state, lock_holds, merge_into, reconcile_loop, summarize
from tests.waiting import wait_for


@pytest.mark.parametrize("full", [False, True])
def test_every_reconciler_passes_over_the_bench_state_and_only_while_leading(full: bool) -> None:
    state, pool_nodes, pool_pods = build_state(20, 80)
    assert len(pool_nodes) == 20 and len(state.pods) >= 80 and len(pool_pods) >= 80
    leading = threading.Event()
    loop = reconcile_loop(state, leading, full=full)
    cursors = [r.changes for r in loop.reconcilers if hasattr(r, "changes")]
    assert len(cursors) == 3 and all((c is None) == full for c in cursors)
    for reconcile in loop.reconcilers:
        reconcile()  # raises if a reconciler cannot work over NoWrites
    loop.run_once()
    assert loop.passes == 0
    leading.set()
    loop.run_once()
    assert loop.passes == 1


def test_heartbeats_change_only_the_node_versions_and_wake_the_loop_themselves() -> None:
    state, pool_nodes, _ = build_state(5, 10)
    changes: list[str] = []
    state.subscribe(changes.append)  # a heartbeat alone tells no one
    leading = threading.Event()
    beats = Heartbeats(state, pool_nodes, leading, rate=1000.0, wake=lambda: changes.append("wake"))
    thread = threading.Thread(target=beats.run, daemon=True)
    before = dict(state.nodes)
    leading.set()
    thread.start()
    try:
        wait_for("a round of heartbeats", lambda: changes.count("wake") >= 6, timeout=10)
    finally:
        beats.stopped.set()
        thread.join(5)
    assert dict(state.nodes) == before  # nothing the core reads changed
    assert "Node" not in changes
    assert state.node_resource_version("egress-1") != "1"


def test_pod_restarts_mark_their_nodes_changed_for_the_cursors() -> None:
    state, pool_nodes, pool_pods = build_state(5, 10)
    cursor = state.changes.cursor()
    assert cursor.take() is None  # the first pass: every node
    leading = threading.Event()
    beats = Heartbeats(state, pool_nodes, leading, rate=1000.0, pods=pool_pods, pods_every=2)
    thread = threading.Thread(target=beats.run, daemon=True)
    before = len(state.pods)
    leading.set()
    thread.start()
    try:
        wait_for("a pod restarted", lambda: bool(cursor.take()), timeout=10)
    finally:
        beats.stopped.set()
        thread.join(5)
    assert len(state.pods) == before  # each pod deleted is added again


def test_the_lock_measure_counts_holds_per_pass() -> None:
    row = lock_holds(40, 160, passes=2)
    assert row["holds_per_pass"] >= 3  # the names, a dry-run choice, one chunk at least
    assert len(row["longest_hold_ms_each"]) == 2 and row["longest_hold_ms"] == max(row["longest_hold_ms_each"])
    assert set(row) == set(schema.TEMPLATE["admission"]["under_reconcile"]["lock"])


def test_the_row_its_target_and_its_merge(tmp_path: Path) -> None:
    idle = [{"p99_ms": 4.0, "p50_ms": 1.0, "errors": 0}, {"p99_ms": 6.0, "p50_ms": 1.2, "errors": 0}]
    busy = [{"p99_ms": 9.0, "p50_ms": 2.0, "errors": 1}, {"p99_ms": 13.0, "p50_ms": 2.2, "errors": 0}]
    row = summarize(5000, 20000, 200, 10.0, idle, busy, [(3, 1.0), (1, 2.0)])
    assert (row["idle_p99_ms"], row["busy_p99_ms"], row["passes"], row["pass_s"], row["errors"]) == (5.0, 11.0, 4, 1.25, 1)
    assert set(row) == set(schema.TEMPLATE["admission"]["under_reconcile"])
    results = schema.empty()
    schema.merge(results["admission"]["under_reconcile"], row)
    (target,) = [t for t in targets(results) if "reconciles" in t["name"]]
    assert (target["value"], target["met"]) == (1.1, False)  # 11 ms against 2 x 5 ms

    (tmp_path / "latest.json").write_text(json.dumps({"admission": {"headline": {"p99_ms": 2.5}}}))
    merge_into(tmp_path, {"idle_p99_ms": 1.0})
    assert json.loads((tmp_path / "latest.json").read_text()) == {
        "admission": {"headline": {"p99_ms": 2.5}, "under_reconcile": {"idle_p99_ms": 1.0}}}
