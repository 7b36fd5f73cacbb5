"""Section 4: balance under bursts, with the real scheduler on KWOK nodes.

A burst is N matching TaskRuns (catalog git-clone, pods kept Running for 15 minutes) created at
once in a namespace pool-K allows; when every pod is bound, the pods per pool node are counted
and the burst is deleted. Cases, each on the same bursts:
  a  egress-placer: webhook registered, the controller's load-based node choice (balance=load);
  b  scheduler only: webhook NOT registered; the TaskRuns carry the pool's toleration and required
     node affinity (the very terms egress-placer writes, without a preferred node) themselves;
  c  load without assumptions: webhook registered, controller with
     EGRESS_PLACER_BALANCE=load-without-assumptions (placements not yet seen as pods do not count).
Imbalance = the most pods on one node / the even share ceil(N/K).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from typing import Any, Callable

from controller.core.patches import place
from controller.core.policy import load_policy

from bench.cluster import BenchCluster, bench_taskrun, namespace_for, pool_name
from bench.kube import Kube, bounded, ensure_namespace
from bench.workload import catalog_task, in_namespace

CASES = {
    "a": "egress-placer (load)",
    "b": "scheduler only (pool constraint)",
    "c": "load without assumptions",
}
RUN_SECONDS = 900
BOUND_TIMEOUT = 300.0
TEKTON_PODS = "app.kubernetes.io/managed-by=tekton-pipelines"
Log = Callable[[str], None]


def burst_namespace(case: str, runs: int, k: int) -> str:
    return namespace_for(f"{case}-n{runs}", k)


async def prepare_namespace(kube: Kube, namespace: str) -> None:
    """The namespace, its default ServiceAccount, and the catalog Task the runs use."""
    await ensure_namespace(kube, namespace)
    task = in_namespace(catalog_task("git-clone"), namespace)
    await kube.create(f"/apis/tekton.dev/v1/namespaces/{namespace}/tasks", task, exist_ok=True)


async def tekton_pods(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    items, _ = await kube.list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=TEKTON_PODS)
    return items


async def clean(kube: Kube, namespace: str, timeout: float = 180.0) -> None:
    """Delete the namespace's TaskRuns and pods; wait until no pod is left."""
    await kube.delete(f"/apis/tekton.dev/v1/namespaces/{namespace}/taskruns", propagationPolicy="Background")
    deadline = time.monotonic() + timeout
    while True:
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)
        items, _ = await kube.list(f"/api/v1/namespaces/{namespace}/pods")
        if not items:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(items)} pods left in {namespace} after {timeout:.0f} s")
        await asyncio.sleep(0.5)


async def burst(bc: BenchCluster, kube: Kube, case: str, runs: int, k: int, log: Log) -> dict[str, Any]:
    namespace = burst_namespace(case, runs, k)
    nodes = bc.pools[k]
    template = None
    if case == "b":
        pool = load_policy(bc.policy_file.read_text()).pool(pool_name(k))
        assert pool is not None
        template = place(None, pool, None)
    bodies = [bench_taskrun(namespace, f"burst-{i:03d}", run_seconds=RUN_SECONDS, pod_template=template) for i in range(runs)]
    path = f"/apis/tekton.dev/v1/namespaces/{namespace}/taskruns"
    started = time.monotonic()
    await bounded([lambda b=b: kube.create(path, b) for b in bodies], 32)
    created_s = time.monotonic() - started
    deadline = started + BOUND_TIMEOUT
    while True:
        pods = await tekton_pods(kube, namespace)
        bound = [p for p in pods if p["spec"].get("nodeName")]
        if len(bound) >= runs:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{case} {runs} runs on {k} nodes: only {len(bound)} pods bound after {BOUND_TIMEOUT:.0f} s")
        await asyncio.sleep(0.5)
    scheduled_s = time.monotonic() - started
    counts = Counter(p["spec"]["nodeName"] for p in bound)
    per_node = {n: counts.get(n, 0) for n in nodes}
    outside = sum(c for n, c in counts.items() if n not in per_node)
    even = math.ceil(runs / k)
    honored = None
    if case != "b":
        chosen = [json.loads(p["metadata"].get("annotations", {}).get("egress-placer.io/decision", "{}")).get("node")
                  for p in bound]
        honored = round(sum(c == p["spec"]["nodeName"] for c, p in zip(chosen, bound)) / len(bound), 3)
    row = {
        "case": case,
        "runs": runs,
        "pool_nodes": k,
        "pods_per_node": per_node,
        "pods_outside_pool": outside,
        "max_pods_on_a_node": max(per_node.values()),
        "even_share": even,
        "imbalance": round(max(per_node.values()) / even, 3),
        "created_s": round(created_s, 2),
        "scheduled_s": round(scheduled_s, 2),
        "preferred_node_honored": honored,
    }
    log(f"balance: ({case}) {runs:>3} runs on {k:>2} nodes: max {row['max_pods_on_a_node']} / even {even} = "
        f"{row['imbalance']}  (all bound in {row['scheduled_s']} s) {sorted(per_node.values())}")
    await clean(kube, namespace)
    await asyncio.sleep(2.0)  # the controller's pod informer sees the deletions
    return row


async def run_case(bc: BenchCluster, case: str, log: Log) -> list[dict[str, Any]]:
    async with Kube(bc.cluster, connections=32) as kube:
        if case == "b":
            await bc.unregister(kube)
        else:
            await bc.register(kube)
        return [await burst(bc, kube, case, runs, k, log) for runs, k in bc.sizes.bursts]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def worst(case: str) -> float | None:
        values = [r["imbalance"] for r in rows if r["case"] == case]
        return max(values) if values else None

    return {"cases": rows, "worst_imbalance": {case: worst(case) for case in CASES}}
