"""End to end, node agents on pool nodes, with the local cluster's real DaemonSet controller (KWOK
nodes): a kube-system DaemonSet created without the pool toleration gets it in its template at
admission and runs on every pool node, and comes back on a node labelled into the pool later; a
DaemonSet of a namespace that may not use the pool gets nothing and stays off the pool nodes; and
DaemonSets that existed before the controller started (the pool taints were already there, as a
controller that stopped leaves them) are reported missing on the pool nodes (Event, metric,
`egress-placer status`) and changed only where their owner opted in."""

from __future__ import annotations

import io
import json
import time
import uuid
from typing import Any, Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tekton_runs import ORDINARY_NODES, POOL, POOL_NODES, TEAM_OTHER, Waiter, events

from controller.cli.status import run_status
from controller.core.agents import POOL_TOLERATIONS_ANNOTATION, TOLERATIONS_ADDED_ANNOTATION
from controller.core.model import TAINT_KEY
from controller.settings import Settings
from devcluster.cluster import Cluster
from devcluster.controller import WEBHOOK_CONFIG
from running_controller import EgressPlacer

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

AGENTS = "kube-system"  # an agent namespace (the e2e policy's default: the exempt namespaces)
POOL_TAINT = {"key": TAINT_KEY, "value": POOL, "effect": "NoSchedule"}
POOL_LABEL = {TAINT_KEY: POOL}
JOIN_NODE = "node-3"  # labelled into the pool by one test (and back)
ON_POOL_SECONDS = 30.0  # the bar: on every pool node within this


