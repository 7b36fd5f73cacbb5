"""Section 1: admission over HTTPS, egress-placer against the floor, side by side.

Both servers run as their own processes (bench/servers.py) for the whole section; each point of
the plan (a concurrency, or an offered rate) is run `http_repeats` times per server, each run by a
fresh load generator process (bench/loadgen.py), alternating which server goes first so drift and
the rest of the machine hit both alike; the median of the repeats is kept. The server's CPU time
per request is read from /proc around each run. A last closed-loop run is sampled with py-spy.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable

from controller.admission.certs import make_ca, make_serving_cert
from controller.admission.handlers import Admission
from controller.admission.review import decode, encode
from controller.metrics import Metrics
from controller.settings import Settings
from controller.state import ClusterState

from bench import machine, profiling
from bench.sizes import Sizes
from bench.stats import bootstrap_percentile_ratio, percentile, ratio
from bench.servers import ORDINARY_NODES, PODS_PER_NODE
from bench.workload import NoEvents, RequestMix, admission_policy, fill, inventory, request_mix

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("egress-placer", "floor")
P99_LIMIT_MS = 10.0
DISTINCT_RUNS = 512  # run names cycle: at most this many runs are in flight (assumed) at once
POOL_NODES = 10
Log = Callable[[str], None]


def write_tls(directory: Path) -> None:
    """A CA and a serving certificate for 127.0.0.1 (ca.crt, tls.crt, tls.key)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    ca = make_ca(now)
    serving = make_serving_cert(ca, ["127.0.0.1"], now, 2)
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    (directory / "tls.crt").write_bytes(serving.cert_pem)
    (directory / "tls.key").write_bytes(serving.key_pem)


def make_mix(runs: int) -> RequestMix:
    """The request bodies, decided by an Admission over the same inventory the server holds."""
    state = ClusterState(admission_policy(), clock=time.time)
    fill(state.apply, inventory(POOL_NODES, ORDINARY_NODES, PODS_PER_NODE))
    admission = Admission(state, Metrics(), NoEvents(), Settings())
    return request_mix(admission.review, runs)


HANDLER_PASSES = 5


def handler_cost(mix: RequestMix, passes: int = HANDLER_PASSES) -> dict[str, Any]:
    """In-process: what the egress-placer server does per review but HTTP and TLS (the wire's JSON in,
    `Admission.review`, the wire's JSON out) over every body of the mix, on the server's inventory;
    process CPU microseconds per review. The first pass fills the memos (`first_pass_us`); the figure
    is the best of the next `passes` (the pass the rest of the machine disturbed least)."""
    state = ClusterState(admission_policy(), clock=time.time)
    fill(state.apply, inventory(POOL_NODES, ORDINARY_NODES, PODS_PER_NODE))
    admission = Admission(state, Metrics(), NoEvents(), Settings())
    each = []
    for _ in range(passes + 1):
        cpu = time.process_time()
        for body in mix.bodies:
            encode(admission.review(decode(body)))
        each.append(round(1e6 * (time.process_time() - cpu) / len(mix.bodies), 1))
    return {"us_per_review": min(each[1:]), "us_per_review_each": each[1:], "first_pass_us": each[0], "reviews": len(mix.bodies),
            "after_idle_us": after_idle(admission, mix.bodies)}


IDLE_SECONDS, IDLE_REVIEWS = 0.1, 40


def after_idle(admission: Admission, bodies: list[bytes], idle: float = IDLE_SECONDS, reviews: int = IDLE_REVIEWS) -> dict[str, float]:
    """The handler as the API server meets it on a cluster: one review after `idle` seconds of nothing (a
    run's TaskRun or Pod CREATE comes every ~100 ms, and between them the machine's other work evicts the
    interpreter's code and data from the CPU caches). By kind (TaskRun, Pod): the median wall time of
    `reviews` such reviews, in microseconds, next to the same reviews back to back (`hot`)."""
    out: dict[str, float] = {}
    for kind in ("TaskRun", "Pod"):
        mine = [b for b in bodies if decode(b)["request"]["kind"]["kind"] == kind][:reviews]
        hot, cold = [], []
        for body in mine:
            started = time.perf_counter()
            encode(admission.review(decode(body)))
            hot.append(time.perf_counter() - started)
        for body in mine:
            time.sleep(idle)
            started = time.perf_counter()
            encode(admission.review(decode(body)))
            cold.append(time.perf_counter() - started)
        if mine:
            out[kind] = round(1e6 * statistics.median(cold), 1)
            out[f"{kind}_hot"] = round(1e6 * statistics.median(hot), 1)
    return out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


