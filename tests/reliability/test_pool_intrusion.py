"""Reliability, getting onto the pool without permission: every way we could think of, tried at once
from namespaces that may not use pool `overseas` (rel-team-other, and rel-team-cdn-evil, which looks like
rel-team-cdn but matches no namespace glob). Each attempt must be stopped: refused at admission (the pool
toleration or constraint stripped, so the pod runs elsewhere or waits for a node it may use) or
evicted within EVICTION_SECONDS. Two ways are trusted by design and checked to stay as documented: a
pod in an exempt namespace, and a DaemonSet's pods (the garbage collector removes a pod that only
claims a DaemonSet owner). An intruder protected by its own PodDisruptionBudget is tested apart: its
evictions are refused, and it is deleted once they have been refused for the budget grace
(BUDGET_GRACE_SECONDS here). Each attempt's outcome and time to stop go to docs/reliability.md."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pytest
from kubernetes.client.exceptions import ApiException

from controller.core.model import PLACEMENT_ANNOTATION, TAINT_KEY
from tests.e2e.harness import ControllerSpec, Placer
from tests.e2e.tekton_runs import (
    MATCHING_IMAGE,
    ORDINARY_NODES,
    POOL,
    POOL_LABEL,
    POOL_NODES,
    POOL_TOLERATION,
    TEST_LABEL,
    Runs,
    decision_of,
    events,
    node_of,
    step,
    taskrun,
)
from tests.kube import Api, namespaced, pods
from tests.reliability.cluster_view import intruder_pod
from tests.reliability.suite import TEAM_CDN_EVIL, TEAM_OTHER, Figures
from tests.waiting import StoppedHolding, WaitTimeout, holds_for, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

EVICTION_SECONDS = 10.0  # stated bound: a pod that got onto a pool node is evicted within this
OBSERVE_SECONDS = 8.0  # a pod refused at admission is watched this long: it must never reach the pool
BUDGET_GRACE_SECONDS = 5.0  # EGRESS_PLACER_INTRUDER_BUDGET_GRACE_SECONDS of this module's controller
CONTROLLER = ControllerSpec(env=(("EGRESS_PLACER_INTRUDER_BUDGET_GRACE_SECONDS", str(BUDGET_GRACE_SECONDS)),))
POLICY = "/apis/policy/v1"
Pod = dict[str, Any]
EXEMPT_NAMESPACE = "kube-public"  # in the policy's default exemptNamespaces
POOL_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": TAINT_KEY, "operator": "In", "values": [POOL]}]}]
        }
    }
}
SNEAKY_TEMPLATE = {"tolerations": [POOL_TOLERATION], "nodeSelector": POOL_LABEL, "affinity": POOL_AFFINITY}


@dataclass(frozen=True)
class Result:
    outcome: str
    seconds: float | None  # time to stop (0: at admission); None: not stopped
    stopped: bool


class Attempts:
    """Creates the attempts' objects (labelled for clean-up) and watches what becomes of them."""

    def __init__(self, api: Api, runs: Runs) -> None:
        self.api = api
        self.runs = runs
        self.extra: list[Callable[[], None]] = []  # clean-ups beyond what `runs` deletes

    def pod(self, namespace: str, body: dict[str, Any]) -> float:
        """Create a pod; when it was created (monotonic)."""
        if namespace == EXEMPT_NAMESPACE:
            body = {**body, "metadata": {**body["metadata"], "labels": {TEST_LABEL: self.runs.id}}}
            self.api.create(pods(namespace), body)
            self.extra.append(lambda: self.api.delete(pods(namespace, body["metadata"]["name"]), gracePeriodSeconds=0))
        else:
            self.runs.create_pod(namespace, body)
        return time.monotonic()

    def read(self, namespace: str, name: str) -> Pod | None:
        return self.api.get(pods(namespace, name))

    def kept_off(self, namespace: str, name: str, seconds: float = OBSERVE_SECONDS, asked_node: str | None = None) -> Result:
        """A pod refused at admission: never on a pool node while watched; what it carries and where it is
        (`asked_node`: the nodeName it was created with)."""

        reached = None

        def off_the_pool() -> bool:
            nonlocal reached
            pod = self.read(namespace, name)
            if pod is not None and node_of(pod) in POOL_NODES and "deletionTimestamp" not in pod["metadata"]:
                reached = node_of(pod)
                return False
            return True

        try:
            # Part of the scenario: the pod must NOT reach a pool node within `seconds`.
            holds_for(f"pod {namespace}/{name} off the pool nodes", off_the_pool, seconds=seconds)
        except StoppedHolding:
            return Result(f"reached {reached}", None, False)
        pod = self.read(namespace, name)
        if pod is None:
            return Result("gone", 0.0, True)
        tolerations = pod["spec"].get("tolerations") or []
        pool_tolerations = [t for t in tolerations if t.get("key") == TAINT_KEY or (not t.get("key") and t.get("operator") == "Exists")]
        where = node_of(pod) or f"{pod.get('status', {}).get('phase')} (no node it may use)"
        stripped = "pool toleration stripped at admission" if not pool_tolerations else "toleration kept"
        if asked_node and node_of(pod) != asked_node:
            stripped = f"nodeName {asked_node} removed at admission" + ("" if pool_tolerations else ", no pool toleration")
        return Result(f"{stripped}; {where}", 0.0, not pool_tolerations and node_of(pod) not in POOL_NODES)

    def evicted(
        self, namespace: str, name: str, created: float, patience: float = 20.0, within: float = EVICTION_SECONDS
    ) -> Result:
        """A pod that got onto a pool node: gone (or terminating) `within` seconds? (Watched `patience`
        seconds longer, to tell "late" from "never".)"""
        node = None

        def gone() -> bool:
            nonlocal node
            pod = self.read(namespace, name)
            if pod is None or "deletionTimestamp" in pod["metadata"]:
                return True
            node = node_of(pod) or node
            return False

        try:
            wait_for(f"pod {namespace}/{name} evicted", gone, timeout=max(0.0, created + within + patience - time.monotonic()), interval=0.2)
        except WaitTimeout:
            return Result(f"still on {node} after {within + patience:.0f} s", None, False)
        took = time.monotonic() - created
        return Result(f"on {node or 'a pool node'}, evicted", round(took, 1), took <= within)

    def taskrun_off_pool(self, namespace: str, body: dict[str, Any]) -> Result:
        name = body["metadata"]["name"]
        self.runs.create(namespace, "taskruns", body)
        done = self.runs.wait_succeeded(namespace, "taskruns", [name], timeout=90)
        node = self.runs.nodes_of(namespace, [name])[name]
        reason = decision_of(done[name]).get("reason")
        return Result(f"refused at admission ({reason}); ran on {node}", 0.0, node in ORDINARY_NODES)

    def cleanup(self) -> None:
        for undo in self.extra:
            undo()  # deletes: a 404 is fine


