"""Checks the agent reconciler (controller/agents/reconcile.py) against a ClusterState and recording
fakes: a node agent kept off pool nodes by an untolerated pool taint is reported (Warning Event on the
DaemonSet, once until what is missing changes or the report is due again, and the gauge), never
patched unless its owner opted in; an opted-in one is patched once (tolerations rebased on the fresh
object, record annotation, Normal Event) and not again while the cache catches up; a failed patch is
tried again next pass; the gauge drops a DaemonSet that no longer misses anything; `egress-placer
status` shows the same plan on each pool node's row."""

from __future__ import annotations

import io
import json
from typing import Any, Callable, Mapping

from controller.cli.status import pool_rows, print_rows
from controller.agents.core import POOL_TOLERATIONS_ANNOTATION, TOLERATIONS_ADDED_ANNOTATION
from controller.core.policy import load_policy
from controller.metrics import Metrics
from controller.agents.reconcile import AgentReconciler, find_gaps
from controller.state import ClusterState

POLICY_TEXT = """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
{extra}
pools:
  - name: overseas
    nodeSelector: {{egress: "yes"}}
    namespaces: ["team-*"]
"""
POOL = {"key": "egress-placer.io/pool", "operator": "Exists", "effect": "NoSchedule"}
OWN = {"key": "gpu", "operator": "Exists"}


def node(name: str, pool: bool) -> dict[str, Any]:
    taints = [{"key": "egress-placer.io/pool", "value": "overseas", "effect": "NoSchedule"}] if pool else []
    return {
        "metadata": {"name": name, "labels": {"egress": "yes"} if pool else {}},
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def daemonset(name: str, uid: str, namespace: str = "kube-system", tolerations: list | None = None, annotations: dict | None = None) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1"}
    if annotations:
        meta["annotations"] = annotations
    spec = {"tolerations": tolerations} if tolerations else {}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta, "spec": {"template": {"spec": spec}}}


def agent_pod(name: str, node_name: str, ds_name: str, uid: str) -> dict:
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds_name, "uid": uid, "controller": True}
    return {
        "metadata": {"namespace": "kube-system", "name": name, "ownerReferences": [owner]},
        "spec": {"nodeName": node_name},
        "status": {"phase": "Running"},
    }


class RecordingEvents:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def emit(self, regarding: dict, type: str, reason: str, note: str, action: str = "") -> None:
        self.sent.append({"regarding": regarding, "type": type, "reason": reason, "note": note, "action": action})


class FakeDaemonSets:
    """The kube adapter's DaemonSet write: keeps the live tolerations, records each patch."""

    def __init__(self, live: Mapping[str, list], fail: int = 0) -> None:
        self.live = {k: list(v) for k, v in live.items()}
        self.patches: list[tuple[str, str, str, list, dict]] = []
        self.fail = fail

    def set_daemonset_tolerations(
        self, namespace: str, name: str, uid: str, rebase: Callable[[list], list], annotations: Mapping[str, str]
    ) -> list | None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("API down")
        current = self.live[name]
        wanted = rebase(current)
        if wanted == current:
            return None
        self.live[name] = wanted
        self.patches.append((namespace, name, uid, wanted, dict(annotations)))
        return wanted


class Env:
    def __init__(self, extra: str = "", daemonsets: list[dict] = (), pods: list[dict] = (), fail: int = 0) -> None:  # type: ignore[assignment]
        self.now = 100.0
        self.state = ClusterState(load_policy(POLICY_TEXT.format(extra=extra)), clock=lambda: self.now)
        self.state.replace("Node", [node("egress-1", True), node("egress-2", True), node("node-1", False)])
        self.state.replace("DaemonSet", list(daemonsets))
        self.state.replace("Pod", list(pods))
        live = {d["metadata"]["name"]: d["spec"]["template"]["spec"].get("tolerations") or [] for d in daemonsets}
        self.writer = FakeDaemonSets(live, fail)
        self.events = RecordingEvents()
        self.metrics = Metrics()
        self.reconciler = AgentReconciler(
            self.state, self.writer, self.events, self.metrics, clock=lambda: self.now, report_again_after=600.0, in_flight_seconds=30.0
        ).reconcile  # a pass: the gaps it acted on

    def gauge(self, namespace: str, name: str) -> float | None:
        for sample in self.metrics.agents_missing.collect()[0].samples:
            if sample.labels == {"namespace": namespace, "daemonset": name}:
                return sample.value
        return None

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.events.sent]


def test_a_node_agent_kept_off_the_pool_is_reported_not_patched() -> None:
    env = Env(daemonsets=[daemonset("kube-proxy", "u-proxy")], pods=[agent_pod("p1", "node-1", "kube-proxy", "u-proxy")])
    env.reconciler()
    assert env.writer.patches == []
    (event,) = env.events.sent
    assert (event["type"], event["reason"]) == ("Warning", "AgentMissingOnPool")
    assert event["regarding"] == {"apiVersion": "apps/v1", "kind": "DaemonSet", "namespace": "kube-system", "name": "kube-proxy", "uid": "u-proxy"}
    assert "No pod on 2 of the 2 pool nodes it targets (egress-1, egress-2)" in event["note"]
    assert POOL_TOLERATIONS_ANNOTATION in event["note"]
    assert env.gauge("kube-system", "kube-proxy") == 2


