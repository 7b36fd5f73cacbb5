"""Section 5: the controller's caches on a big cluster.

Through the API (bulk, concurrent): N Node objects `scale-NNNNN` (not managed by KWOK: label
`bench=scale`, a kubelet-like status), P Tekton-like pods bound to them with `spec.nodeName` (no
scheduler work), and E plain pods bound to the largest pool's nodes in a namespace that pool allows.
Then the controller starts (`python -m controller run` under its ServiceAccount) and we read:
- first sync: process start (/proc) to its "caches synced" log line; ready: to "egress-placer
  running" (the /readyz 200 moment: policy loaded, caches synced, certificate loaded);
- RSS (VmRSS) and its peak (VmHWM) from /proc/PID/status after sync and after the events;
- events: the E pods' phase is patched to Succeeded (E watch events that lower the pool's load);
  a dry-run AdmissionReview sent to the controller's own webhook every 20 ms reads the loads it
  sees, until they dropped by E. Seen rate = E / (time from the first patch to the moment seen);
  the write rate of the API server bounds it, so the lag after the last write is given too;
- in-process: the same watch events (JSON lines of the API's pod objects) through the informer's
  event handling and ClusterState.apply, as fast as they go: the controller's event capacity;
  and the Python heap (tracemalloc) a ClusterState of the same trimmed nodes and pods takes;
- a py-spy profile of the controller from its start to ready (where the first sync's time goes).
`rss_baseline_mb` (set by the caller) is the controller's RSS on the small cluster, before.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import gc
import json
import os
import signal
import ssl
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Callable

import aiohttp

from controller.core.policy import load_policy
from controller.kube.informer import Informer, pods, trim_node, trim_pod
from controller.metrics import Metrics
from controller.state import ClusterState

from bench import profiling
from bench.cluster import WEBHOOK_PATH, BenchCluster, bench_taskrun, namespace_for, read_json_lines
from bench.kube import Kube, bounded, ensure_namespace
from bench.workload import catalog_task, node, review, running_pod, tekton_pod

SCALE_NAMESPACE = "bench-scale"
CONCURRENCY = 64
PROBE_INTERVAL = 0.02
EVENTS_TIMEOUT = 120.0
Log = Callable[[str], None]


def scale_node(i: int) -> dict[str, Any]:
    body = node(f"scale-{i:05d}", {"bench": "scale", "node.kubernetes.io/pool": f"ci-{i % 20}"})
    body["metadata"].pop("resourceVersion")
    return body


def scale_pod(i: int, node_name: str) -> dict[str, Any]:
    """A Tekton-like pod (git-clone), bound to `node_name`."""
    run = bench_taskrun(SCALE_NAMESPACE, f"ci-{i:06d}")
    pod = tekton_pod(run, f"{i:08x}-0000-4000-8000-000000000000", ["ghcr.io/tektoncd-catalog/git-clone:v1.1.0"],
                     catalog_task("git-clone"))
    pod["spec"]["nodeName"] = node_name
    del pod["metadata"]["ownerReferences"]  # no such TaskRun: the garbage collector would delete the pod
    return pod


def _process_start(pid: int) -> float:
    """Wall-clock start of `pid` (boot time + start ticks)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def memory(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024.0, 1)
    return out


def _log_time(lines: list[dict[str, Any]], message_start: str, since: float) -> float | None:
    """The time of the first log line starting with `message_start` written after `since` (the log
    file keeps the lines of earlier controller processes)."""
    for line in lines:
        if str(line.get("message", "")).startswith(message_start):
            stamp = datetime.fromisoformat(line["time"]).timestamp()
            if stamp >= since:
                return stamp
    return None


async def create_all(kube: Kube, path_of: Callable[[dict[str, Any]], str], bodies: list[dict[str, Any]]) -> tuple[float, list[Any]]:
    started = time.monotonic()
    created = await bounded([lambda b=b: kube.create(path_of(b), b) for b in bodies], CONCURRENCY)
    return time.monotonic() - started, created


