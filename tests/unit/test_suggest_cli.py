"""`egress-placer suggest` end to end without a cluster: the fake API server of test_cli_exit_codes.py,
Prometheus answered by `responses` (the adapter's HTTP client is requests). The "Mixed history" of
test_suggest.py, as Prometheus would give it: cAdvisor's bytes, kube-state-metrics' labels, nodes, images."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import responses
import yaml

from controller.cli import main
from controller.cli.errors import Exit
from controller.cli.suggest import parse_bytes
from controller.core.pools import load_any_policy
from controller.prometheus.auth import PrometheusAuth
from controller.prometheus.history import ALLOWLIST, client, join, queries, read_history
from controller.prometheus.egress_source import Sample
from tests.unit.test_cli_exit_codes import (  # noqa: F401 - fixtures
    CONFIGS,
    POOLS,
    FakeApiServer,
    api_server,
    clean_environment,
    kubeconfig,
    pool_node,
    stderr_line,
)
from tests.unit.test_suggest import POOLS as POOL_YAML
from tests.unit.test_suggest import mixed_history

PROM = "http://prometheus.test:9090"
NOW = 1_800_000_000.0


def vector(series: list[tuple[dict[str, str], float]]) -> dict:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [NOW, repr(float(v))]} for m, v in series]},
    }


def answers_for(history) -> dict[str, dict]:
    """Prometheus' answer to each of the five queries, from PodHistory records."""
    out: dict[str, list] = {"bytes": [], "durations": [], "labels": [], "nodes": [], "images": []}
    for p in history:
        pod = {"namespace": p.namespace, "pod": p.pod}
        out["bytes"].append((pod, p.bytes_sent))
        if p.duration is not None:
            out["durations"].append((pod, p.duration))
        labels = {"label_tekton_dev_task_run": p.task_run}
        if p.task:
            labels["label_tekton_dev_task"] = p.task
        out["labels"].append(({**pod, **labels}, 1))
        out["nodes"].append(({**pod, "node": p.node}, 1))
        for image in p.images:
            out["images"].append(({**pod, "image_spec": image, "image": image + "-resolved"}, 1))
    return {k: vector(v) for k, v in out.items()}


def serve(mock: responses.RequestsMock, answers: dict[str, dict], seen: list | None = None) -> None:
    asked = {q: name for name, q in queries("7d", "1m").items()}

    def reply(request):
        query = parse_qs(urlparse(request.url).query)["query"][0]
        if seen is not None:
            seen.append((query, dict(request.headers)))
        return 200, {}, json.dumps(answers.get(asked.get(query, ""), vector([])))

    mock.add_callback(responses.GET, f"{PROM}/api/v1/query", callback=reply)


@pytest.fixture
def cluster(api_server: FakeApiServer) -> FakeApiServer:
    api_server.objects[POOLS] = {"items": [yaml.safe_load(POOL_YAML)]}
    api_server.objects[CONFIGS] = {"items": []}
    node = pool_node([])
    api_server.objects["/api/v1/nodes"] = {"items": [node, {"metadata": {"name": "node-1"}, "spec": {}, "status": {}}]}
    api_server.objects["/api/v1/namespaces"] = {"items": [{"metadata": {"name": "team-a"}}]}
    return api_server


def run(kubeconfig: Path, *extra: str) -> int:
    return main(["suggest", "--kubeconfig", str(kubeconfig), "--prometheus", PROM, *extra])


def secret_file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text + "\n")
    return str(path)


def test_the_adapter_joins_the_five_queries_and_sends_the_credentials(tmp_path: Path):
    history = mixed_history()
    seen: list = []
    with responses.RequestsMock() as mock:
        serve(mock, answers_for(history), seen)
        got = read_history(client(PROM, PrometheusAuth(token_file=secret_file(tmp_path, "token", "s3cret"))), "7d", "1m")
    assert sorted(got.pods, key=lambda p: p.pod) == sorted(
        [p.__class__(**{**p.__dict__, "images": p.images and tuple(sorted(p.images))}) for p in history], key=lambda p: p.pod
    )
    assert got.missing == () and len(got.queries) == 5
    assert all(headers["Authorization"] == "Bearer s3cret" for _, headers in seen)
    session = PrometheusAuth(username="me", password_file=secret_file(tmp_path, "pw", "pw"), ca_file=str(tmp_path / "ca.pem")).session()
    assert session.verify == str(tmp_path / "ca.pem")


