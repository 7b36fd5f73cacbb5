"""Reliability, the controller's own rights bounded in the API server (k8s/controller-rights.yaml;
k8s/README.md, "What bounds each right"; docs/security.md, "The controller's own rights").

The controller runs under the policies (it leads and taints the pool nodes through them). Then, as a
stolen token would, the admin's kubectl impersonates its ServiceAccount (`--as`) and tries, with
`--dry-run=server` (the request goes through authorization and admission, nothing is stored):

- refused, each naming our policy or the missing RBAC right: a webhook configuration's rules or
  service, a node's labels or `unschedulable`, the pool guard's binding, a run's params (a held run and
  a started one), deleting a pod off the pool nodes, a pod's labels, annotations, images or another
  manager's schedulingGate;
- admitted: a new caBundle, a pool taint removed, a held run's `spec.status` removed (the queue's
  release), deleting a pod on a pool node, removing our schedulingGate `egress-placer.io/pool-slot`
  of a pod waiting for a pool slot.

The pools API's CRDs (once, Tekton's webhook is no part of it): a merge patch of the conversion's
caBundle and a prune of `status.storedVersions` are admitted; a schema, a version or the conversion's url
changed, or a version added back to storedVersions, refused by our policy. And under the policy the
leader puts back a conversion caBundle an admin changed, and the storage migration (`egress-placer
migrate-storage` with the controller's own credentials, the leader's code) prunes storedVersions.

Both with Tekton's webhook on and off: Tekton's webhook refuses spec changes of a started run for
anyone, cluster-admin too, which proves nothing about our policy; with its configurations removed only
our policy stands between the token and the change.
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
from typing import Any, Iterator

import pytest

from controller.pool_guard.core import GUARD_NAME
from controller.core.model import POOL_SLOT_GATE, TAINT_KEY
from controller.core.rights import POD_DELETES_NAME, RIGHTS_NAME
from devcluster import tekton_webhook
from devcluster.cluster import Cluster
from devplacer.local_placer import NAMESPACE, POOLS_WEBHOOK_CONFIG, SERVICE_ACCOUNT, WEBHOOK_CONFIG
from tests.e2e.harness import ControllerSpec, Placer, egress_placer_command
from tests.e2e.tekton_runs import OTHER_IMAGE, POOL_TOLERATION, Runs, step
from tests.kube import TEKTON, Api, namespaced, node
from tests.reliability.suite import TEAM_OTHER, Figures
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

CONTROLLER = ControllerSpec(pool_guard=True, controller_rights=True)
THE_CONTROLLER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
POOL_NODE, ORDINARY_NODE = "egress-1", "node-1"
RIGHTS_REFUSED = f"ValidatingAdmissionPolicy '{RIGHTS_NAME}'"
DELETE_REFUSED = f"ValidatingAdmissionPolicy '{POD_DELETES_NAME}'"


def as_the_controller(cluster: Cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl as the controller's ServiceAccount (impersonated by the admin), server-side dry run."""
    return subprocess.run(
        [str(cluster.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig), f"--as={THE_CONTROLLER}",
         "--dry-run=server", *args],
        input=stdin, capture_output=True, text=True, check=False, timeout=60,
    )


def webhook_configuration(api: Api, kind: str, name: str) -> dict[str, Any]:
    return api.call("GET", f"{ADMISSION}/{kind}webhookconfigurations/{name}")


def replaced(obj: dict[str, Any]) -> tuple[list[str], str]:
    """`kubectl replace` (an UPDATE, the verb the controller has on its webhook configurations) of `obj`."""
    return ["replace", "-f", "-"], json.dumps(obj)


def patch(kind: str, name: str, operations: list[dict[str, Any]], namespace: str | None = None) -> list[str]:
    return [*(["-n", namespace] if namespace else []), "patch", kind, name, "--type=json", "-p", json.dumps(operations)]


# -- Tekton's webhook on and off ---------------------------------------------------------------------

TEKTON_CONFIGURATIONS = [
    (f"{ADMISSION}/{kind.lower()}s", name) for kind, names in tekton_webhook.CONFIGURATIONS.items() for name in names
]


def _restorable(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k in ("name", "labels", "annotations", "ownerReferences")}
    return {**obj, "metadata": meta}


