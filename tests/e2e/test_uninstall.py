"""End to end, `egress-placer uninstall` on the local cluster, as an administrator runs it
(docs/uninstall.md): `--dry-run` lists what would go and changes nothing; `--yes` refuses to remove
anything after the Deployment while a controller still leads (it would put the taints back); once it
has stopped, `--yes` removes the webhook configurations (the pools API's fail-closed one too), the pool guard, the pool taints, the RBAC and
the namespace with its Secret and ConfigMaps, and leaves a pool-tolerated node agent's template alone.

The controller here runs as a local process (devplacer.local_placer), so "it has stopped" is the test
stopping it; in a cluster the command deletes the Deployment and waits for the Lease to be released."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from controller.cli.errors import Exit
from controller.agents.core import TOLERATIONS_ADDED_ANNOTATION
from controller.pool_guard.core import GUARD_NAME
from controller.core.model import TAINT_KEY
from controller.last_good_policy.reconcile import store_name
from devplacer.local_placer import NAMESPACE, POLICY_CONFIGMAP, POOLS_WEBHOOK_CONFIG, WEBHOOK_CONFIG, start_controller, stop_controller
from tests.e2e.harness import (
    ADMISSION,
    POLICY_FILE,
    VALIDATING_WEBHOOK_CONFIGS,
    WEBHOOK_CONFIGS,
    Placer,
    egress_placer_command,
    make_plain,
    pool_taints,
)
from tests.e2e.tekton_runs import POOL_NODES, POOL_TAINT
from tests.kube import Api, namespace, namespaced, namespaces_left, node
from tests.waiting import wait_for, wait_gone

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

RBAC = "/apis/rbac.authorization.k8s.io/v1"
TEKTON_NAMESPACE = "tekton-pipelines"


def installed(api: Api) -> dict[str, bool]:
    """What the install made (and the controller made since) that uninstall removes: present or not."""
    paths = {
        "webhook configuration": f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}",
        "pools API webhook configuration": f"{VALIDATING_WEBHOOK_CONFIGS}/{POOLS_WEBHOOK_CONFIG}",
        "pool guard": f"{ADMISSION}/validatingadmissionpolicies/{GUARD_NAME}",
        "pool guard binding": f"{ADMISSION}/validatingadmissionpolicybindings/{GUARD_NAME}",
        "cluster role": f"{RBAC}/clusterroles/egress-placer",
        "cluster role binding": f"{RBAC}/clusterrolebindings/egress-placer",
        "tekton role": namespaced(TEKTON_NAMESPACE, "roles", "egress-placer", group=RBAC),
        "agents role": namespaced("kube-system", "roles", "egress-placer-agents", group=RBAC),
        "namespace": namespace(NAMESPACE),
        "serving certificate secret": namespaced(NAMESPACE, "secrets", "egress-placer-webhook-tls"),
        "last good policy": namespaced(NAMESPACE, "configmaps", store_name(POLICY_CONFIGMAP)),
    }
    return {what: api.get(path) is not None for what, path in paths.items()}


def tainted(api: Api) -> set[str]:
    return {n["metadata"]["name"] for n in api.items(node()) if any(t["key"] == TAINT_KEY for t in n["spec"].get("taints") or [])}


@pytest.fixture(scope="module")
def leading(egress_placer: Placer, api: Api) -> Placer:
    """The controller with the pool guard installed, leading, its taints, Secret and last good policy written."""
    stop_controller(egress_placer.cluster)
    start_controller(egress_placer.cluster, POLICY_FILE, pool_guard=True)
    wait_for("the pool tainted", lambda: all(pool_taints(api, n) == [POOL_TAINT] for n in POOL_NODES), timeout=30)
    wait_for("everything installed and written", lambda: all(installed(api).values()), timeout=30)
    return egress_placer


def test_a_dry_run_lists_what_would_go_and_changes_nothing(leading: Placer, api: Api) -> None:
    before = installed(api), tainted(api)
    done = egress_placer_command(leading.cluster, "uninstall", "--dry-run")
    assert done.returncode == Exit.OK, done.stdout + done.stderr
    assert f"mutatingwebhookconfiguration {WEBHOOK_CONFIG}: present" in done.stdout
    assert f"deployment {NAMESPACE}/egress-placer: absent" in done.stdout  # it runs as a local process here
    assert f"the pool taint {TAINT_KEY} on {len(POOL_NODES)} nodes: {', '.join(sorted(POOL_NODES))}" in done.stdout
    assert "leads: --yes waits for it to stop" in done.stdout
    as_yaml = egress_placer_command(leading.cluster, "uninstall", "--dry-run", "-o", "yaml")  # issue 28
    assert as_yaml.returncode == Exit.OK, as_yaml.stdout + as_yaml.stderr
    report = yaml.safe_load(as_yaml.stdout)
    present = {o["what"]: o["present"] for o in report["objects"]}
    assert present[f"mutatingwebhookconfiguration {WEBHOOK_CONFIG}"] and not present[f"deployment {NAMESPACE}/egress-placer"]
    assert report["taintedNodes"] == sorted(POOL_NODES) and report["leader"]
    assert (installed(api), tainted(api)) == before


def test_it_removes_nothing_while_a_controller_still_leads(leading: Placer, api: Api) -> None:
    done = egress_placer_command(leading.cluster, "uninstall", "--yes", "--timeout", "3")
    assert done.returncode == Exit.FINDINGS, done.stdout + done.stderr
    assert "still leads after 3s: it would put the taints back" in done.stdout
    assert all(installed(api).values()) and tainted(api) == POOL_NODES


def test_once_the_controller_stopped_it_removes_everything_but_the_agents_templates(leading: Placer, api: Api) -> None:
    cluster = leading.cluster
    stop_controller(cluster)  # as deleting the Deployment does in a cluster: the leader releases its Lease
    agent = agent_daemonset(api)
    try:
        done = egress_placer_command(cluster, "uninstall", "--yes")
        assert done.returncode == Exit.OK, done.stdout + done.stderr
        wait_gone("the namespace to be gone", lambda: namespaces_left(api, NAMESPACE), timeout=180)
        assert installed(api) == {what: False for what in installed(api)}
        assert tainted(api) == set()
        kept = api.call("GET", agent)["spec"]["template"]["spec"].get("tolerations") or []
        assert any(t.get("key") == TAINT_KEY for t in kept)  # left as it is: harmless without the taint
        assert "kube-system/e2e-uninstall-agent" in done.stdout
    finally:
        api.delete(agent)
        make_plain(api, cluster)


def agent_daemonset(api: Api) -> str:
    """A kube-system node agent whose template carries the pool tolerations egress-placer adds."""
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "e2e-uninstall-agent", "annotations": {TOLERATIONS_ADDED_ANNOTATION: "overseas"}},
        "spec": {
            "selector": {"matchLabels": {"app": "e2e-uninstall-agent"}},
            "template": {
                "metadata": {"labels": {"app": "e2e-uninstall-agent"}},
                "spec": {
                    "containers": [{"name": "agent", "image": "registry.example.com/node-agent:1"}],
                    "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                },
            },
        },
    }
    path = namespaced("kube-system", "daemonsets", group="/apis/apps/v1")
    api.create(path, body)
    return f"{path}/e2e-uninstall-agent"