def test_basic_auth_reaches_prometheus(tmp_path: Path):
    seen: list = []
    with responses.RequestsMock() as mock:
        serve(mock, {}, seen)
        read_history(client(PROM, PrometheusAuth(username="me", password_file=secret_file(tmp_path, "pw", "pw"))), "7d", "1m")
    assert seen[0][1]["Authorization"] == "Basic " + base64.b64encode(b"me:pw").decode()


def test_what_is_missing_is_said():
    empty = join({}, False, ())
    assert empty.pods == () and len(empty.missing) == 2
    assert ALLOWLIST in empty.missing[0] and "container_network_transmit_bytes_total" in empty.missing[1]
    labels_only = join({"labels": [Sample({"namespace": "a", "pod": "p", "label_tekton_dev_task_run": "r"}, 1, NOW)],
                        "bytes": [Sample({"namespace": "a", "pod": "other"}, 5, NOW)]}, False, ())
    assert labels_only.missing == ("none of the 1 Tekton pods of the window has a transmit series (bytes)",)


def test_mixed_history_table(cluster: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]):
    with responses.RequestsMock() as mock:
        serve(mock, answers_for(mixed_history()))
        assert run(kubeconfig) == Exit.OK
    out = capsys.readouterr().out
    assert out.startswith("Bytes: all-transmit: every byte the pods sent (cAdvisor), in-cluster traffic included")
    assert "team-a/Task:upload" in out and "heavy" in out
    assert "add-image 'registry.example/upload[:@]*' to pool overseas" in out
    assert "add-image 'registry.example/mirror[:@]*' to pool overseas" in out
    assert "remove-image 'registry.example/lint:*' from pool overseas" in out
    assert "flag: team-a/Task:fetch: 1 of 10 runs" in out
    assert "container_network_transmit_bytes_total" in out  # the queries used


def test_mixed_history_yaml_is_complete_pools(cluster: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]):
    with responses.RequestsMock() as mock:
        serve(mock, answers_for(mixed_history()))
        assert run(kubeconfig, "-o", "yaml") == Exit.OK
    text = capsys.readouterr().out
    (pool,) = list(yaml.safe_load_all(text))
    assert pool["kind"] == "EgressPool" and pool["spec"]["namespaces"] == ["team-*"]
    assert pool["spec"]["images"] == ["ghcr.io/acme/never-ran:*", "registry.example/mirror[:@]*", "registry.example/upload[:@]*"]
    assert load_any_policy(text).pool("overseas").images == tuple(pool["spec"]["images"])


def test_mixed_history_json_and_explain(cluster: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]):
    def taskrun(task: str, i: int) -> dict:
        images = {"upload": "registry.example/upload:1.4", "lint": "registry.example/lint:1", "build": "registry.example/build:1"}[task]
        return {"metadata": {"name": f"{task}-{i}", "namespace": "team-a"},
                "spec": {"taskSpec": {"steps": [{"name": "s", "image": images}]}}}

    # Only some runs are still there: 4 upload runs (move onto the pool), 2 lint (move off), 3 build (stay).
    kept = [taskrun("upload", i) for i in range(4)] + [taskrun("lint", i) for i in range(2)] + [taskrun("build", i) for i in range(3)]
    cluster.objects["/apis/tekton.dev/v1/taskruns"] = {"items": kept}
    with responses.RequestsMock() as mock:
        serve(mock, answers_for(mixed_history()))
        assert run(kubeconfig, "-o", "json", "--explain") == Exit.OK
    report = json.loads(capsys.readouterr().out)
    assert report["enough_history"] is True
    assert {(p["action"], p["glob"]) for p in report["proposals"]} == {
        ("add-image", "registry.example/mirror[:@]*"), ("add-image", "registry.example/upload[:@]*"),
        ("flag", None), ("remove-image", "registry.example/lint:*"),
    }
    assert all(len(p["evidence"]["queries"]) == 5 for p in report["proposals"])
    assert report["explain"] | {"moved_runs": None} == {
        "runs": 60, "replayed": 9, "pruned": 51, "moved": 6, "onto_pool": 4, "off_pool": 2, "moved_runs": None,
    }