@pytest.fixture(scope="module", params=["tekton-webhook-on", "tekton-webhook-off"])
def tekton(request: pytest.FixtureRequest, devcluster: Cluster, api: Api, egress_placer: Placer) -> Iterator[str]:
    """Tekton's admission webhooks as they are ("on"), or with their configurations removed for the
    module's tests ("off") and put back afterwards (knative's webhook then fills them in again)."""
    runs_it = devcluster.runs_with(tekton_webhook.NAME)
    if request.param == "tekton-webhook-on":
        if not runs_it:
            pytest.skip("this cluster runs without Tekton's webhook")
        yield request.param
        return
    saved = [(path, _restorable(obj)) for path, name in TEKTON_CONFIGURATIONS if (obj := api.get(f"{path}/{name}")) is not None]
    for path, obj in saved:
        api.delete(f"{path}/{obj['metadata']['name']}")
    try:
        yield request.param
    finally:
        for path, obj in saved:
            api.create(path, obj)


# -- the objects tried on ----------------------------------------------------------------------------


# A pod waiting for a pool slot, and for another manager (no run's pod: the controller leaves its gate alone).
GATES = [{"name": POOL_SLOT_GATE}, {"name": "example.com/another-manager"}]


def run_body(name: str, pending: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "params": [{"name": "url", "value": "https://example.com/a"}],
        "taskSpec": {"params": [{"name": "url", "type": "string"}], "steps": [step(OTHER_IMAGE)]},
    }
    if pending:
        spec["status"] = "TaskRunPending"
    return {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "metadata": {"name": name}, "spec": spec}


@pytest.fixture(scope="module")
def objects(api: Api, egress_placer: Placer, tenants: tuple[str, ...]) -> Iterator[dict[str, str]]:
    """A held run, a started run, a pod on an ordinary node and one on a pool node (kube-system: the
    pool guard leaves it out), made by the admin; deleted afterwards."""
    made = Runs(api)
    held, started = made.name("held"), made.name("started")
    made.create(TEAM_OTHER, "taskruns", run_body(held, pending=True))
    made.create(TEAM_OTHER, "taskruns", run_body(started, pending=False))
    wait_for("the started run to start", lambda: (made.get(TEAM_OTHER, "taskruns", started).get("status") or {}).get("startTime"),
             timeout=60)
    pod = {"containers": [{"name": "c", "image": OTHER_IMAGE}], "terminationGracePeriodSeconds": 0}
    off_pool, on_pool = made.name("off-pool"), made.name("on-pool")
    made.create_pod(TEAM_OTHER, {"metadata": {"name": off_pool}, "spec": {**pod, "nodeName": ORDINARY_NODE}})
    made.create_pod("kube-system", {"metadata": {"name": on_pool}, "spec": {**pod, "nodeName": POOL_NODE, "tolerations": [POOL_TOLERATION]}})
    gated = made.name("gated")
    made.create_pod(TEAM_OTHER, {"metadata": {"name": gated}, "spec": {**pod, "schedulingGates": GATES}})
    try:
        yield {"held": held, "started": started, "off-pool": off_pool, "on-pool": on_pool, "gated": gated}
    finally:
        made.cleanup()


# -- refused -----------------------------------------------------------------------------------------


def refused(cluster: Cluster, args: list[str], stdin: str | None = None, *, names: str) -> str:
    out = as_the_controller(cluster, *args, stdin=stdin)
    assert out.returncode != 0, f"admitted: kubectl {' '.join(args)}\n{out.stdout}"
    assert names in out.stderr, f"kubectl {' '.join(args)}: {out.stderr}"
    return out.stderr.strip()


