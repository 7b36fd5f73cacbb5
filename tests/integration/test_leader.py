"""Leader election on a real Lease: one of two electors leads and the other waits; a graceful stop
releases the lease and the other takes over at once; a crashed leader (no release) is replaced
once its lease expires; callbacks, `is_leader` and the `is_leader` metric follow."""

from __future__ import annotations

import time

import pytest

from controller.kube.client import KubeApi
from controller.kube.leader import LeaderElector
from controller.metrics import Metrics
from controller.runner import Runner
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

LEASE_DURATION = 3.0


class SeenClock:
    """The monotonic clock, remembering the first and the last time its elector read it."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0

    def __call__(self) -> float:
        self.last = time.monotonic()
        self.first = self.last if self.first is None else self.first
        return self.last

    def watched(self) -> float:
        return 0.0 if self.first is None else self.last - self.first


class Candidate:
    def __init__(self, api: KubeApi, namespace: str, identity: str) -> None:
        self.calls: list[str] = []
        self.metrics = Metrics()
        self.runner = Runner()
        self.clock = SeenClock()
        self.elector = LeaderElector(
            api,
            namespace=namespace,
            name="itest-leader",
            identity=identity,
            metrics=self.metrics,
            lease_duration=LEASE_DURATION,
            renew_deadline=2.0,
            retry_period=0.5,
            on_started_leading=lambda: self.calls.append("started"),
            on_stopped_leading=lambda: self.calls.append("stopped"),
            clock=self.clock,
        )

    def stop(self, release: bool = True) -> None:
        self.elector.release_on_stop = release  # False: as a crash would
        self.runner.stop()

    @property
    def gauge(self) -> float:
        return self.metrics.is_leader._value.get()


@pytest.fixture
def candidates(api, namespace):
    made: list[Candidate] = []

    def make(identity: str) -> Candidate:
        c = Candidate(api, namespace, identity)
        made.append(c)
        c.runner.start("leader election", c.elector.run)
        return c

    yield make
    for c in made:
        c.runner.stop()


def holder(api: KubeApi, namespace: str) -> str | None:
    return api.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/itest-leader")["spec"].get(
        "holderIdentity"
    )


def test_one_leads_the_other_waits_and_takes_over_after_a_graceful_stop(api, namespace, candidates):
    a = candidates("replica-a")
    wait_for("a to start leading", lambda: a.calls == ["started"], timeout=10)
    b = candidates("replica-b")
    # Part of the scenario: a renews and b tries every retry period; b stays a follower longer than a lease lasts.
    wait_for("b to watch the lease for longer than it lasts", lambda: b.clock.watched() > LEASE_DURATION + 1, timeout=10, interval=0.05)
    assert a.elector.is_leader and not b.elector.is_leader
    assert holder(api, namespace) == "replica-a" and (a.gauge, b.gauge) == (1, 0)

    a.stop(release=True)
    assert a.calls == ["started", "stopped"] and a.gauge == 0
    # Released: b does not have to wait for the lease to expire, only for its next try.
    wait_for("b to start leading", lambda: b.calls == ["started"], timeout=2.0, interval=0.05)
    assert b.elector.is_leader and holder(api, namespace) == "replica-b" and b.gauge == 1


def test_a_crashed_leader_is_replaced_when_its_lease_expires(api, namespace, candidates):
    a = candidates("replica-a")
    wait_for("a to lead", lambda: a.elector.is_leader, timeout=10)
    b = candidates("replica-b")
    a.stop(release=False)  # a crash: the lease still names a
    assert holder(api, namespace) == "replica-a"
    wait_for("b to lead", lambda: b.elector.is_leader, timeout=LEASE_DURATION + 3)
    lease = api.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/itest-leader")["spec"]
    assert lease["holderIdentity"] == "replica-b" and lease["leaseTransitions"] == 1


def test_timings_must_be_ordered(api):
    with pytest.raises(ValueError):
        LeaderElector(api, namespace="x", name="y", identity="z", metrics=Metrics(), lease_duration=2, renew_deadline=3)
