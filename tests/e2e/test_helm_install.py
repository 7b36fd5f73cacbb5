"""End to end, the Helm chart: `helm install` (the helm built from its Go module, against the local
cluster's admin kubeconfig) installs charts/egress-placer with the e2e policy as its `policy` value
(`policySource: configmap`), and the controller it describes places runs.

The controller runs as in the other e2e tests (devplacer.local_placer.start_controller): a local process
under the chart's ServiceAccount (a minted kubeconfig, so the chart's RBAC is what it may do), with the
settings of the chart's Deployment (devplacer.chart.settings_env; ports and certificate its own). The
post-renderer of the install points the webhooks at that process, since the API server here reaches no
Service; every other object is the chart's, the Deployment included: its pods "run" on KWOK's nodes
without a container, on the node the `nodeSelector` value names. A `helm upgrade` keeps the webhooks'
caBundle the controller wrote, and with prometheus-operator's CRDs installed (from its Go module, an
optional devcluster component of files) the API server accepts the chart's ServiceMonitor and
PrometheusRule. The release goes into a namespace of the user's choosing, `ci-system` (`helm install -n
ci-system --create-namespace --set createNamespace=false`, then labelled, as docs/helm.md says): the
controller runs as the ServiceAccount there, under the chart's RBAC and policies that name it. `helm
uninstall` removes the release, webhooks and admission policy bindings included, and leaves the pool
taints and the pools API's CRDs (crds.keep); `EGRESS_PLACER_NAMESPACE=ci-system
egress-placer uninstall --yes` then removes them and the namespace (docs/helm.md, "Uninstall").
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from devcluster.build import PROMETHEUS_OPERATOR_CRDS, ensure_optional, optional_file
from devcluster.cluster import Cluster, ClusterError
from devplacer.chart import CHART_DIR, RELEASE, Release, helm_binary, run_helm, policy_values, settings_env, template
from controller.pool_guard.core import GUARD_NAME
from controller.core.pools import custom_resource_definitions
from controller.core.rights import rights_bindings
from controller.core.run_guard import RUN_GUARD_NAME
from devplacer.local_placer import NAMESPACE, WEBHOOK_CONFIG, kubectl, start_controller, stop_controller
from tests.e2e.harness import (
    POLICY_FILE,
    POOLS_WEBHOOK_CONFIG,
    VALIDATING_WEBHOOK_CONFIGS,
    WEBHOOK_CONFIGS,
    Placer,
    as_an_administrator,
    egress_placer_command,
    make_plain,
    pool_taints,
)
from tests.e2e.tekton_runs import MATCHING_IMAGE, ORDINARY_NODES, POOL, POOL_NODES, POOL_TAINT, TEAM_CDN, TEAM_OTHER, Runs, decision_of, taskrun
from tests.kube import Api, namespace, namespaced, namespaces_left, pods
from tests.waiting import wait_for, wait_gone

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

CONTROLLER_NODE = sorted(ORDINARY_NODES)[0]  # where the Deployment's (containerless) pods are put
# The chart's ConfigMap form (policySource: configmap), so that the policy is the release's own value.
VALUES: dict[str, Any] = {
    "policySource": "configmap",
    "policy": policy_values(POLICY_FILE),
    "nodeSelector": {"kubernetes.io/hostname": CONTROLLER_NODE},
}
# The release's namespace, not k8s/'s egress-placer: the user's choice.
INSTALL_NAMESPACE = "ci-system"
HELM_MANAGED = {"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": "egress-placer"}
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MONITORING = "/apis/monitoring.coreos.com/v1"
CHART_CRDS = sorted(c["metadata"]["name"] for c in custom_resource_definitions())


def established(api: Api, name: str) -> bool:
    status = (api.get(f"{CRDS}/{name}") or {}).get("status") or {}
    return any(c["type"] == "Established" and c["status"] == "True" for c in status.get("conditions") or [])


@pytest.fixture(scope="module")
def helm(devcluster: Cluster) -> Path:
    """The helm of the local cluster's build (built first, a few minutes, when it is not cached)."""
    return helm_binary(devcluster.log)


