"""Informers on the real API server: first sync through a paginated list, watch events in order and
trimmed, relist after 410 Gone (a watch started from a compacted resourceVersion), backoff and
restart counting on errors, and a prompt stop of a long watch."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from devplacer.local_placer import kubectl
from controller.kube.informer import Informer, Resource, pods, start_informers, tekton, trimmer
from controller.retry import RetryPolicy
from controller.metrics import Metrics
from controller.runner import Runner
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

FAST = RetryPolicy(attempts=None, initial=0.05, maximum=0.2, jitter=0.05)





class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.replaced: list[list[dict[str, Any]]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def on_replace(self, objs: list[dict[str, Any]]) -> None:
        with self.lock:
            self.replaced.append(objs)

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((kind, obj))


def configmaps(namespace: str) -> Resource:
    """The test's ConfigMaps (not the kube-root-ca.crt every namespace gets)."""
    return Resource(
        "configmaps",
        "ConfigMap",
        f"/api/v1/namespaces/{namespace}/configmaps",
        trimmer("v1", "ConfigMap", ("data",)),
        label_selector="itest=informer",
    )


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def configmap(name: str, **data: str) -> dict[str, Any]:
    meta = {"name": name, "labels": {"itest": "informer"}, "annotations": {LAST_APPLIED: "{...}", "other": "x"}}
    return {"metadata": meta, "data": data}


def task(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "Task",
        "metadata": {"name": name},
        "spec": {"steps": [{"name": "s", "image": "alpine:3", "script": "echo hi"}]},
    }


@pytest.fixture
def runner():
    runner = Runner()
    yield runner
    runner.stop()


@pytest.fixture
def started(runner):
    def start(inf: Informer) -> Informer:
        start_informers(runner, [inf])
        return inf

    return start


def running(runner: Runner, inf: Informer) -> bool:
    return runner.health().get(f"informer {inf.resource.name}") in ("running", "waiting")


