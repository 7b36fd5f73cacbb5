"""The adapter's error handling without a cluster: how every write error is classified, that
transient ones are retried with backoff and at least the server's Retry-After while others fail at
once, that the one optimistic-concurrency loop writes on a fresh version after a conflict (and gives
up in time), and how the informer reads watch events (bookmarks move the resourceVersion, ERROR events end
the watch: 410 to relist, others to back off), and that Lease requests go through the same
classification and retries."""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from controller.kube.client import MERGE_PATCH, ApiError, KubeApi, Outcome, classify
from controller.kube.informer import Informer, WatchError, WatchExpired, nodes
from controller.kube.leader import LeaderElector
from controller.kube.reader import KubeReader
from controller.retry import RetryPolicy
from controller.kube.writer import MAX_CONFLICT_ATTEMPTS, KubeClient
from controller.metrics import Metrics


def api_error(status: int, body: dict[str, Any] | None = None, retry_after: str | None = None) -> ApiException:
    error = ApiException(status=status, reason="test")
    error.body = json.dumps(body) if body is not None else None
    error.headers = {"Retry-After": retry_after} if retry_after else {}
    return error


PDB_REFUSAL = {"kind": "Status", "code": 429, "details": {"causes": [{"reason": "DisruptionBudget", "message": "x"}]}}


@pytest.mark.parametrize(
    ("error", "outcome", "cause"),
    [
        (api_error(429), Outcome.RETRY, "throttled"),
        (api_error(429, PDB_REFUSAL), Outcome.REFUSED, "disruption-budget"),
        (api_error(500), Outcome.RETRY, "server-error"),
        (api_error(503), Outcome.RETRY, "server-error"),
        (api_error(404), Outcome.NOT_FOUND, "not-found"),
        (api_error(409), Outcome.CONFLICT, "conflict"),
        (api_error(403), Outcome.FAIL, "http-403"),
        (api_error(422), Outcome.FAIL, "http-422"),
        (ApiException(status=0, reason="SSLError"), Outcome.RETRY, "connection"),
        (urllib3.exceptions.MaxRetryError(None, "/"), Outcome.RETRY, "connection"),
        (ConnectionResetError(), Outcome.RETRY, "connection"),
        (ValueError("bug"), Outcome.FAIL, "ValueError"),
    ],
)
def test_classify(error, outcome, cause):
    assert classify(error) == (outcome, cause)