@pytest.fixture
def attempts(api: Api, runs: Runs) -> Iterator[Attempts]:
    made = Attempts(api, runs)
    yield made
    made.cleanup()


def unschedulable(pod: Pod | None) -> bool:
    """The scheduler looked at the pod and found no node for it (PodScheduled False, Unschedulable)."""
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable" for c in conditions)


def budget_observed(api: Api, namespace: str, name: str) -> bool:
    """The disruption controller has computed the budget's status for its current spec."""
    budget = api.call("GET", namespaced(namespace, "poddisruptionbudgets", name, group=POLICY))
    return (budget.get("status") or {}).get("observedGeneration") == budget["metadata"]["generation"]


# -- the attempts --------------------------------------------------------------------------------------


def taskrun_with_toleration(a: Attempts) -> Result:
    return a.taskrun_off_pool(TEAM_OTHER, taskrun(a.runs.name("tr-tolerates"), MATCHING_IMAGE, pod_template=SNEAKY_TEMPLATE))


def pipelinerun_with_toleration(a: Attempts) -> Result:
    name = a.runs.name("pr-tolerates")
    body = {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": name},
        "spec": {
            "pipelineSpec": {"tasks": [{"name": "upload", "taskSpec": {"steps": [step(MATCHING_IMAGE)]}}]},
            "taskRunTemplate": {"podTemplate": SNEAKY_TEMPLATE},
        },
    }
    a.runs.create(TEAM_OTHER, "pipelineruns", body)
    a.runs.wait_succeeded(TEAM_OTHER, "pipelineruns", [name], timeout=90)
    run_pods = a.api.items(pods(TEAM_OTHER), labelSelector=f"tekton.dev/pipelineRun={name}")
    nodes = sorted({node_of(p) or "-" for p in run_pods})
    return Result(f"stripped at TaskRun and Pod admission; ran on {', '.join(nodes)}", 0.0, bool(run_pods) and set(nodes) <= ORDINARY_NODES)


