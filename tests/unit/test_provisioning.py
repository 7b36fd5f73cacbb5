"""Pools whose nodes a provisioner (Karpenter) brings up: the policy's `provisioning` setting and its
validation, and placement at admission when the pool has no Ready node (controller/admission/handlers.py,
`Admission._place`): the pod is still sent to the pool, with no node named, so that it waits Pending and
Karpenter sees the demand. A queued pool queues and gates as ever: its slots count its Ready nodes, the
nodes Karpenter is launching for it (NodeClaims), and one node while there are none (queue.core.launching,
provisioned_nodes)."""

from __future__ import annotations

import pytest

from controller.core.model import POOL_SLOT_GATE
from controller.core.policy import PolicyError, load_policy
from controller.core.pools import policy_from_objects
from controller.queue.core import NODEPOOL_LABEL, QUEUE_ANNOTATION, launching, provisioned_nodes
from controller.queue.reconcile import QueueReconciler
from tests.unit.test_admission_handlers import (
    DATA,
    EGRESS_NODES,
    EGRESS_TOLERATION,
    Env,
    decision_of,
    preferred_node,
    required_terms,
    taskrun,
    RecordingSink,
    tekton_pod,
)
from tests.unit.test_queue_admission import FakeReleaser, queue_some

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
PROVISIONED = "    provisioning: {karpenter: {nodePool: egress}}\n"
POLICY = (DATA / "policy.yaml").read_text()


def policy_text(provisioned: bool, queued: bool = False, placement: str = "required") -> str:
    extra = f"    placement: {placement}\n"
    extra += PROVISIONED if provisioned else ""
    extra += "    queue: {runsPerNode: 1, maxQueueSeconds: 60}\n" if queued else ""
    old = '    namespaces: ["team-ci", "team-web"]\n'
    return POLICY.replace(old, old + extra)


def env_with(provisioned: bool, ready: bool, queued: bool = False, placement: str = "required") -> Env:
    env = Env()
    env.state.set_policy(load_policy(policy_text(provisioned, queued, placement)))
    env.admission.wall = lambda: env.now
    if not ready:
        for name in EGRESS_NODES:
            env.state.apply("Node", "DELETED", {"metadata": {"name": name}})
    return env


def spec_of(obj: dict) -> dict:
    return obj["spec"].get("podTemplate", {}) if obj["kind"] == "TaskRun" else obj["spec"]


@pytest.mark.parametrize("kind", ["TaskRun", "Pod"])
@pytest.mark.parametrize(
    ("provisioned", "ready", "placement", "pool", "node_named", "note"),
    [
        (False, True, "required", "egress", True, ""),
        (True, True, "required", "egress", True, ""),  # nodes exist: as any pool
        (False, False, "required", None, False, "has no ready node"),  # today's behaviour, kept
        (False, False, "preferred", None, False, "has no ready node"),
        (True, False, "required", "egress", False, "left to NodePool egress to provision"),
        (True, False, "preferred", "egress", False, "left to NodePool egress to provision"),
    ],
)
def test_placement_without_ready_nodes(
    kind: str, provisioned: bool, ready: bool, placement: str, pool: str | None, node_named: bool, note: str
) -> None:
    env = env_with(provisioned, ready, placement=placement)
    _, patched, _ = env.review(taskrun() if kind == "TaskRun" else tekton_pod())
    spec = spec_of(patched)
    record = decision_of(patched)
    assert record["pool"] == pool and bool(record["node"]) == node_named and note in record["message"]
    assert (spec.get("tolerations") == [EGRESS_TOLERATION]) == (pool is not None)
    assert (preferred_node(spec) is not None) == node_named
    if pool is not None and placement == "required":
        assert required_terms(spec) == [{"matchExpressions": [{"key": "egress-placer.io/egress", "operator": "In", "values": ["fast"]}]}]
    if kind == "Pod":
        assert (patched["metadata"]["annotations"].get(DO_NOT_DISRUPT) == "true") == (pool is not None)
    if pool is not None:
        assert env.events.sent[0]["reason"] == "Placed"
    assert len(env.state.load.ledger) == (1 if node_named else 0)  # nothing assumed on a node that does not exist