class WebhookProbe:
    """Reads the loads the running controller sees: a dry-run review of a pool pod to its webhook."""

    def __init__(self, config: dict[str, Any], namespace: str, pool_nodes: list[str]) -> None:
        client = config["webhooks"][0]["clientConfig"]
        self.url = client["url"]
        self.context = ssl.create_default_context(cadata=base64.b64decode(client["caBundle"]).decode())
        run = bench_taskrun(namespace, "probe")
        pod = tekton_pod(run, "probe", ["ghcr.io/tektoncd-catalog/git-clone:v1.1.0"], catalog_task("git-clone"))
        self.body = json.dumps(review(pod, "probe", dry_run=True)).encode()
        self.nodes = set(pool_nodes)

    async def load(self, session: aiohttp.ClientSession) -> int:
        async with session.post(self.url, data=self.body, ssl=self.context,
                                headers={"Content-Type": "application/json"}) as response:
            answer = await response.json()
        from bench.workload import decision_of, response_patch

        decision = decision_of(response_patch(answer)) or {}
        loads = decision.get("loads") or {}
        return sum(int(v.split("/")[0]) for n, v in loads.items() if n in self.nodes)


async def running(kube: Kube, namespace: str, count: int, timeout: float = 300.0) -> None:
    """Until KWOK has made the namespace's `count` pods Running: a later status patch of ours must not
    race with KWOK's own (it would set a Succeeded pod back to Running)."""
    deadline = time.monotonic() + timeout
    while True:
        items, _ = await kube.list(f"/api/v1/namespaces/{namespace}/pods")
        if sum((p.get("status") or {}).get("phase") == "Running" for p in items) >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the pods of {namespace} are not all Running after {timeout:.0f} s")
        await asyncio.sleep(1.0)


async def populate(bc: BenchCluster, log: Log) -> dict[str, Any]:
    sizes = bc.sizes
    k = bc.largest_pool
    events_namespace = namespace_for("scale", k)
    async with Kube(bc.cluster, connections=CONCURRENCY) as kube:
        await kube.delete(WEBHOOK_PATH)  # Tekton-like pods must not call a stopped webhook; start re-applies it
        await ensure_namespace(kube, SCALE_NAMESPACE)
        await ensure_namespace(kube, events_namespace)
        node_s, _ = await create_all(kube, lambda b: "/api/v1/nodes", [scale_node(i) for i in range(sizes.scale_nodes)])
        log(f"scale: {sizes.scale_nodes} nodes created in {node_s:.1f} s")
        names = [f"scale-{i:05d}" for i in range(sizes.scale_nodes)]
        pod_s, created = await create_all(kube, lambda b: f"/api/v1/namespaces/{SCALE_NAMESPACE}/pods",
                                          [scale_pod(i, names[i % len(names)]) for i in range(sizes.scale_pods)])
        log(f"scale: {sizes.scale_pods} pods created in {pod_s:.1f} s")
        pool = bc.pools[k]
        event_pods = [running_pod(events_namespace, f"steady-{i:05d}", pool[i % len(pool)], tolerate=f"pool-{k}")
                      for i in range(sizes.scale_event_pods)]
        for pod in event_pods:
            del pod["metadata"]["ownerReferences"]  # no such ReplicaSet: the garbage collector would delete the pod
        await create_all(kube, lambda b: f"/api/v1/namespaces/{events_namespace}/pods", event_pods)
        await running(kube, events_namespace, len(event_pods))
    objects = sizes.scale_nodes + sizes.scale_pods
    return {
        "create_s": round(node_s + pod_s, 1),
        "create_per_s": round(objects / max(node_s + pod_s, 1e-9)),
        "sample_pods": created[: sizes.scale_event_pods],
        "event_pods": [p["metadata"]["name"] for p in event_pods],
        "events_namespace": events_namespace,
    }


