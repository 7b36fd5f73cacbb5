"""The policy from a ConfigMap on the real API server: a valid policy is loaded into the state; an
invalid edit is refused (Warning Event PolicyRefused on the ConfigMap naming the line, metrics) and
the last good policy stays in force; fixing it loads again; deleting it keeps the last good one."""

from __future__ import annotations

import time

import pytest
from loguru import logger

from controller.core.policy import load_policy
from controller.kube.client import MERGE_PATCH
from controller.kube.policy_source import PolicySource
from controller.retry import RetryPolicy
from controller.kube.writer import EventRecorder, KubeClient
from controller.metrics import Metrics
from controller.runner import Runner
from controller.settings import Settings
from controller.state import ClusterState
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

EMPTY = "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\n"


def policy(pool: str) -> str:
    return EMPTY + f"pools:\n  - name: {pool}\n    nodes: [egress-1]\n"


BROKEN = EMPTY + "pools:\n  - name: Not_A_Name\n    nodes: [egress-1]\n"  # line 4 is wrong


def test_configmap_policy_is_loaded_refused_and_kept(api, namespace):
    cm_path = f"/api/v1/namespaces/{namespace}/configmaps"
    settings = Settings(kubeconfig="unused", namespace=namespace, policy_configmap="policy", policy_key="policy.yaml", policy_source="configmap")
    api.call("POST", cm_path, body={"metadata": {"name": "policy"}, "data": {"policy.yaml": policy("first")}})
    metrics = Metrics()
    state = ClusterState(load_policy(EMPTY), clock=time.time)
    events = EventRecorder(KubeClient(api, metrics), metrics, identity="itest")
    source = PolicySource(settings, state, metrics, events, api=api, backoff=RetryPolicy(attempts=None, initial=0.05, maximum=0.5, jitter=0.05))
    runner = Runner()
    runner.start("event recorder", events.run, on_stop=events.wake)
    source.start(runner)
    try:
        assert source.synced.wait(10)
        assert [p.name for p in state.policy.pools] == ["first"]

        def edit(text: str) -> None:
            api.call("PATCH", f"{cm_path}/policy", body={"data": {"policy.yaml": text}}, content_type=MERGE_PATCH)

        edit(BROKEN)
        wait_for("the broken policy refused", lambda: metrics.policy_reloads.labels(result="refused")._value.get() == 1, timeout=10)
        assert [p.name for p in state.policy.pools] == ["first"] and metrics.policy_valid._value.get() == 0
        assert events.flush(10)
        [refusal] = [e for e in api.call("GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")["items"]]
        assert refusal["reason"] == "PolicyRefused" and refusal["type"] == "Warning"
        assert refusal["regarding"]["kind"] == "ConfigMap" and refusal["regarding"]["name"] == "policy"
        assert f"configmap {namespace}/policy:policy.yaml:4: pools[0].name" in refusal["note"]

        edit(policy("second"))
        wait_for("the fixed policy loaded", lambda: metrics.policy_reloads.labels(result="loaded")._value.get() == 2, timeout=10)
        assert [p.name for p in state.policy.pools] == ["second"] and metrics.policy_valid._value.get() == 1

        warnings: list[str] = []
        sink = logger.add(lambda message: warnings.append(message.record["message"]), level="WARNING")
        try:
            api.call("DELETE", f"{cm_path}/policy")
            wait_for("the DELETED event handled", lambda: any("policy ConfigMap deleted" in w for w in warnings), timeout=10)
        finally:
            logger.remove(sink)
        assert [p.name for p in state.policy.pools] == ["second"]
    finally:
        runner.stop()
