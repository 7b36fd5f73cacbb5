"""End to end, the pool guard (ValidatingAdmissionPolicy, k8s/pool-guard.yaml) on the real API server,
installed by `start_controller(pool_guard=True)` and fed by the leader. With the controller running, an
allowed namespace's placed run still works and the leader keeps the params and the binding. Then the
controller (so the webhook) is stopped, and the API server itself, for a tenant bound to the built-in
`edit` role in team-other (may not use pool `overseas`): refuses a pod with the pool toleration, a pod
naming a pool node, and an UPDATE adding the pool toleration to a pod not bound yet (but admits it for a
pod already bound to an ordinary node, which cannot move); runs a key-less-`Exists` DaemonSet on
every ordinary node and on no pool node; does not refuse finalizer changes or the garbage collector's
update of a pod that got its toleration while the namespace was allowed; and, with the params object
deleted, admits ordinary pods. Started again, the leader recreates the params and the guard holds again.

Tests run in file order: the first needs the controller, the later ones stop it."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from running_controller import POLICY_FILE, EgressPlacer, make_plain
from tekton_runs import MATCHING_IMAGE, ORDINARY_NODES, POOL, POOL_NODES, POOL_TOLERATION, TEAM_CDN, TEAM_OTHER, Runs, Waiter, decision_of, taskrun

from controller.core.guard import GUARD_NAME, policy_binding
from controller.core.model import NAMESPACE_POOLS_ANNOTATION
from controller.core.policy import load_policy
from devcluster.cluster import Cluster
from devplacer.controller import NAMESPACE, start_controller, stop_controller

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

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


def refusal(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> str | None:
    """Create `body` as a server-side dry run (all admission, nothing stored): the guard's refusal
    message, or None when admitted. Any other error fails the test."""
    try:
        client.CoreV1Api(api).create_namespaced_pod(namespace, body, dry_run="All")
        return None
    except ApiException as e:
        if e.status == 403 and GUARD_NAME in (e.body or ""):
            return str(e.body)
        raise


@pytest.fixture(scope="module")
def egress_placer(devcluster: Cluster, kube: client.ApiClient, tenants: tuple[str, str]) -> Iterator[EgressPlacer]:
    """This module's controller: as in conftest, with the pool guard installed; all removed after."""
    try:
        start_controller(devcluster, POLICY_FILE, pool_guard=True)
        yield EgressPlacer(devcluster)
    finally:
        make_plain(kube, devcluster)


@pytest.fixture(scope="module")
def tenant(devcluster: Cluster, kube: client.ApiClient, tenants: tuple[str, str]) -> Iterator[client.ApiClient]:
    """An API client for TENANT_USER, bound to `edit` in team-other (the RoleBinding goes with the namespace)."""
    client.RbacAuthorizationV1Api(kube).create_namespaced_role_binding(
        TEAM_OTHER,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT_USER}],
        },
    )
    api = config.new_client_from_config(config_file=str(devcluster.mint_kubeconfig(TENANT_USER)))
    yield api
    api.close()


def params(kube: client.ApiClient) -> dict[str, str] | None:
    try:
        return client.CoreV1Api(kube).read_namespaced_config_map(GUARD_NAME, NAMESPACE).data or {}
    except ApiException as e:
        if e.status == 404:
            return None
        raise


@pytest.fixture(scope="module")
def webhook_stopped(
    egress_placer: EgressPlacer, devcluster: Cluster, kube: client.ApiClient, tenant: client.ApiClient, wait_for: Waiter
) -> None:
    """The leader wrote the params; then the controller is stopped (its webhook stays registered, failing
    open), and the guard refuses a pool toleration from team-other."""
    wait_for("the leader to write the guard's params", lambda: all((params(kube) or {}).get(n) == POOL for n in POOL_NODES), timeout=30)
    stop_controller(devcluster)
    wait_for(
        "the guard to refuse a pool toleration in team-other",
        lambda: refusal(tenant, TEAM_OTHER, pod_body("probe", tolerations=[POOL_TOLERATION])),
        timeout=GUARD_SECONDS,
    )


