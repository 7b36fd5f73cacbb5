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

from controller.cli.status import run_status
from controller.agents.core import POOL_TOLERATIONS_ANNOTATION, TOLERATIONS_ADDED_ANNOTATION
from controller.core.model import TAINT_KEY
from controller.settings import Settings
from devcluster.cluster import Cluster
from devplacer.local_placer import WEBHOOK_CONFIG
from tests.e2e.harness import Placer
from tests.e2e.tekton_runs import ORDINARY_NODES, POOL_LABEL, POOL_NODES, POOL_TAINT, TEAM_OTHER, events, node_of
from tests.kube import Api, namespaced, node, pods
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

AGENTS = "kube-system"  # an agent namespace (the e2e policy's default: the exempt namespaces)
APPS = "/apis/apps/v1"
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


def daemonsets(namespace: str, name: str = "") -> str:
    return namespaced(namespace, "daemonsets", name, group=APPS)


def agent_pods(api: Api, namespace: str, name: str) -> list[dict[str, Any]]:
    return api.items(pods(namespace), labelSelector=f"app={name}")


def nodes_running(api: Api, namespace: str, name: str) -> set[str]:
    """The nodes where a pod of DaemonSet namespace/name is Running (and not being deleted)."""
    return {
        node_of(p)
        for p in agent_pods(api, namespace, name)
        if (p.get("status") or {}).get("phase") == "Running" and "deletionTimestamp" not in p["metadata"] and node_of(p)
    }


def daemonset_of(api: Api, namespace: str, name: str) -> dict[str, Any]:
    ds = api.get(daemonsets(namespace, name))
    assert ds is not None, f"DaemonSet {namespace}/{name} is gone"
    return ds


def template_tolerations(api: Api, namespace: str, name: str) -> list[dict[str, Any]]:
    return daemonset_of(api, namespace, name)["spec"]["template"]["spec"].get("tolerations") or []


def taints_of(api: Api, name: str) -> list[dict[str, Any]]:
    return ((api.get(node(name)) or {}).get("spec") or {}).get("taints") or []


def set_pool_taints(api: Api) -> None:
    """The pool taint on every pool node, as a controller that ran and stopped leaves it."""
    for name in POOL_NODES:
        taints = [t for t in taints_of(api, name) if t.get("key") != TAINT_KEY]
        api.merge_patch(node(name), {"spec": {"taints": [*taints, POOL_TAINT]}})


def delete_daemonset(api: Api, namespace: str, name: str) -> None:
    api.delete(daemonsets(namespace, name), propagationPolicy="Background")


@pytest.fixture(scope="module")
def existing_agents(api: Api) -> Iterator[tuple[str, str]]:
    """Two kube-system DaemonSets made while no egress-placer runs (its webhook configuration absent)
    and the pool nodes are tainted: one left to its owner, one opted in by annotation. Requested
    before `egress_placer`, so they exist when the controller starts."""
    hooks = api.items("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations")
    assert WEBHOOK_CONFIG not in {w["metadata"]["name"] for w in hooks}
    set_pool_taints(api)
    suffix = uuid.uuid4().hex[:6]
    reported, opted_in = f"old-agent-{suffix}", f"old-opted-in-{suffix}"
    api.create(daemonsets(AGENTS), daemonset(reported))
    api.create(daemonsets(AGENTS), daemonset(opted_in, {POOL_TOLERATIONS_ANNOTATION: "patch"}))
    for name in (reported, opted_in):
        wait_for(f"{name} on the ordinary nodes", lambda name=name: nodes_running(api, AGENTS, name) == ORDINARY_NODES, timeout=60)
    yield reported, opted_in
    for name in (reported, opted_in):
        delete_daemonset(api, AGENTS, name)


@pytest.fixture(scope="module")
def placer(existing_agents: tuple[str, str], egress_placer: Placer) -> Placer:
    """egress-placer, started after the existing DaemonSets were made."""
    return egress_placer


@pytest.fixture
def made(api: Api) -> Iterator[list[tuple[str, str]]]:
    """(namespace, name) of the DaemonSets a test makes; deleted afterwards."""
    out: list[tuple[str, str]] = []
    yield out
    for namespace, name in out:
        delete_daemonset(api, namespace, name)


@pytest.fixture
def join_node(api: Api) -> Iterator[str]:
    """node-3, whose pool label is removed at the end (it leaves the pool again)."""
    labels = dict(((api.get(node(JOIN_NODE)) or {}).get("metadata") or {}).get("labels") or {})
    yield JOIN_NODE
    if TAINT_KEY not in labels:
        api.merge_patch(node(JOIN_NODE), {"metadata": {"labels": {TAINT_KEY: None}}})


