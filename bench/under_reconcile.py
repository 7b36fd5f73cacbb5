"""Section admission.under_reconcile: the admission p99 while the leader reconciles 5,000 pool nodes, next to it idle.

    python -m bench.under_reconcile [--mode quick|full|tiny] [--out DIR]   (this row alone, merged into DIR/latest.json)
    python -m bench.under_reconcile serve --tls-dir DIR --nodes N --pods P [--full 1] (the server process, used by the above)

The server process is the controller's own: `AdmissionServer` and `Admission` on its event loop
(`run_event_loop`: uvloop), over the controller's state filled with N pool nodes and P running pods on them
(the admission section's inventory), the heap frozen after that fill as after the controller's first sync
(controller.app.wait_for_first_sync), and the leader's `ReconcileLoop` with the reconcilers that read every
pool node, wired as controller.app wires them: taints, intruders (report mode) and node agents, each with its
cursor (controller.changes: a pass looks again at the nodes that changed since the last one; the first pass,
and one every 10 minutes, at every node), the pool's load in metrics (`PoolMetrics`, at most every 10 s) and
the queue; their writes go nowhere (`NoWrites`). While "busy" (SIGUSR1 to SIGUSR2), the loop leads and passes
back to back (woken after each event: a heartbeat alone no longer wakes it, ClusterState._node_changed), and a
thread applies node heartbeats (MODIFIED events of the pool nodes, NODE_EVENTS_PER_S) and pod restarts (a
running pod on a pool node deleted and added again, POD_RESTARTS_PER_S: each marks its node changed) into the
state; SIGUSR2 stops both and prints `PASSES <count> <mean s>`. Idle: no pass, no event. The first busy phase
starts with the full pass; with `serve --full 1` every pass is a full one (no cursors, the metrics every pass:
how the controller passed before #24's cursors).

A load generator process (bench/loadgen.py) sends the admission mix at RATE_RPS over HTTPS on loopback,
`seconds` idle and `seconds` busy, `rounds` times; the p99 of each phase is the median of its rounds.
`lock`: in this process, the longest hold of the load view's lock (which admission's node choice waits for)
by one pass of `PoolMetrics`, against the single hold of `LoadView.loads` over the whole pool that the pass
made before (#24).
"""

from __future__ import annotations

import asyncio
import gc
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from bench import under_load
from bench.under_load import RATE_RPS, Log

if TYPE_CHECKING:
    from controller.runner import GiveWay

ORDINARY_NODES = 10
NODE_EVENTS_PER_S = 500  # while busy: every pool node's heartbeat every 10 s at 5,000 nodes
POD_RESTARTS_PER_S = 50  # while busy: runs' pods ending and starting on pool nodes
SETTLE_SECONDS = 2.0  # after a busy phase: the pass in flight ends before the next idle phase
LOCK_PASSES = 5
# (pool nodes, pods, seconds per phase, rounds) per bench mode
PLAN = {"full": (5000, 20000, 10.0, 2), "quick": (5000, 20000, 5.0, 2), "tiny": (200, 800, 1.0, 1)}


class NoWrites:
    """The reconcilers' writer, evictor, Event sink and releaser: every call succeeds and goes nowhere."""

    def __getattr__(self, name: str) -> Callable[..., bool]:
        return lambda *args, **kwargs: True