def opt_in_from_a_namespace_not_allowed(a: Attempts) -> Result:
    body = taskrun(a.runs.name("opt-in"), MATCHING_IMAGE, annotations={PLACEMENT_ANNOTATION: POOL})
    return a.taskrun_off_pool(TEAM_OTHER, body)


def renamed_namespace_taskrun(a: Attempts) -> Result:
    return a.taskrun_off_pool(TEAM_CDN_EVIL, taskrun(a.runs.name("evil"), MATCHING_IMAGE, pod_template=SNEAKY_TEMPLATE))


def bare_pod_with_node_name(a: Attempts) -> Result:
    name = a.runs.name("nodename")
    a.pod(TEAM_OTHER, intruder_pod(name, node="egress-1", tolerations=[]))
    return a.kept_off(TEAM_OTHER, name, asked_node="egress-1")


def bare_pod_with_node_name_and_toleration(a: Attempts) -> Result:
    name = a.runs.name("nodename-tol")
    a.pod(TEAM_OTHER, intruder_pod(name, node="egress-2"))
    return a.kept_off(TEAM_OTHER, name, asked_node="egress-2")


def renamed_namespace_pod(a: Attempts) -> Result:
    name = a.runs.name("evil-pod")
    a.pod(TEAM_CDN_EVIL, intruder_pod(name, node="egress-3"))
    return a.kept_off(TEAM_CDN_EVIL, name, asked_node="egress-3")


def bare_pod_with_toleration_and_node_selector(a: Attempts) -> Result:
    name = a.runs.name("selector-tol")
    a.pod(TEAM_OTHER, intruder_pod(name, node=None, nodeSelector=POOL_LABEL))
    return a.kept_off(TEAM_OTHER, name)


def toleration_exists_without_key(a: Attempts) -> Result:
    name = a.runs.name("exists-all")
    a.pod(TEAM_OTHER, intruder_pod(name, node=None, nodeSelector=POOL_LABEL, tolerations=[{"operator": "Exists"}]))
    return a.kept_off(TEAM_OTHER, name)


def toleration_exists_on_the_pool_key(a: Attempts) -> Result:
    name = a.runs.name("exists-key")
    a.pod(TEAM_OTHER, intruder_pod(name, node=None, affinity=POOL_AFFINITY, tolerations=[{"key": TAINT_KEY, "operator": "Exists"}]))
    return a.kept_off(TEAM_OTHER, name)


def deployment_with_toleration(a: Attempts) -> Result:
    name = a.runs.name("deploy")
    labels = {"app": name, TEST_LABEL: a.runs.id}
    template = intruder_pod(name, node=None, nodeSelector=POOL_LABEL)
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": labels}, "spec": template["spec"]}},
    }
    deployments = namespaced(TEAM_OTHER, "deployments", group="/apis/apps/v1")
    a.api.create(deployments, body)
    a.extra.append(lambda: a.api.delete(f"{deployments}/{name}", propagationPolicy="Foreground"))

    def replicas() -> list[str]:
        return sorted(p["metadata"]["name"] for p in a.api.items(pods(TEAM_OTHER), labelSelector=f"app={name}"))

    wait_for("the Deployment's 2 pods", lambda: len(replicas()) == 2, timeout=30)
    results = [a.kept_off(TEAM_OTHER, pod, OBSERVE_SECONDS if i == 0 else 0.5) for i, pod in enumerate(replicas())]  # watched together
    return Result(f"{len(results)} pods: {results[0].outcome}", 0.0, all(r.stopped for r in results))


def toleration_added_by_an_update(a: Attempts) -> Result:
    """Pods may gain tolerations after creation; admission only sees CREATE."""
    name = a.runs.name("late-tol")
    a.pod(TEAM_OTHER, intruder_pod(name, node=None, nodeSelector=POOL_LABEL, tolerations=[]))
    wait_for("the scheduler to find no node for the pod", lambda: unschedulable(a.read(TEAM_OTHER, name)), timeout=20)
    a.api.json_patch(pods(TEAM_OTHER, name), [{"op": "add", "path": "/spec/tolerations/-", "value": POOL_TOLERATION}])
    created = time.monotonic()
    node = wait_for("the pod scheduled after the update", lambda: (p := a.read(TEAM_OTHER, name)) is None or node_of(p), timeout=20)
    result = a.evicted(TEAM_OTHER, name, created)
    return Result(f"scheduled after the update; {result.outcome}" if node else result.outcome, result.seconds, result.stopped)


