"""The two HTTPS servers the admission benchmark compares, each run as its own process:

    python -m bench.servers egress-placer --tls-dir DIR [--pool-nodes N]
    python -m bench.servers floor --tls-dir DIR

`egress-placer`: the controller's own `AdmissionServer` and `Admission`, on the controller's event loop
(`run_event_loop`: uvloop), over a `ClusterState` filled
in memory (pool and ordinary nodes, namespaces, the catalog's Tasks, StepActions and Pipelines,
running pods), configured as one replica is (no connection recycling: nothing to re-pick with one
endpoint), the interpreter tuned and the heap frozen after the fill as the controller does
(`tune_interpreter` at start, `gc.freeze()` after its first sync), real `Metrics`, JSON logging at INFO as in production, and admission's Event sink as in the controller
(`HeldEvents`: held under a lock until the object exists; no API server).
`floor`: the same library (aiohttp, on asyncio's own loop), the same TLS context and certificate, answering every review
"allowed, no patch" after reading and parsing the body: what any Python webhook costs.

Each prints `READY <port>` on stdout once it accepts connections, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from controller.admission.certs import KeyPair, ServingTLS
from controller.admission.events import CreationEvents
from controller.admission.handlers import Admission
from controller.admission.server import MAX_REVIEW_BYTES, AdmissionServer, run_event_loop
from controller.app import configure_logging, tune_interpreter
from controller.metrics import Metrics
from controller.settings import ONE_ENDPOINT, Settings
from controller.state import ClusterState

from bench.workload import admission_policy, fill, inventory

ORDINARY_NODES = 100
PODS_PER_NODE = 20


class HeldEvents(CreationEvents):
    """Admission's Event sink as in the controller (`controller.admission.events.CreationEvents`): each Event is
    held under a lock until the informers see its object; nothing wakes a thread on admission's path. No
    informer runs here, so beyond KEPT the oldest held Event is let go silently (in the controller an
    informer's thread releases it to `QuietEvents`, off admission's path)."""

    KEPT = 1000

    def __init__(self) -> None:
        super().__init__(_Discarded(), max_held=10**9)

    def hold(self, token: str, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "", *,
             generate_name: str = "") -> None:
        super().hold(token, regarding, type, reason, note, action, generate_name=generate_name)
        with self._lock:
            while len(self._held) > self.KEPT:
                self._held.pop(next(iter(self._held)))


class _Discarded:
    """The EventSink behind `HeldEvents`: nothing reaches it (no object is ever seen)."""

    def emit(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "") -> None:
        return None


def serving_tls(tls_dir: Path) -> ServingTLS:
    tls = ServingTLS()
    tls.load(KeyPair((tls_dir / "tls.crt").read_bytes(), (tls_dir / "tls.key").read_bytes()))
    return tls


def settings() -> Settings:
    return Settings(
        webhook_host="127.0.0.1", webhook_port=0, health_host="127.0.0.1", health_port=0,
        tls_hosts=["127.0.0.1"], leader_election=False, log_format="json", log_level="INFO",
        **ONE_ENDPOINT,  # one server, as one replica runs: no connection recycling
    )


async def egress_placer(tls: ServingTLS, pool_nodes: int) -> int:
    s = settings()
    configure_logging(s)
    tune_interpreter()  # as controller.app.run does
    state = ClusterState(admission_policy(), clock=time.time, assumption_ttl=s.assumption_ttl_seconds)
    fill(state.apply, inventory(pool_nodes, ORDINARY_NODES, PODS_PER_NODE))
    gc.freeze()  # as after the controller's first sync (controller.app.wait_for_first_sync)
    metrics = Metrics()
    server = AdmissionServer(s, Admission(state, metrics, HeldEvents(), s), metrics, tls, readiness=lambda: None)
    await server.start()
    return server.webhook_port


async def floor(tls: ServingTLS) -> int:
    async def allow(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "response": {"uid": body["request"]["uid"], "allowed": True}}
        return web.json_response(answer, dumps=lambda v: json.dumps(v, separators=(",", ":")))

    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    app.router.add_post("/mutate", allow)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
    await site.start()
    return int(runner.addresses[0][1])


async def main(target: str, tls_dir: Path, pool_nodes: int) -> None:
    tls = serving_tls(tls_dir)
    port = await (egress_placer(tls, pool_nodes) if target == "egress-placer" else floor(tls))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print(f"READY {port}", flush=True)
    await stop.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.servers")
    parser.add_argument("target", choices=["egress-placer", "floor"])
    parser.add_argument("--tls-dir", type=Path, required=True)
    parser.add_argument("--pool-nodes", type=int, default=10)
    args = parser.parse_args()
    # Each on its own loop: egress-placer on the controller's (run_event_loop), the floor on asyncio's.
    (run_event_loop if args.target == "egress-placer" else asyncio.run)(main(args.target, args.tls_dir, args.pool_nodes))
    sys.exit(0)
