"""Reliability, API server pressure: the kube-apiserver is restarted with tiny in-flight limits
(--max-requests-inflight=1 --max-mutating-requests-inflight=1; priority-and-fairness stays off, as in
the devcluster, so the classic max-in-flight filter answers 429 with Retry-After: 1) and an audit log
of egress-placer's ServiceAccount. Then all pool taints are removed by hand, intruder pods are put on
pool nodes and a burst of matching TaskRuns is created. Checks that the controller really got 429s,
that its writes were retried no sooner than Retry-After, that nothing was dropped (taints back,
intruders evicted, runs placed), and that it does not hot-loop: once the work is done, still under
pressure, its request rate (read from the audit log) falls back to its idle rate (lease renewals).
The normal API server is restored afterwards."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from burst import Burst, RetryingRuns, all_finished, pool_outcome
from cluster_view import POOL_TAINT, Placer, apiserver_metrics, elapsed_until, intruder_pod, parse_samples, pod_gone, pool_taints, remove_pool_taint
from conftest import Figures
from kubernetes import client
from tekton_runs import POOL_NODES, TEAM_CDN, TEAM_OTHER

from devcluster.cluster import Cluster
from devcluster.controller import service_account_user
from devcluster.faults import Component, kill_component, start_component

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

LIMITS = ["--max-requests-inflight=1", "--max-mutating-requests-inflight=1", "--enable-priority-and-fairness=false"]
INTRUDERS = 6
BURST = 30
CONVERGE_SECONDS = 60.0  # stated bound: taints back and intruders evicted under pressure
IDLE_SECONDS = 8.0  # watched after the work is done, still under pressure
MAX_IDLE_RATE = 4.0  # requests/s then: a lease GET and PUT per retry period (1 s), and a little more
RETRY_AFTER = 1.0  # what the max-in-flight filter sends
CONTROLLER_USER = service_account_user()


def audit_policy() -> dict[str, Any]:
    """Metadata of every request egress-placer's ServiceAccount makes, nothing else."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": [CONTROLLER_USER]}, {"level": "None"}],
    }


@pytest.fixture
def throttled_apiserver(devcluster: Cluster, placer: Placer) -> Iterator[Path]:
    """The API server restarted with LIMITS and an audit log (its path is yielded); restored afterwards."""
    policy = devcluster.dir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(audit_policy()))
    log = devcluster.dir / "logs" / "audit-pressure.log"
    log.unlink(missing_ok=True)
    normal: Component = kill_component(devcluster, "kube-apiserver")
    try:
        start_component(devcluster, normal, [*LIMITS, f"--audit-policy-file={policy}", f"--audit-log-path={log}"])
        yield log
    finally:
        kill_component(devcluster, "kube-apiserver")
        start_component(devcluster, normal)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def read_audit(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def early_retries(entries: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """Writes to one object (a node's taints, a pod's eviction) sent again sooner than Retry-After after a 429."""
    by_target: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in entries:
        ref = e.get("objectRef") or {}
        if e["verb"] in ("patch", "create") and (ref.get("resource"), ref.get("subresource")) in (("nodes", None), ("pods", "eviction")):
            by_target[f'{e["verb"]} {e["requestURI"]}'].append((_ts(e["requestReceivedTimestamp"]), e["responseStatus"]["code"]))
    early = []
    for target, requests in by_target.items():
        requests.sort()
        for (at, code), (next_at, _) in zip(requests, requests[1:]):
            if code == 429 and next_at - at < RETRY_AFTER * 0.95:
                early.append((target, round(next_at - at, 3)))
    return early


def test_under_api_server_pressure_writes_back_off_and_nothing_is_dropped(
    devcluster: Cluster, kube: client.ApiClient, placer: Placer, runs: RetryingRuns, throttled_apiserver: Path, figures: Figures
) -> None:
    figures.fault(
        "API server restarted with --max-requests-inflight=1 --max-mutating-requests-inflight=1 (P&F off)",
        f"all {len(POOL_NODES)} pool taints removed by hand, {INTRUDERS} intruder pods on pool nodes, "
        f"{BURST} matching TaskRuns",
        f"429s seen; writes retried no sooner than Retry-After; taints back and intruders evicted within "
        f"{CONVERGE_SECONDS:.0f} s; runs placed; afterwards, still throttled, the controller's rate back to "
        f"<= {MAX_IDLE_RATE:.0f} req/s (no hot loop)",
    )
    core = client.CoreV1Api(kube)
    started = time.monotonic()
    for node in sorted(POOL_NODES):
        remove_pool_taint(kube, node)
    intruders = [runs.name(f"intruder-{i}") for i in range(INTRUDERS)]
    for i, name in enumerate(intruders):
        runs.create_pod(TEAM_OTHER, intruder_pod(name, node=sorted(POOL_NODES)[i % len(POOL_NODES)]))
    burst = Burst(runs, TEAM_CDN, BURST, prefix="pressure").start()

    elapsed_until(
        "the pool taints back and the intruders evicted",
        lambda: all(pool_taints(core, n) == [POOL_TAINT] for n in POOL_NODES)
        and all(pod_gone(core, TEAM_OTHER, name) for name in intruders),
        timeout=CONVERGE_SECONDS + 60,
        interval=0.5,
    )
    converged = time.monotonic() - started
    burst.join()
    elapsed_until(f"the {BURST} runs to finish", lambda: all_finished(runs, TEAM_CDN, burst.names), timeout=240, interval=1.0)
    outcome = pool_outcome(runs, TEAM_CDN, burst.names)
    work_window = time.monotonic() - started
    idle_from = time.time()
    time.sleep(IDLE_SECONDS)

    entries = [e for e in read_audit(throttled_apiserver) if e["user"]["username"] == CONTROLLER_USER]
    codes = Counter(e["responseStatus"]["code"] for e in entries)
    per_second = Counter(int(_ts(e["requestReceivedTimestamp"])) for e in entries)
    busiest = max(per_second.values(), default=0)
    idle_rate = sum(1 for e in entries if _ts(e["requestReceivedTimestamp"]) >= idle_from) / IDLE_SECONDS
    throttled_total = parse_samples(apiserver_metrics(devcluster), "apiserver_request_total", {"code": "429"})
    retries = placer.metric(placer.replicas[0], "egress_placer_api_write_retries_total", {"cause": "throttled"})
    early = early_retries(entries)
    figures.set("converged_s", round(converged, 1))
    figures.set("controller_429", codes[429])
    figures.set("apiserver_429_total", throttled_total)
    figures.set("throttled_write_retries", retries)
    figures.set("requests", len(entries))
    figures.set("busiest_second", busiest)
    figures.set("idle_rate", round(idle_rate, 1))
    figures.measured(
        f"{codes[429]} of the controller's {len(entries)} requests got 429 ({throttled_total:.0f} 429s in all); "
        f"{retries:.0f} throttled writes retried, {len(early)} sooner than Retry-After; taints back and "
        f"{INTRUDERS} intruders evicted in {converged:.1f} s; {outcome.summary()}; controller "
        f"{len(entries)} requests in {work_window:.0f} s of work (busiest second {busiest}), then {idle_rate:.1f} req/s idle",
        len(outcome.lost) + len(outcome.misplaced),
    )

    assert codes[429] > 0 and retries > 0, f"no pressure: {codes}"
    assert early == [], early
    assert converged <= CONVERGE_SECONDS
    assert outcome.lost == () and outcome.misplaced == (), outcome
    assert idle_rate <= MAX_IDLE_RATE, sorted(per_second.items())[-12:]