def protected_by_its_own_disruption_budget(a: Attempts) -> Result:
    """Onto the pool the one way admission does not see: the pool toleration added by an UPDATE."""
    name = a.runs.name("pdb")
    body = intruder_pod(name, node=None, nodeSelector=POOL_LABEL, tolerations=[])
    body["metadata"]["labels"] = {"pdb": name}
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"pdb": name}}}}
    budgets = namespaced(TEAM_OTHER, "poddisruptionbudgets", group=POLICY)
    a.api.create(budgets, budget)
    a.extra.append(lambda: a.api.delete(f"{budgets}/{name}"))
    wait_for("the disruption controller to compute the budget's status", lambda: budget_observed(a.api, TEAM_OTHER, name), timeout=20)
    a.pod(TEAM_OTHER, body)
    a.api.json_patch(pods(TEAM_OTHER, name), [{"op": "add", "path": "/spec/tolerations", "value": [POOL_TOLERATION]}])
    created = time.monotonic()
    result = a.evicted(TEAM_OTHER, name, created, within=BUDGET_GRACE_SECONDS + EVICTION_SECONDS)
    try:
        deleted = wait_for(
            "an IntruderDeletedPastBudgetGrace Event",
            lambda: any(e["regarding"]["name"] == name for e in events(a.api, TEAM_OTHER, "IntruderDeletedPastBudgetGrace")),
            timeout=5,
            interval=0.5,
        )
    except WaitTimeout:
        deleted = False
    if result.stopped and not deleted:
        return Result(f"{result.outcome}, but without an IntruderDeletedPastBudgetGrace Event", result.seconds, False)
    outcome = result.outcome.replace("evicted", "evictions refused by the budget, deleted after the grace")
    return Result(outcome, result.seconds, result.stopped)


def mirror_pod_annotation(a: Attempts) -> Result:
    """A forged annotation is no mirror pod (a kubelet's has its node's Node owner, uid included)."""
    name = a.runs.name("mirror")
    body = intruder_pod(name, node="egress-2")
    body["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "forged"}
    try:
        a.pod(TEAM_OTHER, body)
    except ApiException as e:  # its nodeName removed, the API server refuses a mirror annotation without one
        if e.status != 422 or "must set spec.nodeName" not in (e.body or ""):
            raise
        return Result("nodeName removed at admission; then refused by the API server (a mirror pod needs a nodeName)", 0.0, True)
    return a.kept_off(TEAM_OTHER, name, asked_node="egress-2")


def fake_daemonset_owner(a: Attempts) -> Result:
    """A DaemonSet owner that resolves to no DaemonSet of an agent namespace is no node agent: no pool
    toleration, nodeName removed (and the garbage collector deletes it: no such apps/v1 DaemonSet)."""
    name = a.runs.name("fake-ds")
    body = intruder_pod(name, node="egress-3", tolerations=[])
    body["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent", "uid": str(uuid.uuid4()), "controller": True}]
    a.pod(TEAM_OTHER, body)
    return a.kept_off(TEAM_OTHER, name, asked_node="egress-3")


def exempt_namespace_pod(a: Attempts) -> Result:
    """Exempt namespaces are trusted by design (only cluster admins create pods there): the pod stays."""
    name = a.runs.name("exempt")
    a.pod(EXEMPT_NAMESPACE, intruder_pod(name, node="egress-1"))

    def stays() -> bool:
        pod = a.read(EXEMPT_NAMESPACE, name)
        return pod is not None and "deletionTimestamp" not in pod["metadata"] and node_of(pod) == "egress-1"

    try:
        # Part of the scenario: nothing removes the pod within OBSERVE_SECONDS.
        holds_for(f"pod {EXEMPT_NAMESPACE}/{name} on egress-1", stays, seconds=OBSERVE_SECONDS)
    except StoppedHolding:
        return Result("removed", None, False)
    return Result("stays on egress-1 (exempt namespaces are trusted by design)", None, True)