def test_it_cannot_rewrite_a_webhook_configuration(devcluster: Cluster, api: Api, tekton: str, figures: Figures) -> None:
    figures.fault("the controller's token: a webhook configuration's rules or service", tekton, f"refused by {RIGHTS_NAME}")
    mutating = webhook_configuration(api, "mutating", WEBHOOK_CONFIG)
    pools = webhook_configuration(api, "validating", POOLS_WEBHOOK_CONFIG)
    no_rules = copy.deepcopy(mutating)
    no_rules["webhooks"][0]["rules"] = []
    elsewhere = copy.deepcopy(mutating)
    bundle = elsewhere["webhooks"][0]["clientConfig"]["caBundle"]
    elsewhere["webhooks"][0]["clientConfig"] = {"service": {"name": "evil", "namespace": TEAM_OTHER, "port": 443}, "caBundle": bundle}
    fails_open = copy.deepcopy(pools)
    fails_open["webhooks"][0]["failurePolicy"] = "Ignore"
    messages = [refused(devcluster, *replaced(obj), names=RIGHTS_REFUSED) for obj in (no_rules, elsewhere, fails_open)]
    # A patch is no verb it has on them: RBAC names the missing right.
    refused(devcluster, patch("mutatingwebhookconfiguration", WEBHOOK_CONFIG, [{"op": "replace", "path": "/webhooks/0/rules", "value": []}]),
            names='cannot patch resource "mutatingwebhookconfigurations"')
    figures.measured(messages[0][-200:], 0)


def test_it_cannot_relabel_or_cordon_a_node(devcluster: Cluster, tekton: str, figures: Figures) -> None:
    figures.fault("the controller's token: a node's labels or unschedulable", tekton, f"refused by {RIGHTS_NAME}")
    refused(devcluster, ["label", "node", POOL_NODE, "egress-placer.io/pool-", "--overwrite"], names=RIGHTS_REFUSED)
    refused(devcluster, ["label", "node", ORDINARY_NODE, f"{TAINT_KEY}=overseas"], names=RIGHTS_REFUSED)
    refused(devcluster, ["patch", "node", POOL_NODE, "--type=merge", "-p", '{"spec":{"unschedulable":true}}'], names=RIGHTS_REFUSED)
    message = refused(devcluster, ["patch", "node", ORDINARY_NODE, "--type=merge", "-p", '{"spec":{"unschedulable":true}}'], names=RIGHTS_REFUSED)
    figures.measured(message[-200:], 0)


def test_it_cannot_change_the_pool_guards_binding(devcluster: Cluster, api: Api, tekton: str, figures: Figures) -> None:
    figures.fault("the controller's token: the pool guard's binding", tekton, "refused by RBAC (no right on bindings)")
    binding = api.call("GET", f"{ADMISSION}/validatingadmissionpolicybindings/{GUARD_NAME}")
    binding["spec"]["validationActions"] = ["Audit"]
    message = refused(devcluster, *replaced(binding), names='cannot update resource "validatingadmissionpolicybindings"')
    refused(devcluster, ["patch", "validatingadmissionpolicybinding", GUARD_NAME, "--type=merge", "-p", '{"spec":{"validationActions":["Audit"]}}'],
            names='resource "validatingadmissionpolicybindings"')  # kubectl reads it first: cannot get
    figures.measured(message[-200:], 0)


def test_it_cannot_change_a_runs_params(devcluster: Cluster, tekton: str, objects: dict[str, str], figures: Figures) -> None:
    figures.fault("the controller's token: a run's params", tekton, f"refused by {RIGHTS_NAME}")
    evil = [{"op": "replace", "path": "/spec/params/0/value", "value": "https://evil.example/"}]
    refused(devcluster, patch("taskrun", objects["held"], evil, TEAM_OTHER), names=RIGHTS_REFUSED)
    message = refused(devcluster, patch("taskrun", objects["started"], evil, TEAM_OTHER), names=RIGHTS_REFUSED)
    refused(devcluster, ["-n", TEAM_OTHER, "annotate", "taskrun", objects["held"], "team.io/owner=evil"], names=RIGHTS_REFUSED)
    figures.measured(message[-200:], 0)


def test_it_cannot_delete_a_pod_off_the_pool_nodes(devcluster: Cluster, tekton: str, objects: dict[str, str], figures: Figures) -> None:
    figures.fault("the controller's token: deleting a pod on an ordinary node", tekton, f"refused by {POD_DELETES_NAME}")
    message = refused(devcluster, ["-n", TEAM_OTHER, "delete", "pod", objects["off-pool"], "--wait=false"], names=DELETE_REFUSED)
    figures.measured(message[-200:], 0)


