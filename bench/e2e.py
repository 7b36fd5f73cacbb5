"""Section 3: end to end, TaskRun creation to pod scheduled, with and without the webhook registered,
and with the floor (a no-op Go webhook on the same hooks, bench/floor.py) instead.

TaskRuns of the catalog's git-clone Task (their image matches pool-K, the largest pool) are created
at a fixed rate in blocks; the registration changes between blocks in a mirrored order (with,
without, floor, floor_patch, floor_patch, floor, without, with, ...) so drift hits every mode alike;
floor_patch is the floor answering with a patch that changes nothing (bench/floor.py), compared in
`call_latency_patch_floor` as the floor is in `call_latency`. With `--with kyverno`
a fourth mode runs Kyverno's ClusterPolicy alone (bench/kyverno.py), reported under `peers.kyverno`. A watch on the namespace's pods
records when each pod is first seen and first seen bound (spec.nodeName set); latency = bound
minus the moment just before the TaskRun's POST, all on this process's monotonic clock (API
timestamps only have whole seconds). Whether the webhook answered is checked on each created run.

Where the time goes: the median of each stage per mode (the POST itself, TaskRun created to pod
seen, pod seen to bound); the API server's own histogram of its calls to egress-placer's webhooks
(apiserver_admission_webhook_admission_duration_seconds) and the controller's own handler histogram
(egress_placer_admission_duration_seconds), both read around the "with" blocks; `call_latency`: per hook,
the API server's mean time per call to egress-placer over the floor's, with a 95% bootstrap interval over
blocks (its histogram's buckets start at 5 ms, so each block's _sum and _count deltas are kept; the rounds,
one block of each mode, are drawn with replacement: drift that hits a round hits both, bench/stats.py); and
the CPU each of
the cluster's processes (API server, etcd, Tekton, KWOK, scheduler, controller manager, egress-placer)
and this client used per run in each mode, from /proc/PID/stat around every block.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from prometheus_client.parser import text_string_to_metric_families

from devplacer.local_placer import replicas_of

from bench import machine
from bench.balance import clean, prepare_namespace
from bench.cluster import BenchCluster, bench_taskrun, namespace_for
from bench.kube import Kube
from bench.stats import bootstrap_ratio, mean_per_call, percentile, ratio

BLOCK_TIMEOUT = 120.0
# egress-placer, no webhook, the no-op Go webhook on the same hooks, and the same answering with a patch that
# changes nothing (bench/floor.py: the API server applies any patch it gets, inside the call it times)
MODES = ("with", "without", "floor", "floor_patch")
FLOOR_SUFFIXES = {"floor": ".floor", "floor_patch": ".floor-patch"}  # the floors' modes -> their hooks' name suffix
KYVERNO = "kyverno"
HOOKS = {"taskruns": "taskruns.egress-placer.io", "pods": "pods.egress-placer.io"}
HANDLER_KINDS = {"taskruns": "TaskRun", "pods": "Pod"}
Log = Callable[[str], None]
Sums = dict[str, list[float]]  # hook -> [seconds, calls]
CALL_LATENCY_KEYS = {"taskruns": "taskrun", "pods": "pod"}  # hook -> its key in e2e.call_latency
FLOOR_RATIO_NOTE = (
    "noisy: added_p50_ms over floor_added_p50_ms divides by the floor's added p50 (about 6 ms), as large as its own "
    "sampling noise (1.12, 2.84 and 0.09 in past runs); read call_latency (the API server's own time per call, "
    "per hook, with a bootstrap interval) instead")
CLIENT = "bench client"  # this process: the load generator and the watch


@dataclass
class Run:
    mode: str
    sent: float  # just before the POST
    created: float  # the POST answered
    webhook_answered: bool
    pod_seen: float | None = None
    bound: float | None = None
    node: str | None = None  # where the pod was bound


# Makes `mode` the only registration in force (egress-placer's, the floor's, Kyverno's or none).
Switch = Callable[[Kube, str], Awaitable[None]]


def metric_lines(text: str, metric: str) -> str:
    """The lines of one metric family of a Prometheus text page (the API server's is ~5 MB: parsing only
    these keeps a scrape between blocks well under a second on a loaded machine)."""
    return "\n".join(line for line in text.splitlines() if metric in line) + "\n"


def _histogram(text: str, metric: str, label: str, names: dict[str, str]) -> Sums:
    """Per hook, [sum, count] of the histogram `metric` whose `label` maps to a hook through `names`."""
    out = {hook: [0.0, 0.0] for hook in HOOKS}
    for family in text_string_to_metric_families(metric_lines(text, metric)):
        if family.name != metric:
            continue
        for sample in family.samples:
            hook = names.get(sample.labels.get(label, ""))
            if hook and sample.name.endswith("_sum"):
                out[hook][0] += sample.value
            elif hook and sample.name.endswith("_count"):
                out[hook][1] += sample.value
    return out


async def timings(bc: BenchCluster, kube: Kube, suffix: str = "") -> tuple[Sums, Sums]:
    """(API server's webhook call seconds, controller's handler seconds), per hook, so far; with
    `suffix`, the API server's calls to the hooks of that name suffix (the floor's)."""
    apiserver = _histogram(await kube.text("/metrics"), "apiserver_admission_webhook_admission_duration_seconds",
                           "name", {v + suffix: k for k, v in HOOKS.items()})
    assert kube.session is not None
    async with kube.session.get(replicas_of(bc.cluster)[0].health_url + "/metrics") as response:
        handler = _histogram(await response.text(), "egress_placer_admission_duration_seconds", "kind",
                             {v: k for k, v in HANDLER_KINDS.items()})
    return apiserver, handler


# The controller's counters read around the "with" blocks (e2e.controller_counts): its reads of a pod's TaskRun
# by outcome, and the webhook's connections (each a TLS handshake inside the API server's call time) by event.
COUNTERS = {"egress_placer_admission_owner_reads_total": ("owner_reads", "outcome"),
            "egress_placer_webhook_connections_total": ("webhook_connections", "event")}


async def controller_counts(bc: BenchCluster, kube: Kube) -> dict[str, float]:
    """"owner_reads.found", "webhook_connections.opened", ...: the controller's COUNTERS so far (replica 0)."""
    assert kube.session is not None
    async with kube.session.get(replicas_of(bc.cluster)[0].health_url + "/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metric_lines(text, "egress_placer_")):
        for sample in family.samples:
            named = COUNTERS.get(sample.name)
            if named is not None:
                key = f"{named[0]}.{sample.labels.get(named[1], '')}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def _add(total: Sums, after: Sums, before: Sums) -> Sums:
    """Add after - before to `total`; the difference itself (one block's), per hook."""
    block = {hook: [after[hook][i] - before[hook][i] for i in (0, 1)] for hook in total}
    for hook in total:
        total[hook] = [total[hook][i] + block[hook][i] for i in (0, 1)]
    return block


def run_name(mode: str, block: int, index: int) -> str:
    """The TaskRun's name: its mode (a DNS label: floor_patch as floor-patch), block and index."""
    return f"{mode.replace('_', '-')}-{block}-{index:03d}"


def cpu_now(bc: BenchCluster) -> dict[str, float]:
    """CPU seconds so far of each live process of the cluster (the controller included) and of this client."""
    out = {CLIENT: time.process_time()}
    for record in bc.cluster.processes():
        seconds = machine.cpu_seconds(record.pid) if record.alive() else None
        if seconds is not None:
            out[record.name] = seconds
    return out


def add_cpu_since(total: dict[str, float], before: dict[str, float], bc: BenchCluster) -> None:
    """Add to `total` (process -> CPU seconds) what each process used since `before` (a `cpu_now`)."""
    for process, seconds in cpu_now(bc).items():
        if process in before:
            total[process] = total.get(process, 0.0) + seconds - before[process]


def block_order(blocks_per_mode: int, modes: tuple[str, ...] = MODES) -> list[str]:
    """Mirrored rounds: with, without, floor, floor, without, with, ... (ABBA for two modes)."""
    out: list[str] = []
    for r in range(blocks_per_mode):
        out += list(modes) if r % 2 == 0 else list(reversed(modes))
    return out


async def run(bc: BenchCluster, log: Log, switch: Switch, modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """The blocks of every mode in `modes`; `switch(kube, mode)` puts a mode's registration in force."""
    sizes = bc.sizes
    namespace = namespace_for("e2e", bc.largest_pool)
    per_block = max(1, sizes.e2e_runs // sizes.e2e_blocks)
    runs: dict[str, Run] = {}
    calls: Sums = {hook: [0.0, 0.0] for hook in HOOKS}
    handled: Sums = {hook: [0.0, 0.0] for hook in HOOKS}
    floor_calls: dict[str, Sums] = {mode: {hook: [0.0, 0.0] for hook in HOOKS} for mode in FLOOR_SUFFIXES}
    blocks: dict[str, list[Sums]] = {"with": [], **{mode: [] for mode in FLOOR_SUFFIXES}}  # each block's API-server call seconds and calls
    cpu: dict[str, dict[str, float]] = {mode: {} for mode in modes}  # mode -> process -> CPU seconds in its blocks
    counts: dict[str, float] = {}  # controller_counts' differences over the "with" blocks
    async with Kube(bc.cluster, connections=16) as kube:
        await prepare_namespace(kube, namespace)
        _, version = await kube.list(f"/api/v1/namespaces/{namespace}/pods")
        seen: dict[str, float] = {}
        bound: dict[str, float] = {}
        nodes: dict[str, str] = {}

        async def watch() -> None:
            async for arrived, _, pod in kube.watch(f"/api/v1/namespaces/{namespace}/pods", version):
                run_name = (pod["metadata"].get("labels") or {}).get("tekton.dev/taskRun")
                if run_name:
                    seen.setdefault(run_name, arrived)
                    if (pod.get("spec") or {}).get("nodeName"):
                        bound.setdefault(run_name, arrived)
                        nodes.setdefault(run_name, pod["spec"]["nodeName"])

        watcher = asyncio.create_task(watch())
        path = f"/apis/tekton.dev/v1/namespaces/{namespace}/taskruns"
        try:
            for b, mode in enumerate(block_order(sizes.e2e_blocks, modes)):
                await switch(kube, mode)
                before = await timings(bc, kube)
                counts_before = await controller_counts(bc, kube) if mode == "with" else {}
                floor_before = await timings(bc, kube, FLOOR_SUFFIXES[mode]) if mode in FLOOR_SUFFIXES else None
                cpu_before = cpu_now(bc)
                names = []
                next_due = time.monotonic()
                for j in range(per_block):
                    await asyncio.sleep(max(0.0, next_due - time.monotonic()))
                    next_due += 1.0 / sizes.e2e_rate
                    name = run_name(mode, b, j)
                    sent = time.monotonic()
                    created = await kube.create(path, bench_taskrun(namespace, name))
                    answered = "egress-placer.io/decision" in (created["metadata"].get("annotations") or {})
                    runs[name] = Run(mode, sent, time.monotonic(), answered)
                    names.append(name)
                deadline = time.monotonic() + BLOCK_TIMEOUT
                while not all(n in bound for n in names):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"e2e block {b} ({mode}): pods not bound after {BLOCK_TIMEOUT:.0f} s")
                    await asyncio.sleep(0.1)
                add_cpu_since(cpu[mode], cpu_before, bc)
                if mode == "with":
                    after = await timings(bc, kube)
                    blocks["with"].append(_add(calls, after[0], before[0]))
                    _add(handled, after[1], before[1])
                    for key, value in (await controller_counts(bc, kube)).items():
                        counts[key] = counts.get(key, 0.0) + value - counts_before.get(key, 0.0)
                if floor_before is not None:
                    after_floor = (await timings(bc, kube, FLOOR_SUFFIXES[mode]))[0]
                    blocks[mode].append(_add(floor_calls[mode], after_floor, floor_before[0]))
                log(f"e2e: block {b + 1}/{len(modes) * sizes.e2e_blocks} ({mode}) done")
        finally:
            watcher.cancel()
        for name, r in runs.items():
            r.pod_seen, r.bound, r.node = seen.get(name), bound.get(name), nodes.get(name)
        await switch(kube, "with")
        await clean(kube, namespace)
    out = summarize(runs, calls, handled, cpu, floor_calls["floor"], blocks, floor_calls["floor_patch"])
    out["controller_counts"] = {key: round(value) for key, value in sorted(counts.items())}
    if KYVERNO in modes:
        pool = set(bc.pools[bc.largest_pool])
        mine = [r for r in runs.values() if r.mode == KYVERNO]
        out[KYVERNO] = {**mode_summary(mine, cpu.get(KYVERNO, {})),
                        "pods_in_pool": sum(r.node in pool for r in mine if r.node is not None)}
    return out


def _ms(sums: Sums) -> dict[str, float | None]:
    return {hook: round(1000 * s / n, 3) if n else None for hook, (s, n) in sums.items()}


def _median_ms(values: list[float]) -> float | None:
    return round(1000 * statistics.median(values), 1) if values else None


def mode_summary(mine: list[Run], cpu: dict[str, float]) -> dict[str, Any]:
    """One mode's runs: latency percentiles, stages, webhook answers, CPU per run."""
    done = [r for r in mine if r.bound is not None and r.pod_seen is not None]
    latencies = [r.bound - r.sent for r in done]  # type: ignore[operator]
    return {
        "runs": len(mine),
        "p50_s": _round(percentile(latencies, 50)),
        "p99_s": _round(percentile(latencies, 99)),
        "mean_s": _round(sum(latencies) / len(latencies)) if latencies else None,
        "webhook_answered": sum(r.webhook_answered for r in mine),
        "stage_p50_ms": {
            "create": _median_ms([r.created - r.sent for r in done]),
            "to_pod": _median_ms([r.pod_seen - r.created for r in done]),  # type: ignore[operator]
            "to_bound": _median_ms([r.bound - r.pod_seen for r in done]),  # type: ignore[operator]
        },
        "cpu_ms_per_run": _per_run_ms(cpu, len(mine)),
    }


def added_ms(mode: dict[str, Any], baseline: dict[str, Any]) -> float | None:
    """p50 of `mode` minus p50 of `baseline` (no webhook), milliseconds."""
    a, b = mode["p50_s"], baseline["p50_s"]
    return round(1000 * (a - b), 1) if a is not None and b is not None else None


def call_latency(blocks: dict[str, list[Sums]], floor_mode: str = "floor") -> dict[str, dict[str, Any]]:
    """Per hook (taskrun, pod): the API server's mean time per call to egress-placer's webhook over the
    floor's (`floor_mode`'s blocks: the floor, or the patching floor) (`ratio`), its 95% bootstrap interval
    over blocks (`ci_low`, `ci_high`), both means (ms), each block's mean (ms) and the number of blocks of each."""
    out = {}
    for hook, key in CALL_LATENCY_KEYS.items():
        ours = [(b[hook][0], b[hook][1]) for b in blocks.get("with", [])]
        floor = [(b[hook][0], b[hook][1]) for b in blocks.get(floor_mode, [])]
        found = bootstrap_ratio(ours, floor, paired=len(ours) == len(floor))  # block i of each: round i
        ours_ms, floor_ms = mean_per_call(ours), mean_per_call(floor)
        out[key] = {
            "ratio": round(found[0], 3) if found else None,
            "ci_low": round(found[1], 3) if found else None,
            "ci_high": round(found[2], 3) if found else None,
            "ms": _rounded_ms(ours_ms), "floor_ms": _rounded_ms(floor_ms),
            "ms_each": [_rounded_ms(mean_per_call([b])) for b in ours],
            "floor_ms_each": [_rounded_ms(mean_per_call([b])) for b in floor],
            "blocks": len(ours), "floor_blocks": len(floor),
        }
    return out


def _rounded_ms(seconds: float | None) -> float | None:
    return round(1000 * seconds, 3) if seconds is not None else None


def summarize(runs: dict[str, Run], calls: Sums, handled: Sums, cpu: dict[str, dict[str, float]] | None = None,
              floor_calls: Sums | None = None, blocks: dict[str, list[Sums]] | None = None,
              patch_floor_calls: Sums | None = None) -> dict[str, Any]:
    none: Sums = {hook: [0.0, 0.0] for hook in HOOKS}
    out: dict[str, Any] = {"webhook_call_ms": _ms(calls), "handler_ms": _ms(handled),
                           "floor_webhook_call_ms": _ms(floor_calls or none),
                           "patch_floor_webhook_call_ms": _ms(patch_floor_calls or none)}
    for mode in MODES:
        out[mode] = mode_summary([r for r in runs.values() if r.mode == mode], (cpu or {}).get(mode, {}))
    with_p50, without_p50 = out["with"]["p50_s"], out["without"]["p50_s"]
    out["added_p50_ms"] = added_ms(out["with"], out["without"])
    out["p50_ratio"] = ratio(with_p50, without_p50)
    out["p99_ratio"] = ratio(out["with"]["p99_s"], out["without"]["p99_s"])
    out["floor_added_p50_ms"] = added_ms(out["floor"], out["without"])
    # Both added p50s from the same no-webhook baseline; null when the floor added nothing measurable (<= 0).
    floor_added = out["floor_added_p50_ms"]
    out["floor_ratio"] = (round(out["added_p50_ms"] / floor_added, 3)
                          if out["added_p50_ms"] is not None and floor_added is not None and floor_added > 0 else None)
    # The same comparison by the API server's own clock of the two calls on a run's path (TaskRun and Pod CREATE):
    # steadier than a difference of two end-to-end p50s on a loaded machine.
    ours, floor = out["webhook_call_ms"], out["floor_webhook_call_ms"]
    both = None not in (*ours.values(), *floor.values())
    out["floor_call_ratio"] = round(sum(ours.values()) / sum(floor.values()), 3) if both and sum(floor.values()) else None
    out["floor_ratio_note"] = FLOOR_RATIO_NOTE
    out["call_latency"] = call_latency(blocks or {})
    out["call_latency_patch_floor"] = call_latency(blocks or {}, "floor_patch")
    return out


def _per_run_ms(seconds: dict[str, float], runs: int) -> dict[str, float]:
    """Process -> CPU ms per run, most first, with their "total"."""
    if not runs or not seconds:
        return {}
    out = {p: round(1000 * s / runs, 1) for p, s in sorted(seconds.items(), key=lambda kv: -kv[1])}
    out["total"] = round(1000 * sum(seconds.values()) / runs, 1)
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
