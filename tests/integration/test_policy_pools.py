"""The policy from the pools API on the real API server (`policy_source: pools`): the EgressPool
objects and the EgressPlacerConfig `cluster` make the policy, in priority order; an edit, a new pool
and a deleted one change it; an object the schema lets through but the loader refuses (a port Go's URL
parser takes and pydantic's does not) is refused as a whole, with a PolicyRefused Event on that
object and the policy in force kept; deleting every object gives the empty policy. The leader's status
writer fills a pool's status, which the CRD's schema takes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from controller.core.policy import PlacementPolicy, load_policy
from controller.core.conversion import MAX_PRIORITY
from controller.core.pools import CONFIG_PLURAL, GROUP, POOL_PLURAL
from controller.core.pools_v1beta1 import served_crds
from controller.kube.client import MERGE_PATCH
from controller.kube.policy_source import PolicySource
from controller.retry import RetryPolicy
from controller.kube.writer import EventRecorder, KubeClient
from controller.metrics import Metrics
from controller.placement_log.view import PlacementLog
from controller.pool_status.reconcile import PoolErrors, PoolStatusWriter
from controller.runner import Runner
from controller.settings import Settings
from controller.state import ClusterState
from tests.kube import Api
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
# Read and written as v1beta1, the storage version the controller reads: no conversion is ever needed.
VERSION = "v1beta1"
POOLS = f"/apis/{GROUP}/{VERSION}/{POOL_PLURAL}"
CONFIGS = f"/apis/{GROUP}/{VERSION}/{CONFIG_PLURAL}"
APPLY = "application/apply-patch+yaml"


def install_crds(api: Api) -> None:
    """Apply the CRDs of k8s/crds/ (the render) and wait until the API server serves them. Nothing here
    reads or writes v1alpha1, so nothing calls their conversion webhook (no controller serves it here)."""
    for crd in served_crds():
        name = crd["metadata"]["name"]
        config = (((crd.get("spec") or {}).get("conversion") or {}).get("webhook") or {}).get("clientConfig")
        if config and api.get(f"{CRDS}/{name}") is not None:
            # An earlier module's local controller left its form (a url): take this one's first, or the apply
            # keeps both, which the API server refuses (devplacer.local_placer.adopt_conversion_form).
            api.merge_patch(f"{CRDS}/{name}", {"spec": {"conversion": {"webhook": {"clientConfig": {"url": config.get("url"), "service": config.get("service")}}}}})
        api.call("PATCH", f"{CRDS}/{name}", body=crd, content_type=APPLY, query={"fieldManager": "tests", "force": "true"})

        def established() -> bool:
            conditions = (api.get(f"{CRDS}/{name}") or {}).get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(f"CRD {name} established", established, timeout=30)


def delete_all(api: Api) -> None:
    for path in (POOLS, CONFIGS):
        for obj in api.items(path):
            api.delete(f"{path}/{obj['metadata']['name']}")
    wait_for("no pools API object left", lambda: not api.items(POOLS) and not api.items(CONFIGS), timeout=30)


def pool(name: str, priority: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "EgressPool", "metadata": {"name": name}, "spec": {"priority": MAX_PRIORITY - priority, "nodes": ["egress-1"], **spec}}  # v1beta1: higher first


@pytest.fixture
def pools_api(api: Api):
    install_crds(api)
    delete_all(api)
    yield api
    delete_all(api)


def names(state: ClusterState) -> list[str]:
    return [p.name for p in state.policy.pools]


def test_the_objects_make_the_policy_and_every_change_is_seen(pools_api: Api, namespace: str) -> None:
    api = pools_api
    api.create(POOLS, pool("late", 20, images=["*/cdn-*"]))
    api.create(POOLS, pool("early", 10))
    api.create(CONFIGS, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "EgressPlacerConfig", "metadata": {"name": "cluster"}, "spec": {"agentNamespaces": ["monitoring"]}})
    settings = Settings(kubeconfig="unused", namespace=namespace, policy_source="pools")
    metrics = Metrics()
    state = ClusterState(PlacementPolicy.empty(), clock=time.time)
    events = EventRecorder(KubeClient(api, metrics), metrics, identity="itest")
    source = PolicySource(settings, state, metrics, events, api=api, backoff=RetryPolicy(attempts=None, initial=0.05, maximum=0.5, jitter=0.05))
    runner = Runner()
    runner.start("event recorder", events.run, on_stop=events.wake)
    source.start(runner)
    try:
        assert source.synced.wait(10)
        assert names(state) == ["early", "late"]
        assert state.policy.agent_namespaces == ("monitoring",)
        assert load_policy(source.loaded_text or "") == state.policy  # the leader stores this copy

        api.merge_patch(f"{POOLS}/late", {"spec": {"priority": MAX_PRIORITY - 5, "images": ["*/uploader*"]}})
        wait_for("the edit seen", lambda: names(state) == ["late", "early"], timeout=10)
        assert state.policy.pool("late").images == ("*/uploader*",)

        api.merge_patch(f"{POOLS}/early", {"spec": {"egressLoad": {"prometheus": {"url": "http://prometheus:99999"}}}})
        wait_for("the bad object refused", lambda: metrics.policy_reloads.labels(result="refused")._value.get() == 1, timeout=10)
        assert names(state) == ["late", "early"] and state.policy.pool("early").egress_load is None
        assert events.flush(10)
        [refusal] = [
            e for e in api.items("/apis/events.k8s.io/v1/namespaces/default/events")
            if e["regarding"].get("uid") == api.get(f"{POOLS}/early")["metadata"]["uid"]
        ]
        assert (refusal["reason"], refusal["type"]) == ("PolicyRefused", "Warning")
        assert (refusal["regarding"]["kind"], refusal["regarding"]["name"]) == ("EgressPool", "early")
        assert "EgressPool early: spec.egressLoad.prometheus.url" in refusal["note"]

        api.call("PATCH", f"{POOLS}/early", body={"spec": {"egressLoad": None}}, content_type=MERGE_PATCH)
        wait_for("the fixed object loaded", lambda: metrics.policy_valid._value.get() == 1, timeout=10)
        api.delete(f"{POOLS}/late")
        wait_for("the deletion seen", lambda: names(state) == ["early"], timeout=10)

        delete_all(api)
        wait_for("no object: the empty policy", lambda: state.policy == PlacementPolicy.empty(), timeout=10)
    finally:
        runner.stop()


def test_the_leaders_status_writer_fills_the_status_the_crd_takes(pools_api: Api, namespace: str) -> None:
    """Through the real API server: the status the writer computes fits the CRD's status schema, is
    read back by the policy source (with the generation it describes) without reloading the policy,
    and follows a refusal and its fix, keeping the last error."""
    api = pools_api
    api.create(POOLS, pool("early", 10, nodes=["egress-1", "egress-2"]))
    settings = Settings(kubeconfig="unused", namespace=namespace, policy_source="pools")
    metrics = Metrics()
    clock = time.time
    state = ClusterState(PlacementPolicy.empty(), clock=clock)
    state.replace("Node", api.items("/api/v1/nodes"))
    client = KubeClient(api, metrics)
    source = PolicySource(settings, state, metrics, api=api, backoff=RetryPolicy(attempts=None, initial=0.05, maximum=0.5, jitter=0.05))
    placements = PlacementLog(state, clock=clock)
    writer = PoolStatusWriter(state, source, client, placements, PoolErrors(clock), clock=clock, min_interval=0.0).reconcile  # a pass: the pools written
    runner = Runner()
    source.start(runner)
    try:
        assert source.synced.wait(10)

        def status() -> dict[str, Any]:
            return (api.get(f"{POOLS}/early") or {}).get("status") or {}

        def stored() -> dict[str, Any]:
            objects, _ = source.pool_objects()
            return dict(objects[0].status) if objects else {}

        assert writer() == ["early"]
        written = status()
        assert (written["nodes"], written["readyNodes"], written["taintedNodes"]) == (2, 2, 0)
        assert written["conditions"][0]["reason"] == "TaintsPending"
        assert written["conditions"][0]["observedGeneration"] == api.get(f"{POOLS}/early")["metadata"]["generation"]
        wait_for("the policy source to see the status", lambda: stored() == written, timeout=10)
        assert writer() == []  # nothing changed: nothing written
        assert metrics.policy_reloads.labels(result="loaded")._value.get() == 1  # a status is not a policy change

        api.merge_patch(f"{POOLS}/early", {"spec": {"egressLoad": {"prometheus": {"url": "http://prometheus:99999"}}}})
        wait_for("the bad object refused", lambda: source.pool_objects()[1] is not None, timeout=10)
        assert writer() == ["early"]
        refused = status()
        assert refused["conditions"][0]["reason"] == "SpecRefused"
        assert refused["conditions"][0]["observedGeneration"] == api.get(f"{POOLS}/early")["metadata"]["generation"]
        assert refused["lastError"]["message"].startswith("EgressPool early: spec.egressLoad.prometheus.url")

        api.call("PATCH", f"{POOLS}/early", body={"spec": {"egressLoad": None}}, content_type=MERGE_PATCH)
        wait_for("the fixed object loaded", lambda: source.pool_objects()[1] is None, timeout=10)
        wait_for("the policy source to see the status", lambda: "lastError" in stored(), timeout=10)
        assert writer() == ["early"]
        fixed = status()
        assert fixed["conditions"][0]["reason"] == "TaintsPending" and fixed["lastError"] == refused["lastError"]
    finally:
        runner.stop()