def test_it_can_change_nothing_of_a_pod_but_remove_our_gate(devcluster: Cluster, tekton: str, objects: dict[str, str], figures: Figures) -> None:
    figures.fault("the controller's token: a pod's labels, images, other gates", tekton, f"refused by {RIGHTS_NAME}")
    gated = objects["gated"]
    refused(devcluster, ["-n", TEAM_OTHER, "label", "pod", gated, "team.io/owner=evil"], names=RIGHTS_REFUSED)
    refused(devcluster, ["-n", TEAM_OTHER, "annotate", "pod", objects["off-pool"], "team.io/owner=evil"], names=RIGHTS_REFUSED)
    refused(devcluster, patch("pod", gated, [{"op": "remove", "path": "/spec/schedulingGates"}], TEAM_OTHER), names=RIGHTS_REFUSED)
    refused(devcluster, patch("pod", gated, [{"op": "remove", "path": "/spec/schedulingGates/1"}], TEAM_OTHER), names=RIGHTS_REFUSED)
    message = refused(devcluster, patch("pod", gated, [
        {"op": "remove", "path": "/spec/schedulingGates/0"},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "registry.example/evil:1"},
    ], TEAM_OTHER), names=RIGHTS_REFUSED)
    figures.measured(message[-200:], 0)


# -- still admitted ----------------------------------------------------------------------------------


def admitted(cluster: Cluster, args: list[str], stdin: str | None = None) -> None:
    out = as_the_controller(cluster, *args, stdin=stdin)
    assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"


def test_it_can_still_do_its_work(devcluster: Cluster, api: Api, egress_placer: Placer, tekton: str, objects: dict[str, str]) -> None:
    other = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nnot-this-one\n-----END CERTIFICATE-----\n").decode()
    for kind, name in (("mutating", WEBHOOK_CONFIG), ("validating", POOLS_WEBHOOK_CONFIG)):
        configuration = webhook_configuration(api, kind, name)
        for webhook in configuration["webhooks"]:
            webhook["clientConfig"]["caBundle"] = other
        admitted(devcluster, *replaced(configuration))
    taints = api.call("GET", node(POOL_NODE))["spec"].get("taints") or []
    assert any(t["key"] == TAINT_KEY for t in taints)  # the leader tainted it through the policy
    without = [t for t in taints if t["key"] != TAINT_KEY]
    admitted(devcluster, ["patch", "node", POOL_NODE, "--type=merge", "-p", json.dumps({"spec": {"taints": without or None}})])
    admitted(devcluster, patch("taskrun", objects["held"], [
        {"op": "test", "path": "/spec/status", "value": "TaskRunPending"}, {"op": "remove", "path": "/spec/status"},
    ], TEAM_OTHER))
    admitted(devcluster, ["-n", "kube-system", "delete", "pod", objects["on-pool"], "--wait=false"])
    admitted(devcluster, patch("pod", objects["gated"], [
        {"op": "test", "path": "/spec/schedulingGates", "value": GATES}, {"op": "remove", "path": "/spec/schedulingGates/0"},
    ], TEAM_OTHER))  # the queue lets in a pod waiting for a pool slot
    # Dry runs: nothing changed.
    assert api.call("GET", namespaced(TEAM_OTHER, "taskruns", objects["held"], group=TEKTON))["spec"]["status"] == "TaskRunPending"
    # The controller itself, under the policies all along (it tainted the pool nodes through them), had no write refused.
    log = egress_placer.log.read_text()
    assert RIGHTS_NAME not in log and POD_DELETES_NAME not in log


# -- the pools API's CRDs ----------------------------------------------------------------------------

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
POOL_CRD = "egresspools.egress-placer.io"
CONFIG_CRD = "egressplacerconfigs.egress-placer.io"


def another_ca(cluster: Cluster) -> str:
    """A CA bundle the API server accepts for a CRD's conversion (it parses the PEM), not the controller's:
    the cluster's own CA."""
    return base64.b64encode(cluster.pki.ca_cert.read_bytes()).decode()


def stored_versions(api: Api, crd: str) -> list[str]:
    return api.call("GET", f"{CRDS}/{crd}")["status"]["storedVersions"]


def with_stored_versions(api: Api, crd: str, versions: list[str]) -> dict[str, Any]:
    """The CRD as read, its storedVersions set (for a PUT to /status)."""
    read = api.call("GET", f"{CRDS}/{crd}")
    read["status"]["storedVersions"] = versions
    return read


