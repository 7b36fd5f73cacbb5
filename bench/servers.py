"""The two HTTPS servers the admission benchmark compares, each run as its own process:

    python -m bench.servers egress-placer --tls-dir DIR [--pool-nodes N]
    python -m bench.servers floor --tls-dir DIR

`egress-placer`: the controller's own `AdmissionServer` and `Admission`, on the controller's event loop
(`run_event_loop`: uvloop), over a `ClusterState` filled
in memory (pool and ordinary nodes, namespaces, the catalog's Tasks, StepActions and Pipelines,
running pods), real `Metrics`, JSON logging at INFO as in production, and an event sink with the
EventRecorder's bounded, non-blocking queue drained by a thread (no API server).
`floor`: the same library (aiohttp, on asyncio's own loop), the same TLS context and certificate, answering every review
"allowed, no patch" after reading and parsing the body: what any Python webhook costs.

Each prints `READY <port>` on stdout once it accepts connections, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from controller.admission.certs import KeyPair, ServingTLS
from controller.admission.handlers import Admission
from controller.admission.server import MAX_REVIEW_BYTES, AdmissionServer, run_event_loop
from controller.app import configure_logging
from controller.metrics import Metrics
from controller.settings import Settings
from controller.state import ClusterState

from bench.workload import admission_policy, fill, inventory

ORDINARY_NODES = 100
PODS_PER_NODE = 20


class QueuedEvents:
    """An EventSink (and EventsOnCreation) shaped like the controller's EventRecorder: a bounded queue, `put_nowait`, drops
    when full; a daemon thread takes events off (and discards them instead of writing them)."""

    def __init__(self, max_queue: int = 1000) -> None:
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue(max_queue)
        self.dropped = 0
        threading.Thread(target=self._drain, name="event sink", daemon=True).start()

    def emit(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "") -> None:
        try:
            self._queue.put_nowait((dict(regarding), type, reason, note, action, time.time()))
        except queue.Full:
            self.dropped += 1

    def hold(self, token: str, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "", *, generate_name: str = "") -> None:
        """Admission's side (EventsOnCreation): no informer here to see the object, so queued at once."""
        self.emit(regarding, type, reason, note, action)

    def _drain(self) -> None:
        while True:
            self._queue.get()
            self._queue.task_done()


def serving_tls(tls_dir: Path) -> ServingTLS:
    tls = ServingTLS()
    tls.load(KeyPair((tls_dir / "tls.crt").read_bytes(), (tls_dir / "tls.key").read_bytes()))
    return tls


def settings() -> Settings:
    return Settings(
        webhook_host="127.0.0.1", webhook_port=0, health_host="127.0.0.1", health_port=0,
        tls_hosts=["127.0.0.1"], leader_election=False, log_format="json", log_level="INFO",
    )


async def egress_placer(tls: ServingTLS, pool_nodes: int) -> int:
    s = settings()
    configure_logging(s)
    state = ClusterState(admission_policy(), clock=time.time, assumption_ttl=s.assumption_ttl_seconds)
    fill(state.apply, inventory(pool_nodes, ORDINARY_NODES, PODS_PER_NODE))
    metrics = Metrics()
    server = AdmissionServer(s, Admission(state, metrics, QueuedEvents(), s), metrics, tls, readiness=lambda: None)
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