class Server:
    """One server process (`python -m bench.servers TARGET`), stopped by its pid on exit."""

    def __init__(self, target: str, tls_dir: Path, log_file: Path, command: list[str] | None = None) -> None:
        """`command`: the server's arguments to python (default: `-m bench.servers TARGET ...`)."""
        self.target = target
        self._log = open(log_file, "ab")
        command = command or ["-m", "bench.servers", target, "--tls-dir", str(tls_dir), "--pool-nodes", str(POOL_NODES)]
        self.process = subprocess.Popen(
            [sys.executable, *command],
            stdout=subprocess.PIPE, stderr=self._log, env=_env(), cwd=REPO,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode().split()
        if len(line) != 2 or line[0] != "READY":
            self.stop()
            raise RuntimeError(f"the {target} server did not start; see {log_file}")
        self.url = f"https://127.0.0.1:{line[1]}/mutate"

    def cpu_seconds(self) -> float:
        return machine.cpu_seconds(self.process.pid) or 0.0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def run_point(server: Server, workdir: Path, point: dict[str, Any]) -> dict[str, Any]:
    spec = {**point, "url": server.url, "ca": str(workdir / "tls" / "ca.crt"), "bodies": str(workdir / "bodies.json")}
    spec_file = workdir / "point.json"
    spec_file.write_text(json.dumps(spec))
    cpu_before = server.cpu_seconds()
    out = subprocess.run([sys.executable, "-m", "bench.loadgen", str(spec_file)], capture_output=True, text=True,
                         env=_env(), cwd=REPO, timeout=point["warmup"] + point["seconds"] + 120, check=False)
    cpu = server.cpu_seconds() - cpu_before
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout)
    total = max(result["requests"], 1) * (point["warmup"] + point["seconds"]) / point["seconds"]
    result["server_cpu_ms_per_request"] = round(1000.0 * cpu / total, 3)
    return {"target": server.target, **{k: point[k] for k in ("concurrency", "rate_rps") if k in point}, **result}


def _plan_order(i: int) -> tuple[str, str]:
    return TARGETS if i % 2 == 0 else TARGETS[::-1]


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the repeats of a point: the median of every figure; `p99_ms_each` keeps the p99s."""
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("concurrency", "rate_rps"):
            values = [r[key] for r in rows if r[key] is not None]
            out[key] = round(statistics.median(values), 3) if values else None
    out["errors"] = sum(r["errors"] for r in rows)
    out["requests"] = sum(r["requests"] for r in rows)
    out["p99_ms_each"] = [r["p99_ms"] for r in rows]
    return out


def measure(servers: dict[str, Server], workdir: Path, point: dict[str, Any], repeats: int, first: int) -> dict[str, dict[str, Any]]:
    """`repeats` runs of `point` against each server, alternating which goes first; median rows. With
    `keep_latencies` in `point`, each row also has `latencies_ms_each`: every run's latencies, in run order."""
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in servers}
    for r in range(repeats):
        for target in _plan_order(first + r):
            if target in servers:
                runs[target].append(run_point(servers[target], workdir, point))
    out = {}
    for target, rows in runs.items():
        kept = [row.pop("latencies_ms") for row in rows if "latencies_ms" in row]
        out[target] = median_row(rows)
        if kept:
            out[target]["latencies_ms_each"] = kept
    return out


