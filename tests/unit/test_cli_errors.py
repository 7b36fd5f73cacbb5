"""`egress-placer run` and `status` that cannot do their work say why and exit 2, with no traceback.

Nothing here reaches a cluster: the kubeconfig is missing, points at a closed port, or the settings
or the policy are wrong before any request.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from loguru import logger

from controller.cli import main

CLOSED_PORT_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch):
    for name in [n for n in os.environ if n.startswith("EGRESS_PLACER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("EGRESS_PLACER_LOG_FORMAT", "text")
    yield
    logger.remove()  # `run` configured logging to the captured stderr of this test
    logger.add(sys.stderr)


@pytest.fixture
def closed_port_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(CLOSED_PORT_KUBECONFIG)
    monkeypatch.setenv("EGRESS_PLACER_KUBECONFIG", str(path))
    return path


def errors_of(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("command", ["run", "status"])
def test_invalid_settings_are_named(command, monkeypatch, capsys):
    monkeypatch.setenv("EGRESS_PLACER_LEASE_DURATION_SECONDS", "fifteen")
    assert main([command]) == 2
    err = errors_of(capsys)
    assert f"egress-placer {command}: invalid settings" in err and "lease_duration_seconds" in err


def test_run_without_a_readable_kubeconfig(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EGRESS_PLACER_KUBECONFIG", str(tmp_path / "missing"))
    assert main(["run"]) == 2
    assert "egress-placer: ConfigException: Invalid kube-config file" in errors_of(capsys)


def test_run_with_leader_timings_that_cannot_work(closed_port_kubeconfig, monkeypatch, capsys):
    monkeypatch.setenv("EGRESS_PLACER_LEASE_DURATION_SECONDS", "2")
    monkeypatch.setenv("EGRESS_PLACER_RENEW_DEADLINE_SECONDS", "3")
    assert main(["run"]) == 2
    assert "leader election needs lease_duration > renew_deadline > retry_period" in errors_of(capsys)


def test_status_without_a_readable_kubeconfig(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EGRESS_PLACER_KUBECONFIG", str(tmp_path / "missing"))
    assert main(["status"]) == 2
    assert "egress-placer status: cannot read the cluster: ConfigException" in errors_of(capsys)


def test_status_without_an_api_server(closed_port_kubeconfig, tmp_path, monkeypatch, capsys):
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npools: []\n")
    monkeypatch.setenv("EGRESS_PLACER_REQUEST_TIMEOUT_SECONDS", "2")
    assert main(["status", "--policy", str(policy)]) == 2
    err = errors_of(capsys)
    assert "egress-placer status: cannot read the cluster:" in err and "127.0.0.1" in err


def test_status_with_an_invalid_policy(closed_port_kubeconfig, tmp_path, capsys):
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npools: [{name: 1}]\n")
    assert main(["status", "--policy", str(policy)]) == 2
    err = errors_of(capsys)
    assert "egress-placer status: invalid policy:" in err and str(policy) in err
