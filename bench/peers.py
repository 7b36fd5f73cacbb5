"""Section 3b: egress-placer against the floor and a peer, through the API server.

Which admission is in force is switched between blocks (`make_switch`): none, the floor (bench/floor.py:
a no-op Go webhook on egress-placer's exact hooks), egress-placer, and with `--with kyverno` Kyverno's
ClusterPolicy (bench/kyverno.py). The end-to-end section (bench/e2e.py) runs its TaskRun blocks in
each of these modes; this section adds admission latency through the API server: an open loop of
dry-run creates of the benchmarks' Tekton pod (the object both egress-placer and Kyverno mutate) at
`RATE` req/s, latency counted from when each request was due to its answer, in mirrored rounds of the
modes; medians over the rounds. The added latency of a webhook is its mode's figure minus none's.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any, Callable

import aiohttp

from bench.cluster import BenchCluster, namespace_for
from bench.e2e import KYVERNO, Switch, add_cpu_since, block_order, cpu_now
from bench.floor import VARIANTS, FloorWebhook, bench_pod, pod_owner
from bench.kube import Kube
from bench.kyverno import Kyverno
from bench.stats import percentile, ratio

RATE = 200  # requests per second, as the admission section's headline
# Per size name: (seconds per run, rounds of every mode).
LOAD = {"tiny": (1.0, 1), "quick": (3.0, 2), "full": (8.0, 3)}
MODE_KEYS = {"without": "none", "floor": "floor", "with": "egress_placer", KYVERNO: "kyverno"}
Log = Callable[[str], None]


def make_switch(bc: BenchCluster, floor: FloorWebhook, kyverno: Kyverno | None, namespaces: list[str]) -> Switch:
    """`switch(kube, mode)`: only `mode`'s registration in force (with, without, floor, floor_patch, kyverno)."""
    state = {"kyverno": True}  # unknown at first: switched off explicitly

    async def switch(kube: Kube, mode: str) -> None:
        if mode != "with":
            await bc.unregister(kube)
        for variant in VARIANTS:
            if mode != variant:
                await floor.unregister(kube, variant)
        if kyverno is not None and mode != KYVERNO and state["kyverno"]:
            await kyverno.switch(kube, namespaces, False)
            state["kyverno"] = False
        if mode == "with":
            await bc.register(kube)
        elif mode in VARIANTS:
            await floor.register(kube, mode)
        elif mode == KYVERNO:
            if kyverno is None:
                raise ValueError("mode kyverno without Kyverno running")
            await kyverno.switch(kube, namespaces, True)
            state["kyverno"] = True

    return switch


