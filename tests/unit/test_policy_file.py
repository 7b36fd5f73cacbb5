"""The policy from a file (no cluster): loaded at start, reloaded when the file changes, a broken
edit refused with the last good policy kept, a missing file keeping the current policy; and the
judging of policy texts shared with ConfigMap mode (identical text is not reloaded)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from loguru import logger

from controller.app import PolicyTracker
from controller.core.policy import load_policy
from controller.kube.policy_source import PolicySource
from controller.metrics import Metrics
from controller.runner import Runner
from controller.settings import Settings
from controller.state import ClusterState
from tests.waiting import wait_for

EMPTY = "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\n"


def policy(pool: str) -> str:
    return EMPTY + f"pools:\n  - name: {pool}\n    nodes: [egress-1]\n"


class Events:
    def __init__(self) -> None:
        self.emitted: list[str] = []

    def emit(self, regarding, type, reason, note, action="") -> None:
        self.emitted.append(reason)


def pools(state: ClusterState) -> list[str]:
    return [p.name for p in state.policy.pools]


def write(path: Path, text: str, bump: int) -> None:
    path.write_text(text)
    os.utime(path, (1_000_000 + bump, 1_000_000 + bump))  # a distinct mtime even within one clock tick


def test_file_policy_is_loaded_reloaded_refused_and_kept(tmp_path):
    path = tmp_path / "policy.yaml"
    write(path, policy("first"), 1)
    metrics = Metrics()
    state = ClusterState(load_policy(EMPTY), clock=time.time)
    source = PolicySource(Settings(policy_file=str(path)), state, metrics, Events(), poll_seconds=0.02)
    runner = Runner()
    source.start(runner)
    try:
        assert source.synced.wait(5) and pools(state) == ["first"]
        write(path, "pools: [\n", 2)
        wait_for("the broken policy refused", lambda: metrics.policy_reloads.labels(result="refused")._value.get() == 1, timeout=10, interval=0.02)
        assert pools(state) == ["first"] and metrics.policy_valid._value.get() == 0
        write(path, policy("second"), 3)
        wait_for("the second policy loaded", lambda: pools(state) == ["second"], timeout=10, interval=0.02)
        warnings: list[str] = []
        sink = logger.add(lambda message: warnings.append(message.record["message"]), level="WARNING")
        try:
            path.unlink()
            wait_for("a poll of the missing file", lambda: any("policy file missing" in w for w in warnings), timeout=10, interval=0.02)
        finally:
            logger.remove(sink)
        assert pools(state) == ["second"]
    finally:
        runner.stop()


def test_offer_judges_each_text_once_and_reports_refusals():
    metrics, events = Metrics(), Events()
    state = ClusterState(load_policy(EMPTY), clock=time.time)
    source = PolicySource(Settings(policy_file="/nonexistent"), state, metrics, events)
    regarding = {"kind": "ConfigMap", "name": "policy", "namespace": "egress-placer"}
    assert source.offer(policy("a"), regarding) is not None
    assert source.offer(policy("a"), regarding) is None  # same text: nothing to do
    assert source.offer("kind: [", regarding) is None
    assert source.offer(None) is None  # the source lost its policy: keep the last good one
    assert pools(state) == ["a"] and events.emitted == ["PolicyRefused"]
    assert metrics.policy_reloads.labels(result="loaded")._value.get() == 1
    assert metrics.policy_reloads.labels(result="refused")._value.get() == 1


def test_the_tracker_keeps_why_the_last_policy_was_refused():
    state = ClusterState(load_policy(EMPTY), clock=time.time)
    handed_on: list[list[str]] = []
    tracker = PolicyTracker(state, on_policy=lambda p: handed_on.append([pool.name for pool in p.pools]))
    source = PolicySource(Settings(policy_file="/nonexistent"), tracker, Metrics(), on_refused=tracker.refused)
    source.offer("kind: [")
    assert not tracker.loaded.is_set() and tracker.refusal is not None and "file /nonexistent" in tracker.refusal
    source.offer(policy("a"))
    assert tracker.loaded.is_set() and tracker.refusal is None and handed_on == [["a"]] and pools(state) == ["a"]
    source.offer(EMPTY + "pools: [{name: 1}]\n")
    assert "pools[0].name" in (tracker.refusal or "") and pools(state) == ["a"]
    assert source.offer(None) is None  # the source lost it: the last good stays, the reason changes
    assert pools(state) == ["a"] and "no policy found in file /nonexistent" in (tracker.refusal or "")


def test_the_tracker_says_what_is_wrong_and_what_is_in_force():
    state = ClusterState(None, clock=time.time)
    tracker = PolicyTracker(state, on_policy=lambda p: None)
    assert not state.policy_in_force
    assert tracker.problem() == "no policy loaded yet; no valid policy in force: nothing is placed on a pool, the pool taints stay"
    tracker.refused("policy.yaml:10: pools[0].placment: Extra inputs are not permitted")
    assert tracker.problem() == (
        "policy.yaml:10: pools[0].placment: Extra inputs are not permitted; no valid policy in force: "
        "nothing is placed on a pool, the pool taints stay"
    )
    assert tracker.adopt_stored(load_policy(policy("kept")), "configmap egress-placer/egress-placer-policy-last-good")
    assert state.policy_in_force and pools(state) == ["kept"] and tracker.loaded.is_set()
    assert tracker.problem() == (
        "policy.yaml:10: pools[0].placment: Extra inputs are not permitted; "
        "in force: the last good policy stored in configmap egress-placer/egress-placer-policy-last-good"
    )
    tracker.set_policy(load_policy(policy("fixed")))  # the source's own: all well
    assert tracker.problem() is None and pools(state) == ["fixed"]
    assert not tracker.adopt_stored(load_policy(policy("late")), "x")  # a late read of the copy loses
    tracker.refused("policy.yaml:3: invalid YAML")
    assert tracker.problem() == "policy.yaml:3: invalid YAML; in force: the last good policy loaded before"
