"""End to end, remote resolution: a Pipelines-as-Code run whose Task comes through Tekton's http
resolver (Tekton's resolvers controller, run by the session cluster, fetching from a loopback HTTP
server in the test) lands on the pool. Its images are unknown when the TaskRun is created; egress-
placer places its pod at Pod CREATE, recognised by the `tekton.dev/taskRun` label Tekton sets."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest
import yaml

from devcluster import tekton_resolvers
from devcluster.cluster import Cluster
from tests.e2e.tekton_runs import (
    MATCHING_IMAGE,
    POOL,
    POOL_NODES,
    POOL_TOLERATION,
    TEAM_CDN,
    Runs,
    decision_of,
    node_of,
    step,
    taskrun,
)

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

PAC_MANAGED_BY = {"app.kubernetes.io/managed-by": "pipelinesascode.tekton.dev"}
REMOTE_TASK = {
    "apiVersion": "tekton.dev/v1",
    "kind": "Task",
    "metadata": {"name": "cdn-upload"},
    "spec": {"steps": [step(MATCHING_IMAGE, "upload")]},
}


@pytest.fixture(scope="module", autouse=True)
def tekton_resolvers_run(devcluster: Cluster) -> None:
    if not devcluster.runs_with(tekton_resolvers.NAME):
        pytest.skip(
            "this cluster runs without Tekton's resolvers (EGRESS_PLACER_DEVCLUSTER_WITH, or "
            "EGRESS_PLACER_DEVCLUSTER naming a cluster brought up without `--with tekton-resolvers`)"
        )


@pytest.fixture
def task_url() -> Iterator[str]:
    """The URL of REMOTE_TASK on a loopback HTTP server (a repository's raw file, as PaC refers to one)."""
    body = yaml.safe_dump(REMOTE_TASK).encode()
    fetched: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server API)
            fetched.append(self.path)
            if self.path != "/tasks/cdn-upload.yaml":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/yaml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/tasks/cdn-upload.yaml"
        assert fetched, "the http resolver never fetched the Task"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_pipelines_as_code_run_with_a_task_from_the_http_resolver_lands_on_the_pool(runs: Runs, task_url: str) -> None:
    name = runs.name("pac")
    body = taskrun(name, spec={"taskRef": {"resolver": "http", "params": [{"name": "url", "value": task_url}]}})
    body["metadata"]["labels"] = dict(PAC_MANAGED_BY)

    runs.create(TEAM_CDN, "taskruns", body)

    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name])[name]
    assert [s["name"] for s in done["status"]["taskSpec"]["steps"]] == ["upload"]  # resolved from the server
    pod = runs.pods_by_taskrun(TEAM_CDN)[name]
    assert node_of(pod) in POOL_NODES
    assert POOL_TOLERATION in (pod["spec"].get("tolerations") or [])
    assert decision_of(pod).get("pool") == POOL