ATTEMPTS: dict[str, Callable[[Attempts], Result]] = {
    "TaskRun podTemplate with the pool toleration, nodeSelector and affinity (rel-team-other)": taskrun_with_toleration,
    "PipelineRun taskRunTemplate.podTemplate with the same (rel-team-other)": pipelinerun_with_toleration,
    "opt-in annotation egress-placer.io/placement: overseas (rel-team-other)": opt_in_from_a_namespace_not_allowed,
    "'renamed' namespace rel-team-cdn-evil: TaskRun with a matching image and the toleration": renamed_namespace_taskrun,
    "bare Pod with nodeName of a pool node, no toleration": bare_pod_with_node_name,
    "bare Pod with nodeName and the toleration": bare_pod_with_node_name_and_toleration,
    "bare Pod with nodeName and the toleration in rel-team-cdn-evil": renamed_namespace_pod,
    "bare Pod with the toleration and a pool nodeSelector": bare_pod_with_toleration_and_node_selector,
    "toleration operator Exists without a key (tolerates everything)": toleration_exists_without_key,
    "toleration Exists on the pool key, pool node affinity": toleration_exists_on_the_pool_key,
    "Deployment (2 replicas) with the toleration and a pool nodeSelector": deployment_with_toleration,
    "toleration added by an UPDATE after creation (admission sees CREATE only)": toleration_added_by_an_update,
    "Pod with a forged mirror-pod annotation (kubernetes.io/config.mirror) on a pool node": mirror_pod_annotation,
    "Pod with a fake DaemonSet ownerReference (no such DaemonSet) on a pool node": fake_daemonset_owner,
    f"Pod in exempt namespace {EXEMPT_NAMESPACE} on a pool node (trusted by design)": exempt_namespace_pod,
}
BY_DESIGN = {exempt_namespace_pod}  # stays: checked to behave as documented, not counted as a failure


def test_every_way_onto_the_pool_without_permission_is_stopped(
    egress_placer: Placer, attempts: Attempts, figures: Figures
) -> None:
    figures.fault(
        "getting onto the pool without permission",
        f"{len(ATTEMPTS)} ways at once, from rel-team-other and rel-team-cdn-evil (see the table below)",
        f"each refused at admission or evicted within {EVICTION_SECONDS:.0f} s; exempt namespaces trusted by design",
    )
    with ThreadPoolExecutor(max_workers=len(ATTEMPTS)) as pool:
        futures = {what: pool.submit(attempt, attempts) for what, attempt in ATTEMPTS.items()}
        results = {what: future.result() for what, future in futures.items()}
    for what, result in results.items():
        figures.attempt(what, result.outcome, result.seconds, result.stopped)
    not_stopped = {w: r for w, r in results.items() if not r.stopped and ATTEMPTS[w] not in BY_DESIGN}
    by_design = {w: r for w, r in results.items() if ATTEMPTS[w] in BY_DESIGN}
    figures.measured(
        f"{sum(r.stopped for w, r in results.items() if ATTEMPTS[w] not in BY_DESIGN)}/{len(results) - len(by_design)} stopped; "
        f"slowest eviction {max((r.seconds or 0) for r in results.values()):.1f} s; by design: "
        + "; ".join(r.outcome for r in by_design.values()),
        len(not_stopped),
    )

    assert not_stopped == {}, not_stopped
    assert all(r.stopped for r in by_design.values()), by_design


def test_an_intruder_protected_by_its_own_disruption_budget_is_deleted_after_the_grace(
    egress_placer: Placer, attempts: Attempts, figures: Figures
) -> None:
    figures.fault(
        "an intruder protected by its own PodDisruptionBudget (minAvailable 1)",
        "one rel-team-other pod put on a pool node by an UPDATE adding the pool toleration, with a budget selecting it",
        f"evictions refused by the budget; deleted within the grace ({BUDGET_GRACE_SECONDS:.0f} s) + {EVICTION_SECONDS:.0f} s",
    )
    what = "Pod on a pool node protected by its own PodDisruptionBudget (minAvailable 1)"
    result = protected_by_its_own_disruption_budget(attempts)
    figures.attempt(what, result.outcome, result.seconds, result.stopped)
    figures.measured(result.outcome, 0 if result.stopped else 1)

    assert result.stopped, result.outcome