class Flaky:
    """Raises the given errors in turn, then answers."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def caller(sleeps: list[float], attempts: int = 4) -> KubeReader:
    policy = RetryPolicy(attempts=attempts, initial=0.1, maximum=5.0, jitter=0.0)
    # No API server: these tests only use KubeReader.call (every request's) with their own functions.
    return KubeReader(KubeApi(None), Metrics(), retry=policy, sleep=sleeps.append)  # type: ignore[arg-type]


def test_transient_errors_are_retried_honouring_retry_after():
    sleeps: list[float] = []
    w = caller(sleeps)
    fn = Flaky(api_error(503), api_error(429, retry_after="3"))
    assert w.call("op", fn) == "ok"
    assert fn.calls == 3
    assert sleeps[0] < 3 <= sleeps[1]
    assert w.metrics.api_write_retries.labels(operation="op", cause="throttled")._value.get() == 1


@pytest.mark.parametrize(
    ("error", "outcome"),
    [(api_error(403), Outcome.FAIL), (api_error(404), Outcome.NOT_FOUND), (api_error(409), Outcome.CONFLICT)],
)
def test_other_errors_are_not_retried(error, outcome):
    sleeps: list[float] = []
    fn = Flaky(error)
    with pytest.raises(ApiError) as raised:
        caller(sleeps).call("op", fn)
    assert (fn.calls, sleeps, raised.value.outcome, raised.value.status) == (1, [], outcome, error.status)


def test_retries_stop_after_the_last_attempt():
    sleeps: list[float] = []
    fn = Flaky(*[api_error(500)] * 10)
    with pytest.raises(ApiError) as raised:
        caller(sleeps, attempts=3).call("op", fn)
    assert fn.calls == 3 and len(sleeps) == 2 and raised.value.outcome is Outcome.RETRY


class Contended:
    """A KubeApi stand-in for one object others keep writing: each GET answers a newer version; the
    first `conflicts` writes are refused with 409."""

    def __init__(self, conflicts: int) -> None:
        self.conflicts = conflicts
        self.version = 0
        self.writes: list[Any] = []

    def call(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        if method == "GET":
            self.version += 1
            return {"metadata": {"resourceVersion": str(self.version)}}
        self.writes.append(body)
        if len(self.writes) <= self.conflicts:
            raise api_error(409)
        return {}


def stamp(obj: dict[str, Any]) -> Any:
    return "PATCH", {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}}, MERGE_PATCH, "written"


def test_a_conflict_reads_the_object_again_and_writes_on_the_fresh_version():
    api = Contended(conflicts=2)
    client = KubeClient(api, Metrics(), sleep=lambda _: None)  # type: ignore[arg-type]
    assert client.update("set-thing", "/thing", stamp, read_as="read-thing") == "written"
    assert [w["metadata"]["resourceVersion"] for w in api.writes] == ["1", "2", "3"]


def test_the_version_the_caller_read_is_written_first_without_reading():
    api = Contended(conflicts=0)
    client = KubeClient(api, Metrics(), sleep=lambda _: None)  # type: ignore[arg-type]
    assert client.update("set-thing", "/thing", stamp, read_as="read-thing", read={"metadata": {"resourceVersion": "7"}})
    assert api.version == 0 and api.writes == [{"metadata": {"resourceVersion": "7"}}]


def test_an_object_that_keeps_changing_is_a_conflict_in_the_end():
    api = Contended(conflicts=100)
    with pytest.raises(ApiError) as raised:
        KubeClient(api, Metrics(), sleep=lambda _: None).update("set-thing", "/thing", stamp, read_as="read-thing")  # type: ignore[arg-type]
    assert raised.value.outcome is Outcome.CONFLICT and len(api.writes) == MAX_CONFLICT_ATTEMPTS


class LeaseApi:
    """A KubeApi stand-in for one Lease: answers (or raises) what each request is given, in turn."""

    timeout = 10.0

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.requests: list[str] = []

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        self.requests.append(method)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def elector(api: LeaseApi) -> LeaderElector:
    return LeaderElector(
        api,  # type: ignore[arg-type]
        namespace="ns", name="lease", identity="me", metrics=Metrics(), lease_duration=3, renew_deadline=2,
        retry_period=0.01,
    )


def test_lease_requests_use_the_clients_classification_and_retry():
    lease = {"metadata": {"resourceVersion": "1"}, "spec": {}}
    taken = {"metadata": {"resourceVersion": "2"}, "spec": {"holderIdentity": "me"}}
    api = LeaseApi(api_error(503), lease, taken)  # a transient error is tried again, then the lease is taken
    e = elector(api)
    assert e.try_acquire_or_renew() is True and api.requests == ["GET", "GET", "PUT"]
    assert e.metrics.api_write_retries.labels(operation="read-lease", cause="server-error")._value.get() == 1


@pytest.mark.parametrize(
    ("answers", "requests"),
    [
        ((api_error(404), api_error(409)), ["GET", "POST"]),  # created by another candidate first
        (({"metadata": {"resourceVersion": "1"}, "spec": {}}, api_error(409)), ["GET", "PUT"]),  # written first
    ],
)
def test_a_lease_conflict_is_a_lost_race_not_an_error(answers, requests):
    api = LeaseApi(*answers)
    assert elector(api).try_acquire_or_renew() is False and api.requests == requests


def test_a_refused_lease_request_is_an_api_error():
    with pytest.raises(ApiError) as raised:
        elector(LeaseApi(api_error(403))).try_acquire_or_renew()
    assert raised.value.outcome is Outcome.FAIL and raised.value.status == 403


def informer(seen: list[tuple[str, str]]) -> Informer:
    return Informer(
        api=None,  # type: ignore[arg-type]  # _handle makes no request
        resource=nodes(),
        on_replace=lambda objs: None,
        on_event=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
        metrics=Metrics(),
    )


def test_watch_events_advance_the_resource_version():
    seen: list[tuple[str, str]] = []
    inf = informer(seen)
    inf._handle({"type": "ADDED", "object": {"metadata": {"name": "n1", "resourceVersion": "10"}}})
    inf._handle({"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "15"}}})
    assert seen == [("ADDED", "n1")] and inf.resource_version == "15"


@pytest.mark.parametrize(
    ("status", "raised"),
    [
        ({"code": 410, "reason": "Expired", "message": "too old"}, WatchExpired),
        ({"code": 500, "message": "x"}, WatchError),
    ],
)
def test_error_events_end_the_watch(status, raised):
    with pytest.raises(raised):
        informer([])._handle({"type": "ERROR", "object": {"kind": "Status", **status}})


def test_a_request_given_up_on_a_retry_after_holds_the_next_call_back_that_long() -> None:
    # A reconciler's next pass must not write sooner than the server asked, even after the retries gave up.
    sleeps: list[float] = []
    reader = caller(sleeps, attempts=2)

    def throttled() -> None:
        raise api_error(429, retry_after="3")

    with pytest.raises(ApiError):
        reader.call("patch-node", throttled)
    assert sleeps == [3.0]  # between the two attempts
    assert reader.call("patch-node", lambda: "written") == "written"
    assert len(sleeps) == 2 and 2.0 < sleeps[1] <= 3.0  # held back before the next call's first request
