"""The queue section (docs/queue.md): what queueing costs at admission, and what it does to a burst.

- Admission cost (in-process, no cluster; the best of 3 passes, process CPU time): microseconds per
  TaskRun review on a pool without a queue,
  and on the same pool with a queue holding 0, 100 and 1,000 waiting runs (admission computes the new
  run's position in the line for its Event: O(waiting runs)).
- On the local cluster (pool of 3 egress nodes, capacity 2, `queue: {runsPerNode: 2}`): a burst of
  upload TaskRuns (6 tiny, 30 quick, 60 full: the issue's) whose KWOK pods run a few seconds. A watch on
  the pods records, per node, how many pods Run at each moment (the plot: against the capacity), the
  most at once, and the release latency: from a pool pod finishing (a slot frees) to the next pod
  being created, paired in order once the pool is full (p50, p99).
- Runs that touch no destination are not slowed (docs/budgets.md, issue #26): the same burst, rounds
  alternating between the queue policy and the same policy with egress budgets whose destinations none
  of the uploads touches; the release latencies of each side pooled over its rounds, the no-budget
  side's median with its 95% bootstrap interval, and whether the budgeted side's median lies within it.

`run(sizes, log, cluster_dir)` returns the `queue` part of latest.json; `chart(results, out)` draws
queue_concurrency.png.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from bench.kube import Kube, ensure_namespace
from bench.sizes import Sizes
from bench.workload import RUN_DURATION_ANNOTATION, NoEvents, review
from controller.admission.handlers import Admission
from controller.core.policy import load_policy
from controller.queue.core import QUEUE_ANNOTATION, entry_annotation
from controller.metrics import Metrics
from controller.settings import Settings
from controller.state import ClusterState
from devcluster.cluster import Cluster
from devplacer.local_placer import start_controller, stop_controller

Log = Callable[[str], None]
POOL = "queued"
NODES = ("egress-1", "egress-2", "egress-3")
RUNS_PER_NODE = 2
NAMESPACE = "bench-queue"
IMAGE = "registry.example.com/cdn-uploader:1.4"
RUN_SECONDS = 3
BURSTS = {"tiny": 6, "quick": 30, "full": 60}
WAITING = (0, 100, 1000)
REPEATS = 3
UNTOUCHED_ROUNDS = {"tiny": 1, "quick": 2, "full": 4}  # rounds of each side (bench `budgets_untouched`)


# Budgets on the pool that the uploads never touch (bench `budgets_untouched`): a registry by image, a
# Task by name, a URL param by host; one of each budget.
UNTOUCHED = [
    {"name": "registry-pulls", "match": {"images": ["docker.io/*"], "urlParams": [{"param": "registry", "hosts": ["*.docker.io"]}]},
     "maxStartsPerWindowPerAddress": 100, "windowSeconds": 3600},
    {"name": "cdn-publish", "match": {"tasks": ["publish-*"]}, "maxConcurrentPerAddress": 1, "maxConcurrentPerPool": 2},
]


def policy(queue: bool = True, nodes: tuple[str, ...] = NODES, budgets: bool = False) -> str:
    pool: dict[str, Any] = {"name": POOL, "nodes": list(nodes), "images": ["*uploader*"], "namespaces": ["bench-*", "team-*"],
                            "capacity": RUNS_PER_NODE}
    if queue:
        pool["queue"] = {"runsPerNode": RUNS_PER_NODE}
    if budgets:
        pool["destinations"] = UNTOUCHED
    return yaml.safe_dump({"apiVersion": "egress-placer.io/v1alpha1", "kind": "PlacementPolicy", "pools": [pool]}, sort_keys=False)


def upload_run(name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "TaskRun",
        "metadata": {"name": name, "namespace": namespace, "annotations": {RUN_DURATION_ANNOTATION: f"{RUN_SECONDS}s"}},
        "spec": {"taskSpec": {"steps": [{"name": "upload", "image": IMAGE, "script": "echo up"}]}},
    }


# -- admission cost -----------------------------------------------------------------------------------


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"taints": [{"key": "egress-placer.io/pool", "value": POOL, "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"pods": "110"}}}


def admission_cost(reviews: int, log: Log) -> dict[str, Any]:
    """Microseconds per TaskRun review: no queue, then queued with WAITING runs already waiting."""

    def measure(queued: bool, waiting: int) -> float:
        state = ClusterState(load_policy(policy(queued)), clock=time.time)
        for name in NODES:
            state.apply("Node", "ADDED", _node(name))
        for i in range(waiting):
            state.apply("TaskRun", "ADDED", {
                "metadata": {"namespace": f"team-{i % 7}", "name": f"w{i}", "uid": f"u{i}",
                             "annotations": {QUEUE_ANNOTATION: entry_annotation(POOL, "TaskRun", 1e9 + i)}},
                "spec": {"status": "TaskRunPending"},
            })
        admission = Admission(state, Metrics(), NoEvents(), Settings())
        bodies = [review(upload_run(f"r{i}", "team-a"), f"uid-{i}") for i in range(reviews)]
        best = float("inf")
        for _ in range(REPEATS):  # the best of a few passes, by process CPU time: the machine is shared
            started = time.process_time()
            for body in bodies:
                admission.review(body)
            best = min(best, time.process_time() - started)
        return round(1e6 * best / reviews, 1)

    out = {"no_queue": measure(False, 0), "queued": {str(n): measure(True, n) for n in WAITING}}
    log(f"queue: admission us per TaskRun review {out}")
    return out


# -- the burst on the cluster ------------------------------------------------------------------------------


async def _burst(cluster: Cluster, burst: int, log: Log) -> dict[str, Any]:
    async with Kube(cluster) as kube:
        await ensure_namespace(kube, NAMESPACE)
        pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        _, version = await kube.list(pods_path)
        running: dict[str, str] = {}  # pod -> node, while Running
        created: list[float] = []
        freed: list[float] = []
        timeline: list[tuple[float, dict[str, int]]] = []
        seen: set[str] = set()
        finished: set[str] = set()
        started = time.monotonic()

        async def watch() -> None:
            async for at, kind, pod in kube.watch(pods_path, version):
                name = pod["metadata"]["name"]
                if kind == "ADDED" and name not in seen:
                    seen.add(name)
                    created.append(at)
                phase = (pod.get("status") or {}).get("phase")
                node = (pod.get("spec") or {}).get("nodeName")
                if phase == "Running" and node:
                    running[name] = node
                elif name in running:
                    del running[name]
                if phase in ("Succeeded", "Failed") and name not in finished:
                    finished.add(name)
                    freed.append(at)
                per_node = {n: 0 for n in NODES}
                for n in running.values():
                    per_node[n] = per_node.get(n, 0) + 1
                timeline.append((at - started, per_node))
                if len(finished) >= burst:
                    return

        watcher = asyncio.create_task(watch())
        for i in range(burst):
            await kube.create(f"/apis/tekton.dev/v1/namespaces/{NAMESPACE}/taskruns", upload_run(f"up-{i:03d}"))
        try:
            await asyncio.wait_for(watcher, timeout=120 + burst * RUN_SECONDS * 2)
        except asyncio.TimeoutError:
            log(f"queue: the burst did not finish: {len(finished)} of {burst} pods done")
        seconds = time.monotonic() - started
        # The last pods finished: their TaskRuns are marked done by Tekton a moment later.
        deadline = time.monotonic() + 60
        while True:
            runs, _ = await kube.list(f"/apis/tekton.dev/v1/namespaces/{NAMESPACE}/taskruns")
            states = [_succeeded(r) for r in runs]
            if all(s is not None for s in states) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        succeeded = states.count("True")
        await kube.delete(f"/apis/tekton.dev/v1/namespaces/{NAMESPACE}/taskruns")
    slots = RUNS_PER_NODE * len(NODES)
    # Once the pool is full, the k-th slot freed is taken by the (slots + k)-th pod created.
    latencies = sorted(1000 * (c - f) for f, c in zip(sorted(freed), sorted(created)[slots:]) if c >= f)
    most = max((sum(p.values()) for _, p in timeline), default=0)
    per_node = {n: max((p.get(n, 0) for _, p in timeline), default=0) for n in NODES}
    return {
        "burst": burst, "slots": slots, "run_seconds": RUN_SECONDS, "seconds": round(seconds, 1), "succeeded": succeeded,
        "max_running": most, "max_running_per_node": per_node, "capacity_per_node": RUNS_PER_NODE,
        "release_latency_ms": {
            "p50": round(statistics.median(latencies), 1) if latencies else None,
            "p99": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1) if latencies else None,
            "samples": len(latencies),
        },
        "timeline": [(round(t, 3), p) for t, p in timeline],
        "latencies_ms": latencies,
    }


def _succeeded(run: dict[str, Any]) -> str | None:
    """'True' or 'False' once the run is done, else None."""
    for condition in (run.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Succeeded" and condition.get("status") in ("True", "False"):
            return str(condition["status"])
    return None


def _latencies(burst: dict[str, Any]) -> list[float]:
    return list(burst.get("latencies_ms") or [])


def median_interval(values: list[float], resamples: int = 4000, level: float = 0.95, seed: int = 26) -> tuple[float, float, float] | None:
    """The median of `values` and its percentile bootstrap interval at `level` (seeded: the same values give
    the same interval); None when empty."""
    import random

    if not values:
        return None
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    return statistics.median(values), medians[int(tail * resamples)], medians[min(resamples - 1, int((1.0 - tail) * resamples))]


def _side(values: list[float]) -> dict[str, Any]:
    interval = median_interval(values)
    p99 = sorted(values)[min(len(values) - 1, int(0.99 * len(values)))] if values else None
    return {"p50": round(interval[0], 1) if interval else None, "p99": round(p99, 1) if p99 is not None else None,
            "samples": len(values), "ci_low": round(interval[1], 1) if interval else None,
            "ci_high": round(interval[2], 1) if interval else None}


def untouched(cluster: Cluster, burst: int, rounds: int, log: Log) -> dict[str, Any]:
    """Rounds alternating without and with budgets the uploads do not touch (UNTOUCHED): the release
    latencies of each side pooled, the no-budget median's 95% interval, and the budgeted median within it."""
    sides: dict[str, list[float]] = {"without": [], "with": []}
    for r in range(rounds):
        for side in ("without", "with") if r % 2 == 0 else ("with", "without"):  # ABBA: drift hits both sides
            policy_file = cluster.dir / f"bench-queue-{side}-budgets.yaml"
            policy_file.write_text(policy(budgets=side == "with"))
            start_controller(cluster, policy_file)
            try:
                sides[side] += _latencies(asyncio.run(_burst(cluster, burst, log)))
            finally:
                stop_controller(cluster)
    out = {"burst": burst, "rounds": rounds, "without": _side(sides["without"]), "with": _side(sides["with"])}
    out.update(slowed_or_not(out["without"], out["with"]))
    log(f"queue: runs touching no destination, release latency without budgets {out['without']}, with {out['with']}: "
        f"within the interval {out['within_interval']}, not slowed {out['not_slowed']}")
    return out


