"""End to end, the pool guard (ValidatingAdmissionPolicy, k8s/pool-guard.yaml) on the real API server,
installed by `start_controller(pool_guard=True)` and fed by the leader. With the controller running, an
allowed namespace's placed run still works, the leader keeps the params (the namespaces left out too)
and the binding is the static one it ships. Then the
controller (so the webhook) is stopped, and the API server itself, for a tenant bound to the built-in
`edit` role in team-other (may not use pool `overseas`): refuses a pod with the pool toleration, a pod
naming a pool node, and an UPDATE adding the pool toleration to a pod not bound yet (but admits it for a
pod already bound to an ordinary node, which cannot move); runs a key-less-`Exists` DaemonSet on
every ordinary node and on no pool node; does not refuse finalizer changes or the garbage collector's
update of a pod that got its toleration while the namespace was allowed; and, with the params object
deleted, admits ordinary pods. Started again, the leader recreates the params and the guard holds again.

Tests run in file order: the first needs the controller, the later ones stop it."""

from __future__ import annotations

import itertools
from typing import Any, Iterator

import pytest
from kubernetes.client.exceptions import ApiException

from controller.pool_guard.core import GUARD_NAME, left_out, policy_binding
from controller.core.model import NAMESPACE_POOLS_ANNOTATION
from controller.core.policy import load_policy
from controller.kube.client import JSON_PATCH
from devcluster.cluster import Cluster
from devplacer.local_placer import NAMESPACE, start_controller, stop_controller
from tests.e2e.harness import ADMISSION, POLICY_FILE, ControllerSpec, Placer, editor
from tests.e2e.tekton_runs import (
    MATCHING_IMAGE,
    ORDINARY_NODES,
    POOL,
    POOL_NODES,
    POOL_TOLERATION,
    TEAM_CDN,
    TEAM_OTHER,
    Runs,
    decision_of,
    node_of,
    taskrun,
)
from tests.kube import Api, namespace, namespaced, pods
from tests.waiting import WaitTimeout, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

CONTROLLER = ControllerSpec(pool_guard=True)  # this module's controller: as the others, with the pool guard installed

TENANT_USER = "tenant@team-other"  # bound to the built-in ClusterRole `edit` in team-other only
REFUSAL = f"namespace {TEAM_OTHER} may not use pool {POOL}"
KEYLESS_EXISTS = {"operator": "Exists"}
GUARD_SECONDS = 20.0  # the API server's policy, params and namespace caches catch up within this


def pod_body(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "busybox", "command": ["sleep", "3600"]}], **spec},
    }


def refusal(api: Api, namespace: str, body: dict[str, Any]) -> str | None:
    """Create `body` as a server-side dry run (all admission, nothing stored): the guard's refusal
    message, or None when admitted. Any other error fails the test."""
    try:
        api.create(pods(namespace), body, dryRun="All")
        return None
    except ApiException as e:
        if e.status == 403 and GUARD_NAME in (e.body or ""):
            return str(e.body)
        raise


@pytest.fixture(scope="module")
def tenant(devcluster: Cluster, api: Api, tenants: tuple[str, str]) -> Iterator[Api]:
    """An API client for TENANT_USER, bound to `edit` in team-other."""
    with editor(devcluster, api, TEAM_OTHER, TENANT_USER) as tenant_api:
        yield tenant_api


def params(api: Api) -> dict[str, str] | None:
    config_map = api.get(namespaced(NAMESPACE, "configmaps", GUARD_NAME))
    return None if config_map is None else config_map.get("data") or {}


@pytest.fixture(scope="module")
def webhook_stopped(
    egress_placer: Placer, devcluster: Cluster, api: Api, tenant: Api
) -> None:
    """The leader wrote the params; then the controller is stopped (its webhook stays registered, failing
    open), and the guard refuses a pool toleration from team-other."""
    wait_for("the leader to write the guard's params", lambda: all((params(api) or {}).get(n) == POOL for n in POOL_NODES), timeout=30)
    stop_controller(devcluster)
    wait_for(
        "the guard to refuse a pool toleration in team-other",
        lambda: refusal(tenant, TEAM_OTHER, pod_body("probe", tolerations=[POOL_TOLERATION])),
        timeout=GUARD_SECONDS,
    )


