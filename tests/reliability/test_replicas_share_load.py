"""Reliability, replicas share the load: two egress-placer replicas behind the webhook proxy (as behind a
Service, one replica per connection). A burst of matching TaskRuns is admitted while binding is held
back (kube-scheduler stopped with SIGSTOP), so neither replica can learn of the other's placements from
bound pods: each must count the other's decision records on the stored runs and pods (load.view).
Checks that the pool's nodes end up evenly loaded by the decisions (the most loaded over the mean
<= 1.1), that every decision names a pool node, and that both replicas answered reviews."""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any, Iterator

import pytest

from devcluster.cluster import Cluster
from tests.e2e.harness import ControllerSpec, Placer
from tests.e2e.tekton_runs import POOL_NODES, Runs, decision_of, node_of
from tests.kube import Api
from tests.reliability.burst import Burst
from tests.reliability.suite import TEAM_CDN, Figures
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

CONTROLLER = ControllerSpec(replicas=2, proxy=True)
BURST = 60  # on the 3 pool nodes: 20 each when shared
TARGET = 1.1
REVIEWS = "egress_placer_admission_reviews_total"


@pytest.fixture
def binding_held(devcluster: Cluster) -> Iterator[None]:
    """kube-scheduler stopped (SIGSTOP) for the test: pods are created and admitted, none binds."""
    record = devcluster.process("kube-scheduler")
    assert record is not None and record.alive()
    os.kill(record.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(record.pid, signal.SIGCONT)


def test_two_replicas_share_placements_before_any_pod_binds(
    api: Api, egress_placer: Placer, runs: Runs, figures: Figures, binding_held: None
) -> None:
    figures.fault(
        "two replicas, binding held back (kube-scheduler stopped) during a burst",
        f"{BURST} matching TaskRuns in {TEAM_CDN}, 8 at a time, through the proxy",
        f"decisions spread: most loaded pool node / mean <= {TARGET}; both replicas answer",
    )
    before = [egress_placer.metric(REVIEWS, replica=r) for r in egress_placer.replicas]
    burst = Burst(runs, TEAM_CDN, BURST, prefix="share", interval=0.0).start()
    burst.join()
    assert burst.errors == {}, burst.errors

    def admitted() -> dict[str, dict[str, Any]] | None:
        pods = runs.pods_by_taskrun(TEAM_CDN)
        return pods if len(pods) >= BURST and all(decision_of(p).get("node") for p in pods.values()) else None

    pods = wait_for(f"{BURST} pods admitted", admitted, timeout=180, interval=0.5)
    assert not [name for name, p in pods.items() if node_of(p)], "a pod bound while binding was held"
    chosen = Counter(decision_of(p)["node"] for p in pods.values())
    assert set(chosen) <= POOL_NODES, chosen
    loads = {n: chosen.get(n, 0) for n in POOL_NODES}
    ratio = max(loads.values()) / (sum(loads.values()) / len(loads))
    answered = [egress_placer.metric(REVIEWS, replica=r) - b for r, b in zip(egress_placer.replicas, before)]
    figures.set("ratio", round(ratio, 3))
    figures.set("reviews_per_replica", answered)
    figures.measured(f"loads {sorted(loads.values())}, ratio {ratio:.3f}; reviews per replica {answered}", 0)
    assert ratio <= TARGET, loads
    assert all(a > 0 for a in answered), f"a replica answered nothing: {answered}"