def test_with_the_controller_running_the_leader_keeps_the_guard_and_an_allowed_run_is_placed(
    egress_placer: EgressPlacer, kube: client.ApiClient, runs: Runs, wait_for: Waiter
) -> None:
    data = wait_for("the guard's params", lambda: params(kube), timeout=30)
    assert data["Pools"] == POOL and data["Pool.overseas.Namespaces"] == "^(?:team-cdn)$"
    wait_for("every pool node in the params", lambda: all((params(kube) or {}).get(n) == POOL for n in POOL_NODES), timeout=30)
    binding = client.AdmissionregistrationV1Api(kube).read_validating_admission_policy_binding(GUARD_NAME)
    wanted = policy_binding(load_policy(POLICY_FILE.read_text()), NAMESPACE)["spec"]["matchResources"]["namespaceSelector"]
    assert kube.sanitize_for_serialization(binding.spec.match_resources.namespace_selector) == wanted

    name = runs.name("placed")
    runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name], timeout=90)

    assert decision_of(done[name])["pool"] == POOL
    assert runs.nodes_of(TEAM_CDN, [name])[name] in POOL_NODES


def test_with_the_webhook_down_the_api_server_refuses_a_pool_toleration_and_a_pool_node(
    webhook_stopped: None, tenant: client.ApiClient, runs: Runs
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
    webhook_stopped: None, tenant: client.ApiClient, runs: Runs, wait_for: Waiter
) -> None:
    core = client.CoreV1Api(tenant)
    add_toleration = [{"op": "add", "path": "/spec/tolerations/-", "value": POOL_TOLERATION}]
    # Held back by a scheduling gate, the pod is not bound yet: a toleration added now would take it to
    # the pool once the gate is removed.
    gated = runs.name("gated")
    runs.create_pod(TEAM_OTHER, pod_body(gated, schedulingGates=[{"name": "example.com/hold"}]), api=tenant)
    # Bound to an ordinary node, a pod cannot move: a toleration added to it reaches no pool node.
    bound = runs.name("bound")
    runs.create_pod(TEAM_OTHER, pod_body(bound), api=tenant)
    wait_for(f"pod {bound} to be bound", lambda: core.read_namespaced_pod(bound, TEAM_OTHER).spec.node_name, timeout=30)

    with pytest.raises(ApiException) as error:
        core.patch_namespaced_pod(gated, TEAM_OTHER, add_toleration)
    core.patch_namespaced_pod(bound, TEAM_OTHER, add_toleration)

    assert error.value.status == 403 and REFUSAL in (error.value.body or "")
    tolerations = core.read_namespaced_pod(gated, TEAM_OTHER).spec.tolerations or []
    assert not [t for t in tolerations if t.key == POOL_TOLERATION["key"]]
    assert core.read_namespaced_pod(bound, TEAM_OTHER).spec.node_name in ORDINARY_NODES


