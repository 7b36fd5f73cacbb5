"""Reliability, leader failover: two egress-placer replicas behind the webhook proxy (as behind a
Service). In the middle of a burst of matching TaskRuns the leader is killed with SIGKILL; right after,
a pool taint is removed by hand and an intruder pod is put on a pool node. Checks that the other
replica takes over within the lease duration plus one retry period and a reconcile (taint back,
intruder evicted), that admission never stopped (every run on the pool, every TaskRun decided, except
a review the API server logged as failed at the kill instant: it fails open, and as a pod counts as a
run's only when its TaskRun carries our decision (#23), that run runs off the pool and the leader
reports it with a NotAdmitted Event), that
nothing is done twice (one IntruderEvicted Event, one taint added), and that the killed replica,
started again, comes back as a follower."""

from __future__ import annotations

import re
import time

import pytest

from devcluster.cluster import Cluster
from devplacer.local_placer import LEADER_TIMINGS, PROXY_NAME
from devplacer.faults import kill_component, start_component
from tests.e2e.harness import ControllerSpec, Placer, lease_holder, pool_taints, quietly, remove_pool_taint
from tests.e2e.tekton_runs import POOL_TAINT, Runs, events
from tests.kube import Api
from tests.reliability.burst import Burst, all_finished, pool_outcome
from tests.reliability.cluster_view import pod_gone, sneak_onto
from tests.reliability.suite import TEAM_CDN, TEAM_OTHER, Figures
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

CONTROLLER = ControllerSpec(replicas=2, proxy=True)
BURST = 60
KILL_AFTER = 20
LEASE_SECONDS = float(LEADER_TIMINGS["EGRESS_PLACER_LEASE_DURATION_SECONDS"])
RETRY_SECONDS = float(LEADER_TIMINGS["EGRESS_PLACER_RETRY_PERIOD_SECONDS"])
# The follower sees the last renewal up to one (jittered) retry period late, takes the lease at its first try
# after the lease expired (up to one more period), then runs a reconcile pass (about a second).
TAKEOVER_SECONDS = LEASE_SECONDS + 2 * 1.2 * RETRY_SECONDS + 2.0
FINISH_SECONDS = 240.0
WEBHOOK_FAILURE = re.compile(r"[Ff]ailed calling webhook")


def apiserver_log_size(cluster: Cluster) -> int:
    return (cluster.dir / "logs" / "kube-apiserver.log").stat().st_size


def webhook_failures_since(cluster: Cluster, offset: int) -> int:
    """Admission reviews the API server logged as failed (and admitted unchanged: fail-open) since `offset`."""
    with open(cluster.dir / "logs" / "kube-apiserver.log", "rb") as log:
        log.seek(offset)
        return sum(1 for line in log.read().decode(errors="replace").splitlines() if WEBHOOK_FAILURE.search(line))


