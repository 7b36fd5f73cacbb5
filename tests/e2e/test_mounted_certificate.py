"""End to end, a serving certificate kept by someone else (what `k8s/cert-manager/` sets up): the
controller runs with EGRESS_PLACER_TLS_CERT_FILE / _KEY_FILE pointing at a pair this test made, the
webhooks get its CA as their caBundle as cert-manager's CA injector would give it, and then the API
server reaches the webhook over that certificate: a matching TaskRun is placed. The controller serves
exactly the files' certificate and writes neither its own Secret nor the caBundle."""

from __future__ import annotations

import base64
import ssl
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from running_controller import POLICY_FILE, EgressPlacer, make_plain
from tekton_runs import MATCHING_IMAGE, POOL, POOL_NODES, TEAM_CDN, Runs, Waiter, decision_of, taskrun

from controller.admission.certs import KeyPair, make_ca, make_serving_cert
from controller.app import CERT_TICK_SECONDS
from controller.settings import Settings
from devcluster.cluster import Cluster
from devplacer.controller import NAMESPACE, WEBHOOK_CONFIG, start_controller

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

TLS_SECRET = Settings.model_fields["tls_secret"].default


def secret_version(core: client.CoreV1Api) -> str | None:
    try:
        return core.read_namespaced_secret(TLS_SECRET, NAMESPACE).metadata.resource_version
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def ca_bundles(kube: client.ApiClient) -> set[bytes | None]:
    config = client.AdmissionregistrationV1Api(kube).read_mutating_webhook_configuration(WEBHOOK_CONFIG)
    return {base64.b64decode(w.client_config.ca_bundle) if w.client_config.ca_bundle else None for w in config.webhooks}


@pytest.fixture(scope="module")
def mounted(
    devcluster: Cluster, kube: client.ApiClient, tenants: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[EgressPlacer, KeyPair, KeyPair, str | None]]:
    """The controller serving a pair from files; (controller, CA, serving pair, Secret version before)."""
    now = datetime.now(UTC)
    ca = make_ca(now)
    serving = make_serving_cert(ca, ["127.0.0.1", "localhost"], now, days=30)
    directory: Path = tmp_path_factory.mktemp("mounted-certificate")
    (directory / "tls.crt").write_bytes(serving.cert_pem)
    (directory / "tls.key").write_bytes(serving.key_pem)
    before = secret_version(client.CoreV1Api(kube))
    env = {"EGRESS_PLACER_TLS_CERT_FILE": str(directory / "tls.crt"), "EGRESS_PLACER_TLS_KEY_FILE": str(directory / "tls.key")}
    try:
        start_controller(devcluster, POLICY_FILE, env=env, ca_bundle=ca.cert_pem)  # the CA injector's part
        yield EgressPlacer(devcluster), ca, serving, before
    finally:
        make_plain(kube, devcluster)


def test_the_controller_serves_the_files_certificate(mounted: tuple[EgressPlacer, KeyPair, KeyPair, str | None]) -> None:
    placer, _, serving, _ = mounted
    served = ssl.get_server_certificate(("127.0.0.1", placer.replica.webhook_port))
    assert ssl.PEM_cert_to_DER_cert(served) == ssl.PEM_cert_to_DER_cert(serving.cert_pem.decode())


def test_a_matching_taskrun_is_placed_through_the_mounted_certificate(
    mounted: tuple[EgressPlacer, KeyPair, KeyPair, str | None], kube: client.ApiClient, wait_for: Waiter
) -> None:
    runs = Runs(kube, wait_for)
    try:
        name = runs.name("mounted")
        runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
        done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name])
        assert decision_of(done[name]).get("pool") == POOL
        assert runs.nodes_of(TEAM_CDN, [name])[name] in POOL_NODES
    finally:
        runs.cleanup()


def test_the_controller_writes_neither_its_secret_nor_the_ca_bundle(
    mounted: tuple[EgressPlacer, KeyPair, KeyPair, str | None], kube: client.ApiClient, wait_for: Waiter
) -> None:
    placer, ca, _, before = mounted
    wait_for("the controller to lead", lambda: placer.metric("egress_placer_leader", {}) == 1, timeout=30)
    time.sleep(3 * CERT_TICK_SECONDS)  # a self-managing leader writes both within one tick of leading
    assert secret_version(client.CoreV1Api(kube)) == before
    assert ca_bundles(kube) == {ca.cert_pem}
    loaded = [r for r in placer.log_records() if "serving certificate loaded from files" in str(r.get("message", ""))]
    assert loaded, "no log line of the certificate loaded from files"
