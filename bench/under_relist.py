"""Section admission.under_relist: the admission p99 while the pod informer relists, next to it idle.

    python -m bench.under_relist [--mode quick|full|tiny] [--out DIR]   (this row alone, merged into DIR/latest.json)
    python -m bench.under_relist serve --tls-dir DIR --pods N           (the server process, used by the above)

The server process is the controller's own: `AdmissionServer` and `Admission` on its event loop
(`run_event_loop`: uvloop), over the controller's state filled as in the admission section (pool and
ordinary nodes, namespaces, the catalog), with its pods fed by the real `Informer` on the pods resource
from an in-process list/watch API (`ListWatchApi`): N plain running pods served as JSON pages of
LIST_PAGE_SIZE (decoded per page, as the client does). SIGUSR1 makes the watch end in 410 Gone RELIST_GAP_SECONDS
after each list, so the informer relists again and again (not back to back: a relist that hogged the
interpreter without pause would starve any thread, lock or no lock); SIGUSR2 lets the watch idle again and prints `RELISTS <count> <mean s>`.
A load generator process (bench/loadgen.py) sends reviews at a steady rate over HTTPS on loopback, for
`seconds` idle and `seconds` relisting, `rounds` times; the p99 of each phase is the median of its rounds.
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from kubernetes.client.exceptions import ApiException

from bench import under_load
from bench.under_load import RATE_RPS, Log

POOL_NODES = 10
RELIST_GAP_SECONDS = 2.0  # while relisting: the quiet watch between the end of one list and the next 410
PODS_PER_NODE = 20
SETTLE_SECONDS = 3.0  # after relisting stops: the list in flight ends and the server drains before the next idle phase
# (pods, seconds per phase, rounds) per bench mode
PLAN = {"full": (20000, 10.0, 2), "quick": (20000, 5.0, 2), "tiny": (2000, 1.0, 1)}


class ListWatchApi:
    """A KubeApi for one collection: `call` serves its pages (JSON, decoded per call), `stream` a watch
    that sends nothing. While `relisting` is set, a watch ends `gap` seconds after the last list and the
    next one answers 410 Gone: the informer relists, watches quietly for `gap` seconds, relists..."""

    timeout = 10.0

    def __init__(self, objs: list[dict[str, Any]], page_size: int, gap: float = RELIST_GAP_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pages = [json.dumps(objs[i:i + page_size]).encode() for i in range(0, len(objs), page_size)] or [b"[]"]
        self.gap = gap
        self.clock = clock
        self.listed_at = clock()
        self.relisting = threading.Event()
        self.stopped = threading.Event()

    def call(self, method: str, path: str, *, query: Mapping[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        index = int((query or {}).get("continue") or 0)
        meta: dict[str, Any] = {"resourceVersion": "1"}
        if index + 1 < len(self.pages):
            meta["continue"] = str(index + 1)
        else:
            self.listed_at = self.clock()
        return {"items": json.loads(self.pages[index]), "metadata": meta}

    def stream(self, path: str, *, query: Mapping[str, Any], timeout: Any) -> "QuietWatch":
        if self.relist_due():
            raise ApiException(status=410, reason="Gone")
        return QuietWatch(self)

    def relist_due(self) -> bool:
        return self.relisting.is_set() and self.clock() - self.listed_at >= self.gap


class QuietWatch:
    """A watch response that sends nothing and ends when a relist is due (or the API stops)."""

    connection = None

    def __init__(self, api: ListWatchApi) -> None:
        self.api = api

    def stream(self, amt: Any = None, decode_content: Any = None) -> Iterator[bytes]:
        while not (self.api.relist_due() or self.api.stopped.is_set()):
            self.api.stopped.wait(0.02)
        yield from ()

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class Relists:
    """Counts and times the informer's lists (on_replace); the first is the initial sync."""

    def __init__(self, replace: Callable[[list[dict[str, Any]]], None]) -> None:
        self._replace = replace
        self.seconds: list[float] = []

    def __call__(self, objs: list[dict[str, Any]]) -> None:
        started = time.perf_counter()
        self._replace(objs)
        self.seconds.append(time.perf_counter() - started)


