"""End to end, remote resolution: a Pipelines-as-Code run whose Task comes through Tekton's http
resolver (Tekton's resolvers controller, run by the session cluster, fetching from a loopback HTTP
server in the test) lands on the pool. Its images are unknown when the TaskRun is created; egress-
placer places its pod at Pod CREATE, recognised by the `tekton.dev/taskRun` label Tekton sets.

The cluster resolver: admission follows a `resolver: cluster` reference into another namespace only
where Tekton's `cluster-resolver-config` lets the run resolve it (docs/security.md, "Cluster resolver
rules"). With that namespace blocked, neither the run's decision nor any Event shows the Task's images
(and Tekton fails the run); with it allowed, the run is placed at CREATE and its pod lands on the pool."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest
import yaml

from controller.core import cluster_resolver
from devcluster import tekton_resolvers
from devcluster.cluster import Cluster
from tests.e2e.tekton_runs import (
    EVENTS,
    MATCHING_IMAGE,
    POOL,
    POOL_NODES,
    POOL_TOLERATION,
    TEAM_CDN,
    Runs,
    decision_of,
    node_of,
    step,
    succeeded,
    taskrun,
)
from tests.kube import Api, namespace, namespaced, namespaces_left
from tests.waiting import wait_for, wait_gone

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


# -- the cluster resolver's rules ---------------------------------------------------------------------

SHARED = "e2e-shared-tasks"  # where the shared Task lives
SHARED_TASK = {
    "apiVersion": "tekton.dev/v1",
    "kind": "Task",
    "metadata": {"name": "cdn-upload"},
    "spec": {"steps": [step(MATCHING_IMAGE, "upload")]},
}
RESOLVER_CONFIG = namespaced(tekton_resolvers.NAMESPACE, "configmaps", cluster_resolver.CONFIG_MAP)


@pytest.fixture
def shared_task(api: Api, make_namespace: Callable[[str], str]) -> Iterator[str]:
    """Namespace SHARED with the Task cdn-upload (its step's image matches the pool); deleted afterwards."""
    wait_gone(f"namespace {SHARED} from an earlier run to be gone", lambda: namespaces_left(api, SHARED), timeout=180)
    make_namespace(SHARED)
    api.create(namespaced(SHARED, "tasks", group="/apis/tekton.dev/v1"), SHARED_TASK)
    yield SHARED
    api.delete(namespace(SHARED))


@pytest.fixture
def resolver_rules(api: Api) -> Iterator[Callable[..., None]]:
    """`resolver_rules(allowed=..., blocked=...)`: Tekton's cluster-resolver-config says so; as it was afterwards."""
    before = (api.get(RESOLVER_CONFIG) or {}).get("data") or {}

    def rules(allowed: str = "", blocked: str = "") -> None:
        api.merge_patch(RESOLVER_CONFIG, {"data": {cluster_resolver.ALLOWED: allowed, cluster_resolver.BLOCKED: blocked}})

    yield rules
    api.merge_patch(RESOLVER_CONFIG, {"data": {k: before.get(k, "") for k in (cluster_resolver.ALLOWED, cluster_resolver.BLOCKED)}})


def cluster_taskrun(name: str) -> dict[str, Any]:
    ref = {"resolver": "cluster", "params": [{"name": "kind", "value": "task"}, {"name": "name", "value": "cdn-upload"},
                                             {"name": "namespace", "value": SHARED}]}
    return taskrun(name, spec={"taskRef": ref})


def until_admission_decides(runs: Runs, what: str, check: Callable[[dict[str, Any]], bool]) -> None:
    """Until admission's decision for a server-side dry run of a cluster-resolved TaskRun passes `check`
    (the controller has seen the ConfigMap's change)."""
    probe = runs.name("probe")
    wait_for(what, lambda: check(decision_of(runs.create(TEAM_CDN, "taskruns", cluster_taskrun(probe), dry_run=True))), timeout=30)


def test_a_task_in_a_namespace_tekton_blocks_is_not_followed(
    api: Api, runs: Runs, shared_task: str, resolver_rules: Callable[..., None]
) -> None:
    resolver_rules(blocked=f"other, {SHARED}")
    blocked = lambda d: d.get("pool") is None and any("is blocked" in u for u in d.get("unresolved", []))  # noqa: E731
    until_admission_decides(runs, "admission to follow the blocked rule", blocked)
    name = runs.name("blocked")
    created = runs.create(TEAM_CDN, "taskruns", cluster_taskrun(name))
    decision = decision_of(created)
    assert blocked(decision), decision
    assert MATCHING_IMAGE not in json.dumps(decision)
    # Tekton refuses it too: the run fails without a pod
    failed = wait_for("Tekton to fail the run", lambda: succeeded(runs.get(TEAM_CDN, "taskruns", name)) == "False" or None)
    assert failed
    assert name not in runs.pods_by_taskrun(TEAM_CDN)
    def about_it() -> list[str]:
        return [json.dumps(e) for e in api.items(namespaced(TEAM_CDN, "events", group=EVENTS)) if name in json.dumps(e)]

    shown = wait_for("admission's Event about the run", lambda: about_it() or None)  # every decision has one
    assert [e for e in shown if MATCHING_IMAGE in e] == [], shown


def test_a_task_in_an_allowed_namespace_is_followed_and_placed_at_create(
    runs: Runs, shared_task: str, resolver_rules: Callable[..., None]
) -> None:
    resolver_rules(allowed=SHARED, blocked="*")
    placed = lambda d: d.get("pool") == POOL and MATCHING_IMAGE in d.get("images", [])  # noqa: E731
    until_admission_decides(runs, "admission to follow the allowed rule", placed)
    name = runs.name("allowed")
    created = runs.create(TEAM_CDN, "taskruns", cluster_taskrun(name))
    assert placed(decision_of(created)), decision_of(created)
    runs.wait_succeeded(TEAM_CDN, "taskruns", [name])
    pod = runs.pods_by_taskrun(TEAM_CDN)[name]
    assert node_of(pod) in POOL_NODES
    assert POOL_TOLERATION in (pod["spec"].get("tolerations") or [])