def test_with_the_controller_running_the_leader_keeps_the_guard_and_an_allowed_run_is_placed(
    egress_placer: Placer, api: Api, runs: Runs
) -> None:
    data = wait_for("the guard's params", lambda: params(api), timeout=30)
    assert data["Pools"] == POOL and data["Pool.overseas.Namespaces"] == "^(?:team-cdn)$"
    wait_for("every pool node in the params", lambda: all((params(api) or {}).get(n) == POOL for n in POOL_NODES), timeout=30)
    assert data["LeftOut"] == ",".join(left_out(load_policy(POLICY_FILE.read_text())))
    binding = api.call("GET", f"{ADMISSION}/validatingadmissionpolicybindings/{GUARD_NAME}")
    wanted = policy_binding(NAMESPACE)["spec"]
    assert {k: binding["spec"][k] for k in ("policyName", "validationActions", "paramRef")} == {
        k: wanted[k] for k in ("policyName", "validationActions", "paramRef")
    }
    assert binding["spec"]["matchResources"].get("namespaceSelector") in (None, {})  # every namespace

    name = runs.name("placed")
    runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name], timeout=90)

    assert decision_of(done[name])["pool"] == POOL
    assert runs.nodes_of(TEAM_CDN, [name])[name] in POOL_NODES


def test_with_the_webhook_down_the_api_server_refuses_a_pool_toleration_and_a_pool_node(
    webhook_stopped: None, tenant: Api, runs: Runs
) -> None:
    refused = {}
    for case, body in [
        ("pool toleration", pod_body(runs.name("toleration"), tolerations=[POOL_TOLERATION])),
        ("key-less Exists", pod_body(runs.name("keyless"), tolerations=[KEYLESS_EXISTS])),
        ("nodeName of a pool node", pod_body(runs.name("nodename"), nodeName="egress-1")),
    ]:
        with pytest.raises(ApiException) as error:
            runs.create_pod(TEAM_OTHER, body, api=tenant)
        refused[case] = (error.value.status, REFUSAL in (error.value.body or ""))
    plain = runs.create_pod(TEAM_OTHER, pod_body(runs.name("plain"), tolerations=[{"key": "gpu", "operator": "Exists"}]), api=tenant)

    assert refused == {case: (403, True) for case in refused}
    assert plain["metadata"]["name"] == runs.name("plain")


def test_with_the_webhook_down_an_update_adding_the_pool_toleration_is_refused(
    webhook_stopped: None, tenant: Api, runs: Runs
) -> None:
    add_toleration = [{"op": "add", "path": "/spec/tolerations/-", "value": POOL_TOLERATION}]
    # Held back by a scheduling gate, the pod is not bound yet: a toleration added now would take it to
    # the pool once the gate is removed.
    gated = runs.name("gated")
    runs.create_pod(TEAM_OTHER, pod_body(gated, schedulingGates=[{"name": "example.com/hold"}]), api=tenant)
    # Bound to an ordinary node, a pod cannot move: a toleration added to it reaches no pool node.
    bound = runs.name("bound")
    runs.create_pod(TEAM_OTHER, pod_body(bound), api=tenant)
    wait_for(f"pod {bound} to be bound", lambda: node_of(tenant.get(pods(TEAM_OTHER, bound))), timeout=30)

    with pytest.raises(ApiException) as error:
        tenant.json_patch(pods(TEAM_OTHER, gated), add_toleration)
    tenant.json_patch(pods(TEAM_OTHER, bound), add_toleration)

    assert error.value.status == 403 and REFUSAL in (error.value.body or "")
    tolerations = tenant.call("GET", pods(TEAM_OTHER, gated))["spec"].get("tolerations") or []
    assert not [t for t in tolerations if t.get("key") == POOL_TOLERATION["key"]]
    assert node_of(tenant.get(pods(TEAM_OTHER, bound))) in ORDINARY_NODES


