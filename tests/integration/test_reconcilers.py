"""The leader's reconcilers end to end on the real API server, fed by the real informers: a node
labelled into the pool gets its taint, loses it when unlabelled, gets it back when it is removed by
hand, and keeps a foreign taint throughout; a pod bound to a pool node from a namespace the pool
does not allow is evicted (with an Event), or only reported in report mode; an allowed pod stays.

The test uses its own KWOK nodes, pool label and pool, and its taint reconciler sees only this test's
nodes (the taint key is egress-placer's fixed one, which the local cluster's pool nodes carry too),
so it disturbs nothing else."""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import pytest

from controller.core.model import TAINT_KEY, NodeState, Taint
from controller.core.policy import load_policy
from controller.kube.client import MERGE_PATCH, KubeApi
from controller.kube.informer import cluster_informers, start_informers
from controller.retry import RetryPolicy
from controller.kube.writer import EventRecorder, KubeClient
from controller.metrics import Metrics
from controller.intruders.reconcile import IntruderReconciler
from controller.reconcile_loop import ReconcileLoop
from controller.taints.reconcile import TaintReconciler
from controller.runner import Runner
from controller.settings import Settings
from controller.state import ClusterState
from devcluster.cluster import node_manifest
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

RUN = uuid.uuid4().hex[:6]
POOL = f"itest-{RUN}"
POOL_LABEL = "itest.egress-placer.io/pool"
POOL_TAINT = Taint(TAINT_KEY, POOL, "NoSchedule")
FOREIGN = Taint("itest.egress-placer.io/foreign", "keep", "NoSchedule")
ALLOWED_NS, DENIED_NS = f"itest-allowed-{RUN}", f"itest-denied-{RUN}"
POLICY = f"""
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: {POOL}
    nodeSelector: {{"{POOL_LABEL}": "{POOL}"}}
    namespaces: ["itest-allowed-*"]
"""
# The brief's promises: a node labelled into the pool is tainted within 5 s; an intruder is evicted within 10 s.
TAINT_WITHIN, EVICT_WITHIN = 5.0, 10.0




def patch_node(api: KubeApi, name: str, body: dict[str, Any]) -> None:
    api.call("PATCH", f"/api/v1/nodes/{name}", body=body, content_type=MERGE_PATCH)


def taints_of(api: KubeApi, name: str) -> set[Taint]:
    return {Taint.from_dict(t) for t in api.call("GET", f"/api/v1/nodes/{name}")["spec"].get("taints") or []}