def daemonset(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A node agent without any toleration, as a CNI or log shipper manifest often is."""
    meta: dict[str, Any] = {"name": name, "labels": {"e2e.egress-placer.io/test": "agents"}}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "agent", "image": "registry.example.com/node-agent:1"}]},
            },
        },
    }


def nodes_running(core: client.CoreV1Api, namespace: str, name: str) -> set[str]:
    """The nodes where a pod of DaemonSet namespace/name is Running (and not being deleted)."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"app={name}").items
    return {
        p.spec.node_name
        for p in pods
        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None and p.spec.node_name
    }


def template_tolerations(apps: client.AppsV1Api, namespace: str, name: str) -> list[dict[str, Any]]:
    ds = apps.read_namespaced_daemon_set(name, namespace)
    return [apps.api_client.sanitize_for_serialization(t) for t in ds.spec.template.spec.tolerations or []]


def set_pool_taints(core: client.CoreV1Api) -> None:
    """The pool taint on every pool node, as a controller that ran and stopped leaves it."""
    for name in POOL_NODES:
        node = core.read_node(name)
        taints = [core.api_client.sanitize_for_serialization(t) for t in node.spec.taints or [] if t.key != TAINT_KEY]
        core.patch_node(name, {"spec": {"taints": [*taints, POOL_TAINT]}})


def delete_daemonset(apps: client.AppsV1Api, namespace: str, name: str) -> None:
    try:
        apps.delete_namespaced_daemon_set(name, namespace, propagation_policy="Background")
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture(scope="module")
def existing_agents(kube: client.ApiClient, wait_for: Waiter) -> Iterator[tuple[str, str]]:
    """Two kube-system DaemonSets made while no egress-placer runs (its webhook configuration absent)
    and the pool nodes are tainted: one left to its owner, one opted in by annotation. Requested
    before `egress_placer`, so they exist when the controller starts."""
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    admission = client.AdmissionregistrationV1Api(kube)
    assert WEBHOOK_CONFIG not in {w.metadata.name for w in admission.list_mutating_webhook_configuration().items}
    set_pool_taints(core)
    suffix = uuid.uuid4().hex[:6]
    reported, opted_in = f"old-agent-{suffix}", f"old-opted-in-{suffix}"
    apps.create_namespaced_daemon_set(AGENTS, daemonset(reported))
    apps.create_namespaced_daemon_set(AGENTS, daemonset(opted_in, {POOL_TOLERATIONS_ANNOTATION: "patch"}))
    for name in (reported, opted_in):
        wait_for(f"{name} on the ordinary nodes", lambda name=name: nodes_running(core, AGENTS, name) == ORDINARY_NODES, timeout=60)
    yield reported, opted_in
    for name in (reported, opted_in):
        delete_daemonset(apps, AGENTS, name)


@pytest.fixture(scope="module")
def placer(existing_agents: tuple[str, str], egress_placer: EgressPlacer) -> EgressPlacer:
    """egress-placer, started after the existing DaemonSets were made."""
    return egress_placer


@pytest.fixture
def made(kube: client.ApiClient) -> Iterator[list[tuple[str, str]]]:
    """(namespace, name) of the DaemonSets a test makes; deleted afterwards."""
    out: list[tuple[str, str]] = []
    yield out
    for namespace, name in out:
        delete_daemonset(client.AppsV1Api(kube), namespace, name)


@pytest.fixture
def join_node(kube: client.ApiClient) -> Iterator[str]:
    """node-3, whose pool label is removed at the end (it leaves the pool again)."""
    core = client.CoreV1Api(kube)
    labels = dict(core.read_node(JOIN_NODE).metadata.labels or {})
    yield JOIN_NODE
    if TAINT_KEY not in labels:
        core.patch_node(JOIN_NODE, {"metadata": {"labels": {TAINT_KEY: None}}})


def test_a_new_node_agent_runs_on_every_pool_node_also_one_labelled_in_later(
    placer: EgressPlacer, kube: client.ApiClient, made: list, join_node: str, wait_for: Waiter, record_property: Any
) -> None:
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    name = f"cni-{uuid.uuid4().hex[:6]}"
    created = time.monotonic()
    apps.create_namespaced_daemon_set(AGENTS, daemonset(name))
    made.append((AGENTS, name))
    everywhere = POOL_NODES | ORDINARY_NODES
    wait_for(f"{name} on every node", lambda: nodes_running(core, AGENTS, name) == everywhere, timeout=ON_POOL_SECONDS)
    seconds = time.monotonic() - created
    record_property("agent_on_every_pool_node_seconds", round(seconds, 2))
    print(f"\n{name}: on all {len(POOL_NODES)} pool nodes {seconds:.1f} s after its creation")
    assert {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in template_tolerations(apps, AGENTS, name)
    ds = apps.read_namespaced_daemon_set(name, AGENTS)
    assert json.loads(ds.metadata.annotations[TOLERATIONS_ADDED_ANNOTATION])["by"] == "admission"

    core.patch_node(join_node, {"metadata": {"labels": POOL_LABEL}})
    wait_for(f"{join_node}, labelled into the pool, to be tainted", lambda: any(
        t.key == TAINT_KEY for t in core.read_node(join_node).spec.taints or []), timeout=10)
    (pod,) = [p for p in core.list_namespaced_pod(AGENTS, label_selector=f"app={name}").items if p.spec.node_name == join_node]
    core.delete_namespaced_pod(pod.metadata.name, AGENTS, grace_period_seconds=0)
    wait_for(f"{name} back on {join_node}, now a tainted pool node", lambda: (
        any(p.spec.node_name == join_node and p.metadata.uid != pod.metadata.uid and p.status.phase == "Running"
            for p in core.list_namespaced_pod(AGENTS, label_selector=f"app={name}").items)), timeout=ON_POOL_SECONDS)


def test_a_daemonset_of_a_namespace_that_may_not_use_the_pool_stays_off_it(
    placer: EgressPlacer, kube: client.ApiClient, made: list, wait_for: Waiter
) -> None:
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    tenant, agent = f"tenant-agent-{uuid.uuid4().hex[:6]}", f"agent-{uuid.uuid4().hex[:6]}"
    apps.create_namespaced_daemon_set(TEAM_OTHER, daemonset(tenant))
    made.append((TEAM_OTHER, tenant))
    apps.create_namespaced_daemon_set(AGENTS, daemonset(agent))
    made.append((AGENTS, agent))
    # Both were made at the same time: once the agent runs everywhere and the tenant's on every
    # ordinary node, the DaemonSet controller has made every pod it would make.
    wait_for(f"{agent} on every node", lambda: nodes_running(core, AGENTS, agent) == POOL_NODES | ORDINARY_NODES, timeout=ON_POOL_SECONDS)
    wait_for(f"{tenant} on the ordinary nodes", lambda: nodes_running(core, TEAM_OTHER, tenant) == ORDINARY_NODES, timeout=ON_POOL_SECONDS)
    assert template_tolerations(apps, TEAM_OTHER, tenant) == []
    pods = core.list_namespaced_pod(TEAM_OTHER, label_selector=f"app={tenant}").items
    assert not [p.metadata.name for p in pods if p.spec.node_name in POOL_NODES]


def test_existing_node_agents_are_reported_and_patched_only_when_opted_in(
    placer: EgressPlacer, existing_agents: tuple[str, str], devcluster: Cluster, kube: client.ApiClient, wait_for: Waiter
) -> None:
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    reported, opted_in = existing_agents

    # Opted in: its template gets the toleration, recorded, and its pods come to the pool nodes.
    wait_for(f"{opted_in} on every node", lambda: nodes_running(core, AGENTS, opted_in) == POOL_NODES | ORDINARY_NODES,
             timeout=ON_POOL_SECONDS)
    ds = apps.read_namespaced_daemon_set(opted_in, AGENTS)
    record = json.loads(ds.metadata.annotations[TOLERATIONS_ADDED_ANNOTATION])
    assert record["by"] == "leader" and record["added"] == [f"{TAINT_KEY}:NoSchedule"]
    assert [e for e in events(kube, AGENTS, "PoolTolerationsAdded") if e["regarding"]["name"] == opted_in]

    # Not opted in: reported (Event on the DaemonSet, the metric), its template left as it is.
    wait_for(f"an AgentMissingOnPool Event regarding {reported}", lambda: [
        e for e in events(kube, AGENTS, "AgentMissingOnPool") if e["regarding"]["name"] == reported], timeout=30)
    assert placer.metric("egress_placer_agent_pool_nodes_missing", {"namespace": AGENTS, "daemonset": reported}) == len(POOL_NODES)
    assert template_tolerations(apps, AGENTS, reported) == []
    assert TOLERATIONS_ADDED_ANNOTATION not in (apps.read_namespaced_daemon_set(reported, AGENTS).metadata.annotations or {})
    assert nodes_running(core, AGENTS, reported) == ORDINARY_NODES

    # `egress-placer status` says the same, and exits 1.
    out = io.StringIO()
    assert run_status(Settings(kubeconfig=str(devcluster.kubeconfig)), out, as_json=True) == 1
    rows = json.loads(out.getvalue())
    assert {r["node"] for r in rows if f"{AGENTS}/{reported}" in r["agents_missing"]} == set(POOL_NODES)
    assert not [r for r in rows if f"{AGENTS}/{opted_in}" in r["agents_missing"]]
