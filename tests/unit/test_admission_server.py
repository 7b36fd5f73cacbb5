"""Checks the admission server (controller/admission/server.py) over real TLS on 127.0.0.1, no cluster:
a real HTTPS client verifying the self-made CA posts AdmissionReviews to /mutate and /mutate/<kind>,
and EgressPools to /validate;
bad JSON, wrong shapes and oversized bodies are refused; /healthz, /readyz (503 until ready, with the
reason) and /metrics answer on the plain port; a certificate rotation by the keeper is presented on
the next handshake without restarting the server; stop() closes both ports; the worst reviews a tenant
can send (bench/hostile.py) are answered unresolved (the caps stopped the work), and while large reviews
are in flight /healthz and ordinary reviews are answered. Nothing here asserts a duration: what the
answers cost is bench.hostile's and bench.admission's figure; these tests check the order of events
(answered while a large review is still held, refused before any slot holder's read times out)."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st
import uvloop
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bench import hostile
from controller.admission import server as server_module
from controller.admission.certs import CA_CERT, TLS_CERT, CertificateKeeper
from controller.admission.handlers import Admission
from controller.admission.pools import PoolValidation
from controller.admission.review import decode, encode
from controller.admission.server import MAX_REVIEW_BYTES, AdmissionServer
from controller.core.model import DECISION_ANNOTATION
from controller.core.policy import load_policy
from controller.metrics import Metrics
from controller.settings import Settings
from controller.state import ClusterState
from tests.waiting import wait_for

DATA = Path(__file__).resolve().parents[1] / "data" / "admission"
TEKTON = Path(__file__).resolve().parents[1] / "data" / "tekton"  # catalog Tasks copied into the repository
DAY = 86400.0


class MemorySecrets:
    """In-memory SecretWriter (one Secret, the caBundle)."""

    def __init__(self) -> None:
        self.secret: tuple[dict[str, bytes], str] | None = None
        self.ca_bundle: bytes | None = None

    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        return self.secret

    def write_secret(self, namespace: str, name: str, data: dict[str, bytes], resource_version: str | None) -> bool:
        self.secret = (dict(data), str(int(resource_version or 0) + 1))
        return True

    def set_webhook_ca_bundle(self, config_name: str, ca_pem: bytes, kind: str = "mutating") -> bool:
        self.ca_bundle = ca_pem
        return True

    def set_crd_conversion_ca_bundle(self, crd_name: str, ca_pem: bytes) -> bool:
        return self.set_webhook_ca_bundle(crd_name, ca_pem, "crd")


class NoEvents:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def hold(self, token: str, regarding: dict, type: str, reason: str, note: str, action: str = "", *,
             generate_name: str = "") -> None:
        self.sent.append((type, reason))


class Running:
    """The servers running in an event loop in a background thread."""

    def __init__(self, tmp: Path) -> None:
        # The keeper's clock starts 80 days ago: the first certificate (90 days) has 10 days left now,
        # valid for the client's real clock, and due for renewal when the fake clock reaches today.
        self.now = time.time() - 80 * DAY
        self.settings = Settings(webhook_host="127.0.0.1", webhook_port=0, health_host="127.0.0.1", health_port=0,
                                 tls_hosts=["127.0.0.1", "localhost"])
        policy = load_policy((DATA / "policy.yaml").read_text())
        self.state = ClusterState(policy, clock=lambda: self.now)
        for doc in yaml.safe_load_all((DATA / "cluster.yaml").read_text()):
            self.state.apply(doc["kind"], "ADDED", doc)
        task = yaml.safe_load((TEKTON / "tasks/kaniko/0.7/kaniko.yaml").read_text())
        task["metadata"]["namespace"] = "team-ci"
        self.state.apply("Task", "ADDED", task)
        self.metrics = Metrics()
        self.events = NoEvents()
        self.store = MemorySecrets()
        self.keeper = CertificateKeeper(self.settings, self.store, clock=lambda: self.now)
        self.synced = False
        self.policy_problem: str | None = None
        self.server = AdmissionServer(
            self.settings,
            Admission(self.state, self.metrics, self.events, self.settings),
            self.metrics,
            self.keeper.tls,
            readiness=lambda: None if self.synced else "caches not synced",
            shutdown_timeout=2.0,
            degraded=lambda: self.policy_problem,
            validation=PoolValidation(lambda: None, self.metrics),
        )
        self.ca_file = tmp / "ca.crt"
        self.loop = uvloop.new_event_loop()  # the controller's loop (run_event_loop)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start())

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def rotate(self, leader: bool = True) -> None:
        self.call(self.keeper.ensure_async(leader))
        assert self.store.secret is not None
        self.ca_file.write_bytes(self.store.secret[0][CA_CERT])

    @property
    def webhook(self) -> str:
        return f"https://127.0.0.1:{self.server.webhook_port}"

    @property
    def health(self) -> str:
        return f"http://127.0.0.1:{self.server.health_port}"

    def presented_certificate(self) -> bytes:
        """The DER certificate the server presents on a new, verified handshake."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        with socket.create_connection(("127.0.0.1", self.server.webhook_port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                return tls.getpeercert(binary_form=True) or b""

    def close(self) -> None:
        try:
            self.call(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    r = Running(tmp_path)
    r.rotate()
    try:
        yield r
    finally:
        r.close()


def review(obj: dict, uid: str = "uid-1") -> dict:
    group, _, version = obj["apiVersion"].rpartition("/")
    request = {"uid": uid, "kind": {"group": group, "version": version, "kind": obj["kind"]}, "operation": "CREATE", "object": obj}
    if obj["metadata"].get("namespace"):
        request["namespace"] = obj["metadata"]["namespace"]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


KANIKO_RUN = {
    "apiVersion": "tekton.dev/v1",
    "kind": "TaskRun",
    "metadata": {"name": "build-1", "namespace": "team-ci"},
    "spec": {"taskRef": {"name": "kaniko"}, "params": [{"name": "IMAGE", "value": "r.example.com/app"}]},
}


@pytest.mark.parametrize("path", ["/mutate", "/mutate/tekton.dev/v1/taskruns"])
def test_mutate_places_a_taskrun_over_verified_tls(running: Running, path: str) -> None:
    answer = requests.post(running.webhook + path, json=review(copy.deepcopy(KANIKO_RUN)), verify=running.ca_file, timeout=10)
    assert answer.status_code == 200
    response = answer.json()["response"]
    assert response["uid"] == "uid-1" and response["allowed"] is True and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/spec/podTemplate"}.items() <= patch[0].items()
    assert running.events.sent == [("Normal", "Placed")]


@pytest.mark.parametrize(
    "body, status",
    [
        pytest.param(b"{not json", 400, id="not-json"),
        pytest.param(b"\xff\xfe", 400, id="not-utf8"),
        pytest.param(json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(), 400, id="not-a-review"),
        pytest.param(json.dumps([1, 2]).encode(), 400, id="a-list"),
        pytest.param(b" " * (MAX_REVIEW_BYTES + 1), 413, id="too-large"),
    ],
)
def test_bad_bodies_are_refused(running: Running, body: bytes, status: int) -> None:
    answer = requests.post(running.webhook + "/mutate", data=body, headers={"Content-Type": "application/json"},
                           verify=running.ca_file, timeout=30)
    assert answer.status_code == status


# What orjson refuses and the standard library reads: the wire reads them as it always did. An integer
# beyond 64 bits (which the API server itself holds as a float, as JSON readers may) is read as that float.
@pytest.mark.parametrize(
    "body, value",
    [
        pytest.param(b'{"a": NaN, "b": -Infinity}', "{'a': nan, 'b': -inf}", id="nan"),
        pytest.param(b'{"a": 1180591620717411303424}', repr({"a": float(2**70)}), id="beyond-64-bits"),
        pytest.param('{"a": "\u00e9"}'.encode("utf-16"), repr({"a": "\u00e9"}), id="utf-16"),
        pytest.param(b'{"a": "\\ud800"}', repr({"a": "\ud800"}), id="lone-surrogate"),
    ],
)
def test_decode_reads_what_the_standard_library_reads(body: bytes, value: str) -> None:
    assert repr(decode(body)) == value


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe", b"", b"[" * 100_000, b'{"a": 1} x'])
def test_decode_refuses_what_the_standard_library_refuses(body: bytes) -> None:
    with pytest.raises((ValueError, RecursionError)) as theirs:
        json.loads(body)
    with pytest.raises(theirs.type):
        decode(body)


def json_values(integers: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | integers | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )


@given(json_values(st.integers()))
def test_encode_writes_the_json_the_standard_library_reads_back(value: Any) -> None:
    assert json.loads(encode(value)) == value


# Integers beyond 64 bits are read as floats (test_decode_reads_what_the_standard_library_reads): within them,
# what is read is what was written.
@given(json_values(st.integers(min_value=-(2**63), max_value=2**64 - 1)))
def test_decode_reads_back_what_the_standard_library_writes(value: Any) -> None:
    assert decode(json.dumps(value).encode()) == value


@pytest.mark.parametrize(("url", "allowed"), [("http://prometheus.monitoring:9090", True), ("http://prometheus:99999", False)])
@pytest.mark.parametrize("path", ["/validate", "/validate/egress-placer.io/v1alpha1/egresspools"])
def test_validate_judges_a_pool_over_verified_tls(running: Running, path: str, url: str, allowed: bool) -> None:
    pool = {"apiVersion": "egress-placer.io/v1alpha1", "kind": "EgressPool", "metadata": {"name": "overseas"},
            "spec": {"nodes": ["egress-1"], "egressLoad": {"prometheus": {"url": url}}}}
    answer = requests.post(running.webhook + path, json=review(pool), verify=running.ca_file, timeout=10)
    assert answer.status_code == 200
    response = answer.json()["response"]
    assert (response["uid"], response["allowed"]) == ("uid-1", allowed)
    if not allowed:
        assert response["status"]["message"] == "EgressPool overseas: spec.egressLoad.prometheus.url: invalid port number"
    assert requests.post(running.webhook + path, data=b"{not json", verify=running.ca_file, timeout=10).status_code == 400


def test_only_post_to_mutate(running: Running) -> None:
    assert requests.get(running.webhook + "/mutate", verify=running.ca_file, timeout=10).status_code == 405
    assert requests.get(running.webhook + "/validate", verify=running.ca_file, timeout=10).status_code == 405
    assert requests.post(running.webhook + "/other", json={}, verify=running.ca_file, timeout=10).status_code == 404


def test_health_readiness_and_metrics(running: Running) -> None:
    assert requests.get(running.health + "/healthz", timeout=10).status_code == 200
    not_ready = requests.get(running.health + "/readyz", timeout=10)
    assert not_ready.status_code == 503 and "caches not synced" in not_ready.text
    running.synced = True
    ready = requests.get(running.health + "/readyz", timeout=10)
    assert (ready.status_code, ready.text) == (200, "ready\n")
    running.policy_problem = "policy.yaml:3: invalid YAML; in force: the last good policy loaded before"
    degraded = requests.get(running.health + "/readyz", timeout=10)  # still ready: it says why, stays in the endpoints
    assert (degraded.status_code, degraded.text) == (200, f"ready, degraded: {running.policy_problem}\n")
    requests.post(running.webhook + "/mutate", json=review(copy.deepcopy(KANIKO_RUN)), verify=running.ca_file, timeout=10)
    metrics = requests.get(running.health + "/metrics", timeout=10)
    assert metrics.status_code == 200 and metrics.headers["Content-Type"].startswith("text/plain")
    assert 'egress_placer_decisions_total{kind="TaskRun",pool="egress",reason="image-match"} 1.0' in metrics.text
    assert 'egress_placer_admission_duration_seconds_count{kind="TaskRun"} 1.0' in metrics.text


def test_not_ready_without_a_certificate(tmp_path: Path) -> None:
    r = Running(tmp_path)  # the Secret does not exist and this replica is a follower
    try:
        r.synced = True
        r.call(r.keeper.ensure_async(leader=False))
        answer = requests.get(r.health + "/readyz", timeout=10)
        assert answer.status_code == 503 and "certificate" in answer.text
    finally:
        r.close()


def test_rotation_is_presented_without_restart(running: Running) -> None:
    first = running.presented_certificate()
    assert first == _der(running.store.secret[0][TLS_CERT])  # type: ignore[index]
    running.now = time.time()  # 10 days left of 90: the leader renews
    running.rotate()
    second = running.presented_certificate()
    assert second != first and second == _der(running.store.secret[0][TLS_CERT])  # type: ignore[index]
    answer = requests.post(running.webhook + "/mutate", json=review(copy.deepcopy(KANIKO_RUN)), verify=running.ca_file, timeout=10)
    assert answer.status_code == 200


def test_stop_closes_both_ports(tmp_path: Path) -> None:
    r = Running(tmp_path)
    r.rotate()
    ports = (r.server.webhook_port, r.server.health_port)
    r.close()
    for port in ports:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


def _der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


# -- the worst reviews a tenant can send -------------------------------------------------------------

# The most any API server waits for a webhook (timeoutSeconds' maximum): an answer later than this is lost
# whatever the webhook's configuration. Only a hang guard: how fast the answers come is bench.hostile's figure.
API_SERVER_MAX_WAIT_SECONDS = 30


def hostile_reviews() -> dict[str, bytes]:
    """bench.hostile's worst inputs, in the namespace of the test data, as review bodies."""
    out = {}
    for name, build in hostile.CASES.items():
        run = build()
        run["metadata"]["namespace"] = "team-ci"
        out[name] = json.dumps(review(run, uid=name)).encode()
        assert len(out[name]) < MAX_REVIEW_BYTES
    return out


def decisions(answer: requests.Response) -> list[dict[str, Any]]:
    """The decision records the answer's patch writes (one per run; a PipelineRun's has its tasks)."""
    patch = json.loads(base64.b64decode(answer.json()["response"]["patch"]))
    records = []
    for op in patch:
        value = op.get("value")
        if isinstance(value, dict) and DECISION_ANNOTATION in value:
            records.append(json.loads(value[DECISION_ANNOTATION]))
        elif op["path"].endswith(DECISION_ANNOTATION.replace("/", "~1")):
            records.append(json.loads(value))
    return records


def test_the_worst_reviews_are_answered_unresolved(running: Running) -> None:
    """Each is answered (allowed, never a 500 or a stall) and the caps stopped discovery ("unresolved").
    The work each cap bounds is checked in tests/unit/test_images_bounds.py; the seconds and memory an
    answer costs are bench.hostile's figures."""
    for name, body in hostile_reviews().items():
        answer = requests.post(running.webhook + "/mutate", data=body, headers={"Content-Type": "application/json"},
                               verify=running.ca_file, timeout=API_SERVER_MAX_WAIT_SECONDS)
        assert answer.status_code == 200 and answer.json()["response"]["allowed"] is True, name
        [record] = decisions(answer)
        reasons = {task["reason"] for task in record["tasks"].values()} if "tasks" in record else {record["reason"]}
        assert "unresolved" in reasons, (name, record)  # past a cap: placed at Pod CREATE instead


def test_health_and_ordinary_reviews_are_answered_while_a_large_review_is_held(running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large review is held where it is answered (until the test lets it go): meanwhile /healthz and an
    ordinary review are answered, so neither waits for it. Were large reviews answered on the event loop,
    the held one would stop the loop and neither would be answered."""
    entered, let_go = threading.Event(), threading.Event()
    answer_body = running.server._answer

    def held(raw: bytes | bytearray, *args: Any) -> Any:
        if len(raw) > server_module.INLINE_REVIEW_BYTES:
            entered.set()
            let_go.wait(API_SERVER_MAX_WAIT_SECONDS)
        return answer_body(raw, *args)

    monkeypatch.setattr(running.server, "_answer", held)
    large: list[requests.Response] = []
    body = json.dumps(review(copy.deepcopy(KANIKO_RUN) | {"x": "y" * 100_000})).encode()
    sender = threading.Thread(target=lambda: large.append(requests.post(
        running.webhook + "/mutate", data=body, verify=running.ca_file, timeout=API_SERVER_MAX_WAIT_SECONDS)))
    sender.start()
    try:
        assert entered.wait(API_SERVER_MAX_WAIT_SECONDS), "the large review never reached its answering"
        assert requests.get(running.health + "/healthz", timeout=10).status_code == 200
        answer = requests.post(running.webhook + "/mutate", json=review(copy.deepcopy(KANIKO_RUN)), verify=running.ca_file, timeout=10)
        assert answer.status_code == 200 and decisions(answer)[0]["reason"] == "image-match"
        assert not large and not let_go.is_set()  # the large review was in flight all along
    finally:
        let_go.set()
        sender.join()
    assert large[0].status_code == 200


def test_health_and_ordinary_reviews_are_not_queued_behind_large_reviews(running: Running) -> None:
    """Large reviews in flight all along (three clients, each sending the largest bodies in turn);
    meanwhile /healthz and ordinary reviews are answered, many of them inside a large review's span.
    Order of events only (the client's clock orders the spans); their latency is bench.admission's figure."""
    bodies = [body for name, body in hostile_reviews().items() if name in hostile.LARGEST]
    large: list[tuple[float, float]] = []  # (start, end) of each large review
    ordinary: list[tuple[float, float]] = []
    health: list[tuple[float, float]] = []

    def send_large() -> None:
        with requests.Session() as session:
            for body in bodies * 2:
                started = time.monotonic()
                answer = session.post(running.webhook + "/mutate", data=body, headers={"Content-Type": "application/json"},
                                      verify=running.ca_file, timeout=60)
                assert answer.status_code == 200
                large.append((started, time.monotonic()))

    senders = [threading.Thread(target=send_large) for _ in range(3)]
    for sender in senders:
        sender.start()
    with requests.Session() as session:
        while any(sender.is_alive() for sender in senders):
            started = time.monotonic()
            assert session.get(running.health + "/healthz", timeout=10).status_code == 200
            health.append((started, time.monotonic()))
            started = time.monotonic()
            answer = session.post(running.webhook + "/mutate", json=review(copy.deepcopy(KANIKO_RUN)), verify=running.ca_file, timeout=10)
            assert answer.status_code == 200 and decisions(answer)[0]["reason"] == "image-match"
            ordinary.append((started, time.monotonic()))
    for sender in senders:
        sender.join()
    assert len(large) == 3 * len(bodies) * 2
    # Not queued: ordinary reviews began AND ended while a large review was in flight. Answered inline,
    # each would wait for the large one to finish first, so none could end inside its span.
    for what, spans in (("ordinary", ordinary), ("health", health)):
        during = [(s, e) for s, e in spans if any(ls < s and e < le for ls, le in large)]
        assert len(during) >= 5, (what, len(during), len(spans))


# -- admission slots: a flood costs a bounded amount, and is turned away unread ----------------------


def stalled(running: Running, length: int, sent: bytes = b"{") -> ssl.SSLSocket:
    """A connection whose POST announces `length` bytes and sends only `sent` of them: it holds a slot."""
    context = ssl.create_default_context(cafile=str(running.ca_file))
    raw = socket.create_connection(("127.0.0.1", running.server.webhook_port), timeout=30)
    conn = context.wrap_socket(raw, server_hostname="127.0.0.1")
    conn.sendall(f"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode() + sent)
    return conn


def status_of(conn: ssl.SSLSocket) -> int:
    """The status of the answer on `conn` (read up to the end of its status line)."""
    received = b""
    while b"\r\n" not in received and (chunk := conn.recv(4096)):
        received += chunk
    return int(received[9:12])


def turned_away(running: Running, reason: str) -> float:
    return running.metrics.admission_turned_away.labels(reason=reason)._value.get()


def test_a_body_announced_over_the_limit_is_refused_before_it_is_sent(running: Running) -> None:
    conn = stalled(running, MAX_REVIEW_BYTES + 1, sent=b"")
    try:
        assert status_of(conn) == 413
    finally:
        conn.close()


def test_ordinary_reviews_past_their_slots_are_turned_away_unread(running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "SMALL_SLOTS", 2)
    holders = [stalled(running, 1000) for _ in range(2)]
    try:
        wait_for("both ordinary slots taken", lambda: running.server._small_in_use == 2, timeout=10, interval=0.01)
        answer = requests.post(running.webhook + "/mutate", json=review(copy.deepcopy(KANIKO_RUN)), verify=running.ca_file, timeout=10)
        assert (answer.status_code, turned_away(running, server_module.BUSY)) == (503, 1)
        # A large review has slots of its own, and health is answered.
        big = json.dumps(review(copy.deepcopy(KANIKO_RUN) | {"x": "y" * 100_000})).encode()
        assert requests.post(running.webhook + "/mutate", data=big, verify=running.ca_file, timeout=10).status_code == 200
        assert requests.get(running.health + "/healthz", timeout=2).status_code == 200
    finally:
        for conn in holders:
            conn.close()


def test_large_reviews_past_their_slots_and_queue_are_turned_away(running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """LARGE_SLOTS stalled large bodies hold every large slot; LARGE_QUEUE more wait; the next is refused
    (large-busy) before any holder's read times out, and ordinary reviews and /healthz are answered before
    then too; the holders get 408 after LARGE_WAIT_SECONDS and the waiters 503 (large-waited) after the
    same time. The wait is lengthened here so that a loaded machine cannot reorder these events: the
    order is the contract, how fast the refusal comes is bench.admission's figure."""
    monkeypatch.setattr(server_module, "LARGE_WAIT_SECONDS", 5.0)
    length = 1024 * 1024
    holders = [stalled(running, length) for _ in range(server_module.LARGE_SLOTS)]
    wait_for("every large slot taken", lambda: running.server._large.full, timeout=10, interval=0.01)
    waiters = [stalled(running, length) for _ in range(server_module.LARGE_QUEUE)]

    def nothing_timed_out_yet() -> bool:
        """No holder's read has timed out (its slot would have gone to a waiter, leaving the queue) nor any wait."""
        return (running.server._large.in_use, running.server._large.waiting, turned_away(running, server_module.LARGE_WAITED)) == (
            server_module.LARGE_SLOTS, server_module.LARGE_QUEUE, 0)

    try:
        wait_for("the large queue full", lambda: running.server._large.waiting == server_module.LARGE_QUEUE, timeout=10, interval=0.01)
        over = stalled(running, length)
        assert status_of(over) == 503 and turned_away(running, server_module.LARGE_BUSY) == 1
        over.close()
        assert nothing_timed_out_yet()  # refused outright, not queued until a wait ran out
        answer = requests.post(running.webhook + "/mutate", json=review(copy.deepcopy(KANIKO_RUN)), verify=running.ca_file, timeout=10)
        assert answer.status_code == 200 and requests.get(running.health + "/healthz", timeout=10).status_code == 200
        assert nothing_timed_out_yet()  # answered while every large slot and the whole queue were still taken
        assert [status_of(conn) for conn in holders] == [408] * server_module.LARGE_SLOTS
        # The holders' slots free when their read times out, as the first waiters' wait nears its end: those
        # few may take a slot (and time out reading, 408); the others are turned away.
        waited = [status_of(conn) for conn in waiters]
        assert set(waited) <= {503, 408} and waited.count(503) >= server_module.LARGE_QUEUE - server_module.LARGE_SLOTS
        assert (turned_away(running, server_module.LARGE_BUSY), turned_away(running, server_module.LARGE_WAITED)) == (
            1, waited.count(503))
    finally:
        for conn in holders + waiters:
            conn.close()
    wait_for("the large slots free again", lambda: not running.server._large.full, timeout=10, interval=0.01)


def test_connections_are_recycled_as_the_settings_say(running: Running) -> None:
    """The webhook's connections close after `webhook_connection_max_requests` answers or
    `webhook_connection_max_seconds` (controller/admission/wire.py; tests/unit/test_admission_wire.py)."""
    settings = running.settings
    assert (running.server.limits.max_requests, running.server.limits.max_seconds) == (
        settings.webhook_connection_max_requests, settings.webhook_connection_max_seconds) == (1000, 3.0)
    assert running.server.limits.max_body == MAX_REVIEW_BYTES


def test_convert_answers_a_conversion_review_before_the_caches_have_synced(running: Running) -> None:
    """/convert needs no cache: with every replica down and objects stored as v1alpha1, the informers'
    first list of v1beta1 goes through it (docs/pools-api.md, "v1beta1")."""
    assert requests.get(running.health + "/readyz", timeout=10).status_code == 503  # not synced
    pool = {"apiVersion": "egress-placer.io/v1alpha1", "kind": "EgressPool", "metadata": {"name": "overseas"},
            "spec": {"priority": 10, "capacity": 2, "nodes": ["egress-1"]}}
    body = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "c-1", "desiredAPIVersion": "egress-placer.io/v1beta1", "objects": [pool]}}
    answer = requests.post(running.webhook + "/convert", json=body, verify=running.ca_file, timeout=10)
    assert answer.status_code == 200
    response = answer.json()["response"]
    assert (response["uid"], response["result"]) == ("c-1", {"status": "Success"})
    assert response["convertedObjects"] == [{**pool, "apiVersion": "egress-placer.io/v1beta1",
                                             "spec": {"priority": 999_990, "loadCapacityPerNode": 2, "nodes": ["egress-1"]}}]
    assert requests.post(running.webhook + "/convert", json={"kind": "ConversionReview"}, verify=running.ca_file, timeout=10).status_code == 400
    assert requests.get(running.webhook + "/convert", verify=running.ca_file, timeout=10).status_code == 405