def test_the_report_is_said_again_only_when_what_is_missing_changes_or_it_is_due() -> None:
    env = Env(daemonsets=[daemonset("kube-proxy", "u-proxy")])
    env.reconciler()
    env.now += 60
    env.reconciler()
    assert env.reasons() == ["AgentMissingOnPool"]
    env.state.apply("Pod", "ADDED", agent_pod("p1", "egress-1", "kube-proxy", "u-proxy"))  # there since before the taint
    env.reconciler()
    assert env.reasons() == ["AgentMissingOnPool"] * 2 and "No pod on 1 of the 2" in env.events.sent[-1]["note"]
    assert env.gauge("kube-system", "kube-proxy") == 1
    env.now += 600
    env.reconciler()
    assert env.reasons() == ["AgentMissingOnPool"] * 3


def test_a_tenant_daemonset_and_a_tolerating_agent_are_not_reported() -> None:
    env = Env(daemonsets=[daemonset("miner", "u-miner", namespace="team-a"), daemonset("exporter", "u-exp", tolerations=[POOL])])
    assert env.reconciler() == [] and env.events.sent == [] and env.writer.patches == []
    assert env.gauge("team-a", "miner") is None and env.gauge("kube-system", "exporter") is None


def test_an_agent_opted_in_by_annotation_is_patched_once_with_a_record() -> None:
    ds = daemonset("kube-proxy", "u-proxy", tolerations=[OWN], annotations={POOL_TOLERATIONS_ANNOTATION: "patch"})
    env = Env(daemonsets=[ds])
    env.reconciler()
    ((namespace, name, uid, tolerations, annotations),) = env.writer.patches
    assert (namespace, name, uid, tolerations) == ("kube-system", "kube-proxy", "u-proxy", [OWN, POOL])
    record = json.loads(annotations[TOLERATIONS_ADDED_ANNOTATION])
    assert record == {"added": ["egress-placer.io/pool:NoSchedule"], "by": "leader",
                      "why": f"annotation {POOL_TOLERATIONS_ANNOTATION}=patch"}
    (event,) = env.events.sent
    assert (event["type"], event["reason"]) == ("Normal", "PoolTolerationsAdded") and "egress-1, egress-2" in event["note"]
    assert env.metrics.agent_tolerations_added.labels(by="leader")._value.get() == 1
    env.now += 5
    env.reconciler()  # the cache has not caught up: in flight, not patched again
    assert len(env.writer.patches) == 1 and len(env.events.sent) == 1
    ds["spec"]["template"]["spec"]["tolerations"] = [OWN, POOL]
    env.state.apply("DaemonSet", "MODIFIED", ds)
    assert env.reconciler() == [] and find_gaps(env.state) == []
    assert env.gauge("kube-system", "kube-proxy") is None  # dropped once nothing is missing


def test_an_agent_namespace_opted_in_by_the_policy_is_patched() -> None:
    env = Env(extra="patchExistingAgents: [kube-system]", daemonsets=[daemonset("kube-proxy", "u-proxy")])
    env.reconciler()
    assert [p[3] for p in env.writer.patches] == [[POOL]]
    assert "policy patchExistingAgents" in json.loads(env.writer.patches[0][4][TOLERATIONS_ADDED_ANNOTATION])["why"]


def test_the_owners_report_annotation_wins_over_the_policy() -> None:
    ds = daemonset("kube-proxy", "u-proxy", annotations={POOL_TOLERATIONS_ANNOTATION: "report"})
    env = Env(extra="patchExistingAgents: [kube-system]", daemonsets=[ds])
    env.reconciler()
    assert env.writer.patches == [] and env.reasons() == ["AgentMissingOnPool"]


def test_a_failed_patch_is_reported_and_tried_again_next_pass() -> None:
    env = Env(extra="patchExistingAgents: [kube-system]", daemonsets=[daemonset("kube-proxy", "u-proxy")], fail=1)
    env.reconciler()
    assert env.writer.patches == [] and env.reasons() == ["AgentMissingOnPool"]
    assert "but the patch failed: API down" in env.events.sent[0]["note"]
    env.reconciler()
    assert len(env.writer.patches) == 1 and env.reasons() == ["AgentMissingOnPool", "PoolTolerationsAdded"]


def test_tolerations_the_owner_added_meanwhile_are_kept_and_nothing_is_patched_when_they_suffice() -> None:
    env = Env(extra="patchExistingAgents: [kube-system]", daemonsets=[daemonset("kube-proxy", "u-proxy")])
    env.writer.live["kube-proxy"] = [{"operator": "Exists"}]  # the owner's fix, not in the cache yet
    env.reconciler()
    assert env.writer.patches == [] and env.events.sent == []


def test_status_shows_the_missing_agents_on_each_pool_node() -> None:
    env = Env(daemonsets=[daemonset("kube-proxy", "u-proxy")], pods=[agent_pod("p1", "egress-2", "kube-proxy", "u-proxy")])
    gaps = find_gaps(env.state)
    rows = {r.node: r for r in pool_rows(env.state, gaps)}
    assert rows["egress-1"].agents_missing == ("kube-system/kube-proxy",) and rows["egress-2"].agents_missing == ()
    out = io.StringIO()
    print_rows(list(rows.values()), out, gaps)
    text = out.getvalue()
    assert "AGENTS MISSING" in text
    assert "kube-system/kube-proxy: pools overseas; no pod on 1 of 2 pool nodes it targets; reported only" in text
