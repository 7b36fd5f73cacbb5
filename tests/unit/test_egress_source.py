"""The Prometheus side of egress load (`controller.prometheus.egress_source`), with HTTP mocked by `responses`.

The client: good answers, the answer shapes it refuses, which failures are retried (connection
errors, timeouts, 5xx, 429) and which are not. The poller: instance labels with ports mapped to
node names, empty answers, NaN/Inf values, old sample timestamps, failures that keep the old
figures until they are stale, `status()`, and the polling loop (driven by a fake clock, no waiting).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import requests
import responses
from responses import matchers

from controller.core.egress import DEFAULT_EGRESS_QUERY, EgressLoad, egress_ratio, rank_nodes
from controller.core.model import NodeLoad
from controller.prometheus.egress_source import (
    EgressPoller,
    PrometheusAnswerError,
    PrometheusClient,
    PrometheusUnavailable,
    Sample,
    node_of,
)
from controller.runner import Runner

PROM = "http://prometheus.monitoring:9090"
QUERY_URL = PROM + "/api/v1/query"
NOW = 1_700_000_000.0
POOL_NODES = ("egress-1", "egress-2", "egress-3")


def vector(*series: tuple[dict[str, str], str], ts: float = NOW) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [ts, v]} for m, v in series]},
    }


def instance(name: str) -> dict[str, str]:
    return {"instance": name}


class FakeClock:
    def __init__(self, now: float = NOW, step: float = 0.0) -> None:
        self.now, self.step = now, step

    def __call__(self) -> float:
        value = self.now
        self.now += self.step
        return value


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(sleeps: list[float]) -> PrometheusClient:
    return PrometheusClient(PROM, timeout=3.0, sleep=sleeps.append)


def make_poller(
    client: PrometheusClient, clock: FakeClock | None = None, nodes: tuple[str, ...] = POOL_NODES, **prometheus: Any
) -> EgressPoller:
    config = EgressLoad.model_validate({"prometheus": {"url": PROM, **prometheus}})
    return EgressPoller("fast", config, client, clock or FakeClock(), lambda: nodes)


# -- the client -----------------------------------------------------------------------------------


@responses.activate
def test_a_good_answer_becomes_samples_and_the_query_is_sent_with_its_timeout(client):
    responses.get(
        QUERY_URL,
        json=vector((instance("egress-1:9100"), "1250.5"), ({"instance": "egress-2:9100", "job": "node"}, "0")),
        match=[matchers.query_param_matcher({"query": DEFAULT_EGRESS_QUERY, "timeout": "3s"})],
    )
    assert client.query(DEFAULT_EGRESS_QUERY) == [
        Sample({"instance": "egress-1:9100"}, 1250.5, NOW),
        Sample({"instance": "egress-2:9100", "job": "node"}, 0.0, NOW),
    ]


@pytest.mark.parametrize(
    "url, endpoint",
    [
        ("http://p:9090", "http://p:9090/api/v1/query"),
        ("http://p:9090/", "http://p:9090/api/v1/query"),
        ("https://gw.example/prometheus/", "https://gw.example/prometheus/api/v1/query"),
    ],
)
def test_the_endpoint_keeps_a_path_prefix(url, endpoint):
    assert PrometheusClient(url, 1.0).endpoint == endpoint


@responses.activate
def test_http_500_then_success_is_retried_with_backoff(client, sleeps):
    responses.get(QUERY_URL, status=500, body="overloaded")
    responses.get(QUERY_URL, json=vector((instance("egress-1:9100"), "10")))
    assert client.query("q") == [Sample({"instance": "egress-1:9100"}, 10.0, NOW)]
    assert len(responses.calls) == 2
    assert len(sleeps) == 1 and 0 < sleeps[0] <= 2.0


@pytest.mark.parametrize(
    "failure, message",
    [
        ({"status": 500, "body": "boom"}, "HTTP 500"),
        ({"status": 503, "json": {"status": "error", "errorType": "timeout", "error": "query timed out"}}, "query timed out"),
        ({"status": 429, "body": "slow down"}, "HTTP 429"),
        ({"body": requests.ConnectionError("connection refused")}, "ConnectionError"),
        ({"body": requests.ConnectTimeout("connect timed out")}, "ConnectTimeout"),
        ({"body": requests.ReadTimeout("read timed out")}, "ReadTimeout"),
    ],
)
@responses.activate
def test_unreachable_or_overloaded_prometheus_is_retried_then_reported(client, sleeps, failure, message):
    responses.get(QUERY_URL, **failure)
    with pytest.raises(PrometheusUnavailable, match=message):
        client.query("q")
    assert len(responses.calls) == 3
    assert len(sleeps) == 2


@pytest.mark.parametrize(
    "answer, message",
    [
        ({"body": "<html>not json"}, "not JSON"),
        ({"json": ["a", "list"]}, "not a JSON object"),
        ({"json": {"status": "error", "errorType": "execution", "error": "many-to-many"}}, "many-to-many"),
        ({"status": 400, "json": {"status": "error", "errorType": "bad_data", "error": "parse error"}}, "bad_data: parse error"),
        ({"status": 422, "json": {"status": "error", "errorType": "execution", "error": "x"}}, "HTTP 422"),
        ({"json": {"status": "success"}}, "no data object"),
        ({"json": {"status": "success", "data": {"resultType": "matrix", "result": []}}}, "got resultType 'matrix'"),
        ({"json": {"status": "success", "data": {"resultType": "scalar", "result": [NOW, "1"]}}}, "resultType 'scalar'"),
        ({"json": {"status": "success", "data": {"resultType": "vector", "result": {}}}}, "not a list"),
        ({"json": vector(({"instance": 5}, "1"))}, r"result\[0\].metric"),  # type: ignore[dict-item]
        ({"json": {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [NOW]}]}}}, "value"),
        ({"json": {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [NOW, 1]}]}}}, "value"),
        ({"json": {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": ["t", "1"]}]}}}, "timestamp"),
        ({"json": vector(({}, "lots"))}, "'lots' is not a number"),
    ],
)
@responses.activate
def test_bad_answers_are_refused_without_retry(client, sleeps, answer, message):
    responses.get(QUERY_URL, **answer)
    with pytest.raises(PrometheusAnswerError, match=message):
        client.query("q")
    assert len(responses.calls) == 1
    assert sleeps == []


@responses.activate
def test_empty_and_special_values_parse(client):
    responses.get(QUERY_URL, json=vector((instance("a"), "NaN"), (instance("b"), "+Inf"), (instance("c"), "-Inf")))
    values = [s.value for s in client.query("q")]
    assert str(values) == "[nan, inf, -inf]"
    responses.get(QUERY_URL, json=vector())
    assert client.query("q") == []


# -- node names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "label, node",
    [
        ("egress-1", "egress-1"),
        ("egress-1:9100", "egress-1"),
        ("egress-1:metrics", None),  # not a port
        ("egress-9:9100", None),
        ("10.0.0.7:9100", None),  # an address is not a node name
        ("[fd00::1]:9100", "fd00::1"),
        ("egress-1.example.com:9100", None),
        ("", None),
    ],
)
def test_node_of_matches_the_name_or_the_host_before_the_port(label, node):
    assert node_of(label, {"egress-1", "egress-2", "fd00::1"}) == node


# -- the poller -----------------------------------------------------------------------------------


@responses.activate
def test_several_nodes_with_ports_become_measurements(client):
    responses.get(
        QUERY_URL,
        json=vector(
            (instance("egress-1:9100"), "100000000"),
            (instance("egress-2:9100"), "2500"),
            (instance("ordinary-7:9100"), "999"),  # not a pool node
            ({"job": "node"}, "5"),  # no instance label
            ts=NOW - 1,
        ),
    )
    poller = make_poller(client)
    fresh = poller.poll_once(NOW)
    assert {n: (m.bytes_per_second, m.sampled_at) for n, m in fresh.items()} == {
        "egress-1": (100e6, NOW - 1),
        "egress-2": (2500.0, NOW - 1),
    }
    assert poller.snapshot() == fresh
    status = poller.status()
    assert status["nodes"] == {
        "egress-1": {"bps": 100e6, "age": 1.0, "source": "measured"},
        "egress-2": {"bps": 2500.0, "age": 1.0, "source": "measured"},
        "egress-3": {"bps": None, "age": None, "source": "runs"},
    }
    assert status["unmatched"] == ["<no instance label>", "ordinary-7:9100"]
    assert status["scrapes"]["success"] == 1 and status["failing"] is False


@pytest.mark.parametrize("label", ["node", "kubernetes_node"])
@responses.activate
def test_another_node_label_can_name_the_node(client, label):
    responses.get(QUERY_URL, json=vector(({label: "egress-3", "instance": "10.0.0.3:9100"}, "42")))
    poller = make_poller(client, nodeLabel=label, query=f"sum by ({label}) (rate(x[1m]))")
    assert {n: m.bytes_per_second for n, m in poller.poll_once(NOW).items()} == {"egress-3": 42.0}


@responses.activate
def test_series_of_one_node_add_up(client):
    responses.get(
        QUERY_URL,
        json=vector(({"instance": "egress-1:9100", "device": "eth0"}, "300"), ({"instance": "egress-1:9100", "device": "eth1"}, "200")),
    )
    assert make_poller(client).poll_once(NOW)["egress-1"].bytes_per_second == 500.0


@responses.activate
def test_an_empty_answer_leaves_every_node_on_run_counts(client):
    responses.get(QUERY_URL, json=vector())
    poller = make_poller(client)
    assert poller.poll_once(NOW) == {}
    assert {n["source"] for n in poller.status()["nodes"].values()} == {"runs"}
    loads = {n: NodeLoad(n, i, 0, 10) for i, n in enumerate(POOL_NODES)}
    ranked = rank_nodes(loads, poller.snapshot(), poller.config.bandwidth_of, NOW, 60.0)
    assert [(n, f.source) for n, f in ranked.items()] == [(n, "runs") for n in POOL_NODES]


@responses.activate
def test_nan_inf_and_negative_values_are_ignored(client):
    responses.get(
        QUERY_URL,
        json=vector(
            (instance("egress-1:9100"), "NaN"),
            (instance("egress-2:9100"), "+Inf"),
            (instance("egress-3:9100"), "-5"),
            (instance("egress-3:9100"), "-Inf"),
        ),
    )
    poller = make_poller(client)
    assert poller.poll_once(NOW) == {}
    assert poller.status()["ignored_samples"] == {"not-finite": 3, "negative": 1, "no-node": 0}


@responses.activate
def test_an_old_sample_timestamp_is_stale(client):
    responses.get(QUERY_URL, json=vector((instance("egress-1:9100"), "1000"), ts=NOW - 120))
    poller = make_poller(client)
    poller.poll_once(NOW)
    figure = poller.snapshot()["egress-1"]
    assert poller.status()["nodes"]["egress-1"] == {"bps": 1000.0, "age": 120.0, "source": "runs"}
    assert egress_ratio(NodeLoad("egress-1", 1, 0, 10), figure, 125e6, NOW, 60.0).source == "runs"


@responses.activate
def test_a_sample_from_the_future_counts_as_taken_now(client):
    responses.get(QUERY_URL, json=vector((instance("egress-1:9100"), "1000"), ts=NOW + 30))
    assert make_poller(client).poll_once(NOW)["egress-1"].sampled_at == NOW


@responses.activate
def test_an_older_sample_does_not_replace_a_newer_figure(client):
    responses.get(QUERY_URL, json=vector((instance("egress-1:9100"), "1000"), ts=NOW))
    responses.get(QUERY_URL, json=vector((instance("egress-1:9100"), "7"), ts=NOW - 50))
    poller = make_poller(client)
    poller.poll_once(NOW)
    poller.poll_once(NOW + 15)
    assert poller.snapshot()["egress-1"].bytes_per_second == 1000.0


@pytest.mark.parametrize(
    "failure, result",
    [
        ({"body": requests.ConnectionError("refused")}, "unavailable"),
        ({"body": requests.ReadTimeout("read timed out")}, "unavailable"),
        ({"status": 502, "body": "bad gateway"}, "unavailable"),
        ({"json": {"status": "error", "errorType": "bad_data", "error": "parse error"}}, "bad-answer"),
        ({"body": "{truncated"}, "bad-answer"),
    ],
)
@responses.activate
def test_a_failed_poll_keeps_the_old_figures_until_they_are_stale(client, failure, result):
    responses.get(QUERY_URL, json=vector((instance("egress-1:9100"), "5000"), ts=NOW))
    clock = FakeClock(NOW)
    poller = make_poller(client, clock)
    poller.poll_once(NOW)
    responses.replace(responses.GET, QUERY_URL, **failure)

    clock.now = NOW + 15
    assert poller.poll_once(NOW + 15) == {}
    assert poller.snapshot()["egress-1"].bytes_per_second == 5000.0
    status = poller.status()
    assert status["nodes"]["egress-1"]["source"] == "measured"
    assert status["failing"] is True and status["last_error"] and status["last_error_at"] == NOW + 15
    assert status["scrapes"]["success"] == 1 and status["scrapes"][result] == 1

    clock.now = NOW + 61
    assert poller.status()["nodes"]["egress-1"] == {"bps": 5000.0, "age": 61.0, "source": "runs"}
    load = NodeLoad("egress-1", 2, 0, 10)
    stale = egress_ratio(load, poller.snapshot()["egress-1"], 125e6, clock.now, 60.0)
    none = egress_ratio(load, None, 125e6, clock.now, 60.0)
    assert (stale.ratio, stale.source) == (none.ratio, none.source) == (0.2, "runs")


@responses.activate
def test_recovery_clears_failing_but_remembers_the_last_error(client):
    responses.get(QUERY_URL, body=requests.ConnectionError("refused"))
    poller = make_poller(client)
    poller.poll_once(NOW)
    responses.replace(responses.GET, QUERY_URL, json=vector((instance("egress-2:9100"), "1")))
    poller.poll_once(NOW + 15)
    status = poller.status()
    assert status["failing"] is False
    assert "refused" in status["last_error"] and status["last_success_at"] == NOW + 15


@responses.activate
def test_figures_of_nodes_that_left_the_pool_are_dropped(client):
    nodes = ["egress-1", "egress-2"]
    responses.get(QUERY_URL, json=vector((instance("egress-1:9100"), "1"), (instance("egress-2:9100"), "2")))
    poller = EgressPoller("fast", EgressLoad.model_validate({"prometheus": {"url": PROM}}), client, FakeClock(), lambda: nodes)
    poller.poll_once(NOW)
    nodes.remove("egress-2")
    responses.replace(responses.GET, QUERY_URL, body=requests.ConnectionError("refused"))
    poller.poll_once(NOW + 15)  # a failed poll does not prune
    responses.replace(responses.GET, QUERY_URL, json=vector())
    poller.poll_once(NOW + 30)
    assert set(poller.snapshot()) == {"egress-1"}


# -- the loop -------------------------------------------------------------------------------------


class StoppingClient:
    """Answers `answers` in turn (an exception is raised) and sets `stop` after the last one."""

    def __init__(self, stop: threading.Event, *answers: list[Sample] | Exception) -> None:
        self.stop, self.answers, self.calls = stop, list(answers), 0

    def query(self, promql: str) -> list[Sample]:
        answer = self.answers[self.calls]
        self.calls += 1
        if self.calls == len(self.answers):
            self.stop.set()
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_run_polls_until_stopped_and_survives_unexpected_errors():
    stop = threading.Event()
    fake = StoppingClient(stop, RuntimeError("a bug"), [Sample({"instance": "egress-1:9100"}, 9.0, NOW)])
    clock = FakeClock(NOW, step=20.0)  # each poll "takes" longer than the interval: no waiting
    poller = EgressPoller("fast", EgressLoad.model_validate({"prometheus": {"url": PROM}}), fake, clock, lambda: POOL_NODES)
    poller.run(stop)
    assert fake.calls == 2
    status = poller.status()
    assert status["scrapes"]["failed"] == 1 and status["scrapes"]["success"] == 1
    assert "a bug" in status["last_error"]
    assert poller.snapshot()["egress-1"].bytes_per_second == 9.0


def test_the_runner_runs_the_loop_in_a_daemon_thread():
    runner, ran = Runner(), threading.Event()
    fake = StoppingClient(ran, [])
    poller = EgressPoller("fast", EgressLoad.model_validate({"prometheus": {"url": PROM}}), fake, FakeClock(), lambda: ())
    task = runner.start("egress fast", poller.run)
    assert task.thread.daemon and task.thread.name == "egress fast"
    assert ran.wait(10)
    runner.stop()
    assert not task.thread.is_alive() and fake.calls == 1
