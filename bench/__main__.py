"""`python -m bench --mode quick|full [--tiny] [--out DIR] [--sections ...] [--cluster-dir DIR]`

Runs the sections in this order: admission, under_relist (admission while the pod informer relists;
alone: `python -m bench.under_relist`) and under_reconcile (admission while the leader reconciles 5,000
pool nodes; alone: `python -m bench.under_reconcile`) (no cluster), core, then on one local cluster: end to
end (none, the floor, egress-placer, and Kyverno with `--with kyverno`), peers (admission through the
API server in the same modes), balance (a, b, c, and the egress case with a real Prometheus), scale, queue (bench/queue.py). Writes DIR/latest.json, DIR/report.md and the PNG charts (DIR is
bench/results by default) and prints a summary table. Exit status 1 when a section failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable

from loguru import logger

from bench import admission, balance, balance_egress, core, e2e, machine, peers, report, scale, schema, under_reconcile, under_relist
from bench import queue as bench_queue
from bench import cluster as bench_cluster
from bench import balance_replicas
from bench import floor as bench_floor
from bench import kyverno as bench_kyverno
from bench.kube import Kube
from bench.sizes import SIZES, Sizes

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = ("admission", "under_relist", "under_reconcile", "core", "e2e", "peers", "balance", "scale", "queue")
CLUSTER_SECTIONS = ("e2e", "peers", "balance", "scale", "queue")
PEERS = ("kyverno",)  # optional peers (`--with`), built on demand; the full mode runs them all


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["quick", "full"], default="quick")
    p.add_argument("--tiny", action="store_true", help="shrink every section to seconds (checks the output's shape)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where latest.json, report.md and the charts go")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--cluster-dir", type=Path, help="use this running devcluster instead of bringing one up")
    p.add_argument("--keep-workdir", action="store_true", help="keep the temporary files (logs, profiles)")
    p.add_argument("--with", dest="peers", action="append", default=[], choices=PEERS,
                   help="also measure this peer side by side (built on demand; --mode full runs every peer)")
    p.add_argument("--without", dest="no_peers", action="append", default=[], choices=PEERS,
                   help="leave this peer out of a full run")
    return p


def _section(results: dict[str, Any], name: str, work: Callable[[], Any]) -> Any:
    """Run one section; a failure is recorded in results["errors"] and the run goes on."""
    started = time.monotonic()
    try:
        value = work()
        log(f"{name}: done in {time.monotonic() - started:.0f} s")
        return value
    except Exception as error:  # noqa: BLE001 - one section's failure must not lose the others' figures
        results["errors"].append(f"{name}: {type(error).__name__}: {error}"[:2000])
        log(f"{name}: FAILED: {error}")
        traceback.print_exc()
        return None


async def prepare(bc: bench_cluster.BenchCluster) -> None:
    """The namespaces of the probe, the end-to-end runs and every burst, with the catalog Task."""
    async with Kube(bc.cluster) as kube:
        names = [bc.probe_namespace, bench_cluster.namespace_for("e2e", bc.largest_pool)]
        names += [balance.burst_namespace(c, n, k) for c in balance.CASES for n, k in bc.sizes.bursts]
        await asyncio.gather(*(balance.prepare_namespace(kube, ns) for ns in names))


async def start_peers(bc: bench_cluster.BenchCluster, with_kyverno: bool
                      ) -> tuple[bench_floor.FloorWebhook, bench_kyverno.Kyverno | None]:
    """The floor webhook (always) and Kyverno (when asked), started and switched off."""
    async with Kube(bc.cluster) as kube:
        floor = await bench_floor.start(bc.cluster, kube, bench_cluster.WEBHOOK_PATH, bc.probe_namespace, log)
        kyverno = None
        if with_kyverno:
            log("peers: starting Kyverno (built on demand: minutes the first time)")
            pool = bench_kyverno.bench_pool(bc.policy_file.read_text(), bench_cluster.pool_name(bc.largest_pool))
            probe = bench_cluster.namespace_for("kyverno-probe", bc.largest_pool)  # allowed by the pool
            try:
                kyverno = await bench_kyverno.start(bc.cluster, kube, pool, probe, log)
            except BaseException:
                floor.stop()
                raise
            log(f"peers: Kyverno {kyverno.version} in force {kyverno.start_s} s after its start")
    return floor, kyverno


def run_peer_sections(results: dict[str, Any], bc: bench_cluster.BenchCluster, wanted: set[str],
                      with_kyverno: bool) -> bench_kyverno.Kyverno | None:
    """e2e in every mode, then admission through the API server in every mode (section peers)."""
    started = _section(results, "peers (start)", lambda: asyncio.run(start_peers(bc, with_kyverno)))
    if not started:
        return None
    floor, kyverno = started
    modes = e2e.MODES + ((e2e.KYVERNO,) if kyverno else ())
    switch = peers.make_switch(bc, floor, kyverno, [bench_cluster.namespace_for("e2e", bc.largest_pool)])
    try:
        _peer_sections(results, bc, wanted, kyverno, switch, modes)
    finally:  # egress-placer's webhook alone in force again, whatever failed
        _section(results, "peers (restore)", lambda: asyncio.run(_in_force(bc, switch, "with")))
        floor.stop()
    return kyverno


async def _in_force(bc: bench_cluster.BenchCluster, switch: e2e.Switch, mode: str) -> None:
    async with Kube(bc.cluster) as kube:
        await switch(kube, mode)


def _peer_sections(results: dict[str, Any], bc: bench_cluster.BenchCluster, wanted: set[str],
                   kyverno: bench_kyverno.Kyverno | None, switch: e2e.Switch, modes: tuple[str, ...]) -> None:
    e2e_out: dict[str, Any] = dict(results["e2e"])
    if "e2e" in wanted:
        e2e_out = _section(results, "e2e", lambda: asyncio.run(e2e.run(bc, log, switch, modes))) or {}
        kyverno_e2e = e2e_out.pop(e2e.KYVERNO, None)
        schema.merge(results["e2e"], e2e_out)
        e2e_out = {**results["e2e"], **({e2e.KYVERNO: kyverno_e2e} if kyverno_e2e else {})}
    adm = None
    if "peers" in wanted:
        peer_modes = tuple(m for m in modes if m in peers.MODE_KEYS)  # the patching floor is e2e's alone
        adm = _section(results, "peers", lambda: asyncio.run(peers.admission(bc, switch, peer_modes, log)))
        if adm:
            schema.merge(results["peers"]["admission"], adm)
    if kyverno is not None:
        schema.merge(results["peers"]["kyverno"], peers.kyverno_summary(kyverno, e2e_out, adm))
        results["peers"]["kyverno"]["cannot"] = list(bench_kyverno.CANNOT)


def run_cluster_sections(results: dict[str, Any], sizes: Sizes, workdir: Path, wanted: set[str],
                         cluster_dir: Path | None, with_kyverno: bool = False) -> None:
    log("cluster: bringing up the local cluster" if cluster_dir is None else f"cluster: using {cluster_dir}")
    bc = bench_cluster.up(sizes, workdir, log, cluster_dir)
    kyverno = None
    try:
        if wanted & {"e2e", "peers", "balance", "scale"}:
            pid = bc.start_controller()
            results["scale"]["rss_baseline_mb"] = scale.memory(pid).get("VmRSS")
            asyncio.run(prepare(bc))
        if wanted & {"e2e", "peers"}:
            kyverno = run_peer_sections(results, bc, wanted, with_kyverno)
        if "balance" in wanted:
            rows: list[dict[str, Any]] = []
            for case in ("a", "b"):
                rows += _section(results, f"balance ({case})", lambda c=case: asyncio.run(balance.run_case(bc, c, log))) or []
            bc.stop_controller()
            bc.start_controller({"EGRESS_PLACER_BALANCE": "load-without-assumptions"})
            rows += _section(results, "balance (c)", lambda: asyncio.run(balance.run_case(bc, "c", log))) or []
            schema.merge(results["balance"], balance.summarize(rows))
            bc.stop_controller()  # the egress case starts the controller with its own policy, and stops it
            egress = _section(results, "balance (egress)", lambda: balance_egress.run_egress_case(
                bc.cluster.dir, burst=sizes.egress_burst, nodes=bc.pools[min(bc.pools)], log=log))
            if egress:
                schema.merge(results["balance"]["egress"], egress)
            replicas = _section(results, "balance (replicas)", lambda: balance_replicas.run(bc, sizes.replica_burst, log))
            if replicas:
                schema.merge(results["balance"], balance_replicas.summarize(replicas))
        if "scale" in wanted:
            kyverno_cpu = kyverno.cpu_seconds() if kyverno is not None else None
            out = _section(results, "scale", lambda: scale.run(bc, log))
            if kyverno is not None:  # the same objects were in the API server for Kyverno's informers too
                used = kyverno.cpu_seconds()
                results["peers"]["kyverno"].update(
                    rss_at_scale_mb=kyverno.rss_mb(), scale_nodes=(out or {}).get("nodes"), scale_pods=(out or {}).get("pods"),
                    scale_cpu_s=round(used - kyverno_cpu, 2) if used is not None and kyverno_cpu is not None else None)
            if out:
                schema.merge(results["scale"], out)
            if not bc.owned:
                asyncio.run(scale.clean(bc))
        if "queue" in wanted:  # its own controller, on the queue policy (bench/queue.py)
            bc.stop_controller()
            out = _section(results, "queue", lambda: bench_queue.run(sizes, log, bc.cluster.dir))
            if out:
                schema.merge(results["queue"], out)
    finally:
        if kyverno is not None and not bc.owned:
            kyverno.stop()
        bc.down()


def findings(results: dict[str, Any]) -> list[str]:
    """What the profiles and figures say about each missed target."""
    out = []
    missed = {t["name"].split(" ")[0] for t in results["targets"] if t["met"] is False}
    adm = results["admission"]
    if "admission" in missed and adm["profile"]["top_inclusive"]:
        incl = {r["function"].split(" (")[0]: r["pct"] for r in adm["profile"]["top_inclusive"]}
        head = adm["headline"]
        own = ", ".join(f"{r['function']} {r['pct']}%" for r in adm["profile"]["top_self"][:8])
        out.append(
            f"Admission: the server's CPU per request is {head['cpu_ms_per_request']} ms against the floor's "
            f"{head['floor_cpu_ms_per_request']} ms (aiohttp + TLS + JSON). py-spy: Admission.review (the decision, "
            f"the patch, the Events) {incl.get('Admission.review', '?')}% of the samples, of which decode "
            f"{incl.get('decode', '?')}%, json_patch {incl.get('json_patch', '?')}%, decide {incl.get('decide', '?')}%, "
            f"events {incl.get('Admission._emit', '?')}%; the rest is the server: most own time in {own}.")
        if adm["max_throughput_rps"] is not None and adm["max_throughput_rps"] < report.ADMISSION_MAX_THROUGHPUT:
            def at_best(target: str) -> dict[str, Any]:
                rows = [r for r in adm["closed_loop"] if r["target"] == target and r["throughput_rps"]]
                return max(rows, key=lambda r: r["throughput_rps"]) if rows else {}
            mine, floor = at_best("egress-placer"), at_best("floor")
            budget = 1000 / report.ADMISSION_MAX_THROUGHPUT
            out.append(
                f"Admission throughput: {adm['max_throughput_rps']:,.0f} req/s against the floor's "
                f"{adm['floor_max_throughput_rps']:,.0f}; both answer on one Python thread (the floor is the same aiohttp "
                f"server and TLS doing no work). At their best rates the server's CPU per request is "
                f"{mine.get('server_cpu_ms_per_request')} ms against the floor's {floor.get('server_cpu_ms_per_request')}. "
                f"{report.ADMISSION_MAX_THROUGHPUT:,.0f} req/s on one thread needs at most {budget:.2f} ms: the review's "
                "decoding, the decision, the patch, the Events and the metrics would have to fit in the difference "
                "between that and the floor's, a fraction of what they take (Admission.review's share above). More "
                "processes behind one port, or more replicas behind the Service (supported), would reach it; each "
                "holds only its own assumed placements, so a burst split between them is spread on partial views "
                "until the pods are seen. The figure here is one process.")
    if "core" in missed and results["core"]["profile"]["top_self"]:
        rows = results["core"]["rows"]
        top = ", ".join(f"{r['function']} {r['pct']}%" for r in results["core"]["profile"]["top_self"][:5])
        out.append("Decision core: " + "; ".join(f"{r['pool_nodes']:,} pool nodes {r['decisions_per_s']} decisions/s, "
                                                  f"{r['handler_us']} us per review" for r in rows)
                   + f". cProfile of the handler at the largest pool, most own time: {top}.")
    if "balance" in missed:
        for c in results["balance"]["cases"]:
            if c["case"] == "a" and c["imbalance"] > 1.1:
                why = ("so the spread is egress-placer's own choice: at Pod CREATE the run's own TaskRun assumption "
                       "still counts on the node picked at TaskRun CREATE (Admission._tekton_pod forgets it only after "
                       "_place), which biases each choice by one run"
                       if c["preferred_node_honored"] == 1.0 else "so the scheduler overrode some preferences")
                out.append(f"Balance (a) {c['runs']} on {c['pool_nodes']}: {list(c['pods_per_node'].values())}; every "
                           f"pod honored the preferred node ({c['preferred_node_honored']}), {why}.")
    if "controller" in missed:
        s = results["scale"]
        out.append(f"Memory: RSS {s['rss_mb']} MB after sync (peak {s['rss_peak_mb']} MB); {s['rss_baseline_mb']} MB "
                   f"on the small cluster; the ClusterState itself is {s['state_mb']} MB of Python heap.")
    if "end" in missed:
        e = results["e2e"]
        calls = e["webhook_call_ms"]
        handled = e["handler_ms"]
        text = (f"End to end: p50 {e['with']['p50_s']} s with vs {e['without']['p50_s']} s without "
                f"({e['added_p50_ms']} ms added). Both webhook calls are on every run's path: the API server timed them "
                f"at {calls['taskruns']} ms per TaskRun CREATE and {calls['pods']} ms per Pod CREATE, of which "
                f"egress-placer's handler is {handled['taskruns']} and {handled['pods']} ms (the rest: the API server "
                "encoding the review and applying the patch, TLS and HTTP, and waiting for one of the 2 cores).")
        if None not in (calls["taskruns"], calls["pods"], e["without"]["p50_s"]):
            floor = (1000 * e["without"]["p50_s"] + calls["taskruns"] + calls["pods"]) / (1000 * e["without"]["p50_s"])
            text += (f" The two calls alone put the ratio at {floor:.2f} on this {1000 * e['without']['p50_s']:.0f} ms "
                     f"KWOK path, where the 1.10 target leaves {100 * e['without']['p50_s']:.1f} ms for both. On real "
                     "nodes (image pulls, container starts: seconds) the same milliseconds are a fraction of a percent.")
        cpu_with, cpu_without = e["with"]["cpu_ms_per_run"], e["without"]["cpu_ms_per_run"]
        if cpu_with.get("total") and cpu_without.get("total"):
            mine = next((p for p in cpu_with if p.startswith("egress-placer")), None)
            text += (f" CPU per run, all processes: {cpu_with['total']} ms with vs {cpu_without['total']} ms without"
                     + (f" (egress-placer {cpu_with[mine]} vs {cpu_without.get(mine)} ms, kube-apiserver "
                        f"{cpu_with.get('kube-apiserver')} vs {cpu_without.get('kube-apiserver')} ms)" if mine else "") + ".")
        out.append(text)
    out += _peer_findings(results)
    return out


def _peer_findings(results: dict[str, Any]) -> list[str]:
    """Where egress-placer's cost over the floor's (and over Kyverno's) comes from, when those targets are missed."""
    missed = {t["name"] for t in results["targets"] if t["met"] is False}
    e = results["e2e"]
    out = []
    if any("floor webhook" in name for name in missed):
        calls, floor, handled = e["webhook_call_ms"], e["floor_webhook_call_ms"], e["handler_ms"]
        out.append(
            f"Against the floor: egress-placer adds {e['added_p50_ms']} ms at p50, the no-op Go webhook on the same hooks "
            f"{e['floor_added_p50_ms']} ms. The API server timed a call at {calls['taskruns']} / {calls['pods']} ms "
            f"(TaskRun / Pod CREATE) to egress-placer against {floor['taskruns']} / {floor['pods']} ms to the floor; "
            f"egress-placer's handler itself is {handled['taskruns']} / {handled['pods']} ms of that: the rest of the gap "
            "is its HTTP/TLS/JSON stack (aiohttp on one Python thread) against Go's net/http, and the patch the API "
            "server applies (the floor sends none). By stage (medians, ms): TaskRun created to pod seen "
            f"{e['with']['stage_p50_ms']['to_pod']} with egress-placer, {e['floor']['stage_p50_ms']['to_pod']} with the "
            f"floor, {e['without']['stage_p50_ms']['to_pod']} with none: where that gap exceeds the Pod call, the time is "
            "in Tekton's path from run to pod (its reconcile of the placed podTemplate, the API server's other work), "
            "not in the webhook call itself.")
    k = results["peers"]["kyverno"]
    if k["version"] is not None and any("Kyverno" in name for name in missed):
        out.append(
            f"Against Kyverno {k['version']}: admission p99 {k['egress_placer_admission_p99_ms']} ms (egress-placer) vs "
            f"{k['admission_p99_ms']} ms; end-to-end added p50 {k['egress_placer_e2e_added_p50_ms']} ms vs "
            f"{k['e2e_added_p50_ms']} ms. egress-placer answers two hooks per run (the TaskRun and its Pod) where the "
            "policy answers one (the Pod), and chooses a node; the machine's load makes single figures noisy, see "
            "each round's p99 in peers.admission.modes.")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sizes = SIZES["tiny" if args.tiny else args.mode]
    wanted = {s.strip() for s in args.sections.split(",") if s.strip()}
    with_peers = (set(PEERS) if args.mode == "full" else set(args.peers)) - set(args.no_peers)
    unknown = wanted - set(SECTIONS)
    if unknown:
        parser().error(f"unknown sections: {', '.join(sorted(unknown))}")
    logger.remove()
    logger.add(sys.stderr, level="WARNING")  # in-process Admission: production filters debug lines the same way
    results = schema.empty()
    results["mode"] = sizes.name
    results["started"] = datetime.now(UTC).isoformat(timespec="seconds")
    results["machine"] = machine.describe()
    workdir = Path(tempfile.mkdtemp(prefix="egress-placer-bench-"))
    started = time.monotonic()
    log(f"mode {sizes.name}, sections {', '.join(s for s in SECTIONS if s in wanted)}, peers "
        f"{', '.join(sorted(with_peers)) or 'none'}, work dir {workdir}")
    try:
        if "admission" in wanted:
            out = _section(results, "admission", lambda: admission.run(sizes, workdir / "admission", log))
            if out:
                schema.merge(results["admission"], out)
        if "under_relist" in wanted:
            out = _section(results, "under_relist", lambda: under_relist.run(sizes.name, workdir / "under_relist", log))
            if out:
                schema.merge(results["admission"]["under_relist"], out)
        if "under_reconcile" in wanted:
            out = _section(results, "under_reconcile", lambda: under_reconcile.run(sizes.name, workdir / "under_reconcile", log))
            if out:
                schema.merge(results["admission"]["under_reconcile"], out)
        if "core" in wanted:
            out = _section(results, "core", lambda: core.run(sizes, log))
            if out:
                schema.merge(results["core"], out)
        if wanted & set(CLUSTER_SECTIONS):
            _section(results, "cluster", lambda: run_cluster_sections(results, sizes, workdir, wanted, args.cluster_dir,
                                                                      "kyverno" in with_peers))
    finally:
        results["duration_s"] = round(time.monotonic() - started, 1)
        results["machine"]["loadavg_end"] = machine.loadavg()
        results["targets"] = report.targets(results)
        args.out.mkdir(parents=True, exist_ok=True)
        images = _section(results, "charts", lambda: report.charts(results, args.out)) or []
        images += _section(results, "queue chart", lambda: bench_queue.chart(results["queue"], args.out)) or []
        (args.out / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "report.md").write_text(report.markdown(results, images, findings(results)))
        if not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(report.summary_table(results))
    print(f"\nwritten: {args.out / 'latest.json'}, {args.out / 'report.md'}, {', '.join(images) or 'no charts'}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
