"""egress-placer beside Kyverno (issue #25): three common Kyverno mutate ClusterPolicies on Pods, each in an
allowed (team-cdn) and a not-allowed (team-other) namespace of pool `overseas`, and what wins.

One cluster of this module's own (`kyverno_cluster`: core plus Kyverno, `up --with kyverno`), egress-placer
started on it with the e2e suite's policy and the pool guard (`running_placer`). Kyverno's mutating webhook
configuration (`kyverno-resource-mutating-webhook-cfg`) sorts after ours (`egress-placer`), and both are
`reinvocationPolicy: IfNeeded` on Pods: ours runs, Kyverno's changes the pod, ours runs again, Kyverno's once
more if ours changed it. Each policy is awaited in force on a probe namespace our webhooks skip.

What is checked, per policy: an allowed run's pod is placed on the pool and Succeeds there, with what the
policy added; a not-allowed run's pod never reaches a pool node (the guard refuses what would); a plain
pod of the not-allowed namespace never reaches a pool node. See docs/coexistence.md, "Kyverno".
"""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from controller.pool_guard.core import GUARD_NAME
from devcluster import kyverno
from devcluster.cluster import Cluster
from devcluster.pytest_plugin import brought_up, reporter
from devplacer.local_placer import NAMESPACE
from tests.coexist.conftest import not_built, skip_reason
from tests.e2e.harness import POLICY_FILE, Placer, running_placer
from tests.e2e.tekton_runs import (
    MATCHING_IMAGE,
    ORDINARY_NODES,
    POOL,
    POOL_NODES,
    TEAM_CDN,
    TEAM_OTHER,
    Runs,
    decision_of,
    node_of,
    taskrun,
)
from tests.kube import Api, api_for, namespace, namespaced, pods
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.coexist]

PROBE = "kyverno-probe"  # in every policy's match; egress-placer's webhooks skip it: only Kyverno mutates there
POOL_LABEL = "egress-placer.io/pool"
UNRELATED = {"key": "example.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
BLANKET = {"operator": "Exists"}
# name -> the JSON patch a user would write (Kyverno adds missing parents: EnsurePathExistsOnAdd)
POLICIES: dict[str, list[dict[str, Any]]] = {
    "unrelated-toleration": [{"op": "add", "path": "/spec/tolerations/-", "value": UNRELATED}],
    "blanket-exists-toleration": [{"op": "add", "path": "/spec/tolerations/-", "value": BLANKET}],
    "pool-node-selector": [{"op": "add", "path": "/spec/nodeSelector/egress-placer.io~1pool", "value": POOL}],
}


def cluster_policy(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": name},
        "spec": {
            "admission": True,
            "background": False,
            "rules": [{
                "name": name,
                "match": {"any": [{"resources": {"kinds": ["Pod"], "operations": ["CREATE"],
                                                 "namespaces": [TEAM_CDN, TEAM_OTHER, PROBE]}}]},
                "mutate": {"patchesJson6902": yaml.safe_dump(POLICIES[name], sort_keys=False)},
            }],
        },
    }


def carries(pod: dict[str, Any], name: str) -> bool:
    """Whether `pod` has what policy `name` adds."""
    spec = pod.get("spec") or {}
    if name == "pool-node-selector":
        return (spec.get("nodeSelector") or {}).get(POOL_LABEL) == POOL
    return POLICIES[name][0]["value"] in (spec.get("tolerations") or [])


def plain_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "busybox", "command": ["sleep", "3600"]}]}}


def in_force(api: Api, name: str) -> bool:
    """A dry-run pod of the probe namespace comes back with what policy `name` adds (or, with the blanket
    toleration, is refused by the pool guard: the probe namespace may not use the pool)."""
    try:
        answer = api.create(pods(PROBE), plain_pod(f"probe-{uuid.uuid4().hex[:6]}"), dryRun="All")
    except ApiException as e:
        if e.status == 403 and GUARD_NAME in (e.body or ""):
            return True
        raise
    return carries(answer, name)


def guard_params(api: Api) -> dict[str, str]:
    config_map = api.get(namespaced(NAMESPACE, "configmaps", GUARD_NAME))
    return (config_map or {}).get("data") or {}


@pytest.fixture(scope="module")
def kyverno_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = not_built((kyverno.NAME,))
    if missing:
        pytest.skip(skip_reason(missing))
    cluster = Cluster(tmp_path_factory.mktemp("kyverno"), log=reporter(request.config), optional=(kyverno.NAME,))
    with brought_up(cluster) as running:
        yield running


@pytest.fixture(scope="module")
def kapi(kyverno_cluster: Cluster) -> Api:
    return api_for(kyverno_cluster.kubeconfig)