@pytest.fixture
def daemonset(tenant: Api, runs: Runs) -> Iterator[str]:
    """A node-exporter-like DaemonSet (key-less Exists) made by the tenant in team-other; deleted after."""
    daemonsets = namespaced(TEAM_OTHER, "daemonsets", group="/apis/apps/v1")
    name = runs.name("exporter")
    labels = {"app": name}
    tenant.create(
        daemonsets,
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"tolerations": [KEYLESS_EXISTS], "containers": [{"name": "exporter", "image": "busybox"}]},
                },
            },
        },
    )
    yield name
    tenant.delete(f"{daemonsets}/{name}", propagationPolicy="Background")


def test_with_the_webhook_down_a_keyless_exists_daemonset_runs_on_every_ordinary_node_and_no_pool_node(
    webhook_stopped: None, api: Api, daemonset: str
) -> None:
    def nodes_running() -> set[str]:
        listed = api.items(pods(TEAM_OTHER), labelSelector=f"app={daemonset}")
        return {node_of(p) for p in listed if (p.get("status") or {}).get("phase") == "Running"}

    def refused_for_pool_nodes() -> list[str]:
        events = api.items(namespaced(TEAM_OTHER, "events"), fieldSelector=f"involvedObject.name={daemonset}")
        return [e.get("message") for e in events if e.get("reason") == "FailedCreate" and REFUSAL in (e.get("message") or "")]

    # The DaemonSet controller creates in slow-start batches (1, 2, 4 ...) in the node lister's order, which
    # is a rotation of a small Go map's slots, and stops at the first batch with a refused create; every sync
    # that meets a pool node fails, and it retries the DaemonSet with exponential backoff (5 ms doubling, to
    # 1,000 s). So the last ordinary node gets its pod only on a sync whose order starts with it: about one
    # in eight, and the syncs grow minutes apart (CI saw 2 of 3 ordinary nodes after 240 s). An update to
    # the DaemonSet syncs it at once, as an operator's edit would: the test makes one per poll, so what it
    # waits for is the guard's answers, not the controller's backoff.
    daemonset_path = f"{namespaced(TEAM_OTHER, 'daemonsets', group='/apis/apps/v1')}/{daemonset}"
    syncs = itertools.count()

    def running_everywhere_ordinary() -> bool:
        if nodes_running() >= ORDINARY_NODES:
            return True
        api.merge_patch(daemonset_path, {"metadata": {"annotations": {"example.com/sync": str(next(syncs))}}})
        return False

    try:
        wait_for("the DaemonSet's pods running on every ordinary node", running_everywhere_ordinary, timeout=120, interval=1.0)
    except WaitTimeout as timeout:
        listed = api.items(pods(TEAM_OTHER), labelSelector=f"app={daemonset}")
        raise AssertionError(f"{timeout}; pods: {[(node_of(p), (p.get('status') or {}).get('phase')) for p in listed]}") from timeout
    messages = wait_for("the DaemonSet controller's pool-node pods refused by the guard", refused_for_pool_nodes, timeout=30)
    listed = api.items(pods(TEAM_OTHER), labelSelector=f"app={daemonset}")

    assert {node_of(p) for p in listed} == ORDINARY_NODES
    assert all(GUARD_NAME in m for m in messages)