async def time_events(bc: BenchCluster, made: dict[str, Any], log: Log) -> dict[str, Any]:
    """Patch the event pods to Succeeded and time until the controller's loads drop by as many.
    When they do not within EVENTS_TIMEOUT, the figures say so (null) and `load_at_end` what was seen."""
    namespace = made["events_namespace"]
    names = made["event_pods"]
    async with Kube(bc.cluster, connections=CONCURRENCY) as kube:
        config = await kube.get(WEBHOOK_PATH)
        probe = WebhookProbe(config, namespace, bc.pools[bc.largest_pool])
        async with aiohttp.ClientSession() as session:
            baseline = await probe.load(session)
            target = baseline - len(names)
            loads: list[tuple[float, int]] = []

            async def watch_load() -> None:
                while not loads or loads[-1][1] > target:
                    loads.append((time.monotonic(), await probe.load(session)))
                    await asyncio.sleep(PROBE_INTERVAL)

            first = time.monotonic()
            watcher = asyncio.create_task(watch_load())
            try:
                await bounded([lambda n=n: kube.patch(f"/api/v1/namespaces/{namespace}/pods/{n}/status",
                                                      {"status": {"phase": "Succeeded"}}) for n in names], CONCURRENCY)
                last = time.monotonic()
                await asyncio.wait_for(watcher, EVENTS_TIMEOUT)
            except asyncio.TimeoutError:
                log(f"scale: the controller's load was still {loads[-1][1]} (want <= {target}) "
                    f"{EVENTS_TIMEOUT:.0f} s after the last write")
            finally:
                watcher.cancel()
    seen = loads[-1][0] if loads and loads[-1][1] <= target else None
    return {
        "events": len(names),
        "baseline_load": baseline,
        "load_at_end": loads[-1][1] if loads else None,
        "api_write_s": round(last - first, 3),
        "seen_after_s": round(seen - first, 3) if seen else None,
        "events_seen_per_s": round(len(names) / max(seen - first, 1e-9)) if seen else None,
        "lag_after_last_write_s": round(max(seen - last, 0.0), 3) if seen else None,
    }


def in_process_events(bc: BenchCluster, sample_pods: list[dict[str, Any]], sizes_nodes: int, seconds: float = 2.0) -> int:
    """Watch events (JSON lines of real API pod objects) through Informer._handle into a ClusterState."""
    state = ClusterState(load_policy(bc.policy_file.read_text()), clock=time.time)
    state.replace("Node", [trim_node(scale_node(i)) for i in range(sizes_nodes)])
    state.replace("Pod", [trim_pod(p) for p in sample_pods])
    informer = Informer(None, pods(), on_replace=partial(state.replace, "Pod"),  # type: ignore[arg-type]
                        on_event=partial(state.apply, "Pod"), metrics=Metrics())
    lines = []
    for i, pod in enumerate(sample_pods):
        changed = copy.deepcopy(pod)
        changed["metadata"]["labels"]["bench/round"] = str(i)
        changed["metadata"]["resourceVersion"] = str(10_000_000 + i)
        lines.append(json.dumps({"type": "MODIFIED", "object": changed}).encode())
    handled, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for line in lines:
            informer._handle(json.loads(line))  # noqa: SLF001 - the informer's own per-event path
        handled += len(lines)
    return round(handled / (time.perf_counter() - started))


def state_mb(bc: BenchCluster, nodes: int, pods: int) -> float:
    """Python heap (tracemalloc) a ClusterState retains for `nodes` nodes and `pods` pods, decoded
    from JSON and trimmed as the informer does (the decoded objects are dropped, as after a list)."""
    node_lines = [json.dumps(scale_node(i)) for i in range(nodes)]
    pod_lines = [json.dumps(scale_pod(i, f"scale-{i % nodes:05d}")) for i in range(pods)]
    gc.collect()
    tracemalloc.start()
    state = ClusterState(load_policy(bc.policy_file.read_text()), clock=time.time)
    state.replace("Node", [trim_node(json.loads(line)) for line in node_lines])
    state.replace("Pod", [trim_pod(json.loads(line)) for line in pod_lines])
    gc.collect()
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del state
    return round(size / 2**20, 1)