def build_state(nodes: int, pods: int) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
    """The controller's state with `nodes` pool nodes, ORDINARY_NODES others and `pods` running pods spread
    over the pool nodes (the admission section's inventory: its namespaces, catalog and runs); the pool
    nodes' objects, and the pods' objects on them."""
    from controller.state import ClusterState

    from bench.workload import admission_policy, fill, inventory

    state = ClusterState(admission_policy(), clock=time.time)
    inv = inventory(nodes, ORDINARY_NODES, max(1, pods // nodes))
    fill(state.apply, inv)
    pool_nodes = [o for kind, o in inv.objects if kind == "Node" and o["metadata"]["name"].startswith("egress-")]
    names = {o["metadata"]["name"] for o in pool_nodes}
    return state, pool_nodes, [o for kind, o in inv.objects if kind == "Pod" and o["spec"].get("nodeName") in names]


def reconcile_loop(state: Any, leading: threading.Event, give_way: GiveWay | None = None, full: bool = False) -> Any:
    """The leader's loop over every reconciler that reads each pool node; `leading` set: it passes. `give_way`:
    the controller's `runner.GiveWay` (its walks give way to the reviews in flight), and the reconcilers'
    cursors, as controller.app wires them; `full`: no cursors, and the pool's metrics every pass."""
    from controller.metrics import Metrics
    from controller.queue.reconcile import QueueReconciler
    from controller.agents.reconcile import AgentReconciler
    from controller.intruders.reconcile import IntruderReconciler
    from controller.reconcile_loop import ReconcileLoop
    from controller.pool_status.metrics import PoolMetrics
    from controller.taints.reconcile import TaintReconciler

    from controller.runner import unpaced

    metrics, nowhere = Metrics(), NoWrites()
    paced = give_way.paced if give_way is not None else unpaced
    def cursor() -> Any:
        return None if full else state.changes.cursor()

    return ReconcileLoop(state, [
        TaintReconciler(state, nowhere, metrics, paced=paced, changes=cursor()),
        IntruderReconciler(state, nowhere, nowhere, metrics, "report", paced=paced, changes=cursor()),
        AgentReconciler(state, nowhere, nowhere, metrics, paced=paced, changes=cursor()),
        PoolMetrics(state, metrics, paced=paced, **({"min_interval": 0} if full else {})),
        QueueReconciler(state, nowhere, nowhere, metrics),
    ], is_leader=leading.is_set)


class Heartbeats:
    """While `leading` is set: MODIFIED events of the pool nodes into the state, `rate` per second, round robin,
    and every `pods_every`-th of them a pod of `pods` restarted (DELETED, then ADDED), round robin."""

    def __init__(self, state: Any, nodes: list[dict[str, Any]], leading: threading.Event, rate: float,
                 wake: Callable[[], None] = lambda: None, pods: list[dict[str, Any]] = (), pods_every: int = 10) -> None:  # type: ignore[assignment]
        self.state, self.nodes, self.leading, self.rate, self.wake = state, nodes, leading, rate, wake
        self.pods, self.pods_every = list(pods), pods_every
        self.stopped = threading.Event()

    def run(self) -> None:
        version, due = 0, time.monotonic()
        while not self.stopped.is_set():
            if not self.leading.wait(0.05):
                due = time.monotonic()
                continue
            node = self.nodes[version % len(self.nodes)]
            version += 1
            meta = {**node["metadata"], "resourceVersion": str(1000 + version)}
            self.state.apply("Node", "MODIFIED", {**node, "metadata": meta})
            if self.pods and not version % self.pods_every:
                pod = self.pods[(version // self.pods_every) % len(self.pods)]
                self.state.apply("Pod", "DELETED", pod)
                self.state.apply("Pod", "ADDED", pod)
            self.wake()
            due += 1.0 / self.rate
            self.stopped.wait(max(0.0, due - time.monotonic()))


class TimedLock:
    """A lock wrapper that keeps the duration of each outermost hold (seconds)."""

    def __init__(self, lock: Any) -> None:
        self._lock, self._depth, self._since = lock, 0, 0.0
        self.holds: list[float] = []

    def __enter__(self) -> "TimedLock":
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            self._since = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.holds.append(time.perf_counter() - self._since)
        self._lock.release()


def lock_holds(nodes: int, pods: int, passes: int = LOCK_PASSES) -> dict[str, Any]:
    """In this process: the longest hold of the load view's lock in one `PoolMetrics` pass (the worst of
    `passes`, and each pass's), the holds per pass, the pass's own time (median), and the single hold
    `LoadView.loads` makes over the whole pool (the pass's one hold before #24, median), all in ms. On a
    shared machine a hold also counts the time the thread waited for a core. And a full collection of
    the state, before and after gc.freeze() (ms, median of 3)."""
    from controller.metrics import Metrics
    from controller.pool_status.metrics import PoolMetrics

    state, _, _ = build_state(nodes, pods)
    unfrozen = full_collection_ms()
    gc.freeze()  # as after the controller's first sync: no collection of the state inside a hold
    frozen = full_collection_ms()
    lock = TimedLock(state.load._lock)  # noqa: SLF001 - measured, not changed
    state.load._lock = lock  # noqa: SLF001
    publish = PoolMetrics(state, Metrics(), min_interval=0)
    publish()  # the first pass makes every series
    whole, longest, seconds, holds = [], [], [], []
    for _ in range(passes):
        for pool in state.policy.pools:
            state.load.loads(pool)
        whole.append(sum(lock.holds))
        lock.holds.clear()
        started = time.perf_counter()
        publish()
        seconds.append(time.perf_counter() - started)
        longest.append(max(lock.holds))
        holds.append(len(lock.holds))
        lock.holds.clear()
    return {"nodes": nodes, "pods": pods, "passes": passes,
            "pass_ms": round(1000 * statistics.median(seconds), 2),
            "longest_hold_ms": round(1000 * max(longest), 3),
            "longest_hold_ms_each": [round(1000 * h, 3) for h in longest], "holds_per_pass": max(holds),
            "whole_pool_hold_ms": round(1000 * statistics.median(whole), 2),
            "full_collection_ms": unfrozen, "frozen_full_collection_ms": frozen}


def full_collection_ms(times: int = 3) -> float:
    """The median time of a full collection (gc.collect()) now, ms."""
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        gc.collect()
        seconds.append(time.perf_counter() - started)
    return round(1000 * statistics.median(seconds), 2)


def summarize(nodes: int, pods: int, rate: float, seconds: float, idle: list[dict[str, Any]], busy: list[dict[str, Any]],
              passes: list[tuple[int, float]], lock: dict[str, Any] | None = None) -> dict[str, Any]:
    """The row: the median p99 of each phase's runs, each run's p99, the passes the busy phases saw."""
    return {**under_load.phases(idle, busy, "busy", passes, "passes", "pass_s"),
            "nodes": nodes, "pods": pods, "rate_rps": rate, "seconds": seconds, "node_events_per_s": NODE_EVENTS_PER_S,
            "pod_restarts_per_s": POD_RESTARTS_PER_S,
            "lock": lock or {}}


# -- the server process ---------------------------------------------------------------------------


async def serve(tls_dir: Path, nodes: int, pods: int, full: bool = False) -> None:
    from controller.admission.handlers import Admission
    from controller.admission.server import AdmissionServer
    from controller.app import configure_logging, tune_interpreter
    from controller.metrics import Metrics
    from controller.runner import GiveWay, Runner

    from bench.servers import HeldEvents, serving_tls, settings

    s = settings()
    configure_logging(s)
    tune_interpreter()  # as controller.app.run does
    state, pool_nodes, pool_pods = build_state(nodes, pods)
    gc.freeze()  # as after the controller's first sync
    leading = threading.Event()
    give_way = GiveWay()
    loop_ = reconcile_loop(state, leading, give_way, full)
    heartbeats = Heartbeats(state, pool_nodes, leading, NODE_EVENTS_PER_S, wake=loop_.wake, pods=pool_pods,
                            pods_every=NODE_EVENTS_PER_S // POD_RESTARTS_PER_S)
    runner = Runner()
    runner.start("reconcile loop", loop_.run, on_stop=loop_.wake)
    runner.start("node heartbeats", lambda stop: heartbeats.run(), on_stop=heartbeats.stopped.set)
    server = AdmissionServer(s, Admission(state, Metrics(), HeldEvents(), s), Metrics(), serving_tls(tls_dir),
                             readiness=lambda: None)
    give_way.follow(server.reviews_in_flight)  # as controller.app does
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    mark = [0, 0.0]

    def busy_on() -> None:
        mark[:] = [loop_.passes, time.monotonic()]
        leading.set()
        loop_.wake()

    def busy_off() -> None:
        leading.clear()
        done, elapsed = loop_.passes - mark[0], time.monotonic() - mark[1]
        print(f"PASSES {done} {elapsed / done if done else 0.0:.4f}", flush=True)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, busy_on)
    loop.add_signal_handler(signal.SIGUSR2, busy_off)
    print(f"READY {server.webhook_port}", flush=True)
    await stop.wait()
    await server.stop()
    runner.stop()


# -- the bench side -------------------------------------------------------------------------------


def run(mode: str, workdir: Path, log: Log) -> dict[str, Any]:
    nodes, pods, seconds, count = PLAN[mode]
    log(f"under_reconcile: starting the server with {nodes:,} pool nodes and {pods:,} pods")
    idle, busy, passes = under_load.rounds(
        "under_reconcile", ["--nodes", str(nodes), "--pods", str(pods)], workdir, seconds, count, SETTLE_SECONDS, log,
        lambda n, mean: f"{n} passes over {nodes:,} pool nodes, {mean:.2f} s each",
    )
    log("under_reconcile: the load view's lock in a pool-metrics pass")
    return summarize(nodes, pods, RATE_RPS, seconds, idle, busy, passes, lock_holds(nodes, pods))


def merge_into(out: Path, row: dict[str, Any]) -> None:
    """Write `row` as admission.under_reconcile into out/latest.json, leaving every other key as it is."""
    under_load.merge_into(out, "under_reconcile", row)


def main(argv: list[str] | None = None) -> int:
    return under_load.main("under_reconcile", __doc__, list(PLAN), {"nodes": 5000, "pods": 20000, "full": 0}, serve, run, argv)


if __name__ == "__main__":
    sys.exit(main())