def earlier_install_left(api: Api) -> list[str]:
    """What is left of an earlier install: namespace egress-placer or ci-system (being deleted or not, with
    what it waits on) and the webhook configuration of another form. Empty: nothing."""
    webhook = [f"mutatingwebhookconfiguration {WEBHOOK_CONFIG}"] if api.get(f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}") is not None else []
    return namespaces_left(api, NAMESPACE, INSTALL_NAMESPACE) + webhook


VAP_BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def admission_left(api: Api) -> list[str]:
    """The chart's webhook configurations and admission policy bindings still there."""
    paths = [f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}", f"{VALIDATING_WEBHOOK_CONFIGS}/{POOLS_WEBHOOK_CONFIG}",
             *(f"{VAP_BINDINGS}/{name}" for name in (GUARD_NAME, RUN_GUARD_NAME, *(b["metadata"]["name"] for b in rights_bindings())))]
    return [p for p in paths if api.get(p) is not None]


def tainted_nodes(api: Api) -> list[str]:
    return sorted(n["metadata"]["name"] for n in api.items("/api/v1/nodes") if pool_taints(api, n["metadata"]["name"]))


@pytest.fixture(scope="module")
def prometheus_operator_crds(devcluster: Cluster, api: Api) -> Iterator[None]:
    """ServiceMonitor and PrometheusRule CRDs from prometheus-operator's module, for the whole module (the release's
    uninstall needs them while it has such objects); deleted afterwards."""
    files = [optional_file(ensure_optional("prometheus-operator-crds", devcluster.log), f) for f in PROMETHEUS_OPERATOR_CRDS.module_files]
    names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in files]
    try:
        for f in files:
            kubectl(devcluster, "apply", "--server-side", "-f", str(f))
        for name in names:
            wait_for(f"CRD {name} established", lambda: established(api, name), timeout=60)
        yield
    finally:
        for name in names:
            api.delete(f"{CRDS}/{name}")


def installed_render(helm: Path) -> list[dict[str, Any]]:
    """What `Release.install` installs: the chart in ci-system, the namespace made by Helm."""
    return template(helm, {**VALUES, "createNamespace": False}, namespace=INSTALL_NAMESPACE)


@pytest.fixture(scope="module")
def release(devcluster: Cluster, api: Api, tenants: tuple[str, str], helm: Path, prometheus_operator_crds: None) -> Iterator[Release]:
    """The chart installed, its controller started; uninstalled and the cluster made plain afterwards."""
    # An earlier module's local install (k8s/ applied: its namespace, RBAC, webhook, CRDs) would be refused
    # by Helm as objects it does not own: removed as a user would, with `egress-placer uninstall`.
    done = egress_placer_command(devcluster, "uninstall", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    wait_gone("namespace egress-placer of an earlier module to be gone", lambda: earlier_install_left(api), timeout=180)
    release = Release(devcluster, helm, VALUES, namespace=INSTALL_NAMESPACE)
    try:
        start_controller(devcluster, POLICY_FILE, env=settings_env(installed_render(helm)), install=release.install, namespace=INSTALL_NAMESPACE)
        yield release
    finally:
        stop_controller(devcluster)
        release.uninstall()
        make_plain(api, devcluster)
        for name in CHART_CRDS:  # crds.keep: Helm leaves the CRDs (docs/helm.md)
            api.delete(f"{CRDS}/{name}")
        api.delete(namespace(INSTALL_NAMESPACE))  # made by helm install --create-namespace: not Helm's to delete
        wait_gone(f"namespace {INSTALL_NAMESPACE} to be gone", lambda: namespaces_left(api, INSTALL_NAMESPACE), timeout=180)


@pytest.fixture
def runs(api: Api, release: Release) -> Iterator[Runs]:
    made = Runs(api)
    yield made
    made.cleanup()


def test_the_release_is_deployed_with_the_chart_s_objects(release: Release, helm: Path, api: Api) -> None:
    assert release.status()["info"]["status"] == "deployed"
    rendered = installed_render(helm)
    installed = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in release.manifest()}
    templated = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in rendered}
    assert installed == templated  # the release's manifest, the CRDs included (templates: crds.install)
    assert {ns for _, ns, _ in installed} - {None, "tekton-pipelines", "tekton-pipelines-resolvers", "kube-system"} == {INSTALL_NAMESPACE}
    labels = api.call("GET", namespace(INSTALL_NAMESPACE))["metadata"]["labels"]
    assert (labels["egress-placer.io/webhook"], labels["pod-security.kubernetes.io/enforce"]) == ("skip", "restricted")
    assert api.get(namespace(NAMESPACE)) is None  # nothing went to k8s/'s namespace
    assert CHART_CRDS == sorted(d["metadata"]["name"] for d in rendered if d["kind"] == "CustomResourceDefinition")
    assert all(established(api, name) for name in CHART_CRDS)
    deployment = api.call("GET", namespaced(INSTALL_NAMESPACE, "deployments", "egress-placer", group="/apis/apps/v1"))
    assert HELM_MANAGED.items() <= deployment["metadata"]["labels"].items()
    (hook, *_) = api.call("GET", f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}")["webhooks"]
    assert hook["clientConfig"]["caBundle"]  # written by the controller, which has the chart's rights to do it


