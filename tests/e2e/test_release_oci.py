"""End to end, the release's chart from an OCI registry (docs/releasing.md): the chart packaged and pushed
(`helm push --plain-http`) to a real registry on 127.0.0.1 (the CNCF distribution registry built from its Go
module, an optional devcluster component cached by version), then `helm install --plain-http
oci://127.0.0.1:PORT/egress-placer/charts/egress-placer --version VERSION` onto the local cluster; its controller
(a local process under the release's ServiceAccount, as in test_helm_install.py) becomes ready, and what Helm
installed is what the checkout's chart renders. `make release-dry-run` does the rest (image, signature).

Skipped, saying so, when the registry is not built (`python -m devcluster build --with oci-registry`)."""

from __future__ import annotations

import json
from typing import Iterator

import pytest
import requests

from devcluster.cluster import Cluster
from devplacer.chart import RELEASE, RELEASE_NAMESPACE, helm_binary, run_helm, settings_env, template
from devplacer.local_placer import start_controller, stop_controller
from devplacer.release import CHART_PATH, REGISTRY_PROCESS, RegistryRelease, cached_registry, push_chart, start_registry
from devplacer.version import VERSION
from tests.e2e.harness import POLICY_FILE, egress_placer_command, make_plain
from tests.e2e.test_helm_install import CHART_CRDS, CRDS, VALUES, admission_left, earlier_install_left
from tests.kube import Api, namespace, namespaces_left
from tests.waiting import wait_gone

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]


@pytest.fixture(scope="module")
def registry(devcluster: Cluster) -> Iterator[str]:
    binary = cached_registry()
    if binary is None:
        pytest.skip("the OCI registry is not built (python -m devcluster build --with oci-registry, or make release-dry-run)")
    try:
        yield start_registry(devcluster, binary)
    finally:
        devcluster.stop_process(REGISTRY_PROCESS)


@pytest.fixture(scope="module")
def release(devcluster: Cluster, api: Api, registry: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryRelease]:
    helm = helm_binary(devcluster.log)
    reference = push_chart(helm, registry, tmp_path_factory.mktemp("chart"))
    assert reference == f"oci://{registry}/{CHART_PATH}/egress-placer"
    done = egress_placer_command(devcluster, "uninstall", "--yes")  # an earlier module's install
    assert done.returncode == 0, done.stdout + done.stderr
    wait_gone("an earlier module's install to be gone", lambda: earlier_install_left(api), timeout=180)
    release = RegistryRelease(devcluster, helm, VALUES, reference=reference)
    try:
        env = settings_env(template(helm, {**VALUES, "createNamespace": False}, namespace=RELEASE_NAMESPACE))
        start_controller(devcluster, POLICY_FILE, env=env, install=release.install)
        yield release
    finally:
        stop_controller(devcluster)
        release.uninstall()
        make_plain(api, devcluster)
        for name in CHART_CRDS:
            api.delete(f"{CRDS}/{name}")
        api.delete(namespace(RELEASE_NAMESPACE))
        wait_gone(f"namespace {RELEASE_NAMESPACE} to be gone", lambda: namespaces_left(api, RELEASE_NAMESPACE), timeout=180)  # the next module installs into it


def test_the_registry_serves_the_chart_as_an_oci_artifact(registry: str, release: RegistryRelease) -> None:
    tags = requests.get(f"http://{registry}/v2/{CHART_PATH}/egress-placer/tags/list", timeout=10).json()
    assert tags["tags"] == [VERSION]
    manifest = requests.get(
        f"http://{registry}/v2/{CHART_PATH}/egress-placer/manifests/{VERSION}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}, timeout=10,
    ).json()  # fmt: skip
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"


def test_helm_installs_it_from_the_registry_and_the_controller_is_ready(release: RegistryRelease) -> None:
    assert release.installed_with[:4] == ["helm", "install", "egress-placer", release.reference]
    assert "--plain-http" in release.installed_with
    assert release.status()["info"]["status"] == "deployed"
    metadata = json.loads(run_helm(release.helm, "get", "metadata", RELEASE, "--namespace", release.namespace, "--output", "json",
                                   kubeconfig=release.cluster.kubeconfig))
    assert (metadata["chart"], metadata["version"], metadata["appVersion"]) == ("egress-placer", VERSION, VERSION)
    installed = {(d["kind"], d["metadata"]["name"]) for d in release.manifest()}
    rendered = {(d["kind"], d["metadata"]["name"]) for d in template(release.helm, {**VALUES, "createNamespace": False})}
    assert installed == rendered - {("Namespace", RELEASE_NAMESPACE)}


def test_uninstall_leaves_no_admission(release: RegistryRelease, api: Api) -> None:
    """Last: `helm uninstall` of the registry's release takes its webhooks and policy bindings."""
    stop_controller(release.cluster)
    release.uninstall()
    assert admission_left(api) == []
