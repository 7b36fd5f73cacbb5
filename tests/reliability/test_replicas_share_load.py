"""Reliability, replicas share the load: two egress-placer replicas behind the webhook proxy (as behind a
Service, one replica per connection). A burst of matching TaskRuns is admitted while binding is held
back (kube-scheduler stopped with SIGSTOP), so neither replica can learn of the other's placements from
bound pods: each must count the other's decision records on the stored runs and pods (load.view).
Checks that the pool's nodes end up evenly loaded by the decisions (the most loaded node's load, runs
already there plus placed, over the mean <= 1.1), on an even pool and on one whose first node already
carries PRELOAD pods (bound straight to it by nodeName, in a namespace that may use the pool: they count
as its load); that every decision names a pool node; and that both replicas answered reviews."""

from __future__ import annotations

import os
import signal
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

from devcluster.cluster import Cluster
from tests.e2e.harness import ControllerSpec, Placer
from tests.e2e.tekton_runs import POOL_NODES, Runs, decision_of, node_of
from tests.kube import Api
from tests.reliability.burst import Burst
from tests.reliability.cluster_view import intruder_pod
from tests.reliability.suite import TEAM_CDN, Figures
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

CONTROLLER = ControllerSpec(replicas=2, proxy=True)
BURST = 60  # on the 3 pool nodes: 20 each when shared (uneven: 25 each, the preloaded node 10 more)
PRELOAD = 15  # uneven: pods already on the first pool node (replicas ignoring each other: 30, 30 and 15 at best)
TARGET = 1.1
REVIEWS = "egress_placer_admission_reviews_total"


@contextmanager
def binding_held(devcluster: Cluster) -> Iterator[None]:
    """kube-scheduler stopped (SIGSTOP): pods are created and admitted, none binds, until the block ends."""
    record = devcluster.process("kube-scheduler")
    assert record is not None and record.alive()
    os.kill(record.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(record.pid, signal.SIGCONT)


@pytest.mark.parametrize("pool", ["even", "uneven"])
def test_two_replicas_share_placements_before_any_pod_binds(
    devcluster: Cluster, api: Api, egress_placer: Placer, runs: Runs, figures: Figures, pool: str
) -> None:
    figures.fault(
        f"two replicas, binding held back (kube-scheduler stopped) during a burst, {pool} pool",
        f"{BURST} matching TaskRuns in {TEAM_CDN}, 8 at a time, through the proxy"
        + (f"; {PRELOAD} pods already on {min(POOL_NODES)}" if pool == "uneven" else ""),
        f"decisions spread: most loaded pool node / mean <= {TARGET}; both replicas answer",
    )
    preloaded = {n: 0 for n in POOL_NODES}
    if pool == "uneven":
        busy = min(POOL_NODES)
        for i in range(PRELOAD):  # bound at creation: no scheduler needed; its namespace may use the pool
            runs.create_pod(TEAM_CDN, intruder_pod(runs.name(f"there-{i}"), node=busy))
        preloaded[busy] = PRELOAD
    before = [egress_placer.metric(REVIEWS, replica=r) for r in egress_placer.replicas]
    with binding_held(devcluster):
        burst = Burst(runs, TEAM_CDN, BURST, prefix=f"share-{pool}", interval=0.0).start()
        burst.join()
        assert burst.errors == {}, burst.errors

        def admitted() -> dict[str, dict[str, Any]] | None:
            pods = runs.pods_by_taskrun(TEAM_CDN)
            return pods if len(pods) >= BURST and all(decision_of(p).get("node") for p in pods.values()) else None

        pods = wait_for(f"{BURST} pods admitted", admitted, timeout=180, interval=0.5)
        assert not [name for name, p in pods.items() if node_of(p)], "a pod bound while binding was held"
    chosen = Counter(decision_of(p)["node"] for p in pods.values())
    assert set(chosen) <= POOL_NODES, chosen
    loads = {n: preloaded[n] + chosen.get(n, 0) for n in sorted(POOL_NODES)}
    ratio = max(loads.values()) / (sum(loads.values()) / len(loads))
    answered = [egress_placer.metric(REVIEWS, replica=r) - b for r, b in zip(egress_placer.replicas, before)]
    figures.set("ratio", round(ratio, 3))
    figures.set("reviews_per_replica", answered)
    figures.measured(f"loads {list(loads.values())}, ratio {ratio:.3f}; reviews per replica {answered}", 0)
    assert ratio <= TARGET, loads
    assert all(a > 0 for a in answered), f"a replica answered nothing: {answered}"