def test_the_follower_takes_over_taints_and_evictions_and_admission_never_stops(
    devcluster: Cluster, api: Api, egress_placer: Placer, runs: Runs, figures: Figures
) -> None:
    figures.fault(
        "the leader replica SIGKILLed mid-burst (2 replicas behind the webhook proxy)",
        f"{BURST} matching TaskRuns in {TEAM_CDN}; a pool taint removed by hand and an intruder pod "
        "created right after the kill",
        f"the follower takes over within {TAKEOVER_SECONDS:.1f} s (lease {LEASE_SECONDS:.0f} s + 2 retries + reconcile): "
        "taint back, intruder evicted once; every run placed and decided",
    )
    wait_for("a leader", quietly(lambda: lease_holder(api)), timeout=30, interval=0.1)
    leader = egress_placer.named(lease_holder(api) or "")
    follower = next(r for r in egress_placer.replicas if r != leader)
    taints_added_before = egress_placer.metric("egress_placer_taint_changes_total", {"action": "add"}, replica=follower)
    log_offset = apiserver_log_size(devcluster)
    proxy_log = devcluster.dir / "logs" / f"{PROXY_NAME}.log"
    proxy_offset = proxy_log.stat().st_size

    burst = Burst(runs, TEAM_CDN, BURST, prefix="failover").start()
    burst.wait_started(KILL_AFTER)
    killed = kill_component(devcluster, leader.name)
    killed_at, created_before_kill = time.monotonic(), burst.submitted
    remove_pool_taint(api, "egress-1")
    intruder = runs.name("intruder")
    sneak_onto(api, runs, TEAM_OTHER, intruder, "egress-2")

    wait_for(
        "the removed pool taint back",
        quietly(lambda: pool_taints(api, "egress-1") == [POOL_TAINT]),
        timeout=TAKEOVER_SECONDS + 10,
        interval=0.1,
    )
    taint_back = time.monotonic() - killed_at
    wait_for(
        "the intruder evicted",
        quietly(lambda: pod_gone(api, TEAM_OTHER, intruder)),
        timeout=TAKEOVER_SECONDS + 10,
        interval=0.1,
    )
    evicted = time.monotonic() - killed_at
    new_leader = lease_holder(api)
    figures.set("taint_back_s", round(taint_back, 1))
    figures.set("intruder_evicted_s", round(evicted, 1))

    burst.join()
    assert burst.errors == {}, burst.errors
    wait_for(
        f"the {BURST} runs to finish",
        quietly(lambda: all_finished(runs, TEAM_CDN, burst.names)),
        timeout=FINISH_SECONDS,
        interval=1.0,
    )
    outcome = pool_outcome(runs, TEAM_CDN, burst.names)
    failed_reviews = webhook_failures_since(devcluster, log_offset)
    eviction_events = [e for e in events(api, TEAM_OTHER, "IntruderEvicted") if e["regarding"]["name"] == intruder]
    taints_added = egress_placer.metric("egress_placer_taint_changes_total", {"action": "add"}, replica=follower) - taints_added_before
    figures.set("failed_reviews_at_kill", failed_reviews)
    with open(proxy_log, "rb") as f:
        f.seek(proxy_offset)
        rerouted = sum(1 for line in f.read().decode(errors="replace").splitlines() if "skipped" in line)

    restarted_at = time.monotonic()
    start_component(devcluster, killed)
    wait_for(f"{leader.name} ready again", quietly(lambda: egress_placer.ready(leader)), timeout=60, interval=0.1)
    rejoined = time.monotonic() - restarted_at
    figures.set("rejoined_s", round(rejoined, 1))
    figures.measured(
        f"taint back {taint_back:.1f} s and intruder evicted {evicted:.1f} s after the kill; {outcome.summary()} "
        f"({BURST - created_before_kill} created after the kill; {failed_reviews} review(s) failed at the kill instant; "
        f"the proxy skipped the dead replica on {rerouted} connection(s)); {len(eviction_events)} IntruderEvicted Event, "
        f"{taints_added:.0f} taint added; killed replica ready again as follower in {rejoined:.1f} s",
        len(outcome.lost) + len(outcome.misplaced),
    )

    assert new_leader == follower.identity
    assert taint_back <= TAKEOVER_SECONDS and evicted <= TAKEOVER_SECONDS
    missed = set(outcome.without_run_decision)  # its review was cut at the kill instant: admitted unchanged
    assert outcome.lost == () and outcome.no_pod == () and outcome.failed == (), outcome
    assert len(missed) <= failed_reviews, outcome
    assert set(outcome.misplaced) <= missed, outcome  # only a missed run is off the pool
    if missed:
        wait_for(
            f"a NotAdmitted Event for each of {sorted(missed)}",
            quietly(lambda: missed <= {e["regarding"]["name"] for e in events(api, TEAM_CDN, "NotAdmitted")}),
            timeout=30,
            interval=0.5,
        )
    assert len(eviction_events) == 1 and (eviction_events[0].get("series") or {}).get("count", 1) == 1, eviction_events
    assert taints_added == 1
    assert lease_holder(api) == follower.identity  # the old leader came back as a follower
