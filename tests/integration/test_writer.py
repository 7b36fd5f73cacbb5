"""KubeClient on the real API server: node taints with optimistic concurrency (a conflict is re-read
and rebased, foreign changes kept), evictions (done, gone, refused by a PodDisruptionBudget), the
Secret round trip with its conflicts, the webhook CA bundle (mutating and validating), refusals raised as ApiError, and
Events written by the EventRecorder (with series for repeats, drops counted when the queue is full)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from controller.core.model import Taint
from controller.kube.client import MERGE_PATCH, ApiError, KubeApi, Outcome
from controller.retry import RetryPolicy
from controller.kube.writer import REPORTING_CONTROLLER, EventRecorder, KubeClient
from controller.metrics import Metrics
from controller.runner import Runner
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

NODE = "node-3"
ITEST_KEY = "itest.egress-placer.io/writer"


@pytest.fixture
def writer(api) -> KubeClient:
    return KubeClient(api, Metrics(), retry=RetryPolicy(attempts=3, initial=0.05, maximum=0.5))


def node_taints(api: KubeApi) -> tuple[tuple[Taint, ...], str]:
    node = api.call("GET", f"/api/v1/nodes/{NODE}")
    return tuple(Taint.from_dict(t) for t in node["spec"].get("taints") or []), node["metadata"]["resourceVersion"]


@pytest.fixture
def clean_node(api):
    """NODE without this test's taints and label, before and after."""

    def clean() -> None:
        taints, _ = node_taints(api)
        keep = [t.to_dict() for t in taints if not t.key.startswith(ITEST_KEY)]
        body = {"metadata": {"labels": {ITEST_KEY: None}}, "spec": {"taints": keep or None}}
        api.call("PATCH", f"/api/v1/nodes/{NODE}", body=body, content_type=MERGE_PATCH)

    clean()
    yield
    clean()


def test_set_node_taints_writes_the_whole_list(api, writer, clean_node):
    mine = Taint(ITEST_KEY, "a", "NoSchedule")
    before, rv = node_taints(api)
    writer.set_node_taints(NODE, (*before, mine), rv)
    assert node_taints(api)[0] == (*before, mine)
    writer.set_node_taints(NODE, before, None)  # no precondition
    assert node_taints(api)[0] == before


def test_a_conflict_is_reread_and_rebased_keeping_what_changed_meanwhile(api, writer, clean_node):
    mine = Taint(ITEST_KEY, "mine", "NoSchedule")
    theirs = Taint(f"{ITEST_KEY}-other", "theirs", "NoExecute")
    before, stale_rv = node_taints(api)
    # Someone else adds a taint after we read the node.
    api.call(
        "PATCH",
        f"/api/v1/nodes/{NODE}",
        body={"spec": {"taints": [t.to_dict() for t in (*before, theirs)]}},
        content_type=MERGE_PATCH,
    )
    writer.set_node_taints(NODE, (*before, mine), stale_rv, rebase=lambda current: (*current, mine))
    assert node_taints(api)[0] == (*before, theirs, mine)


def test_a_conflict_without_rebase_writes_the_given_list_on_the_fresh_version(api, writer, clean_node):
    mine = Taint(ITEST_KEY, "mine", "NoSchedule")
    before, stale_rv = node_taints(api)
    api.call(
        "PATCH", f"/api/v1/nodes/{NODE}", body={"metadata": {"labels": {ITEST_KEY: "x"}}}, content_type=MERGE_PATCH
    )
    writer.set_node_taints(NODE, (*before, mine), stale_rv)
    assert node_taints(api)[0] == (*before, mine)


def test_a_refused_write_raises_a_clear_error(writer):
    with pytest.raises(ApiError) as raised:
        writer.set_node_taints(NODE, [Taint(ITEST_KEY, "x", "Sometimes")], None)
    assert raised.value.outcome is Outcome.FAIL and raised.value.status == 422
    assert "set-node-taints failed" in str(raised.value) and "Sometimes" in str(raised.value)


