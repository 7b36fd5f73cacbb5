"""End to end, a serving certificate kept by someone else (what `k8s/cert-manager/` sets up): the
controller runs with EGRESS_PLACER_TLS_CERT_FILE / _KEY_FILE pointing at a pair this test made, the
webhooks get its CA as their caBundle as cert-manager's CA injector would give it, and then the API
server reaches the webhook over that certificate: a matching TaskRun is placed. The controller serves
exactly the files' certificate, serves the renewed pair once the files change, and writes neither its
own Secret nor the caBundle."""

from __future__ import annotations

import base64
import os
import ssl
from datetime import UTC, datetime
from pathlib import Path
from typing import Iterator

import pytest

from controller.admission.certs import KeyPair, make_ca, make_serving_cert
from controller.app import CERT_CHECK_SECONDS
from controller.settings import Settings
from devcluster.cluster import Cluster
from devplacer.local_placer import NAMESPACE, WEBHOOK_CONFIG
from tests.e2e.harness import POLICY_FILE, WEBHOOK_CONFIGS, Placer, running_placer
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL, POOL_NODES, TEAM_CDN, Runs, decision_of, taskrun
from tests.kube import Api, namespaced
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

TLS_SECRET = Settings.model_fields["tls_secret"].default


def secret_version(api: Api) -> str | None:
    secret = api.get(namespaced(NAMESPACE, "secrets", TLS_SECRET))
    return secret["metadata"]["resourceVersion"] if secret else None


def ca_bundles(api: Api) -> set[bytes | None]:
    config = api.call("GET", f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}")
    bundles = (w["clientConfig"].get("caBundle") for w in config["webhooks"])
    return {base64.b64decode(b) if b else None for b in bundles}


def write_pair(directory: Path, pair: KeyPair) -> None:
    """Put `pair` into tls.crt/tls.key, each file replaced whole (as a Secret volume's update is)."""
    for name, data in (("tls.key", pair.key_pem), ("tls.crt", pair.cert_pem)):
        (directory / f".{name}.new").write_bytes(data)
        os.replace(directory / f".{name}.new", directory / name)


def served(placer: Placer) -> bytes:
    """The certificate the webhook serves (DER)."""
    return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", placer.replica.webhook_port)))


@pytest.fixture(scope="module")
def mounted(
    devcluster: Cluster, api: Api, tenants: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Placer, KeyPair, KeyPair, str | None, Path]]:
    """The controller serving a pair from files; (controller, CA, serving pair, Secret version before,
    the files' directory)."""
    now = datetime.now(UTC)
    ca = make_ca(now)
    serving = make_serving_cert(ca, ["127.0.0.1", "localhost"], now, days=30)
    directory: Path = tmp_path_factory.mktemp("mounted-certificate")
    write_pair(directory, serving)
    before = secret_version(api)
    env = {"EGRESS_PLACER_TLS_CERT_FILE": str(directory / "tls.crt"), "EGRESS_PLACER_TLS_KEY_FILE": str(directory / "tls.key")}
    with running_placer(devcluster, api, POLICY_FILE, env=env, ca_bundle=ca.cert_pem) as placer:  # the CA injector's part
        yield placer, ca, serving, before, directory


def test_the_controller_serves_the_files_certificate(
    mounted: tuple[Placer, KeyPair, KeyPair, str | None, Path],
) -> None:
    placer, _, serving, _, _ = mounted
    assert served(placer) == ssl.PEM_cert_to_DER_cert(serving.cert_pem.decode())


def test_a_matching_taskrun_is_placed_through_the_mounted_certificate(
    mounted: tuple[Placer, KeyPair, KeyPair, str | None, Path], api: Api
) -> None:
    runs = Runs(api)
    try:
        name = runs.name("mounted")
        runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
        done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name])
        assert decision_of(done[name]).get("pool") == POOL
        assert runs.nodes_of(TEAM_CDN, [name])[name] in POOL_NODES
    finally:
        runs.cleanup()


def test_the_controller_writes_neither_its_secret_nor_the_ca_bundle(
    mounted: tuple[Placer, KeyPair, KeyPair, str | None, Path], api: Api
) -> None:
    placer, ca, _, before, directory = mounted
    wait_for("the controller to lead", lambda: placer.metric("egress_placer_leader", {}) == 1, timeout=30)
    # A certificate check as leader, seen from outside: the files get a new pair (same CA, as
    # cert-manager renews) and the controller serves it. A self-managing leader writes its Secret and
    # the caBundle in every check as leader.
    renewed = make_serving_cert(ca, ["127.0.0.1", "localhost"], datetime.now(UTC), days=30)
    write_pair(directory, renewed)
    wait_for(
        "the renewed certificate served (a certificate check as leader)",
        lambda: served(placer) == ssl.PEM_cert_to_DER_cert(renewed.cert_pem.decode()),
        timeout=CERT_CHECK_SECONDS + 15,
        interval=0.5,
    )
    assert secret_version(api) == before
    assert ca_bundles(api) == {ca.cert_pem}
    loaded = [r for r in placer.log_records() if "serving certificate loaded from files" in str(r.get("message", ""))]
    assert len(loaded) == 2, "not one log line per certificate loaded from files"