@pytest.fixture(scope="module")
def nodes(api) -> Iterator[dict[str, str]]:
    """Two KWOK nodes of this test: `plain` (only a foreign taint) and `pool` (in the pool, tainted,
    so the scheduler sends nothing else there)."""
    plain, pool = f"itest-{RUN}-plain", f"itest-{RUN}-pool"
    created = []
    for name, labels, taints in ((plain, {}, [FOREIGN]), (pool, {POOL_LABEL: POOL}, [POOL_TAINT])):
        body = node_manifest(name, labels)
        body["spec"]["taints"] = [t.to_dict() for t in taints]
        api.call("POST", "/api/v1/nodes", body=body)
        created.append(name)
    for ns in (ALLOWED_NS, DENIED_NS):
        api.call("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    yield {"plain": plain, "pool": pool}
    for name in created:
        api.call("DELETE", f"/api/v1/nodes/{name}")
    for ns in (ALLOWED_NS, DENIED_NS):
        api.call("DELETE", f"/api/v1/namespaces/{ns}")


class OwnNodes:
    """The state as the taint reconciler sees it, limited to this test's nodes: the local cluster's
    own pool nodes carry egress-placer's taint, which this test's policy does not know."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    @property
    def policy(self):
        return self.state.policy

    @property
    def policy_in_force(self) -> bool:
        return self.state.policy_in_force

    def node_list(self) -> list[NodeState]:
        return [n for n in self.state.node_list() if n.name.startswith(f"itest-{RUN}-")]

    def node_resource_version(self, name: str) -> str | None:
        return self.state.node_resource_version(name)


class Controller:
    """The leader's side of egress-placer, wired from the real pieces (informers, state, writer,
    reconcilers, loop) with short timings."""

    def __init__(self, api: KubeApi, mode: str) -> None:
        self.metrics = Metrics()
        self.state = ClusterState(load_policy(POLICY), clock=time.time)
        settings = Settings(kubeconfig="unused", watch_timeout_seconds=30, intruder_mode=mode)
        self.informers = cluster_informers(api, self.state, settings, self.metrics, backoff=RetryPolicy(attempts=None, initial=0.05, maximum=0.5, jitter=0.05))
        self.writer = KubeClient(api, self.metrics, retry=RetryPolicy(attempts=3, initial=0.05, maximum=0.5))
        self.events = EventRecorder(self.writer, self.metrics, identity="itest")
        self.taints = TaintReconciler(OwnNodes(self.state), self.writer, self.metrics)
        self.intruders = IntruderReconciler(self.state, self.writer, self.events, self.metrics, settings.intruder_mode)
        self.runner = Runner()
        self.loop = ReconcileLoop(self.state, [self.taints, self.intruders], lambda: True, resync_seconds=2.0)

    def start(self) -> None:
        self.runner.start("event recorder", self.events.run, on_stop=self.events.wake)
        start_informers(self.runner, self.informers)
        for inf in self.informers:
            assert inf.synced.wait(15), inf.resource.name
        self.runner.start("reconcile loop", self.loop.run, on_stop=self.loop.wake)

    def stop(self) -> None:
        self.runner.stop()


@pytest.fixture
def controller(api, nodes, request) -> Iterator[Controller]:
    c = Controller(api, getattr(request, "param", "evict"))
    c.start()
    yield c
    c.stop()


def test_taints_follow_pool_membership_and_foreign_taints_stay(api, nodes, controller):
    node = nodes["plain"]
    wait_for("a first reconcile pass", lambda: controller.loop.passes >= 1, timeout=10)
    assert taints_of(api, node) == {FOREIGN}  # not in the pool: nothing of ours

    patch_node(api, node, {"metadata": {"labels": {POOL_LABEL: POOL}}})
    wait_for(f"{node} tainted for the pool", lambda: taints_of(api, node) == {FOREIGN, POOL_TAINT}, timeout=TAINT_WITHIN)

    patch_node(api, node, {"spec": {"taints": [FOREIGN.to_dict()]}})  # removed by hand
    wait_for(f"{node} tainted for the pool", lambda: taints_of(api, node) == {FOREIGN, POOL_TAINT}, timeout=TAINT_WITHIN)

    patch_node(api, node, {"metadata": {"labels": {POOL_LABEL: None}}})
    wait_for(f"the pool taint off {node}", lambda: taints_of(api, node) == {FOREIGN}, timeout=TAINT_WITHIN)
    changes = controller.metrics.taint_changes
    # Counted once each write returned (a moment after the API server shows it).
    wait_for("the removal counted", lambda: changes.labels(pool=POOL, action="remove")._value.get() == 1, timeout=5)
    assert changes.labels(pool=POOL, action="add")._value.get() == 2


def make_pod(api: KubeApi, namespace: str, name: str, node: str) -> None:
    body = {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,  # a plain Pod that names a pool node: no scheduler, no webhook
            "tolerations": [POOL_TAINT.to_dict() | {"operator": "Equal"}],
            "containers": [{"name": "c", "image": "alpine:3", "command": ["sleep", "inf"]}],
        },
    }
    api.call("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)


def pod_going(api: KubeApi, namespace: str, name: str) -> bool:
    try:
        return bool(api.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")["metadata"].get("deletionTimestamp"))
    except Exception as e:
        return getattr(e, "status", None) == 404


def reasons_about(api: KubeApi, namespace: str, name: str) -> list[str]:
    items = api.call("GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")["items"]
    return [e["reason"] for e in items if e["regarding"].get("name") == name]


def test_an_intruder_is_evicted_and_an_allowed_pod_stays(api, nodes, controller):
    name = f"intruder-{uuid.uuid4().hex[:6]}"
    make_pod(api, ALLOWED_NS, name, nodes["pool"])
    make_pod(api, DENIED_NS, name, nodes["pool"])
    wait_for(f"pod {name} evicted", lambda: pod_going(api, DENIED_NS, name), timeout=EVICT_WITHIN)
    wait_for("an IntruderEvicted Event", lambda: "IntruderEvicted" in reasons_about(api, DENIED_NS, name), timeout=5)
    assert not pod_going(api, ALLOWED_NS, name)
    assert controller.metrics.evictions.labels(pool=POOL, outcome="evicted")._value.get() == 1


@pytest.mark.parametrize("controller", ["report"], indirect=True)
def test_report_mode_reports_an_intruder_and_leaves_it(api, nodes, controller):
    name = f"reported-{uuid.uuid4().hex[:6]}"
    make_pod(api, DENIED_NS, name, nodes["pool"])
    wait_for("an IntruderFound Event", lambda: "IntruderFound" in reasons_about(api, DENIED_NS, name), timeout=EVICT_WITHIN)
    assert not pod_going(api, DENIED_NS, name)
    assert controller.metrics.intruders_reported.labels(pool=POOL)._value.get() == 1
