"""What `bench.under_relist` and `bench.under_reconcile` share: a server process that starts its
background work on SIGUSR1 and stops it on SIGUSR2 (then prints `WORD <count> <mean s>`), rounds of an
idle and a busy admission phase at the headline rate, the command line, and the row they write into
latest.json under `admission.<key>`."""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Coroutine

REPO = Path(__file__).resolve().parents[1]
RATE_RPS = 200  # the admission headline's rate
Log = Callable[[str], None]
Phase = dict[str, Any]


def rounds(
    key: str, command: list[str], workdir: Path, seconds: float, count: int, settle: float, log: Log,
    describe: Callable[[int, float], str],
) -> tuple[list[Phase], list[Phase], list[tuple[int, float]]]:
    """Start the server (`python -m bench.<key> serve ...`, `command`), then `count` rounds of an idle and a
    busy phase of `seconds` each, `settle` s apart; the idle and the busy phases' figures and, per round,
    what the server did while busy (count, mean seconds). `describe(count, mean)` ends each round's log line."""
    from bench.admission import Server, make_mix, run_point, write_tls

    workdir.mkdir(parents=True, exist_ok=True)
    write_tls(workdir / "tls")
    (workdir / "bodies.json").write_text(json.dumps([b.decode() for b in make_mix(64).bodies]))
    idle: list[Phase] = []
    busy: list[Phase] = []
    done: list[tuple[int, float]] = []
    point = {"mode": "open", "rate": RATE_RPS, "rate_rps": RATE_RPS, "warmup": 0.5, "seconds": seconds}
    with ExitStack() as stack:
        server = Server("egress-placer", workdir / "tls", workdir / f"server-{key.replace('_', '-')}.log",
                        command=["-m", f"bench.{key}", "serve", "--tls-dir", str(workdir / "tls"), *command])
        stack.callback(server.stop)
        run_point(server, workdir, {**point, "seconds": 1.0})  # warm the connections and the code paths
        for r in range(count):
            idle.append(run_point(server, workdir, point))
            server.process.send_signal(signal.SIGUSR1)
            busy.append(run_point(server, workdir, point))
            server.process.send_signal(signal.SIGUSR2)
            assert server.process.stdout is not None
            _, n, mean = server.process.stdout.readline().decode().split()
            done.append((int(n), float(mean)))
            time.sleep(settle)  # scenario: the work in flight ends before the next idle phase
            log(f"{key}: round {r + 1}: p99 idle {idle[-1]['p99_ms']} ms, busy {busy[-1]['p99_ms']} ms "
                f"({describe(int(n), float(mean))})")
    return idle, busy, done


def phases(
    idle: list[Phase], busy: list[Phase], busy_word: str, done: list[tuple[int, float]], count_key: str, mean_key: str
) -> dict[str, Any]:
    """The figures of the rounds, under the keys the rows have always had: the median p99 and p50 of each
    phase (idle, and busy named `busy_word`), each round's p99, what the server did while busy (`count_key`:
    how many; `mean_key`: their mean seconds) and the load generator's errors."""

    def median(rows: list[Phase], key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return round(statistics.median(values), 3) if values else None

    total = sum(n for n, _ in done)
    return {
        "idle_p99_ms": median(idle, "p99_ms"),
        f"{busy_word}_p99_ms": median(busy, "p99_ms"),
        "idle_p99_ms_each": [r["p99_ms"] for r in idle],
        f"{busy_word}_p99_ms_each": [r["p99_ms"] for r in busy],
        "idle_p50_ms": median(idle, "p50_ms"),
        f"{busy_word}_p50_ms": median(busy, "p50_ms"),
        count_key: total,
        mean_key: round(sum(n * s for n, s in done) / total, 3) if total else None,
        "errors": sum(r["errors"] for r in idle + busy),
    }


def merge_into(out: Path, key: str, row: dict[str, Any]) -> None:
    """Write `row` as admission.<key> into out/latest.json, leaving every other key as it is."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "latest.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results.setdefault("admission", {})[key] = row
    path.write_text(json.dumps(results, indent=2) + "\n")


def main(
    key: str, doc: str | None, modes: list[str], serve_options: dict[str, int],
    serve: Callable[..., Coroutine[Any, Any, None]], run: Callable[[str, Path, Log], dict[str, Any]],
    argv: list[str] | None,
) -> int:
    """`python -m bench.<key> [--mode M] [--out DIR]`: run, merge the row into DIR/latest.json, print it;
    `python -m bench.<key> serve --tls-dir D [--OPTION N ...]`: the server, `serve(tls_dir, *options)`."""
    p = argparse.ArgumentParser(prog=f"python -m bench.{key}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")
    server = sub.add_parser("serve")
    server.add_argument("--tls-dir", type=Path, required=True)
    for option, default in serve_options.items():
        server.add_argument(f"--{option}", type=int, default=default)
    p.add_argument("--mode", choices=sorted(modes), default="full")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args(argv)
    if args.command == "serve":
        from controller.admission.server import run_event_loop

        run_event_loop(serve(args.tls_dir, *(getattr(args, o) for o in serve_options)))
        return 0
    import tempfile

    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    with tempfile.TemporaryDirectory(prefix=f"egress-placer-{key.replace('_', '-')}-") as work:
        row = run(args.mode, Path(work), lambda m: print(f"[bench {time.strftime('%H:%M:%S')}] {m}", flush=True))
    merge_into(args.out, key, row)
    print(json.dumps(row, indent=2))
    return 0