@pytest.fixture
def daemonset(tenant: client.ApiClient, runs: Runs) -> Iterator[str]:
    """A node-exporter-like DaemonSet (key-less Exists) made by the tenant in team-other; deleted after."""
    apps = client.AppsV1Api(tenant)
    name = runs.name("exporter")
    labels = {"app": name}
    apps.create_namespaced_daemon_set(
        TEAM_OTHER,
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
    apps.delete_namespaced_daemon_set(name, TEAM_OTHER, propagation_policy="Background")


def test_with_the_webhook_down_a_keyless_exists_daemonset_runs_on_every_ordinary_node_and_no_pool_node(
    webhook_stopped: None, kube: client.ApiClient, daemonset: str, wait_for: Waiter
) -> None:
    core = client.CoreV1Api(kube)

    def nodes_running() -> set[str]:
        pods = core.list_namespaced_pod(TEAM_OTHER, label_selector=f"app={daemonset}").items
        return {p.spec.node_name for p in pods if p.status.phase == "Running"}

    def refused_for_pool_nodes() -> list[str]:
        events = core.list_namespaced_event(TEAM_OTHER, field_selector=f"involvedObject.name={daemonset}").items
        return [e.message for e in events if e.reason == "FailedCreate" and REFUSAL in (e.message or "")]

    wait_for("the DaemonSet's pods running on every ordinary node", lambda: nodes_running() >= ORDINARY_NODES, timeout=60)
    messages = wait_for("the DaemonSet controller's pool-node pods refused by the guard", refused_for_pool_nodes, timeout=30)
    pods = core.list_namespaced_pod(TEAM_OTHER, label_selector=f"app={daemonset}").items

    assert {p.spec.node_name for p in pods} == ORDINARY_NODES
    assert all(GUARD_NAME in m for m in messages)


def test_with_the_webhook_down_finalizer_and_garbage_collector_updates_of_an_existing_pod_are_not_refused(
    webhook_stopped: None, kube: client.ApiClient, tenant: client.ApiClient, runs: Runs, wait_for: Waiter
) -> None:
    admin, core = client.CoreV1Api(kube), client.CoreV1Api(tenant)
    probe = pod_body("probe", tolerations=[POOL_TOLERATION])
    # team-other may use the pool for a while (an admin's annotation): a pod on a pool node is made then.
    admin.patch_namespace(TEAM_OTHER, {"metadata": {"annotations": {NAMESPACE_POOLS_ANNOTATION: POOL}}})
    try:
        wait_for("the guard to admit team-other", lambda: refusal(tenant, TEAM_OTHER, probe) is None, timeout=GUARD_SECONDS)
        owner = core.create_namespaced_config_map(TEAM_OTHER, {"metadata": {"name": runs.name("owner")}})
        name = runs.name("existing")
        body = pod_body(name, tolerations=[POOL_TOLERATION], nodeName="egress-1")
        body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name, "uid": owner.metadata.uid}]
        runs.create_pod(TEAM_OTHER, body, api=tenant)
    finally:
        admin.patch_namespace(TEAM_OTHER, {"metadata": {"annotations": {NAMESPACE_POOLS_ANNOTATION: None}}})
    wait_for("the guard to refuse team-other again", lambda: refusal(tenant, TEAM_OTHER, probe), timeout=GUARD_SECONDS)

    core.patch_namespaced_pod(name, TEAM_OTHER, {"metadata": {"finalizers": ["example.com/hold"]}})
    core.patch_namespaced_pod(name, TEAM_OTHER, {"metadata": {"labels": {"touched": "yes"}}})
    core.patch_namespaced_pod(name, TEAM_OTHER, [{"op": "remove", "path": "/metadata/finalizers"}])
    # The garbage collector orphans the pod: it removes the ownerReference with an UPDATE of its own.
    core.delete_namespaced_config_map(owner.metadata.name, TEAM_OTHER, propagation_policy="Orphan")
    wait_for(
        "the garbage collector to remove the pod's ownerReference",
        lambda: not core.read_namespaced_pod(name, TEAM_OTHER).metadata.owner_references,
        timeout=30,
    )
    pod = core.read_namespaced_pod(name, TEAM_OTHER)

    assert pod.spec.node_name == "egress-1" and pod.metadata.labels["touched"] == "yes"
    assert not pod.metadata.finalizers


def test_with_the_params_missing_ordinary_pods_are_admitted_and_the_leader_brings_them_back(
    webhook_stopped: None, devcluster: Cluster, kube: client.ApiClient, tenant: client.ApiClient, runs: Runs, wait_for: Waiter
) -> None:
    client.CoreV1Api(kube).delete_namespaced_config_map(GUARD_NAME, NAMESPACE)
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

    start_controller(devcluster, POLICY_FILE, pool_guard=True)
    # The webhook is back and would strip a pool toleration first; a pool node in nodeName it leaves.
    message = wait_for(
        "the leader to recreate the params and the guard to refuse a pool node again",
        lambda: refusal(tenant, TEAM_OTHER, pod_body("probe", nodeName="egress-2")),
        timeout=30,
    )

    assert made == [runs.name("plain"), runs.name("foreign"), runs.name("ordinary-node")]
    assert REFUSAL in message