@pytest.fixture(scope="module")
def placer(kyverno_cluster: Cluster, kapi: Api) -> Iterator[Placer]:
    """team-cdn, team-other and the probe namespace; egress-placer with the pool guard, its taints and the
    guard's params in place."""
    for name, labels in ((TEAM_CDN, {}), (TEAM_OTHER, {}), (PROBE, {"egress-placer.io/webhook": "skip"})):
        kapi.create(namespace(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        wait_for(f"ServiceAccount {name}/default", lambda: kapi.get(f"{namespace(name)}/serviceaccounts/default"))
    with running_placer(kyverno_cluster, kapi, POLICY_FILE, taints=True, pool_guard=True) as running:
        wait_for("the guard's params", lambda: all(guard_params(kapi).get(n) == POOL for n in POOL_NODES), timeout=30)
        yield running


@pytest.fixture(params=sorted(POLICIES))
def policy(request: pytest.FixtureRequest, kapi: Api, placer: Placer) -> Iterator[str]:
    """Kyverno ClusterPolicy `name` in force (awaited on the probe namespace); deleted and awaited gone afterwards."""
    name: str = request.param
    path = kyverno.POLICY_PATH
    def created() -> bool:
        try:
            kapi.create(path, cluster_policy(name))
            return True
        except ApiException as e:  # Kyverno listens before its serving certificate is in place: "tls: internal error"
            if e.status == 500 and "kyverno" in (e.body or ""):
                return False
            if e.status == 409:  # left by an interrupted run
                return True
            raise

    wait_for(f"Kyverno to take policy {name}", created, timeout=120, interval=1)
    wait_for(f"Kyverno policy {name} in force", lambda: in_force(kapi, name), timeout=120, interval=1)
    yield name
    kapi.delete(f"{path}/{name}")
    wait_for(f"Kyverno policy {name} gone", lambda: not in_force(kapi, name), timeout=120, interval=1)


@pytest.fixture
def kruns(kapi: Api, placer: Placer) -> Iterator[Runs]:
    made = Runs(kapi)
    yield made
    made.cleanup()


def created_or_refused(kapi: Api, runs: Runs, namespace_name: str, body: dict[str, Any]) -> dict[str, Any] | str:
    """The created pod, or the pool guard's refusal message."""
    try:
        return runs.create_pod(namespace_name, body)
    except ApiException as e:
        if e.status == 403 and GUARD_NAME in (e.body or ""):
            return str(e.body)
        raise


def test_an_allowed_run_is_placed_on_the_pool_with_what_the_policy_adds(policy: str, kruns: Runs) -> None:
    name = kruns.name("cdn")
    kruns.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    kruns.wait_succeeded(TEAM_CDN, "taskruns", [name])
    pod = kruns.pods_by_taskrun(TEAM_CDN)[name]
    assert node_of(pod) in POOL_NODES
    assert decision_of(pod)["pool"] == POOL
    assert carries(pod, policy)  # Kyverno ran: what it added is there beside our placement


def test_a_not_allowed_run_never_reaches_the_pool(policy: str, kruns: Runs, kapi: Api) -> None:
    """Without a policy the run Succeeds on an ordinary node. With one: what it leaves of that (the guard
    refuses a pod that would reach the pool; a pool nodeSelector without the toleration cannot schedule)."""
    name = kruns.name("other")
    kruns.create(TEAM_OTHER, "taskruns", taskrun(name, MATCHING_IMAGE))

    def outcome() -> tuple[str, Any] | None:
        run = kruns.listed(TEAM_OTHER, "taskruns").get(name) or {}
        conditions = {c["type"]: c for c in (run.get("status") or {}).get("conditions") or []}
        pod = kruns.pods_by_taskrun(TEAM_OTHER).get(name)
        if conditions.get("Succeeded", {}).get("status") == "True":
            return "succeeded", node_of(pod)
        if conditions.get("Succeeded", {}).get("status") == "False":
            return "failed", conditions["Succeeded"].get("message", "")
        if pod is not None and any(c.get("reason") == "Unschedulable" for c in (pod.get("status") or {}).get("conditions") or []):
            return "unschedulable", pod
        return None

    result, detail = wait_for(f"TaskRun {TEAM_OTHER}/{name} to end or to stay unscheduled", outcome, timeout=120, interval=0.5)
    if policy == "unrelated-toleration":
        assert (result, detail in ORDINARY_NODES) == ("succeeded", True)
    elif policy == "blanket-exists-toleration":
        # Kyverno's blanket toleration is added again after our webhook strips it (both IfNeeded): the guard refuses the pod.
        assert result == "failed" and GUARD_NAME in detail, (result, detail)
    else:
        assert result == "unschedulable" and node_of(detail) is None, (result, detail)


def test_a_plain_pod_of_a_not_allowed_namespace_never_reaches_the_pool(policy: str, kruns: Runs, kapi: Api) -> None:
    pod = created_or_refused(kapi, kruns, TEAM_OTHER, plain_pod(kruns.name("plain")))
    if policy == "blanket-exists-toleration":
        assert isinstance(pod, str) and f"may not use pool {POOL}" in pod, pod
        return
    assert isinstance(pod, dict)
    assert carries(pod, policy)
    if policy == "unrelated-toleration":
        placed = wait_for("the plain pod bound", lambda: node_of(kapi.get(pods(TEAM_OTHER, pod["metadata"]["name"]))), timeout=60)
        assert placed in ORDINARY_NODES