def test_a_queued_provisioned_pool_without_nodes_still_queues_and_gates() -> None:
    """0 Ready nodes: the run is queued all the same (placed on the pool, no node named); its queue counts one
    node while none is Ready or launching (`provisioned_nodes`), so a slot is free and its release brings a node
    up. Another queue manager's run's pod waits at the slot gate as on any queued pool."""
    env = env_with(provisioned=True, ready=False, queued=True)
    _, run, _ = env.review(taskrun())
    assert run["spec"]["status"] == "TaskRunPending" and QUEUE_ANNOTATION in run["metadata"]["annotations"]
    assert run["spec"]["podTemplate"]["tolerations"] == [EGRESS_TOLERATION]
    (queued,) = [e for e in env.events.sent if e["reason"] == "Queued"]
    assert "a slot is free" in queued["note"]
    _, pod, _ = env.review(tekton_pod(taskrun_name="other-1", name="other-1-pod"))
    assert pod["spec"]["tolerations"] == [EGRESS_TOLERATION]
    assert [g["name"] for g in pod["spec"]["schedulingGates"]] == [POOL_SLOT_GATE]


def claim(name: str, node: str = "", labels: dict[str, str] | None = None, deleting: bool = False) -> dict:
    meta: dict = {"name": name, "labels": {"egress-placer.io/egress": "fast", NODEPOOL_LABEL: "egress"} if labels is None else labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    return {"metadata": meta, "status": {"nodeName": node} if node else {}}


def test_launching_counts_the_pools_live_nodeclaims_less_its_counted_nodes() -> None:
    selector = {"egress-placer.io/egress": "fast"}
    claims = [claim("a"), claim("b", node="kwok-b"), claim("c"),
              claim("d", labels={NODEPOOL_LABEL: "egress"}),  # a template without the pool's label: no member
              claim("e", deleting=True), {"metadata": "junk"}, "junk"]
    assert launching(claims, selector, 0) == 3
    assert launching(claims, selector, 1) == 2  # a Ready node of the NodePool, whether its claim names it yet or not
    assert launching(claims, selector, 5) == 0
    assert [provisioned_nodes(r, n) for r, n in [(0, 0), (0, 2), (3, 0), (2, 1)]] == [1, 2, 3, 3]


def test_a_ready_nodepool_node_is_not_counted_again_by_its_claim() -> None:
    env = env_with(provisioned=True, ready=False, queued=True)
    releaser = FakeReleaser(env)
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    env.state.apply("Node", "ADDED", {"metadata": {"name": "kwok-a", "labels": {"egress-placer.io/egress": "fast", NODEPOOL_LABEL: "egress"}},
                                      "spec": {"taints": [{"key": "egress-placer.io/pool", "value": "egress", "effect": "NoSchedule"}]},
                                      "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert env.state.queue.counted_nodes(env.state.policy.pool("egress")) == ["kwok-a"]
    releaser.claims = [claim("a"), claim("b")]  # kwok-a is Ready, its claim does not name it yet; b launches
    queue_some(env, "team-ci", 3)
    reconciler()
    assert reconciler.plans["egress"].slots == 2 and len(releaser.calls) == 2  # not 3: kwok-a counted once


def test_the_queue_of_a_provisioned_pool_at_zero_releases_one_nodes_runs_then_counts_launching_nodes() -> None:
    env = env_with(provisioned=True, ready=False, queued=True)  # runsPerNode 1
    releaser = FakeReleaser(env)
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    queue_some(env, "team-ci", 4)
    assert reconciler() is not None  # runs wait: it looks again for NodeClaims (they change nothing watched)
    assert [c[2] for c in releaser.calls] == ["team-ci-0"]  # one node's worth, before any node exists
    assert releaser.claims_asked == ["egress"]
    releaser.claims = [claim("a")]  # Karpenter launches the node for it: still one node, taken by team-ci-0
    reconciler()
    assert len(releaser.calls) == 1
    releaser.claims = [claim("a"), claim("b"), claim("c")]  # 3 launching: 2 more slots
    reconciler()
    assert [c[2] for c in releaser.calls] == ["team-ci-0", "team-ci-1", "team-ci-2"]
    releaser.claims = None  # unreadable: counted as none launching (one node at zero), so nothing more
    reconciler()
    assert len(releaser.calls) == 3 and reconciler.plans["egress"].slots == 1


def test_a_queued_provisioned_pool_with_nodes_is_capped_as_before() -> None:
    env = env_with(provisioned=True, ready=True, queued=True)
    _, run, _ = env.review(taskrun())
    assert run["spec"]["status"] == "TaskRunPending" and QUEUE_ANNOTATION in run["metadata"]["annotations"]
    _, pod, _ = env.review(tekton_pod(taskrun_name="other-1", name="other-1-pod"))
    assert [g["name"] for g in pod["spec"]["schedulingGates"]] == [POOL_SLOT_GATE]


PROVISIONING_ERROR = "provisioning needs a pool chosen by nodeSelector alone"


@pytest.mark.parametrize(
    ("members", "error"),
    [
        ("nodeSelector: {egress-placer.io/egress: fast}", None),
        ("nodes: [lab-1]", PROVISIONING_ERROR),
        ("nodeSelector: {egress-placer.io/egress: fast}\n    nodes: [lab-1]", PROVISIONING_ERROR),
    ],
)
def test_provisioning_needs_a_pool_chosen_by_labels(members: str, error: str | None) -> None:
    text = (
        "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npools:\n"
        f"  - name: egress\n    {members}\n    provisioning: {{karpenter: {{nodePool: egress-nodes}}}}\n"
    )
    if error is None:
        pool = load_policy(text, "p.yaml").pools[0]
        assert pool.provisioning is not None and pool.provisioning.karpenter.node_pool == "egress-nodes"
        return
    with pytest.raises(PolicyError) as e:
        load_policy(text, "p.yaml")
    assert f"p.yaml:{text.splitlines().index('    provisioning: {karpenter: {nodePool: egress-nodes}}') + 1}: pools[0].provisioning: {error}" in str(e.value)


@pytest.mark.parametrize(
    ("provisioning", "error"),
    [
        ({"karpenter": {}}, "karpenter.nodePool: Field required"),
        ({"karpenter": {"nodePool": "Not_A_Name"}}, "not a valid node name"),
        ({"cluster-autoscaler": {}}, "Extra inputs are not permitted"),
    ],
)
def test_bad_provisioning_is_refused_naming_the_field(provisioning: dict, error: str) -> None:
    pool = {"apiVersion": "egress-placer.io/v1alpha1", "kind": "EgressPool", "metadata": {"name": "egress"},
            "spec": {"nodeSelector": {"egress-placer.io/egress": "fast"}, "provisioning": provisioning}}
    with pytest.raises(PolicyError) as e:
        policy_from_objects([pool])
    assert "EgressPool egress: spec.provisioning" in str(e.value) and error in str(e.value)


def test_an_egress_pool_listing_nodes_may_not_be_provisioned() -> None:
    pool = {"apiVersion": "egress-placer.io/v1alpha1", "kind": "EgressPool", "metadata": {"name": "lab"},
            "spec": {"nodes": ["lab-1"], "provisioning": {"karpenter": {"nodePool": "lab"}}}}
    with pytest.raises(PolicyError) as e:
        policy_from_objects([pool])
    assert f"EgressPool lab: spec.provisioning: {PROVISIONING_ERROR}" in str(e.value)