async def _open_loop(kube: Kube, namespace: str, owner: dict[str, Any], tag: str, rate: float, seconds: float) -> dict[str, Any]:
    """Dry-run pod creates at `rate` for `seconds`; latency from when each was due. Bodies are serialised
    before the clock starts and answers are only searched, not decoded, so that this one Python process
    (sharing the 2 cores with the cluster) spends as little as it can per request."""
    count = max(1, int(rate * seconds))
    bodies = [json.dumps(bench_pod(namespace, f"adm-{tag}-{i:05d}", owner), separators=(",", ":")).encode() for i in range(count)]
    latencies: list[float] = []
    lags: list[float] = []
    outcome = {"errors": 0, "mutated": 0}
    url = f"{kube.base}/api/v1/namespaces/{namespace}/pods?dryRun=All"
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    assert kube.session is not None
    session = kube.session

    async def one(body: bytes, due: float) -> None:
        lags.append(time.monotonic() - due)
        try:
            async with session.post(url, data=body, headers=headers) as response:
                answer = await response.read()
                ok = response.status == 201
        except (OSError, asyncio.TimeoutError, aiohttp.ClientError):
            ok = False
        if not ok:
            outcome["errors"] += 1
            return
        latencies.append(time.monotonic() - due)
        outcome["mutated"] += b'"affinity"' in answer

    start = time.monotonic() + 0.05
    tasks = []
    for i, body in enumerate(bodies):
        due = start + i / rate
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        tasks.append(asyncio.create_task(one(body, due)))
    await asyncio.gather(*tasks)
    return {
        "requests": count,
        "p50_ms": _ms(percentile(latencies, 50)),
        "p99_ms": _ms(percentile(latencies, 99)),
        "max_ms": _ms(max(latencies) if latencies else None),
        "errors": outcome["errors"],
        "mutated": outcome["mutated"],
        "send_lag_p99_ms": _ms(percentile(lags, 99)),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


async def admission(bc: BenchCluster, switch: Switch, modes: tuple[str, ...], log: Log) -> dict[str, Any]:
    """Admission through the API server at RATE req/s in every mode, mirrored rounds; medians."""
    seconds, rounds = LOAD.get(bc.sizes.name, LOAD["quick"])
    namespace = namespace_for("e2e", bc.largest_pool)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    cpu: dict[str, dict[str, float]] = {m: {} for m in modes}
    async with Kube(bc.cluster, connections=64) as kube:
        owner = await pod_owner(kube, namespace)  # egress-placer places only a real run's pods
        for b, mode in enumerate(block_order(rounds, modes)):
            await switch(kube, mode)
            await _open_loop(kube, namespace, owner, f"warm{b}", RATE, 0.5)  # connections and caches warm
            before = cpu_now(bc)
            runs[mode].append(await _open_loop(kube, namespace, owner, f"{mode}{b}", RATE, seconds))
            add_cpu_since(cpu[mode], before, bc)
            log(f"peers: admission {mode} round {b // len(modes) + 1}/{rounds}: p99 {runs[mode][-1]['p99_ms']} ms")
        await switch(kube, "with")
    out: dict[str, Any] = {"rate_rps": RATE, "seconds": seconds, "rounds": rounds, "modes": {}}
    for mode in modes:
        rows = runs[mode]
        total = sum(r["requests"] for r in rows)
        out["modes"][MODE_KEYS[mode]] = {
            "requests": total,
            "p50_ms": _median([r["p50_ms"] for r in rows]),
            "p99_ms": _median([r["p99_ms"] for r in rows]),
            "max_ms": max((r["max_ms"] for r in rows if r["max_ms"] is not None), default=None),
            "errors": sum(r["errors"] for r in rows),
            "mutated": sum(r["mutated"] for r in rows),
            "send_lag_p99_ms": _median([r["send_lag_p99_ms"] for r in rows]),
            "p99_ms_each": [r["p99_ms"] for r in rows],
            "cpu_ms_per_request": {p: round(1000 * s / total, 3) for p, s in sorted(cpu[mode].items(), key=lambda kv: -kv[1])
                                   if s > 0} if total else {},
            # CPU the rate asks of the machine in this mode (every process, the load generator included):
            # above the cores there are (2 here, shared), latency is a queue's.
            "cores_at_rate": round(RATE * sum(cpu[mode].values()) / total, 2) if total else None,
        }
    m = out["modes"]
    none_p99 = m["none"]["p99_ms"]
    for key in ("floor", "egress_placer", "kyverno"):
        if key in m:
            row = m[key]
            row["added_p50_ms"] = _minus(row["p50_ms"], m["none"]["p50_ms"])
            row["added_p99_ms"] = _minus(row["p99_ms"], none_p99)
    out["p99_ratio_to_floor"] = ratio(m["egress_placer"]["p99_ms"], m["floor"]["p99_ms"])
    return out


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(statistics.median(kept), 2) if kept else None


def _minus(a: float | None, b: float | None) -> float | None:
    return round(a - b, 2) if a is not None and b is not None else None


def kyverno_summary(kyverno: Kyverno, e2e: dict[str, Any], adm: dict[str, Any] | None) -> dict[str, Any]:
    """`peers.kyverno`: its admission p99 and e2e added p50 beside egress-placer's, from the same run."""
    modes = (adm or {}).get("modes") or {}
    mine = e2e.get(KYVERNO) or {}
    added = None
    if mine.get("p50_s") is not None and e2e["without"]["p50_s"] is not None:
        added = round(1000 * (mine["p50_s"] - e2e["without"]["p50_s"]), 1)
    return {
        "version": kyverno.version,
        "start_s": kyverno.start_s,
        "admission_p99_ms": (modes.get("kyverno") or {}).get("p99_ms"),
        "egress_placer_admission_p99_ms": (modes.get("egress_placer") or {}).get("p99_ms"),
        "e2e_added_p50_ms": added,
        "egress_placer_e2e_added_p50_ms": e2e.get("added_p50_ms"),
        "e2e": mine,
        "rss_mb": kyverno.rss_mb(),
    }