def profile_first_sync(bc: BenchCluster, out: Path, stop: threading.Event) -> dict[str, Any]:
    """py-spy of the controller from its start until `stop` is set (it is ready)."""
    deadline = time.monotonic() + 30
    record = None
    while record is None and time.monotonic() < deadline and not stop.is_set():
        record = bc.cluster.process("egress-placer-0")
        time.sleep(0.02)
    spy = None
    for _ in range(5):  # py-spy cannot attach until the interpreter is up: retry
        time.sleep(0.2)
        spy = profiling.start_py_spy(record.pid, 600, out) if record is not None else None
        if spy is None or (time.sleep(0.3) or spy.poll() is None):
            break
    if spy is None or spy.poll() is not None:
        return {"tool": None, "load": None, "samples": 0, "top_self": [], "top_inclusive": []}
    stop.wait()
    spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled and exits
    spy.wait(30)
    summary = profiling.summarize_collapsed(out) if out.exists() else {"samples": 0, "top_self": [], "top_inclusive": []}
    return {"tool": profiling.py_spy_version(), "load": "controller start to ready", **summary}


def run(bc: BenchCluster, log: Log) -> dict[str, Any]:
    sizes = bc.sizes
    bc.stop_controller()
    made = asyncio.run(populate(bc, log))
    ready = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        profile = pool.submit(profile_first_sync, bc, bc.workdir / "profile-first-sync.txt", ready)
        before = time.time()
        try:
            pid = bc.start_controller()
        finally:
            ready.set()
        start_call_s = time.time() - before
        sync_profile = profile.result()
    rss = memory(pid)
    lines = read_json_lines(bc.controller_log())
    process_start = _process_start(pid)
    synced_at = _log_time(lines, "caches synced", process_start)
    running_at = _log_time(lines, "egress-placer running", process_start)
    log(f"scale: controller ready; RSS {rss.get('VmRSS')} MB (peak {rss.get('VmHWM')} MB)")
    events = asyncio.run(time_events(bc, made, log))
    rss_after = memory(pid)
    log(f"scale: {events['events']} pod changes seen after {events['seen_after_s']} s "
        f"(writes took {events['api_write_s']} s)")
    bc.stop_controller()
    in_process = in_process_events(bc, made["sample_pods"], min(sizes.scale_nodes, 1000))
    heap = state_mb(bc, sizes.scale_nodes, sizes.scale_pods)
    return {
        "nodes": sizes.scale_nodes,
        "pods": sizes.scale_pods,
        "create_s": made["create_s"],
        "create_per_s": made["create_per_s"],
        "first_sync_s": round(synced_at - process_start, 2) if synced_at else None,
        "ready_s": round(running_at - process_start, 2) if running_at else None,
        "start_controller_s": round(start_call_s, 2),
        "rss_mb": rss.get("VmRSS"),
        "rss_peak_mb": rss.get("VmHWM"),
        "rss_after_events_mb": rss_after.get("VmRSS"),
        **events,
        "in_process_events_per_s": in_process,
        "state_mb": heap,
        "profile": sync_profile,
    }


async def clean(bc: BenchCluster) -> None:
    """Remove what `populate` made (only needed on a cluster the benchmark does not own)."""
    async with Kube(bc.cluster) as kube:
        await kube.delete(f"/api/v1/namespaces/{SCALE_NAMESPACE}/pods", gracePeriodSeconds=0)
        await kube.delete(f"/api/v1/namespaces/{namespace_for('scale', bc.largest_pool)}/pods", gracePeriodSeconds=0)
        await kube.delete("/api/v1/nodes", labelSelector="bench=scale")