def test_a_new_node_agent_runs_on_every_pool_node_also_one_labelled_in_later(
    placer: Placer, api: Api, made: list, join_node: str, record_property: Any
) -> None:
    name = f"cni-{uuid.uuid4().hex[:6]}"
    created = time.monotonic()
    api.create(daemonsets(AGENTS), daemonset(name))
    made.append((AGENTS, name))
    everywhere = POOL_NODES | ORDINARY_NODES
    wait_for(f"{name} on every node", lambda: nodes_running(api, AGENTS, name) == everywhere, timeout=ON_POOL_SECONDS)
    seconds = time.monotonic() - created
    record_property("agent_on_every_pool_node_seconds", round(seconds, 2))
    print(f"\n{name}: on all {len(POOL_NODES)} pool nodes {seconds:.1f} s after its creation")
    assert {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in template_tolerations(api, AGENTS, name)
    ds = daemonset_of(api, AGENTS, name)
    assert json.loads(ds["metadata"]["annotations"][TOLERATIONS_ADDED_ANNOTATION])["by"] == "admission"

    api.merge_patch(node(join_node), {"metadata": {"labels": POOL_LABEL}})
    wait_for(f"{join_node}, labelled into the pool, to be tainted",
             lambda: any(t.get("key") == TAINT_KEY for t in taints_of(api, join_node)), timeout=10)
    (pod,) = [p for p in agent_pods(api, AGENTS, name) if node_of(p) == join_node]
    api.delete(pods(AGENTS, pod["metadata"]["name"]), gracePeriodSeconds=0)
    wait_for(f"{name} back on {join_node}, now a tainted pool node", lambda: any(
        node_of(p) == join_node and p["metadata"]["uid"] != pod["metadata"]["uid"] and (p.get("status") or {}).get("phase") == "Running"
        for p in agent_pods(api, AGENTS, name)), timeout=ON_POOL_SECONDS)


def test_a_daemonset_of_a_namespace_that_may_not_use_the_pool_stays_off_it(
    placer: Placer, api: Api, made: list
) -> None:
    tenant, agent = f"tenant-agent-{uuid.uuid4().hex[:6]}", f"agent-{uuid.uuid4().hex[:6]}"
    api.create(daemonsets(TEAM_OTHER), daemonset(tenant))
    made.append((TEAM_OTHER, tenant))
    api.create(daemonsets(AGENTS), daemonset(agent))
    made.append((AGENTS, agent))
    # Both were made at the same time: once the agent runs everywhere and the tenant's on every
    # ordinary node, the DaemonSet controller has made every pod it would make.
    wait_for(f"{agent} on every node", lambda: nodes_running(api, AGENTS, agent) == POOL_NODES | ORDINARY_NODES, timeout=ON_POOL_SECONDS)
    wait_for(f"{tenant} on the ordinary nodes", lambda: nodes_running(api, TEAM_OTHER, tenant) == ORDINARY_NODES, timeout=ON_POOL_SECONDS)
    assert template_tolerations(api, TEAM_OTHER, tenant) == []
    assert not [p["metadata"]["name"] for p in agent_pods(api, TEAM_OTHER, tenant) if node_of(p) in POOL_NODES]


def test_existing_node_agents_are_reported_and_patched_only_when_opted_in(
    placer: Placer, existing_agents: tuple[str, str], devcluster: Cluster, api: Api
) -> None:
    reported, opted_in = existing_agents

    # Opted in: its template gets the toleration, recorded, and its pods come to the pool nodes.
    wait_for(f"{opted_in} on every node", lambda: nodes_running(api, AGENTS, opted_in) == POOL_NODES | ORDINARY_NODES,
             timeout=ON_POOL_SECONDS)
    record = json.loads(daemonset_of(api, AGENTS, opted_in)["metadata"]["annotations"][TOLERATIONS_ADDED_ANNOTATION])
    assert record["by"] == "leader" and record["added"] == [f"{TAINT_KEY}:NoSchedule"]
    assert [e for e in events(api, AGENTS, "PoolTolerationsAdded") if e["regarding"]["name"] == opted_in]

    # Not opted in: reported (Event on the DaemonSet, the metric), its template left as it is.
    wait_for(f"an AgentMissingOnPool Event regarding {reported}", lambda: [
        e for e in events(api, AGENTS, "AgentMissingOnPool") if e["regarding"]["name"] == reported], timeout=30)
    assert placer.metric("egress_placer_agent_pool_nodes_missing", {"namespace": AGENTS, "daemonset": reported}) == len(POOL_NODES)
    assert template_tolerations(api, AGENTS, reported) == []
    assert TOLERATIONS_ADDED_ANNOTATION not in (daemonset_of(api, AGENTS, reported)["metadata"].get("annotations") or {})
    assert nodes_running(api, AGENTS, reported) == ORDINARY_NODES

    # `egress-placer status` says the same, and exits 1.
    out = io.StringIO()
    settings = Settings(kubeconfig=str(devcluster.kubeconfig), policy_source="configmap")  # this module's controller reads the ConfigMap
    assert run_status(settings, out, as_json=True) == 1
    rows = json.loads(out.getvalue())
    assert {r["node"] for r in rows if f"{AGENTS}/{reported}" in r["agents_missing"]} == set(POOL_NODES)
    assert not [r for r in rows if f"{AGENTS}/{opted_in}" in r["agents_missing"]]