def test_taints_of_a_missing_node_are_done(api, writer):
    """A node deleted after it was read (and one that never was): the write returns and writes nothing."""
    name = f"itest-gone-{uuid.uuid4().hex[:8]}"
    api.call("POST", "/api/v1/nodes", body={"metadata": {"name": name}})
    read = api.call("GET", f"/api/v1/nodes/{name}")["metadata"]["resourceVersion"]
    api.call("DELETE", f"/api/v1/nodes/{name}")
    for node, version in ((name, read), ("itest-no-such-node", "1")):
        writer.set_node_taints(node, [Taint(ITEST_KEY, "x", "NoSchedule")], version)
        with pytest.raises(ApiException) as read_back:
            api.call("GET", f"/api/v1/nodes/{node}")
        assert read_back.value.status == 404, f"{node} exists after the write"  # a PATCH never creates
    retried = [s for m in writer.metrics.api_write_retries.collect() for s in m.samples if s.name.endswith("_total")]
    assert retried == []  # a node that is gone is not worth another try


def make_pod(api: KubeApi, namespace: str, name: str, labels: dict[str, str] | None = None) -> None:
    body = {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "alpine:3", "command": ["sleep", "inf"]}]},
    }
    api.call("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)


def pod_going(api: KubeApi, namespace: str, name: str) -> bool:
    try:
        return bool(api.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")["metadata"].get("deletionTimestamp"))
    except Exception as e:
        return getattr(e, "status", None) == 404


def test_evict(api, writer, namespace):
    make_pod(api, namespace, "victim")
    assert writer.evict(namespace, "victim") is True
    wait_for("pod victim evicted", lambda: pod_going(api, namespace, "victim"), timeout=15)
    assert writer.evict(namespace, "never-existed") is True  # gone is done


def test_an_eviction_or_delete_for_another_uid_leaves_the_pod_of_that_name_alone(api, writer, namespace):
    make_pod(api, namespace, "reborn")
    uid = api.call("GET", f"/api/v1/namespaces/{namespace}/pods/reborn")["metadata"]["uid"]
    assert writer.evict(namespace, "reborn", uid="00000000-0000-0000-0000-000000000000") is True  # that pod is gone
    writer.delete_pod(namespace, "reborn", uid="00000000-0000-0000-0000-000000000000")
    assert not pod_going(api, namespace, "reborn")
    writer.delete_pod(namespace, "reborn", uid=uid)
    wait_for("pod reborn evicted", lambda: pod_going(api, namespace, "reborn"), timeout=15)
    writer.delete_pod(namespace, "reborn", uid=uid)  # gone is done


def test_an_eviction_a_disruption_budget_forbids_is_refused_for_now(api, writer, namespace):
    make_pod(api, namespace, "guarded", labels={"app": "guarded"})
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    api.call("POST", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", body=pdb)

    def budget_counts_the_pod() -> bool:
        status = (
            api.call("GET", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/guard").get("status") or {}
        )
        return status.get("currentHealthy") == 1 and status.get("disruptionsAllowed") == 0

    wait_for("the budget to count the pod", budget_counts_the_pod, timeout=30)
    assert writer.evict(namespace, "guarded") is False
    assert not pod_going(api, namespace, "guarded")


def test_secret_round_trip_and_conflicts(writer, namespace):
    assert writer.read_secret(namespace, "tls") is None
    writer.write_secret(namespace, "tls", {"tls.crt": b"one", "bin": bytes(range(256))}, None)
    data, rv = writer.read_secret(namespace, "tls")
    assert data == {"tls.crt": b"one", "bin": bytes(range(256))}
    writer.write_secret(namespace, "tls", {"tls.crt": b"two"}, rv)
    data2, rv2 = writer.read_secret(namespace, "tls")
    assert data2["tls.crt"] == b"two" and rv2 != rv
    with pytest.raises(ApiError) as stale:
        writer.write_secret(namespace, "tls", {"tls.crt": b"three"}, rv)  # someone wrote since rv
    with pytest.raises(ApiError) as exists:
        writer.write_secret(namespace, "tls", {"tls.crt": b"four"}, None)
    assert stale.value.status == exists.value.status == 409
    assert stale.value.outcome is exists.value.outcome is Outcome.CONFLICT
    assert writer.read_secret(namespace, "tls")[0]["tls.crt"] == b"two"


@pytest.fixture(params=["mutating", "validating"])
def webhook_config(api, request):
    """(kind, name) of a webhook configuration of two webhooks, mutating or validating."""
    kind = request.param
    name = f"itest-{uuid.uuid4().hex[:8]}"

    def hook(n: str) -> dict[str, Any]:
        return {
            "name": f"{n}.itest.egress-placer.io",
            "clientConfig": {"url": "https://127.0.0.1:9/never"},
            "rules": [
                {
                    "apiGroups": ["itest.example.invalid"],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["things"],
                }
            ],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }

    body = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": f"{kind.capitalize()}WebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [hook("a"), hook("b")],
    }
    path = f"/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations"
    api.call("POST", path, body=body)
    yield kind, name
    api.call("DELETE", f"{path}/{name}")


def test_webhook_ca_bundle(api, writer, webhook_config):
    import base64

    kind, name = webhook_config

    def bundles() -> list[bytes]:
        config = api.call("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations/{name}")
        return [base64.b64decode(w["clientConfig"].get("caBundle", "")) for w in config["webhooks"]]

    assert writer.set_webhook_ca_bundle(name, b"CA ONE", kind) is True
    assert bundles() == [b"CA ONE", b"CA ONE"]
    assert writer.set_webhook_ca_bundle(name, b"CA ONE", kind) is False
    assert writer.set_webhook_ca_bundle(name, b"CA TWO", kind) is True
    assert bundles() == [b"CA TWO", b"CA TWO"]
    assert writer.set_webhook_ca_bundle("itest-no-such-config", b"CA", kind) is False


def events_about(api: KubeApi, namespace: str, name: str) -> list[dict[str, Any]]:
    items = api.call("GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")["items"]
    return [e for e in items if e["regarding"].get("name") == name]


def test_events_are_written_with_series_for_repeats(api, writer, namespace):
    metrics = Metrics()
    recorder = EventRecorder(writer, metrics, identity="itest-replica")
    runner = Runner()
    runner.start("event recorder", recorder.run, on_stop=recorder.wake)
    regarding = {"apiVersion": "v1", "kind": "ConfigMap", "namespace": namespace, "name": "policy"}
    recorder.emit(regarding, "Warning", "PolicyRefused", "policy.yaml:3: pools[0].name: bad")
    recorder.emit(regarding, "Warning", "PolicyRefused", "policy.yaml:3: pools[0].name: bad")
    recorder.emit(regarding, "Normal", "PolicyLoaded", "x" * 5000, action="Load")
    assert recorder.flush(10)
    runner.stop()
    events = {e["reason"]: e for e in events_about(api, namespace, "policy")}
    refused, loaded = events["PolicyRefused"], events["PolicyLoaded"]
    assert refused["type"] == "Warning" and refused["note"] == "policy.yaml:3: pools[0].name: bad"
    assert refused["reportingController"] == REPORTING_CONTROLLER and refused["reportingInstance"] == "itest-replica"
    assert refused["action"] == "PolicyRefused" and refused["series"]["count"] == 2
    assert loaded["action"] == "Load" and len(loaded["note"]) == 1024 and "series" not in loaded
    assert metrics.events_dropped._value.get() == 0


def test_events_beyond_the_queue_are_dropped_and_counted(writer):
    metrics = Metrics()
    recorder = EventRecorder(writer, metrics, identity="itest", max_queue=2)  # not started: nothing drains
    for _ in range(5):
        recorder.emit({"kind": "Pod", "name": "p", "namespace": "default"}, "Normal", "Test", "note")
    assert metrics.events_dropped._value.get() == 3