def test_first_sync_pages_through_the_list_then_watches_in_order(api, namespace, started):
    for i in range(5):
        api.call("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=configmap(f"cm-{i}", n=str(i)))
    rec, metrics = Recorder(), Metrics()
    inf = started(
        Informer(api, configmaps(namespace), rec.on_replace, rec.on_event, metrics, page_size=2, backoff=FAST)
    )
    assert inf.synced.wait(10)
    [listed] = rec.replaced
    assert sorted(o["metadata"]["name"] for o in listed) == [f"cm-{i}" for i in range(5)]
    first = next(o for o in listed if o["metadata"]["name"] == "cm-0")
    assert first["kind"] == "ConfigMap" and first["data"] == {"n": "0"}
    assert "annotations" not in first["metadata"] and "labels" not in first["metadata"]  # no reader: none kept
    assert "managedFields" not in first["metadata"] and "creationTimestamp" not in first["metadata"]

    path = f"/api/v1/namespaces/{namespace}/configmaps"
    api.call("POST", path, body=configmap("new", n="new"))
    api.call("PATCH", f"{path}/new", body={"data": {"n": "changed"}}, content_type="application/merge-patch+json")
    api.call("DELETE", f"{path}/cm-1")
    wait_for("three watch events", lambda: len(rec.events) >= 3, timeout=10)
    assert [(k, o["metadata"]["name"]) for k, o in rec.events] == [
        ("ADDED", "new"),
        ("MODIFIED", "new"),
        ("DELETED", "cm-1"),
    ]
    assert rec.events[1][1]["data"] == {"n": "changed"}
    assert inf.resource_version == rec.events[-1][1]["metadata"]["resourceVersion"]


def test_pods_are_trimmed_to_what_the_controller_reads(api, namespace, started):
    body = {
        "metadata": {"name": "p", "labels": {"app": "x", "tekton.dev/taskRun": "run-1"}},
        "spec": {
            "nodeName": "node-1",
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "containers": [
                {"name": "c", "image": "alpine:3", "command": ["sleep", "1"], "env": [{"name": "A", "value": "b"}]}
            ],
        },
    }
    api.call("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)
    rec = Recorder()
    resource = pods()
    resource = Resource(resource.name, resource.kind, f"/api/v1/namespaces/{namespace}/pods", resource.trim)
    started(Informer(api, resource, rec.on_replace, rec.on_event, Metrics(), backoff=FAST)).synced.wait(10)
    [[p]] = rec.replaced
    assert set(p) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert p["spec"]["nodeName"] == "node-1"
    assert set(p["spec"]) == {"nodeName", "terminationGracePeriodSeconds"}  # no containers, no tolerations
    assert set(p["status"]) == {"phase"}
    assert p["metadata"]["labels"] == {"tekton.dev/taskRun": "run-1"} and p["metadata"]["uid"]


def test_a_watch_from_a_too_old_version_relists(api, namespace, started):
    """Start the Task watch from resourceVersion 1, older than anything the API server's watch
    cache for the CRD holds: it answers 410 Gone; the informer counts it, relists, and events flow."""
    path = f"/apis/tekton.dev/v1/namespaces/{namespace}/tasks"
    api.call("POST", path, body=task("before"))
    rec, metrics = Recorder(), Metrics()
    tasks = tekton("Task")
    resource = Resource(tasks.name, tasks.kind, path, tasks.trim)
    inf = Informer(api, resource, rec.on_replace, rec.on_event, metrics, backoff=FAST)
    inf.resource_version = "1"  # as if this informer had been disconnected for a long time
    started(inf)
    assert inf.synced.wait(10)
    [listed] = rec.replaced
    assert [o["metadata"]["name"] for o in listed] == ["before"]
    assert listed[0]["kind"] == "Task" and listed[0]["spec"]["steps"][0]["image"] == "alpine:3"
    assert metrics.watch_restarts.labels(resource="tasks", cause="gone")._value.get() == 1
    api.call("POST", path, body=task("after"))
    wait_for("the event of Task after", lambda: any(o["metadata"]["name"] == "after" for _, o in rec.events), timeout=10)


def test_a_relist_on_request_lists_again_then_watches(api, namespace, started):
    """`Informer.relist` (what it keeps changed, e.g. the Node annotations a policy names): the open watch
    is shut, the collection listed again, and events flow after it."""
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    api.call("POST", path, body=configmap("before", n="1"))
    rec = Recorder()
    inf = started(Informer(api, configmaps(namespace), rec.on_replace, rec.on_event, Metrics(), backoff=FAST))
    assert inf.synced.wait(10)
    inf.relist()
    wait_for("a second list", lambda: len(rec.replaced) >= 2, timeout=10)
    assert [o["metadata"]["name"] for o in rec.replaced[-1]] == ["before"]
    api.call("POST", path, body=configmap("after", n="2"))
    wait_for("the event of ConfigMap after", lambda: any(o["metadata"]["name"] == "after" for _, o in rec.events), timeout=10)


def test_errors_back_off_and_are_counted_until_the_resource_exists(api, started, runner):
    rec, metrics = Recorder(), Metrics()
    missing = Resource(
        "missing", "Thing", "/apis/itest.example.invalid/v1/things", trimmer("itest.example.invalid/v1", "Thing")
    )
    inf = started(Informer(api, missing, rec.on_replace, rec.on_event, metrics, backoff=FAST))
    wait_for(
        "three failed watches counted",
        lambda: metrics.watch_restarts.labels(resource="missing", cause="failure")._value.get() >= 3,
        timeout=10,
    )
    assert not inf.synced.is_set() and rec.replaced == [] and running(runner, inf)


def test_stop_ends_a_long_watch_at_once(api, namespace, runner):
    inf = Informer(api, configmaps(namespace), Recorder().on_replace, Recorder().on_event, Metrics(), watch_timeout_seconds=300)
    [task] = start_informers(runner, [inf])
    assert inf.synced.wait(10)
    wait_for("the watch request in flight", lambda: inf._response is not None, timeout=10, interval=0.02)
    runner.stop(timeout=5)
    assert not task.thread.is_alive()


def deep_pipelinerun(name: str, nest: int) -> str:
    """A PipelineRun whose custom task spec (stored as its creator wrote it) nests `nest` arrays: JSON text,
    since no JSON writer here goes that deep."""
    deep = "[" * nest + '"x"' + "]" * nest
    return ('{"apiVersion":"tekton.dev/v1","kind":"PipelineRun","metadata":{"name":"%s"},"spec":{"pipelineSpec":{"tasks":'
            '[{"name":"t","taskSpec":{"apiVersion":"example.dev/v1","kind":"Example","spec":{"deep":%s}}}]}}}') % (name, deep)


def test_a_run_nested_deeper_than_the_readers_go_stops_no_list_and_no_watch(api, namespace, started, devcluster):
    """The API server keeps JSON nested up to 10,000 deep, and anyone who may create PipelineRuns writes a
    custom task's spec as they like: such a run, listed or watched, is read pruned (json_wire.decode_pruned),
    and the runs beside it and after it are seen as ever."""
    path = f"/apis/tekton.dev/v1/namespaces/{namespace}/pipelineruns"
    kubectl(devcluster, "create", "-n", namespace, "-f", "-", stdin=deep_pipelinerun("deep-before", 5000))
    rec = Recorder()
    runs = tekton("PipelineRun")
    inf = started(Informer(api, Resource(runs.name, runs.kind, path, runs.trim), rec.on_replace, rec.on_event, Metrics(), backoff=FAST))
    assert inf.synced.wait(10)
    [listed] = rec.replaced
    assert [o["metadata"]["name"] for o in listed] == ["deep-before"] and listed[0]["kind"] == "PipelineRun"
    kubectl(devcluster, "create", "-n", namespace, "-f", "-", stdin=deep_pipelinerun("deep-after", 3000))
    kubectl(devcluster, "create", "-n", namespace, "-f", "-", stdin=deep_pipelinerun("plain", 1))
    wait_for("the events of deep-after and plain",
             lambda: {"deep-after", "plain"} <= {o["metadata"]["name"] for _, o in rec.events}, timeout=10)