def slowed_or_not(without: dict[str, Any], budgeted: dict[str, Any]) -> dict[str, bool | None]:
    """`within_interval`: the budgeted side's median lies within the no-budget median's 95% interval;
    `not_slowed`: it lies within it or below it (faster is not slowed: issue #26 asks that those runs are not
    slowed). None when a side has no samples."""
    low, high, median = without.get("ci_low"), without.get("ci_high"), budgeted.get("p50")
    if low is None or high is None or median is None:
        return {"within_interval": None, "not_slowed": None}
    return {"within_interval": bool(low <= median <= high), "not_slowed": bool(median <= high)}


def run(sizes: Sizes, log: Log, cluster_dir: Path | None) -> dict[str, Any]:
    """The admission cost, then (with a cluster) the burst with the controller started on the queue policy,
    then the rounds with and without budgets the uploads do not touch."""
    out: dict[str, Any] = {"admission_us": admission_cost(200 if sizes.name == "tiny" else 2000, log)}
    if cluster_dir is None:
        return out
    cluster = Cluster(cluster_dir, log=log)
    policy_file = cluster.dir / "bench-queue-policy.yaml"
    policy_file.write_text(policy())
    start_controller(cluster, policy_file)
    try:
        out.update(asyncio.run(_burst(cluster, BURSTS.get(sizes.name, 30), log)))
    finally:
        stop_controller(cluster)
    out.pop("latencies_ms", None)
    out["budgets_untouched"] = untouched(cluster, BURSTS.get(sizes.name, 30), UNTOUCHED_ROUNDS.get(sizes.name, 2), log)
    log(f"queue: burst {out.get('burst')}: max running {out.get('max_running')} of {out.get('slots')} slots, "
        f"release latency {out.get('release_latency_ms')}")
    return out


