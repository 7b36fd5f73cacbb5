"""Section 4, replicas: balance with 1, 2 and 3 controller replicas (real processes) behind one address.

The webhook URL is a proxy that splits per connection, as a Service does (`devplacer.webhook_proxy`,
`start_controller(proxy=True)`). For each replica count, on the largest pool (10 nodes in the quick
and full sizes), two pools:
  even    no run on any node before the burst;
  uneven  PRELOADED_NODES nodes already carry PRELOAD runs each (real runs, placed while the other
          nodes were cordoned, bound before the burst).
A burst is N TaskRuns created as fast as the API server takes them, with binding held back (the
scheduler stopped with SIGSTOP) until every run's pod is admitted, so that no replica learns of
another's placements from bound pods. Then the scheduler goes on and the pods bind.

ratio = the most loaded node's load (runs already there plus placed by the burst's decisions) over
the mean load of the pool's nodes; `bound_ratio` the same with the nodes the pods were bound to.
`pod_calls`: the Pod admission reviews each replica answered during the burst (its metrics).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from prometheus_client.parser import text_string_to_metric_families

from devplacer import local_placer as dc

from bench.balance import TEKTON_PODS, clean, prepare_namespace
from bench.cluster import BenchCluster, bench_taskrun, namespace_for
from bench.kube import Kube, bounded

REPLICAS = (1, 2, 3)
POOLS = ("even", "uneven")
PRELOADED_NODES = 3
PRELOAD = 4
RUN_SECONDS = 900
ADMIT_TIMEOUT = 300.0
BOUND_TIMEOUT = 300.0
CREATE_CONCURRENCY = 64
Log = Callable[[str], None]


def burst_namespace(replicas: int, pool: str, k: int) -> str:
    return namespace_for(f"rep{replicas}-{pool}", k)


def namespaces(bc: BenchCluster) -> list[str]:
    return [burst_namespace(r, p, bc.largest_pool) for r in REPLICAS for p in POOLS]


def ratio(loads: dict[str, int]) -> float:
    mean = sum(loads.values()) / len(loads)
    return round(max(loads.values()) / mean, 3) if mean else 1.0


def pod_calls(replica: dc.ControllerReplica) -> float:
    """The Pod admission reviews a replica answered so far (every outcome)."""
    with urllib.request.urlopen(replica.health_url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "egress_placer_admission_reviews"
               for sample in family.samples if sample.name.endswith("_total") and sample.labels.get("kind") == "Pod")


@contextmanager
def binding_held(bc: BenchCluster) -> Iterator[None]:
    """The scheduler stopped (SIGSTOP): pods are created and admitted, none binds, until the block ends."""
    record = bc.cluster.process("kube-scheduler")
    assert record is not None, "no kube-scheduler process"
    os.kill(record.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(record.pid, signal.SIGCONT)


async def _node_unschedulable(kube: Kube, nodes: list[str], value: bool) -> None:
    await asyncio.gather(*(kube.patch(f"/api/v1/nodes/{n}", {"spec": {"unschedulable": value}}) for n in nodes))


async def _pods(kube: Kube, namespace: str, prefix: str) -> list[dict[str, Any]]:
    items, _ = await kube.list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=TEKTON_PODS)
    return [p for p in items if (p["metadata"].get("labels") or {}).get("tekton.dev/taskRun", "").startswith(prefix)]


async def _until(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s")
        await asyncio.sleep(0.5)


async def preload(kube: Kube, namespace: str, nodes: list[str]) -> Counter[str]:
    """PRELOAD runs on each of the first PRELOADED_NODES nodes (the others cordoned meanwhile), bound."""
    busy, others = nodes[:PRELOADED_NODES], nodes[PRELOADED_NODES:]
    await _node_unschedulable(kube, others, True)
    try:
        await asyncio.sleep(1.0)  # the replicas' node informers see the cordon
        path = f"/apis/tekton.dev/v1/namespaces/{namespace}/taskruns"
        bodies = [bench_taskrun(namespace, f"pre-{i:03d}", run_seconds=RUN_SECONDS) for i in range(PRELOAD * len(busy))]
        await bounded([lambda b=b: kube.create(path, b) for b in bodies], 16)

        async def bound() -> list[dict[str, Any]] | None:
            pods = [p for p in await _pods(kube, namespace, "pre-") if p["spec"].get("nodeName")]
            return pods if len(pods) >= len(bodies) else None

        pods = await _until(f"{len(bodies)} preloaded runs bound", bound, BOUND_TIMEOUT)
    finally:
        await _node_unschedulable(kube, others, False)
    await asyncio.sleep(1.0)  # the replicas see the nodes back
    return Counter(p["spec"]["nodeName"] for p in pods)


async def burst(bc: BenchCluster, kube: Kube, replicas: list[dc.ControllerReplica], pool: str, runs: int, log: Log) -> dict[str, Any]:
    k = bc.largest_pool
    nodes = bc.pools[k]
    namespace = burst_namespace(len(replicas), pool, k)
    preload_counts: Counter[str] = Counter()
    if pool == "uneven":
        preload_counts = await preload(kube, namespace, nodes)
    before = [pod_calls(r) for r in replicas]
    path = f"/apis/tekton.dev/v1/namespaces/{namespace}/taskruns"
    bodies = [bench_taskrun(namespace, f"burst-{i:03d}", run_seconds=RUN_SECONDS) for i in range(runs)]
    started = time.monotonic()
    with binding_held(bc):
        await bounded([lambda b=b: kube.create(path, b) for b in bodies], CREATE_CONCURRENCY)
        created_s = time.monotonic() - started

        async def admitted() -> list[dict[str, Any]] | None:
            pods = await _pods(kube, namespace, "burst-")
            return pods if len(pods) >= runs else None

        pods = await _until(f"{runs} pods admitted", admitted, ADMIT_TIMEOUT)
        admitted_s = time.monotonic() - started
        assert not any(p["spec"].get("nodeName") for p in pods), "a pod bound while binding was held"
    after = [pod_calls(r) for r in replicas]
    chosen = Counter(json.loads((p["metadata"].get("annotations") or {}).get("egress-placer.io/decision") or "{}").get("node")
                     for p in pods)
    placed = {n: preload_counts.get(n, 0) + chosen.get(n, 0) for n in nodes}

    async def all_bound() -> list[dict[str, Any]] | None:
        pods = [p for p in await _pods(kube, namespace, "burst-") if p["spec"].get("nodeName")]
        return pods if len(pods) >= runs else None

    bound_pods = await _until(f"{runs} pods bound", all_bound, BOUND_TIMEOUT)
    bound_counts = Counter(p["spec"]["nodeName"] for p in bound_pods)
    bound = {n: preload_counts.get(n, 0) + bound_counts.get(n, 0) for n in nodes}
    calls = [round(a - b) for a, b in zip(after, before)]
    row = {
        "replicas": len(replicas),
        "pool": pool,
        "worst_ratio": ratio(placed),
        "bound_ratio": ratio(bound),
        "runs": runs,
        "pool_nodes": k,
        "preloaded": {n: c for n, c in sorted(preload_counts.items())},
        "load_per_node": placed,
        "outside_pool": sum(c for n, c in chosen.items() if n not in placed),
        "pod_calls": calls,
        "min_pod_call_share": round(min(calls) / sum(calls), 3) if sum(calls) else None,
        "created_s": round(created_s, 2),
        "admitted_s": round(admitted_s, 2),
    }
    log(f"balance replicas: {len(replicas)} replica(s), {pool:>6} pool, {runs} runs on {k} nodes: ratio {row['worst_ratio']} "
        f"(bound {row['bound_ratio']}), loads {sorted(placed.values())}, Pod calls per replica {calls}, "
        f"admitted in {row['admitted_s']} s")
    await clean(kube, namespace)
    return row


async def prepare(bc: BenchCluster) -> None:
    async with Kube(bc.cluster) as kube:
        await asyncio.gather(*(prepare_namespace(kube, ns) for ns in [bc.probe_namespace, *namespaces(bc)]))


async def run_replicas(bc: BenchCluster, replicas: list[dc.ControllerReplica], runs: int, log: Log) -> list[dict[str, Any]]:
    async with Kube(bc.cluster, connections=CREATE_CONCURRENCY) as kube:
        await bc.wait_webhook(kube, active=True)
        return [await burst(bc, kube, replicas, pool, runs, log) for pool in POOLS]


def run(bc: BenchCluster, runs: int, log: Log) -> list[dict[str, Any]]:
    """Every replica count; the controller is left stopped (the caller starts what it needs next)."""
    asyncio.run(prepare(bc))
    rows: list[dict[str, Any]] = []
    for count in REPLICAS:
        bc.stop_controller()
        replicas = dc.start_controller(bc.cluster, bc.policy_file, replicas=count, proxy=True)
        try:
            rows += asyncio.run(run_replicas(bc, replicas, runs, log))
        finally:
            bc.stop_controller()
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    worst = {str(r): max((row["worst_ratio"] for row in rows if row["replicas"] == r), default=None) for r in REPLICAS}
    return {"replicas": rows, "replicas_worst_ratio": worst}


def main(argv: list[str] | None = None) -> int:
    """For development: `python -m bench.balance_replicas [--cluster-dir DIR] [--runs 60] [--replicas 2]`, on a
    running devcluster with at least 13 egress nodes (or one brought up and down for it); prints the rows."""
    import argparse
    import tempfile
    from pathlib import Path

    from bench import cluster as bench_cluster
    from bench.sizes import SIZES

    global REPLICAS
    parser = argparse.ArgumentParser(prog="python -m bench.balance_replicas")
    parser.add_argument("--cluster-dir", type=Path)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--replicas", type=int, action="append", help="replica counts (default 1, 2, 3)")
    args = parser.parse_args(argv)
    REPLICAS = tuple(args.replicas or REPLICAS)
    log = lambda message: print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory() as workdir:
        bc = bench_cluster.up(SIZES["quick"], Path(workdir), log, args.cluster_dir)
        try:
            rows = run(bc, args.runs, log)
        finally:
            bc.down()
    print(json.dumps(summarize(rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
