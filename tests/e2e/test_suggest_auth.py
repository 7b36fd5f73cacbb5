"""Prometheus as users run it (issue 27): the cluster's real Prometheus behind basic auth and TLS
(`--web.config.file`: a bcrypt-hashed user, a serving certificate signed by the devcluster's CA), and
`egress-placer suggest` reaching it with the credentials from files, as docs/suggest.md ("Prometheus behind
auth") says. What users see: without credentials, with a wrong password, with a bearer token where basic
auth is asked, or without the CA, one line on stderr naming what failed (401 / the certificate) and exit 3;
with the user, its password file and the CA file, an answer (exit 0; "not enough history" when nothing ran).
The controller's history rule, given the same credentials as mounted files (EGRESS_PLACER_PROMETHEUS_*), shows
the 401 in the pool's `status.history.lastError` while the password file is wrong, and clears it once the
file is right (read again at every query: a rotated Secret needs no restart).
The unit tests (tests/unit/test_prometheus_auth.py) use a local HTTP server; this is the real server's auth.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import requests

from controller.core.conversion import V1BETA1
from devcluster import build
from devcluster.cluster import Cluster
from devcluster.prometheus import PROCESS_NAME, start_prometheus, stop_prometheus
from devplacer.local_placer import start_controller
from devplacer.pod_exporter import PodExporter
from tests.e2e.harness import POLICY_FILE, REPO, Placer, as_an_administrator, egress_placer_command, make_plain
from tests.e2e.tekton_runs import POOL
from tests.e2e.test_suggest_rule import POOLS, delete_pools, history_pool
from tests.kube import Api
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

STORED_POOLS = f"/apis/{V1BETA1}/egresspools"
USER = "placer"
PASSWORD = "placer-e2e-secret"
# bcrypt (cost 10) of PASSWORD, made once with golang.org/x/crypto/bcrypt (the package Prometheus' own
# web config uses; no bcrypt in the venv, no htpasswd on the machine): a test credential, nothing else.
PASSWORD_HASH = "$2a$10$0wpIGSzowvISluQHqHrvgust2nffwTyrgecd.Y8azW0e5dAYFLGii"


class Secured:
    """The running Prometheus' URL and the files a user gives `suggest`."""

    def __init__(self, url: str, files: Path, ca_file: Path) -> None:
        self.url = url
        self.ca_file = str(ca_file)
        self.password_file = self._write(files / "password", PASSWORD)
        self.wrong_password_file = self._write(files / "wrong-password", PASSWORD + "-not")
        self.token_file = self._write(files / "token", "a-bearer-token-prometheus-does-not-know")

    @staticmethod
    def _write(path: Path, text: str) -> str:
        path.write_text(text + "\n")
        path.chmod(0o600)
        return str(path)


@pytest.fixture(scope="module")
def secured(devcluster: Cluster, api: Api, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    if build.find_optional(PROCESS_NAME) is None:
        pytest.skip("Prometheus is not built (an optional component: `python -m devcluster build --with prometheus`, "
                    "or run tests/e2e/test_suggest.py once, which builds it)")
    cert, key = devcluster.serving_cert("prometheus-auth")  # SANs localhost and 127.0.0.1, signed by the cluster CA
    web_config = {
        "tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
        "basic_auth_users": {USER: PASSWORD_HASH},
    }
    probe = requests.Session()
    probe.trust_env = False
    probe.auth = (USER, PASSWORD)
    probe.verify = str(devcluster.pki.ca_cert)
    exporter = PodExporter(lambda: [])  # a target to scrape; no run needs to send anything here
    stop_prometheus(devcluster)  # another module's, if left
    try:
        url = start_prometheus(devcluster, {"pods": exporter.start()}, web_config=web_config, probe=probe)
        # The pools API and a pool: `suggest` reads the policy before Prometheus. The storage version, as
        # tests/e2e/test_suggest.py does: no controller runs yet to convert.
        crds = as_an_administrator(devcluster, str(devcluster.binary("kubectl")), "apply", "--server-side", "--force-conflicts",
                                   "-f", str(REPO / "k8s" / "crds"))
        assert crds.returncode == 0, crds.stderr
        wait_for("the pools API served", lambda: api.get(STORED_POOLS), timeout=60, interval=0.5)  # 404 until established
        api.delete(f"{STORED_POOLS}/{POOL}")
        api.create(STORED_POOLS, {"apiVersion": V1BETA1, "kind": "EgressPool", "metadata": {"name": POOL},
                                  "spec": {"priority": 999_990, "nodeSelector": {"egress-placer.io/pool": POOL},
                                           "namespaces": ["team-cdn"], "images": ["registry.example/upload:*"]}})
        yield Secured(url, tmp_path_factory.mktemp("prometheus-auth"), devcluster.pki.ca_cert)
    finally:
        api.delete(f"{STORED_POOLS}/{POOL}")
        stop_prometheus(devcluster)
        exporter.stop()
        probe.close()


def suggest(cluster: Cluster, prometheus: Secured, *args: str) -> subprocess.CompletedProcess[str]:
    return egress_placer_command(cluster, "suggest", "--prometheus", prometheus.url, "--window", "30m", "--step", "1s", *args)


def one_line_refusal(done: subprocess.CompletedProcess[str], prometheus: Secured) -> str:
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"egress-placer suggest: cannot read Prometheus at {prometheus.url}: "), done.stderr
    return done.stderr


