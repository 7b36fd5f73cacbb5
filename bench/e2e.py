"""Section 5: end to end, TaskRun creation to pod scheduled, with and without the webhook registered.

TaskRuns of the catalog's git-clone Task (their image matches pool-K, the largest pool) are created
at a fixed rate in blocks; the registration alternates between blocks in an ABBA order (with,
without, without, with, ...) so drift hits both modes alike. A watch on the namespace's pods
records when each pod is first seen bound (spec.nodeName set); latency = that moment minus the
moment just before the TaskRun's POST, both on this process's monotonic clock (API timestamps only
have whole seconds). Whether the webhook answered is checked on each created TaskRun.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from bench.balance import clean, prepare_namespace
from bench.cluster import BenchCluster, bench_taskrun, namespace_for
from bench.kube import Kube
from bench.stats import percentile, ratio

BLOCK_TIMEOUT = 120.0
MODES = ("with", "without")
Log = Callable[[str], None]


def block_order(blocks_per_mode: int) -> list[str]:
    """ABBA...: with, without, without, with, with, without, ..."""
    return [MODES[(b + 1) // 2 % 2] for b in range(2 * blocks_per_mode)]


async def run(bc: BenchCluster, log: Log) -> dict[str, Any]:
    sizes = bc.sizes
    namespace = namespace_for("e2e", bc.largest_pool)
    per_block = max(1, sizes.e2e_runs // sizes.e2e_blocks)
    started: dict[str, tuple[str, float]] = {}
    bound_at: dict[str, float] = {}
    webhook_seen: dict[str, bool] = {}
    async with Kube(bc.cluster, connections=16) as kube:
        await prepare_namespace(kube, namespace)
        _, version = await kube.list(f"/api/v1/namespaces/{namespace}/pods")

        async def watch() -> None:
            async for arrived, _, pod in kube.watch(f"/api/v1/namespaces/{namespace}/pods", version):
                run_name = (pod["metadata"].get("labels") or {}).get("tekton.dev/taskRun")
                if run_name and (pod.get("spec") or {}).get("nodeName"):
                    bound_at.setdefault(run_name, arrived)

        watcher = asyncio.create_task(watch())
        path = f"/apis/tekton.dev/v1/namespaces/{namespace}/taskruns"
        try:
            for b, mode in enumerate(block_order(sizes.e2e_blocks)):
                await (bc.register(kube) if mode == "with" else bc.unregister(kube))
                names = []
                next_due = time.monotonic()
                for j in range(per_block):
                    await asyncio.sleep(max(0.0, next_due - time.monotonic()))
                    next_due += 1.0 / sizes.e2e_rate
                    name = f"{mode}-{b}-{j:03d}"
                    before = time.monotonic()
                    created = await kube.create(path, bench_taskrun(namespace, name))
                    started[name] = (mode, before)
                    webhook_seen[name] = "egress-placer.io/decision" in (created["metadata"].get("annotations") or {})
                    names.append(name)
                deadline = time.monotonic() + BLOCK_TIMEOUT
                while not all(n in bound_at for n in names):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"e2e block {b} ({mode}): pods not bound after {BLOCK_TIMEOUT:.0f} s")
                    await asyncio.sleep(0.1)
                log(f"e2e: block {b + 1}/{2 * sizes.e2e_blocks} ({mode} webhook) done")
        finally:
            watcher.cancel()
        await bc.register(kube)
        await clean(kube, namespace)
    return summarize(started, bound_at, webhook_seen)


def summarize(started: dict[str, tuple[str, float]], bound_at: dict[str, float],
              webhook_seen: dict[str, bool]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        names = [n for n, (m, _) in started.items() if m == mode]
        latencies = [bound_at[n] - started[n][1] for n in names if n in bound_at]
        out[mode] = {
            "runs": len(names),
            "p50_s": _round(percentile(latencies, 50)),
            "p99_s": _round(percentile(latencies, 99)),
            "mean_s": _round(sum(latencies) / len(latencies)) if latencies else None,
            "webhook_answered": sum(webhook_seen[n] for n in names),
        }
    out["p50_ratio"] = ratio(out["with"]["p50_s"], out["without"]["p50_s"])
    out["p99_ratio"] = ratio(out["with"]["p99_s"], out["without"]["p99_s"])
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