def chart(queue: dict[str, Any], out: Path) -> list[str]:
    """queue_concurrency.png: Running pool pods per node over the burst, against runsPerNode."""
    timeline = queue.get("timeline") or []
    if not timeline:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for node in NODES:
        ax.step([t for t, _ in timeline], [p.get(node, 0) for _, p in timeline], where="post", label=node)
    ax.axhline(queue["capacity_per_node"], color="tab:red", linestyle="--", label=f"runsPerNode {queue['capacity_per_node']}")
    ax.set_xlabel("seconds since the burst began")
    ax.set_ylabel("pods Running on the node")
    ax.set_title(f"Queue: {queue['burst']} uploads on {len(NODES)} nodes, {queue['slots']} slots")
    ax.legend(loc="upper right")
    fig.tight_layout()
    name = "queue_concurrency.png"
    fig.savefig(out / name, dpi=100)
    plt.close(fig)
    return [name]


def markdown_part(queue: dict[str, Any], images: list[str]) -> list[str]:
    """The queue's part of report.md (nothing when the section did not run)."""
    adm = queue.get("admission_us") or {}
    if adm.get("no_queue") is None and queue.get("burst") is None:
        return []
    out = ["## 6. The pool queue (docs/queue.md)", ""]
    if adm.get("no_queue") is not None:
        waiting = ", ".join(f"{n} waiting: {us} us" for n, us in (adm.get("queued") or {}).items())
        out += [f"Admission, us per TaskRun review (in-process): no queue {adm['no_queue']} us; queued with {waiting}.", ""]
    if queue.get("burst") is not None:
        latency = queue["release_latency_ms"]
        out += [
            f"Burst of {queue['burst']} uploads ({queue['run_seconds']} s pods) on 3 nodes, {queue['slots']} slots: "
            f"{queue['succeeded']} Succeeded in {queue['seconds']} s; most Running at once {queue['max_running']} "
            f"(per node {queue['max_running_per_node']}, runsPerNode {queue['capacity_per_node']}); release latency "
            f"(slot free to next pod created) p50 {latency['p50']} ms, p99 {latency['p99']} ms over {latency['samples']}.",
            "",
        ]
    untouched_part = queue.get("budgets_untouched") or {}
    if (untouched_part.get("without") or {}).get("p50") is not None:
        a, b = untouched_part["without"], untouched_part["with"]
        out += [
            f"Runs touching no destination (docs/budgets.md), release latency over {untouched_part['rounds']} rounds of "
            f"{untouched_part['burst']} each side: without budgets p50 {a['p50']} ms (95% interval {a['ci_low']}..{a['ci_high']}, "
            f"{a['samples']} samples), with budgets on the pool p50 {b['p50']} ms ({b['ci_low']}..{b['ci_high']}, {b['samples']}): "
            f"within the no-budget interval: {untouched_part['within_interval']}; not slowed (within it or below): "
            f"{untouched_part.get('not_slowed')}.",
            "",
        ]
    if "queue_concurrency.png" in images:
        out += ["![Running pods per node over the burst](queue_concurrency.png)", ""]
    return out