def run(sizes: Sizes, workdir: Path, log: Log) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    write_tls(workdir / "tls")
    log("admission: building the request mix from the catalog")
    mix = make_mix(DISTINCT_RUNS if sizes.name != "tiny" else 32)
    (workdir / "bodies.json").write_text(json.dumps([b.decode() for b in mix.bodies]))
    timing = {"warmup": sizes.http_warmup, "seconds": sizes.http_seconds}
    out: dict[str, Any] = {"requests": mix.summary(), "closed_loop": [], "open_loop": []}
    out["handler"] = handler_cost(mix)
    log(f"admission: handler in-process {out['handler']['us_per_review']} us per review "
        f"(passes {out['handler']['us_per_review_each']}, first {out['handler']['first_pass_us']}); "
        f"after {IDLE_SECONDS * 1000:.0f} ms idle (and back to back), us: {out['handler']['after_idle_us']}")
    with ExitStack() as stack:
        servers = {}
        for target in TARGETS:
            servers[target] = Server(target, workdir / "tls", workdir / f"server-{target}.log")
            stack.callback(servers[target].stop)
        for i, concurrency in enumerate(sizes.concurrencies):
            rows = measure(servers, workdir, {"mode": "closed", "concurrency": concurrency, **timing}, sizes.http_repeats, i)
            for target in TARGETS:
                row = rows[target]
                out["closed_loop"].append(row)
                log(f"admission: closed c={concurrency:<3} {target:<14} {row['throughput_rps']:>7} req/s  "
                    f"p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  (p99 of each run {row['p99_ms_each']})")
        live = dict(servers)
        for i, rate in enumerate(sizes.rates):
            rows = measure(live, workdir, {"mode": "open", "rate": rate, "rate_rps": rate, **timing}, sizes.http_repeats, i)
            for target in TARGETS:
                if target not in rows:
                    continue
                row = rows[target]
                out["open_loop"].append(row)
                log(f"admission: open {rate:>5} req/s {target:<14} achieved {row['throughput_rps']:>7}  "
                    f"p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  (p99 of each run {row['p99_ms_each']})")
                if row["throughput_rps"] < 0.8 * rate or (row["p99_ms"] or 0) > 20 * P99_LIMIT_MS:
                    live.pop(target)  # saturated: higher rates would only queue
        rate = sizes.headline_rate
        point = {"mode": "open", "rate": rate, "rate_rps": rate, "warmup": sizes.http_warmup, "seconds": sizes.headline_seconds,
                 "keep_latencies": True}
        headline = measure(servers, workdir, point, sizes.headline_repeats, 0)
        log(f"admission: headline {rate} req/s, {sizes.headline_repeats} runs each: p99 egress-placer "
            f"{headline['egress-placer']['p99_ms_each']}, floor {headline['floor']['p99_ms_each']}")
        out["profile"] = profile_server(servers["egress-placer"], workdir, sizes)
    out.update(summarize(out, headline))
    return out


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def profile_server(server: Server, workdir: Path, sizes: Sizes) -> dict[str, Any]:
    """py-spy samples of the egress-placer server under a closed loop at concurrency 16."""
    seconds = max(2.0, sizes.http_seconds)
    raw = workdir / "profile-egress-placer.txt"
    spy = profiling.start_py_spy(server.process.pid, seconds, raw)
    if spy is None:
        return {"tool": None, "load": None, "samples": 0, "top_self": [], "top_inclusive": []}
    time.sleep(0.5)
    run_point(server, workdir, {"mode": "closed", "concurrency": 16, "warmup": 0.2, "seconds": seconds})
    spy.wait(timeout=seconds + 30)
    summary = profiling.summarize_collapsed(raw) if raw.exists() else {"samples": 0, "top_self": [], "top_inclusive": []}
    return {"tool": profiling.py_spy_version(), "load": "closed loop, concurrency 16", **summary}


def sustained(rows: list[dict[str, Any]], target: str) -> float | None:
    """The highest offered rate that was kept (>= 97 % achieved) with p99 under 10 ms; 0 when rates were
    tried and none was kept (a missed target, e.g. on a loaded machine), None when none was tried."""
    tried = [r for r in rows if r["target"] == target]
    ok = [r["rate_rps"] for r in tried if r["p99_ms"] is not None
          and r["p99_ms"] <= P99_LIMIT_MS and r["throughput_rps"] >= 0.97 * r["rate_rps"] and r["errors"] == 0]
    return max(ok) if ok else (0.0 if tried else None)


def summarize(out: dict[str, Any], headline: dict[str, dict[str, Any]]) -> dict[str, Any]:
    def best(target: str) -> float | None:
        values = [r["throughput_rps"] for r in out["closed_loop"] if r["target"] == target and r["errors"] == 0]
        return max(values) if values else None

    mine, floor = headline["egress-placer"], headline["floor"]
    ours, theirs = mine.pop("latencies_ms_each", []), floor.pop("latencies_ms_each", [])
    pooled = bootstrap_percentile_ratio(ours, theirs, 99.0) if ours and len(ours) == len(theirs) else None
    return {
        "headline": {
            "rate_rps": mine["rate_rps"],
            "runs": len(mine["p99_ms_each"]),
            "p50_ms": mine["p50_ms"],
            "p99_ms": mine["p99_ms"],
            "floor_p50_ms": floor["p50_ms"],
            "floor_p99_ms": floor["p99_ms"],
            "p99_ratio": ratio(mine["p99_ms"], floor["p99_ms"]),
            "p99_ms_each": mine["p99_ms_each"],
            "floor_p99_ms_each": floor["p99_ms_each"],
            "cpu_ms_per_request": mine["server_cpu_ms_per_request"],
            "floor_cpu_ms_per_request": floor["server_cpu_ms_per_request"],
            # The steadier view: the p99 of every request of the runs pooled (a run's p99 is its 4th-slowest of
            # 400), its ratio with a 95% bootstrap interval over paired rounds (bench.stats).
            "pooled": {
                "p99_ms": _rounded(percentile([x for run in ours for x in run], 99.0)),
                "floor_p99_ms": _rounded(percentile([x for run in theirs for x in run], 99.0)),
                "p99_ratio": round(pooled[0], 3) if pooled else None,
                "ci_low": round(pooled[1], 3) if pooled else None,
                "ci_high": round(pooled[2], 3) if pooled else None,
            },
        },
        "sustained_rps": sustained(out["open_loop"], "egress-placer"),
        "floor_sustained_rps": sustained(out["open_loop"], "floor"),
        "max_throughput_rps": best("egress-placer"),
        "floor_max_throughput_rps": best("floor"),
    }