@pytest.fixture
def unpruned(api: Api) -> Iterator[None]:
    """The pool CRD's storedVersions as before the migration (set by the admin); pruned again afterwards."""
    api.json_patch(f"{CRDS}/{POOL_CRD}/status", [{"op": "replace", "path": "/status/storedVersions", "value": ["v1alpha1", "v1beta1"]}])
    try:
        yield
    finally:
        api.json_patch(f"{CRDS}/{POOL_CRD}/status", [{"op": "replace", "path": "/status/storedVersions", "value": ["v1beta1"]}])


def test_it_can_change_nothing_of_the_crds_but_the_conversion_ca_bundle(
    devcluster: Cluster, api: Api, egress_placer: Placer, figures: Figures
) -> None:
    figures.fault("the controller's token: a CRD's schema, versions or conversion url", "", f"refused by {RIGHTS_NAME}")
    crd = api.call("GET", f"{CRDS}/{POOL_CRD}")
    stored = next(i for i, v in enumerate(crd["spec"]["versions"]) if v["storage"])
    other = 1 - stored
    admitted(devcluster, ["patch", "crd", POOL_CRD, "--type=merge", "-p", json.dumps(
        {"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": another_ca(devcluster)}}}}})])  # the leader's patch
    schema = f"/spec/versions/{stored}/schema/openAPIV3Schema/description"
    refused(devcluster, patch("crd", POOL_CRD, [{"op": "add", "path": schema, "value": "evil"}]), names=RIGHTS_REFUSED)
    refused(devcluster, patch("crd", CONFIG_CRD, [{"op": "replace", "path": f"/spec/versions/{other}/served", "value": False}]), names=RIGHTS_REFUSED)
    message = refused(devcluster, ["patch", "crd", POOL_CRD, "--type=merge", "-p", json.dumps(
        {"spec": {"conversion": {"webhook": {"clientConfig": {"url": "https://evil.example/convert"}}}}})], names=RIGHTS_REFUSED)
    assert "may change only the conversion webhook's caBundle" in message
    figures.measured(message[-200:], 0)


def test_it_can_only_prune_stored_versions(devcluster: Cluster, api: Api, egress_placer: Placer, unpruned: None, figures: Figures) -> None:
    figures.fault("the controller's token: a version added to a CRD's storedVersions", "", f"refused by {RIGHTS_NAME}")
    status = ["replace", "--subresource=status", "-f", "-"]
    admitted(devcluster, status, json.dumps(with_stored_versions(api, POOL_CRD, ["v1beta1"])))
    assert stored_versions(api, CONFIG_CRD) == ["v1beta1"]  # the leader pruned it, under the policy
    message = refused(devcluster, status, json.dumps(with_stored_versions(api, CONFIG_CRD, ["v1alpha1", "v1beta1"])), names=RIGHTS_REFUSED)
    assert "may only remove versions from a CustomResourceDefinition's status.storedVersions" in message
    figures.measured(message[-200:], 0)


def test_the_storage_migration_works_under_the_policy(
    devcluster: Cluster, api: Api, egress_placer: Placer, unpruned: None, tmp_path: Any
) -> None:
    """The leader's migration code (`migrate_storage`) with the controller's own credentials: every object
    written back unchanged, storedVersions pruned."""
    kubeconfig = devcluster.mint_kubeconfig(THE_CONTROLLER, out=tmp_path / "controller.kubeconfig")
    done = egress_placer_command(devcluster, "migrate-storage", kubeconfig=kubeconfig)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"{POOL_CRD}: storedVersions [v1beta1]" in done.stdout, done.stdout
    assert stored_versions(api, POOL_CRD) == ["v1beta1"]


def test_the_leader_keeps_the_conversion_ca_bundle_under_the_policy(devcluster: Cluster, api: Api, egress_placer: Placer) -> None:
    path = f"{CRDS}/{CONFIG_CRD}"
    ca = api.call("GET", path)["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"]
    api.merge_patch(path, {"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": another_ca(devcluster)}}}}})  # an admin, by mistake
    wait_for("the leader to put the conversion caBundle back",
             lambda: api.call("GET", path)["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"] == ca, timeout=120)
    log = egress_placer.log.read_text()
    assert RIGHTS_NAME not in log