def summarize(pods: int, rate: float, seconds: float, idle: list[dict[str, Any]], relist: list[dict[str, Any]],
              relists: list[tuple[int, float]]) -> dict[str, Any]:
    """The row: the median p99 of each phase's runs, each run's p99, and the relists the phases saw."""
    return {**under_load.phases(idle, relist, "relist", relists, "relists", "relist_s"),
            "pods": pods, "rate_rps": rate, "seconds": seconds}


# -- the server process ---------------------------------------------------------------------------


async def serve(tls_dir: Path, pods: int) -> None:
    from controller.admission.handlers import Admission
    from controller.admission.server import AdmissionServer
    from controller.app import configure_logging, tune_interpreter
    from controller.kube import informer
    from controller.metrics import Metrics
    from controller.runner import Runner
    from controller.state import ClusterState

    from bench.servers import HeldEvents, serving_tls, settings
    from bench.workload import admission_policy, fill, inventory

    s = settings()
    configure_logging(s)
    tune_interpreter()  # as controller.app.run does
    state = ClusterState(admission_policy(), clock=time.time, assumption_ttl=s.assumption_ttl_seconds)
    ordinary = max(pods // PODS_PER_NODE - POOL_NODES - 2, 1)
    inv = inventory(POOL_NODES, ordinary, PODS_PER_NODE)
    fill(state.apply, type(inv)(tuple(o for o in inv.objects if o[0] != "Pod")))
    api = ListWatchApi([o for kind, o in inv.objects if kind == "Pod"][:pods], informer.LIST_PAGE_SIZE)
    metrics = Metrics()
    relists = Relists(lambda objs: state.replace("Pod", objs))
    pod_informer = informer.Informer(api, informer.pods(), relists, lambda e, o: state.apply("Pod", e, o), metrics)  # type: ignore[arg-type]
    runner = Runner()
    informer.start_informers(runner, [pod_informer])
    await asyncio.to_thread(pod_informer.synced.wait)
    server = AdmissionServer(s, Admission(state, metrics, HeldEvents(), s), metrics, serving_tls(tls_dir), readiness=lambda: None)
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    mark = [0]

    def relist_off() -> None:
        api.relisting.clear()
        done = relists.seconds[mark[0]:]
        print(f"RELISTS {len(done)} {statistics.mean(done) if done else 0.0:.4f}", flush=True)

    def relist_on() -> None:
        mark[0] = len(relists.seconds)
        api.relisting.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, relist_on)
    loop.add_signal_handler(signal.SIGUSR2, relist_off)
    print(f"READY {server.webhook_port}", flush=True)
    await stop.wait()
    api.stopped.set()
    await server.stop()
    runner.stop()


# -- the bench side -------------------------------------------------------------------------------


def run(mode: str, workdir: Path, log: Log) -> dict[str, Any]:
    pods, seconds, count = PLAN[mode]
    log(f"under_relist: starting the server with {pods:,} pods")
    idle, relist, counts = under_load.rounds(
        "under_relist", ["--pods", str(pods)], workdir, seconds, count, SETTLE_SECONDS, log,
        lambda n, mean: f"{n} relists of {pods:,} pods, {mean:.2f} s each",
    )
    return summarize(pods, RATE_RPS, seconds, idle, relist, counts)


def merge_into(out: Path, row: dict[str, Any]) -> None:
    """Write `row` as admission.under_relist into out/latest.json, leaving every other key as it is."""
    under_load.merge_into(out, "under_relist", row)


def main(argv: list[str] | None = None) -> int:
    return under_load.main("under_relist", __doc__, list(PLAN), {"pods": 20000}, serve, run, argv)


if __name__ == "__main__":
    sys.exit(main())