def test_with_the_webhook_down_finalizer_and_garbage_collector_updates_of_an_existing_pod_are_not_refused(
    webhook_stopped: None, api: Api, tenant: Api, runs: Runs
) -> None:
    probe = pod_body("probe", tolerations=[POOL_TOLERATION])
    # team-other may use the pool for a while (an admin's annotation): a pod on a pool node is made then.
    api.merge_patch(namespace(TEAM_OTHER), {"metadata": {"annotations": {NAMESPACE_POOLS_ANNOTATION: POOL}}})
    try:
        wait_for("the guard to admit team-other", lambda: refusal(tenant, TEAM_OTHER, probe) is None, timeout=GUARD_SECONDS)
        owner = tenant.create(namespaced(TEAM_OTHER, "configmaps"), {"metadata": {"name": runs.name("owner")}})
        name = runs.name("existing")
        body = pod_body(name, tolerations=[POOL_TOLERATION], nodeName="egress-1")
        body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
        runs.create_pod(TEAM_OTHER, body, api=tenant)
    finally:
        api.merge_patch(namespace(TEAM_OTHER), {"metadata": {"annotations": {NAMESPACE_POOLS_ANNOTATION: None}}})
    wait_for("the guard to refuse team-other again", lambda: refusal(tenant, TEAM_OTHER, probe), timeout=GUARD_SECONDS)

    tenant.merge_patch(pods(TEAM_OTHER, name), {"metadata": {"finalizers": ["example.com/hold"]}})
    tenant.merge_patch(pods(TEAM_OTHER, name), {"metadata": {"labels": {"touched": "yes"}}})
    tenant.json_patch(pods(TEAM_OTHER, name), [{"op": "remove", "path": "/metadata/finalizers"}])
    # The garbage collector orphans the pod: it removes the ownerReference with an UPDATE of its own.
    tenant.delete(namespaced(TEAM_OTHER, "configmaps", owner["metadata"]["name"]), propagationPolicy="Orphan")
    wait_for(
        "the garbage collector to remove the pod's ownerReference",
        lambda: not tenant.call("GET", pods(TEAM_OTHER, name))["metadata"].get("ownerReferences"),
        timeout=30,
    )
    pod = tenant.call("GET", pods(TEAM_OTHER, name))

    assert node_of(pod) == "egress-1" and pod["metadata"]["labels"]["touched"] == "yes"
    assert not pod["metadata"].get("finalizers")


def test_with_the_params_missing_ordinary_pods_are_admitted_and_the_leader_brings_them_back(
    webhook_stopped: None, devcluster: Cluster, api: Api, tenant: Api, runs: Runs
) -> None:
    api.delete(namespaced(NAMESPACE, "configmaps", GUARD_NAME))
    wait_for(
        "the guard to notice the params are gone",
        lambda: refusal(tenant, TEAM_OTHER, pod_body("probe", tolerations=[POOL_TOLERATION])) is None,
        timeout=GUARD_SECONDS,
    )
    made = [
        runs.create_pod(TEAM_OTHER, body, api=tenant)["metadata"]["name"]
        for body in [
            pod_body(runs.name("plain")),
            pod_body(runs.name("foreign"), tolerations=[{"key": "gpu", "operator": "Exists"}]),
            pod_body(runs.name("ordinary-node"), nodeName="node-1"),
        ]
    ]

    # Held back by the pool taint (no node yet): a pod the guard judges when an UPDATE adds a toleration.
    target = runs.create_pod(TEAM_OTHER, pod_body(runs.name("pending"), nodeSelector={"kubernetes.io/hostname": "egress-2"}),
                             api=tenant)["metadata"]["name"]

    start_controller(devcluster, POLICY_FILE, pool_guard=True)
    # The webhook is back and strips a pool toleration or a pool node's nodeName at CREATE; it does
    # not see UPDATEs, so the probe is an UPDATE adding the pool toleration to the pending pod.

    def update_refused() -> str | None:
        operations = [{"op": "add", "path": "/spec/tolerations/-", "value": POOL_TOLERATION}]
        try:
            tenant.call("PATCH", pods(TEAM_OTHER, target), body=operations, content_type=JSON_PATCH, query={"dryRun": "All"})
            return None
        except ApiException as e:
            if e.status == 403 and GUARD_NAME in (e.body or ""):
                return str(e.body)
            raise

    message = wait_for("the leader to recreate the params and the guard to refuse again", update_refused, timeout=30)

    assert made == [runs.name("plain"), runs.name("foreign"), runs.name("ordinary-node")]
    assert REFUSAL in message