def test_the_deployment_s_pods_go_where_the_node_selector_value_says(release: Release, api: Api) -> None:
    selector = "app.kubernetes.io/name=egress-placer,app.kubernetes.io/component=controller"

    def bound() -> list[str] | None:
        nodes = [p["spec"].get("nodeName") for p in api.items(pods(INSTALL_NAMESPACE), labelSelector=selector)]
        return nodes if len(nodes) == 2 and all(nodes) else None

    assert wait_for("the Deployment's two pods scheduled", bound, timeout=60) == [CONTROLLER_NODE] * 2


def test_the_leader_taints_the_pool_under_the_chart_s_rights(release: Release, api: Api, devcluster: Cluster) -> None:
    wait_for("this replica to lead", lambda: Placer(devcluster).metric("egress_placer_leader", {}) == 1, timeout=60)
    tainted: Callable[[], bool] = lambda: all(pool_taints(api, n) == [POOL_TAINT] for n in POOL_NODES)  # noqa: E731
    wait_for("the pool taint on every pool node", tainted, timeout=60)


def test_its_controller_places_a_matching_run_and_leaves_others_off_the_pool(runs: Runs) -> None:
    placed, foreign = runs.name("cdn"), runs.name("foreign")
    runs.create(TEAM_CDN, "taskruns", taskrun(placed, MATCHING_IMAGE))
    runs.create(TEAM_OTHER, "taskruns", taskrun(foreign, MATCHING_IMAGE))

    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [placed])
    runs.wait_succeeded(TEAM_OTHER, "taskruns", [foreign])
    assert runs.nodes_of(TEAM_CDN, [placed])[placed] in POOL_NODES
    assert runs.nodes_of(TEAM_OTHER, [foreign])[foreign] in ORDINARY_NODES
    decision = decision_of(done[placed])
    assert (decision.get("pool"), decision.get("reason")) == (POOL, "image-match")


