"""Reliability, control plane restarts: in the middle of a burst of 100 matching TaskRuns in rel-team-cdn,
the kube-apiserver (then etcd) is killed with SIGKILL and started again with the same argv. Runs the
client could not create while it was down are created when it is back (the client retries). Checks
that egress-placer reconnects by itself (its watch restarts counter goes up after the API server
kill), that a pool taint removed by hand right after the restart is back within RECOVERY_SECONDS, and
that every run of the burst went to the pool with its decision annotation: none lost, none misplaced.
Two outcomes of the outage that are not egress-placer's are counted apart: Tekton fails a run whose pod
creation the API server refused (its placement is checked in the podTemplate), and a fake (KWOK) node
can miss the status update that finishes a pod (where it was bound is what counts)."""

from __future__ import annotations

import time

import pytest

from devcluster.cluster import Cluster
from devplacer.faults import is_healthy, kill_component, snapshot, start_component, wait_healthy
from tests.e2e.harness import Placer, quietly, remove_pool_taint, taints_right
from tests.e2e.tekton_runs import Runs
from tests.kube import Api
from tests.reliability.burst import Burst, all_finished, all_settled, pool_outcome
from tests.reliability.suite import TEAM_CDN, Figures
from tests.waiting import WaitTimeout, holds_for, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

BURST = 100
KILL_AFTER = 30  # runs handed out before the kill
DOWN_SECONDS = 3.0  # how long the component stays dead
RECOVERY_SECONDS = 30.0  # stated bound: API server back -> taints right (one removed by hand) and controller ready
FINISH_SECONDS = 300.0
FINISH_GRACE_SECONDS = 30.0  # once every run is bound, how long the unfinished ones may take to finish
WATCH_RESTARTS = "egress_placer_watch_restarts_total"


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_a_control_plane_component_killed_mid_burst_loses_and_misplaces_nothing(
    component: str, devcluster: Cluster, api: Api, egress_placer: Placer, runs: Runs, figures: Figures
) -> None:
    figures.fault(
        f"{component} SIGKILLed mid-burst, restarted {DOWN_SECONDS:.0f} s later (same argv)",
        f"{BURST} matching TaskRuns in {TEAM_CDN}, one every 50 ms; the client retries creations",
        f"all {BURST} on the pool with a decision; a pool taint removed by hand after the restart back "
        f"within {RECOVERY_SECONDS:.0f} s; the controller reconnects by itself",
    )
    replica = egress_placer.replicas[0]
    restarts_before = egress_placer.metric(WATCH_RESTARTS, replica=replica)

    burst = Burst(runs, TEAM_CDN, BURST, prefix=f"{component[:4]}").start()
    burst.wait_started(KILL_AFTER)
    killed = kill_component(devcluster, component)
    killed_at, submitted_at_kill = time.monotonic(), burst.submitted
    # Part of the scenario: the component stays dead for DOWN_SECONDS while the burst goes on.
    holds_for(f"{component} to stay down", lambda: not is_healthy(devcluster, killed), seconds=DOWN_SECONDS, interval=0.1)
    start_component(devcluster, killed)
    wait_healthy(devcluster, snapshot(devcluster, "kube-apiserver"))
    back_at = time.monotonic()
    submitted_while_down = burst.submitted - submitted_at_kill
    figures.set("down_s", round(back_at - killed_at, 1))
    figures.set("submitted_while_down", submitted_while_down)

    remove_pool_taint(api, "egress-2")
    recovery_from = time.monotonic()
    wait_for(
        "the pool taints right and the controller ready",
        quietly(lambda: taints_right(api) and egress_placer.ready(replica)),
        timeout=RECOVERY_SECONDS,
        interval=0.1,
    )
    recovery = time.monotonic() - recovery_from
    figures.set("recovery_s", round(recovery, 1))

    burst.join()
    figures.set("creations_retried", burst.retried)
    assert burst.errors == {}, burst.errors
    wait_for(
        f"the {BURST} runs to be bound or finished",
        quietly(lambda: all_settled(runs, TEAM_CDN, burst.names)),
        timeout=FINISH_SECONDS,
        interval=1.0,
    )
    try:
        wait_for(f"the {BURST} runs to finish", lambda: all_finished(runs, TEAM_CDN, burst.names), timeout=FINISH_GRACE_SECONDS, interval=1.0)
    except WaitTimeout:
        pass  # a fake node can miss the update that finishes a pod: pool_outcome counts those apart
    outcome = pool_outcome(runs, TEAM_CDN, burst.names)
    restarts = egress_placer.metric(WATCH_RESTARTS, replica=replica) - restarts_before
    figures.set("watch_restarts", restarts)
    figures.measured(
        f"{outcome.summary()}; down {back_at - killed_at:.1f} s while {submitted_while_down} runs were being created "
        f"({burst.retried} creations retried); "
        f"taints right and controller ready {recovery:.1f} s after the API server was back; "
        f"{restarts:.0f} watch restarts",
        len(outcome.lost) + len(outcome.misplaced),
    )

    assert outcome.lost == () and outcome.misplaced == (), outcome
    assert outcome.without_run_decision == (), outcome
    assert submitted_while_down > 0, "the fault did not hit the burst"
    if component == "kube-apiserver":
        assert restarts > 0, "the controller's watches did not restart after the API server was killed"
