"""End to end, `helm upgrade` from the 0.1.0 chart (charts/egress-placer as merged at OLD_CHART_COMMIT, when
the chart put its objects in namespace egress-placer whatever the release's and Helm recorded the release in
`default`) to this one, as docs/helm.md, "Upgrading from the 0.1.0 chart", says: `--namespace default
--reset-then-reuse-values --set namespaceOverride=egress-placer`. The release is installed and its controller
started as in test_helm_install.py (a local process under the chart's ServiceAccount; the post-renderer
points the webhooks at it). After the upgrade every object is where it was, the CRDs are the release's
(templates now, updated by the upgrade), the webhooks keep the caBundle
the controller wrote, the new values have their defaults, and the controller still places a run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from devcluster.cluster import Cluster, ClusterError
from devplacer.chart import Release, helm_binary, policy_values, settings_env, template
from devplacer.local_placer import NAMESPACE, REPO, WEBHOOK_CONFIG, kubectl, start_controller, stop_controller
from tests.e2e.harness import POLICY_FILE, WEBHOOK_CONFIGS, egress_placer_command, make_plain
from tests.e2e.tekton_runs import MATCHING_IMAGE, ORDINARY_NODES, POOL, POOL_NODES, TEAM_CDN, Runs, decision_of, taskrun
from tests.kube import Api, namespace, namespaced, namespaces_left
from tests.waiting import wait_for, wait_gone

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

OLD_CHART_COMMIT = "4821e6457d3bb39f9ebb5c3464298cfdd83a7e0d"  # main with the 0.1.0 chart, before the release namespace
OLD_RELEASE_NAMESPACE = "default"
VALUES: dict[str, Any] = {
    "policySource": "configmap",
    "policy": policy_values(POLICY_FILE),
    "nodeSelector": {"kubernetes.io/hostname": sorted(ORDINARY_NODES)[0]},
}
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CHART_CRDS = ("egresspools.egress-placer.io", "egressplacerconfigs.egress-placer.io")
# docs/helm.md's command: the CRDs the 0.1.0 chart installed from crds/ become the release's.
ADOPT_THE_CRDS = [
    "kubectl label crd egresspools.egress-placer.io egressplacerconfigs.egress-placer.io app.kubernetes.io/managed-by=Helm",
    "kubectl annotate crd egresspools.egress-placer.io egressplacerconfigs.egress-placer.io"
    " meta.helm.sh/release-name=egress-placer meta.helm.sh/release-namespace=default",
]


@pytest.fixture(scope="module")
def old_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 0.1.0 chart, from the repository's history."""
    out = tmp_path_factory.mktemp("chart-0.1.0")
    archive = subprocess.run(["git", "archive", OLD_CHART_COMMIT, "charts/egress-placer"], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out / "charts" / "egress-placer"


def objects_namespaces(release: Release) -> set[str]:
    return {d["metadata"]["namespace"] for d in release.manifest() if "namespace" in d["metadata"]} - {
        "tekton-pipelines", "tekton-pipelines-resolvers", "kube-system"}


@pytest.fixture(scope="module")
def release(devcluster: Cluster, api: Api, tenants: tuple[str, str], old_chart: Path) -> Iterator[Release]:
    """The 0.1.0 chart installed (release in `default`, objects in egress-placer), its controller started."""
    done = egress_placer_command(devcluster, "uninstall", "--yes")  # an earlier module's install
    assert done.returncode == 0, done.stdout + done.stderr
    wait_gone(f"namespace {NAMESPACE} of an earlier module to be gone", lambda: namespaces_left(api, NAMESPACE), timeout=180)
    helm = helm_binary(devcluster.log)
    release = Release(devcluster, helm, VALUES, namespace=OLD_RELEASE_NAMESPACE, chart=old_chart)
    try:
        start_controller(devcluster, POLICY_FILE, env=settings_env(template(helm, VALUES)), install=release.install)
        yield release
    finally:
        stop_controller(devcluster)
        release.uninstall()  # the release made namespace egress-placer: Helm deletes it
        make_plain(api, devcluster)
        for crd in CHART_CRDS:  # Helm leaves crds/ (0.1.0) and kept CRDs
            api.delete(f"{CRDS}/{crd}")
        wait_gone(f"namespace {NAMESPACE} to be gone", lambda: namespaces_left(api, NAMESPACE), timeout=180)


def test_an_upgrade_from_the_0_1_0_chart_keeps_everything_where_it_is(release: Release, api: Api, devcluster: Cluster) -> None:
    assert "namespaceOverride" not in (release.chart / "values.yaml").read_text()  # the 0.1.0 chart indeed
    assert objects_namespaces(release) == {NAMESPACE}
    config = f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}"
    wait_for("the controller's caBundle", lambda: all(h["clientConfig"].get("caBundle") for h in api.call("GET", config)["webhooks"]), timeout=60)
    before = [h["clientConfig"] for h in api.call("GET", config)["webhooks"]]
    namespace_uid = api.call("GET", namespace(NAMESPACE))["metadata"]["uid"]
    with pytest.raises(ClusterError, match="invalid ownership metadata"):  # the CRDs of 0.1.0's crds/ are not the release's
        release.upgrade({"namespaceOverride": NAMESPACE})
    for command in ADOPT_THE_CRDS:  # docs/helm.md
        kubectl(devcluster, *command.split()[1:])

    release.upgrade({"namespaceOverride": NAMESPACE})

    status = release.status()
    assert (status["info"]["status"], status["version"]) == ("deployed", 2)
    assert objects_namespaces(release) == {NAMESPACE}
    assert api.call("GET", namespace(NAMESPACE))["metadata"]["uid"] == namespace_uid  # the same Namespace, kept
    assert [h["clientConfig"] for h in api.call("GET", config)["webhooks"]] == before
    assert {(h["failurePolicy"], h["timeoutSeconds"]) for h in api.call("GET", config)["webhooks"]} == {("Ignore", 3)}  # new values' defaults
    deployment = api.call("GET", namespaced(NAMESPACE, "deployments", "egress-placer", group="/apis/apps/v1"))
    assert deployment["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == OLD_RELEASE_NAMESPACE
    assert api.get(namespaced(OLD_RELEASE_NAMESPACE, "deployments", "egress-placer", group="/apis/apps/v1")) is None
    for crd in CHART_CRDS:  # now the release's, updated by the upgrade: the keep policy and Helm's labels
        metadata = api.call("GET", f"{CRDS}/{crd}")["metadata"]
        assert metadata["annotations"]["helm.sh/resource-policy"] == "keep"
        assert metadata["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_the_upgraded_release_still_places_a_run(release: Release, api: Api) -> None:
    runs = Runs(api)
    try:
        name = runs.name("after-upgrade")
        runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
        done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name])
        assert runs.nodes_of(TEAM_CDN, [name])[name] in POOL_NODES
        assert (decision_of(done[name]).get("pool"), decision_of(done[name]).get("reason")) == (POOL, "image-match")
    finally:
        runs.cleanup()