def test_an_upgrade_keeps_the_ca_bundle_and_the_api_server_accepts_the_monitoring_objects(release: Release, api: Api) -> None:
    config = f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}"
    before = [h["clientConfig"] for h in api.call("GET", config)["webhooks"]]
    release.upgrade({"intruderMode": "report", "serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}})

    status = release.status()
    assert (status["info"]["status"], status["version"]) == ("deployed", 2)
    assert [h["clientConfig"] for h in api.call("GET", config)["webhooks"]] == before  # caBundle and URL as they were
    deployment = api.call("GET", namespaced(INSTALL_NAMESPACE, "deployments", "egress-placer", group="/apis/apps/v1"))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "EGRESS_PLACER_INTRUDER_MODE", "value": "report"} in container["env"]
    monitor = api.call("GET", namespaced(INSTALL_NAMESPACE, "servicemonitors", "egress-placer", group=MONITORING))
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    rule = api.call("GET", namespaced(INSTALL_NAMESPACE, "prometheusrules", "egress-placer", group=MONITORING))
    assert rule["spec"] == yaml.safe_load((CHART_DIR / "files" / "prometheus-rules.yaml").read_text())


def test_an_upgrade_to_a_chart_that_drops_a_stored_version_fails_first_naming_the_migration(
    release: Release, api: Api, helm: Path, devcluster: Cluster, tmp_path: Path
) -> None:
    """The chart's pre-upgrade check (docs/pools-api.md, "Deprecation policy", point 3): a later chart that
    serves v1beta1 only (this chart, its check's list of versions cut to v1beta1), while the CRD's
    storedVersions still lists v1alpha1, fails before anything is applied (`--dry-run=server` runs the
    lookups as the upgrade does) and names the command; after `egress-placer migrate-storage` it goes on."""
    chart = tmp_path / "egress-placer"
    shutil.copytree(CHART_DIR, chart)
    crds = chart / "templates" / "crds.yaml"
    both = '(has . (list "v1alpha1" "v1beta1"))'
    assert crds.read_text().count(both) == len(CHART_CRDS)
    crds.write_text(crds.read_text().replace(both, '(has . (list "v1beta1"))'))
    pool_crd = f"{CRDS}/egresspools.egress-placer.io"
    api.json_patch(f"{pool_crd}/status", [{"op": "replace", "path": "/status/storedVersions", "value": ["v1alpha1", "v1beta1"]}])
    upgrade = ("upgrade", RELEASE, str(chart), "--namespace", INSTALL_NAMESPACE, "--reuse-values", "--dry-run=server")
    with pytest.raises(ClusterError) as refused:
        run_helm(helm, *upgrade, kubeconfig=devcluster.kubeconfig)
    said = " ".join(str(refused.value).split())
    assert "egresspools.egress-placer.io still stores objects as v1alpha1 (status.storedVersions: [v1alpha1 v1beta1])" in said, said
    assert "`egress-placer migrate-storage`" in said
    done = egress_placer_command(devcluster, "migrate-storage")
    assert done.returncode == 0, done.stdout + done.stderr
    assert api.get(pool_crd)["status"]["storedVersions"] == ["v1beta1"]
    run_helm(helm, *upgrade, kubeconfig=devcluster.kubeconfig)  # the check passes now


def test_helm_uninstall_then_the_command_leave_nothing(release: Release, api: Api, devcluster: Cluster) -> None:
    """Last in the module: `helm uninstall` leaves no webhook and no admission policy binding, but the pool
    taints and the CRDs (by design); `egress-placer uninstall --yes` for the release's namespace removes
    them and the namespace. The fixture's teardown finds nothing left."""
    assert tainted_nodes(api) == sorted(POOL_NODES) and admission_left(api) != []
    stop_controller(devcluster)
    release.uninstall()
    assert admission_left(api) == []
    assert api.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/egress-placer") is None
    assert all(established(api, name) for name in CHART_CRDS)  # crds.keep: Helm leaves them
    assert tainted_nodes(api) == sorted(POOL_NODES)  # no leader was left to put them back, nor to take them off
    done = as_an_administrator(devcluster, "env", f"EGRESS_PLACER_NAMESPACE={INSTALL_NAMESPACE}", sys.executable, "-m", "controller",
                               "uninstall", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert tainted_nodes(api) == []
    left: Callable[[], list[str]] = lambda: earlier_install_left(api) + [f"crd {n}" for n in CHART_CRDS if api.get(f"{CRDS}/{n}")]  # noqa: E731
    wait_gone("the namespace and the pools API's CRDs to be gone", left, timeout=180)
