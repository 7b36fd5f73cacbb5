"""Prometheus behind auth (docs/suggest.md, "Prometheus behind auth"): one HTTP client path
(controller.prometheus.auth.PrometheusAuth) for `egress-placer suggest`, the controller's history readers
and its egress source's pollers.
Secrets come from files (a mounted Secret of the controller's namespace), read again at every query."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import responses

from controller.app import prometheus_auth
from controller.core.policy import load_policy
from controller.metrics import Metrics
from controller.prometheus.auth import PrometheusAuth
from controller.prometheus.egress_source import EgressPollers, PrometheusAnswerError, PrometheusClient
from controller.runner import Runner
from controller.settings import SettingsError, load_settings
from controller.state import ClusterState
from controller.suggest.reconcile import HistoryReaders
from controller.suggest.view import MeasuredView
from tests.unit.test_egress_wiring import NOW, URL, node, policy_text
from tests.unit.test_suggest_rule import POLICY, Sink
from tests.waiting import wait_for

PROM = "http://prometheus.monitoring:9090"


def answered(mock: responses.RequestsMock, seen: list[str | None]) -> None:
    def reply(request):  # type: ignore[no-untyped-def]
        seen.append(request.headers.get("Authorization"))
        return 200, {}, '{"status": "success", "data": {"resultType": "vector", "result": []}}'

    mock.add_callback(responses.GET, f"{PROM}/api/v1/query", callback=reply)


def test_a_rotated_token_is_taken_at_the_next_query(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    prometheus = PrometheusClient(PROM, 3.0, PrometheusAuth(token_file=str(token)).session())
    seen: list[str | None] = []
    with responses.RequestsMock() as mock:
        answered(mock, seen)
        prometheus.query("up")
        token.write_text("second")  # the kubelet swapped the mounted Secret's file
        prometheus.query("up")
    assert seen == ["Bearer first", "Bearer second"]


def test_a_missing_secret_file_fails_the_query_naming_the_file_never_retried(tmp_path: Path) -> None:
    password = tmp_path / "password"
    prometheus = PrometheusClient(PROM, 3.0, PrometheusAuth(username="me", password_file=str(password), password_name="PW").session())
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        answered(mock, [])
        with pytest.raises(PrometheusAnswerError, match=f"PW: cannot read {password}"):
            prometheus.query("up")
        assert len(mock.calls) == 0  # nothing was sent without its credentials
        password.write_text("pw")
        prometheus.query("up")
        assert mock.calls[0].request.headers["Authorization"] == "Basic " + base64.b64encode(b"me:pw").decode()


def test_no_auth_sends_no_authorization_header() -> None:
    seen: list[str | None] = []
    with responses.RequestsMock() as mock:
        answered(mock, seen)
        PrometheusClient(PROM, 3.0, PrometheusAuth().session()).query("up")
    assert seen == [None]


@pytest.mark.parametrize(
    "auth, said",
    [
        (PrometheusAuth(token_file="t", username="me", password_file="p"), "not both"),
        (PrometheusAuth(username="me"), "needs both"),
        (PrometheusAuth(password_file="p"), "needs both"),
    ],
)
def test_one_way_to_authenticate(auth: PrometheusAuth, said: str) -> None:
    assert said in " ".join(auth.problems())
    with pytest.raises(ValueError, match=said):
        auth.check()


def test_check_reads_the_files_and_never_shows_their_content(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="--prometheus-token-file: .* is empty"):
        PrometheusAuth(token_file=str(empty), token_name="--prometheus-token-file").check()
    (tmp_path / "pw").write_text("hunter2")
    with pytest.raises(ValueError) as raised:
        PrometheusAuth(username="me", password_file=str(tmp_path / "pw"), ca_file=str(tmp_path / "ca.crt"), ca_name="CA").check()
    assert "CA: cannot read" in str(raised.value) and "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    "env, said",
    [
        ({"prometheus_token_file": "/t", "prometheus_username": "me", "prometheus_password_file": "/p"}, "EGRESS_PLACER_PROMETHEUS_TOKEN_FILE"),
        ({"prometheus_username": "me"}, "EGRESS_PLACER_PROMETHEUS_PASSWORD_FILE"),
    ],
)
def test_the_controller_refuses_two_ways_or_half_of_basic_auth(env: dict[str, str], said: str) -> None:
    with pytest.raises(SettingsError, match=said):
        load_settings(env)


def test_the_ca_file_wins_over_the_environment_s_ca_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE replace a session's `verify` (psf/requests#3829): set,
    as on many machines, they made the CA file ignored and the real Prometheus' certificate refused (found by
    tests/e2e/test_suggest_auth.py). The settings requests will use for a request keep the CA file."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("CURL_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    ca = str(tmp_path / "ca.crt")
    for auth in (PrometheusAuth(ca_file=ca), PrometheusAuth(username="me", password_file=str(tmp_path / "pw"), ca_file=ca)):
        session = auth.session()
        assert session.merge_environment_settings(f"{PROM}/api/v1/query", {}, None, None, None)["verify"] == ca
        assert session.merge_environment_settings(f"{PROM}/api/v1/query", {}, None, False, None)["verify"] is False
    plain = PrometheusAuth().session()  # no CA file given: the environment's bundle, as requests does
    assert plain.merge_environment_settings(f"{PROM}/api/v1/query", {}, None, None, None)["verify"] == "/etc/ssl/certs/ca-certificates.crt"


def test_the_controller_s_history_readers_send_the_mounted_credentials(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-the-secret\n")
    settings = load_settings({"prometheus_token_file": str(tmp_path / "token"), "prometheus_ca_file": str(tmp_path / "ca.crt")})
    auth = prometheus_auth(settings)
    assert auth.session().verify == str(tmp_path / "ca.crt")
    view = MeasuredView()
    readers = HistoryReaders(view, Runner(), Metrics(), Sink(), lambda: True, lambda: 5000.0, lambda pool: {},
                             auth=PrometheusAuth(token_file=auth.token_file))  # no CA file here: the test Prometheus is http
    seen: list[str | None] = []
    try:
        with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
            answered(mock, seen)
            readers.sync(POLICY)
            readers.readers()["egress"].read_once()
            readers.sync(type(POLICY).empty())
    finally:
        readers._runner.stop()  # noqa: SLF001
    assert seen and set(seen) == {"Bearer from-the-secret"}


def test_a_token_file_that_cannot_be_read_shows_in_the_reader_s_last_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "token")
    readers = HistoryReaders(MeasuredView(), Runner(), Metrics(), Sink(), lambda: True, lambda: 5000.0, lambda pool: {},
                             auth=prometheus_auth(load_settings({"prometheus_token_file": missing})))
    try:
        with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
            answered(mock, [])
            readers.sync(POLICY)
            reader = readers.readers()["egress"]
            assert reader.read_once() is None
            readers.sync(type(POLICY).empty())
    finally:
        readers._runner.stop()  # noqa: SLF001
    assert reader.last_error == f"EGRESS_PLACER_PROMETHEUS_TOKEN_FILE: cannot read {missing}: No such file or directory"


def test_the_egress_source_s_pollers_send_the_same_mounted_credentials(tmp_path: Path) -> None:
    (tmp_path / "password").write_text("pw\n")
    auth = prometheus_auth(load_settings({"prometheus_username": "placer", "prometheus_password_file": str(tmp_path / "password")}))
    state = ClusterState(load_policy(policy_text()), clock=lambda: NOW)
    state.replace("Node", [node("egress-1")])
    runner = Runner()
    seen: list[str | None] = []
    pollers = EgressPollers(state.load, clock=lambda: NOW, runner=runner, session=auth.session)
    try:
        with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
            def reply(request):  # type: ignore[no-untyped-def]
                seen.append(request.headers.get("Authorization"))
                return 200, {}, '{"status": "success", "data": {"resultType": "vector", "result": []}}'

            mock.add_callback(responses.GET, f"{URL}/api/v1/query", callback=reply)
            pollers.sync(state.policy)
            wait_for("a poll of the egress source", lambda: bool(seen), timeout=5, interval=0.05)
            pollers.sync(type(state.policy).empty())
    finally:
        runner.stop()
    assert seen[0] == "Basic " + base64.b64encode(b"placer:pw").decode()