def test_the_server_itself_asks_for_credentials(secured: Secured) -> None:
    """The fixture's Prometheus really is behind auth and TLS (not a misread of the CLI's errors)."""
    plain = requests.Session()
    plain.trust_env = False
    assert plain.get(f"{secured.url}/api/v1/query", params={"query": "up"}, verify=secured.ca_file, timeout=5).status_code == 401
    answer = plain.get(f"{secured.url}/api/v1/query", params={"query": "up"}, verify=secured.ca_file, auth=(USER, PASSWORD), timeout=5)
    assert answer.status_code == 200 and answer.json()["status"] == "success"


def test_without_credentials_a_401_in_one_line(devcluster: Cluster, secured: Secured) -> None:
    line = one_line_refusal(suggest(devcluster, secured, "--prometheus-ca-file", secured.ca_file), secured)
    assert "HTTP 401" in line and "Unauthorized" in line


def test_with_the_user_and_its_password_file_it_answers(devcluster: Cluster, secured: Secured) -> None:
    done = suggest(devcluster, secured, "--prometheus-ca-file", secured.ca_file,
                   "--prometheus-username", USER, "--prometheus-password-file", secured.password_file)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), done.stderr  # a report, or "not enough history ..." (nothing ran here)
    assert PASSWORD not in done.stdout + done.stderr


def test_a_wrong_password_is_refused(devcluster: Cluster, secured: Secured) -> None:
    line = one_line_refusal(suggest(devcluster, secured, "--prometheus-ca-file", secured.ca_file,
                                    "--prometheus-username", USER, "--prometheus-password-file", secured.wrong_password_file), secured)
    assert "HTTP 401" in line
    assert PASSWORD not in line  # the file's content is never shown


def test_a_bearer_token_is_refused_where_basic_auth_is_asked(devcluster: Cluster, secured: Secured) -> None:
    line = one_line_refusal(suggest(devcluster, secured, "--prometheus-ca-file", secured.ca_file,
                                    "--prometheus-token-file", secured.token_file), secured)
    assert "HTTP 401" in line and "a-bearer-token" not in line


def test_without_the_ca_the_certificate_is_not_trusted(devcluster: Cluster, secured: Secured) -> None:
    line = one_line_refusal(suggest(devcluster, secured,
                                    "--prometheus-username", USER, "--prometheus-password-file", secured.password_file), secured)
    assert "certificate" in line.lower(), line


def test_a_token_and_basic_auth_together_are_bad_options(devcluster: Cluster, secured: Secured) -> None:
    done = suggest(devcluster, secured, "--prometheus-ca-file", secured.ca_file, "--prometheus-token-file", secured.token_file,
                   "--prometheus-username", USER, "--prometheus-password-file", secured.password_file)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and "not both" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def history_reader(devcluster: Cluster, api: Api, secured: Secured, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Placer, Path]]:
    """egress-placer reading the pools API, pool overseas with the history rule pointing at the secured
    Prometheus; its credentials mounted as files (EGRESS_PLACER_PROMETHEUS_*), the password file at first
    holding a wrong password (as a Secret not yet updated). Yields the controller and that password file."""
    password_file = tmp_path_factory.mktemp("controller-prometheus") / "password"
    password_file.write_text(PASSWORD + "-old\n")
    env = {
        "EGRESS_PLACER_POLICY_SOURCE": "pools",
        "EGRESS_PLACER_PROMETHEUS_USERNAME": USER,
        "EGRESS_PLACER_PROMETHEUS_PASSWORD_FILE": str(password_file),
        "EGRESS_PLACER_PROMETHEUS_CA_FILE": secured.ca_file,
    }
    try:
        start_controller(devcluster, POLICY_FILE, env=env)
        delete_pools(api)  # now through the controller's conversion, as tests/e2e/test_suggest_rule.py does
        api.create(POOLS, history_pool(secured.url))
        yield Placer(devcluster), password_file
    finally:
        delete_pools(api)
        make_plain(api, devcluster)


def test_the_controller_s_history_rule_names_the_401_until_the_mounted_password_is_right(
    api: Api, history_reader: tuple[Placer, Path]
) -> None:
    placer, password_file = history_reader

    def history() -> dict:
        return ((api.get(f"{POOLS}/{POOL}") or {}).get("status") or {}).get("history") or {}

    refused = wait_for("status.history.lastError naming the 401", lambda: (lambda h: h if "HTTP 401" in (h.get("lastError") or "") else None)(history()),
                       timeout=90, interval=1)
    assert PASSWORD not in refused["lastError"]
    assert placer.metric("egress_placer_history_reads_total", {"pool": POOL, "result": "success"}) == 0

    password_file.write_text(PASSWORD + "\n")  # the kubelet swaps the mounted Secret's file: no restart
    wait_for("status.history read and its lastError gone", lambda: (lambda h: h if h.get("readAt") and "lastError" not in h else None)(history()),
                    timeout=90, interval=1)
    assert placer.metric("egress_placer_history_reads_total", {"pool": POOL, "result": "success"}) >= 1