def test_unreachable_prometheus_is_3_in_one_line(cluster: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["suggest", "--kubeconfig", str(kubeconfig), "--prometheus", "http://127.0.0.1:1"]) == Exit.UNREACHABLE
    line = stderr_line(capsys)
    assert line.startswith("egress-placer suggest: cannot read Prometheus at http://127.0.0.1:1: ")
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("output", ["table", "json"])
def test_no_history_is_0_and_says_what_is_missing(cluster: FakeApiServer, kubeconfig: Path, output: str, capsys: pytest.CaptureFixture[str]):
    with responses.RequestsMock() as mock:
        serve(mock, {})
        assert run(kubeconfig, "-o", output) == Exit.OK
    out = capsys.readouterr().out
    if output == "json":
        report = json.loads(out)
        assert report["enough_history"] is False and any("kube_pod_labels" in m for m in report["missing"])
    else:
        (line,) = out.strip().splitlines()
        assert line.startswith("not enough history in the last 7d at http://prometheus.test:9090: no kube_pod_labels")


@pytest.mark.parametrize(
    "extra, said",
    [(["--window", "a week"], "--window must be a Prometheus duration"), (["--prometheus", "prometheus:9090"], "--prometheus must be an http"), (["--heavy-bytes", "lots"], "not a size"),
     (["--quiet-bytes", "2Gi"], "quiet bytes <= heavy bytes")],
)
def test_bad_options_are_2(cluster: FakeApiServer, kubeconfig: Path, extra: list[str], said: str, capsys: pytest.CaptureFixture[str]):
    assert run(kubeconfig, *extra) == Exit.USAGE
    assert said in stderr_line(capsys)


@pytest.mark.parametrize("text, value", [("1Gi", 1024**3), ("500M", 5e8), ("2GiB", 2 * 1024**3), ("1e9", 1e9), ("0", 0)])
def test_sizes(text: str, value: float):
    assert parse_bytes(text) == value


def test_a_bytes_query_of_internet_bytes_replaces_cadvisor_s(cluster: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]):
    """A flow exporter's external-destination bytes: its query is run instead, and named in the evidence."""
    internet = 'sum by (namespace, pod) (increase(flow_bytes_total{destination="external"}[7d]))'
    answers = answers_for(mixed_history())
    seen: list = []
    with responses.RequestsMock() as mock:
        asked = {q: name for name, q in queries("7d", "1m", internet).items()}

        def reply(request):
            query = parse_qs(urlparse(request.url).query)["query"][0]
            seen.append(query)
            return 200, {}, json.dumps(answers.get(asked.get(query, ""), vector([])))

        mock.add_callback(responses.GET, f"{PROM}/api/v1/query", callback=reply)
        assert run(kubeconfig, "-o", "json", "--bytes-query", internet) == Exit.OK
    report = json.loads(capsys.readouterr().out)
    assert internet in seen and internet in report["queries"] and report["bytes"].startswith("internet:")
    assert {p["glob"] for p in report["proposals"] if p["action"] == "add-image"} == {
        "registry.example/mirror[:@]*", "registry.example/upload[:@]*"
    }
    assert "no series of --bytes-query in the window" in join({"labels": [Sample({"namespace": "a", "pod": "p", "label_tekton_dev_task_run": "r"}, 1, NOW)]}, True, ()).missing


def test_no_history_as_yaml_prints_no_object(cluster: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]):
    with responses.RequestsMock() as mock:
        serve(mock, {})
        assert run(kubeconfig, "-o", "yaml") == Exit.OK
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("not enough history in the last 7d")
