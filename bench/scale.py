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
- a py-spy profile of the controller from its start to ready (where the first sync's time goes);
- memory after the first sync of N nodes, P pods and T TaskRuns, lean and with tenant-sized metadata
  (in-process, no cluster: `first_sync_memory` below; `python -m bench.scale first-sync-memory N P T`).
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

from controller.core.json_wire import decode
from controller.core.policy import load_policy
from controller.kube.informer import Informer, pods, trim_node, trim_pod
from controller.metrics import Metrics
from controller.state import ClusterState

from bench import profiling
from bench.report import TENANT_EXTRA_LIMIT_MB
from bench.floor import pod_owner
from bench.cluster import WEBHOOK_PATH, BenchCluster, bench_taskrun, namespace_for, read_json_lines
from bench.kube import Kube, bounded, ensure_namespace
from bench.workload import catalog_task, node, review, running_pod, tekton_pod

SCALE_NAMESPACE = "bench-scale"
CONCURRENCY = 64
PROBE_RUN = "load-probe"  # the TaskRun that owns the WebhookProbe's pod (pending, opted out: it never runs)
PROBE_INTERVAL = 0.02
FIRST_SYNC_TIMEOUT = 600.0  # s the controller may take to be ready on the populated cluster (13 s measured quiet)
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
    """Reads the loads the running controller sees: a dry-run review of a pool pod to its webhook.

    The controller places a pod only when it is a run's pod: its controller owner resolves by uid to a
    TaskRun carrying its decision. So the probe's pod is owned by a real TaskRun (`create`: made pending
    and opted out of placement, so Tekton never starts it and admission assumes no load for it)."""

    def __init__(self, config: dict[str, Any], namespace: str, pool_nodes: list[str], owner: dict[str, Any]) -> None:
        client = config["webhooks"][0]["clientConfig"]
        self.url = client["url"]
        self.context = ssl.create_default_context(cadata=base64.b64decode(client["caBundle"]).decode())
        meta = owner["metadata"]
        run = bench_taskrun(namespace, meta["name"])
        pod = tekton_pod(run, meta["uid"], ["ghcr.io/tektoncd-catalog/git-clone:v1.1.0"], catalog_task("git-clone"))
        self.body = json.dumps(review(pod, "probe", dry_run=True)).encode()
        self.nodes = set(pool_nodes)

    @classmethod
    async def create(cls, kube: Kube, config: dict[str, Any], namespace: str, pool_nodes: list[str]) -> "WebhookProbe":
        """The probe with its owner TaskRun created through the API server (and so admitted)."""
        return cls(config, namespace, pool_nodes, await pod_owner(kube, namespace, PROBE_RUN))

    async def load(self, session: aiohttp.ClientSession) -> int:
        async with session.post(self.url, data=self.body, ssl=self.context,
                                headers={"Content-Type": "application/json"}) as response:
            answer = await response.json()
        from bench.workload import decision_of, response_patch

        decision = decision_of(response_patch(answer)) or {}
        if decision.get("moreNodes"):  # the decision lists the loads of LOADS_SHOWN nodes at most
            raise RuntimeError(f"the probe's pool has {decision['moreNodes']} nodes more than its decision lists")
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
        probe = await WebhookProbe.create(kube, config, namespace, bc.pools[bc.largest_pool])
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
            informer._handle(decode(line))  # noqa: SLF001 - the informer's own decoding and per-event path
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
    state.replace("Node", [trim_node(decode(line)) for line in node_lines])
    state.replace("Pod", [trim_pod(decode(line)) for line in pod_lines])
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
            # Its first list of every node and pod, with py-spy sampling it and (full mode) Kyverno's
            # informers listing the same objects on the same cores: minutes are possible, and measured.
            pid = bc.start_controller(ready_timeout=FIRST_SYNC_TIMEOUT)
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
    first_sync = first_sync_memory(sizes.scale_nodes, sizes.scale_pods, sizes.scale_taskruns, log)
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
        "first_sync_memory": first_sync,
    }


async def clean(bc: BenchCluster) -> None:
    """Remove what `populate` made (only needed on a cluster the benchmark does not own)."""
    async with Kube(bc.cluster) as kube:
        await kube.delete(f"/api/v1/namespaces/{SCALE_NAMESPACE}/pods", gracePeriodSeconds=0)
        await kube.delete(f"/api/v1/namespaces/{namespace_for('scale', bc.largest_pool)}/pods", gracePeriodSeconds=0)
        await kube.delete("/api/v1/nodes", labelSelector="bench=scale")


# -- memory after the first sync, with and without tenant-sized metadata ------------------------------
#
# The real informers (kube.informer.cluster_informers) and ClusterState of the controller, in a process of
# their own, list from a stand-in for the API server that makes each page of objects when asked (one
# page's JSON in memory at a time, as from a real one): N nodes, P Tekton pods, T TaskRuns, Tasks and
# namespaces. Twice: "lean" objects (nothing but what Kubernetes and Tekton write) and "tenant" objects
# (the same, plus what tenants and their tools write: kubectl apply's last-applied-configuration of each
# run, labels and annotations a CI system adds, scripts in Tasks). Memory that does not grow with tenant
# data means the two RSS figures differ by a fixed amount whatever the counts: the target is tenant RSS
# - lean RSS <= TENANT_EXTRA_LIMIT_MB (bench.report).

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
SYNC_NAMESPACES = 200
SYNC_TASKS = 500
TENANT_LABELS = {f"ci.example.com/{k}": v for k, v in (
    ("team", "platform"), ("repo", "github.com-example-monorepo"), ("branch", "feature-1234-longish-name"),
    ("commit", "0123456789abcdef0123456789abcdef01234567"), ("trigger", "push"), ("cost-center", "cc-4711"),
    ("env", "ci"), ("owner", "someone-at-example.com"))}


def _blob(seed: int, size: int) -> str:
    """`size` characters of JSON-looking text that do not repeat between objects (no interning)."""
    unit = json.dumps({"seed": seed, "build": f"{seed:08x}", "log": "https://ci.example.com/builds/"})
    return (unit * (size // len(unit) + 1))[:size]


def _team(i: int) -> str:
    return f"team-{i % SYNC_NAMESPACES:03d}"


def sync_namespace(i: int, tenant: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": _team(i), "uid": f"ns-{i}", "resourceVersion": "1",
                            "labels": {"kubernetes.io/metadata.name": _team(i)}}
    if tenant:
        meta["labels"].update(TENANT_LABELS)
        meta["annotations"] = {LAST_APPLIED: _blob(i, 1500), "egress-placer.io/pools": "pool-3"}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta, "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"}}


def sync_pod(i: int, nodes: int, tenant: bool) -> dict[str, Any]:
    pod = scale_pod(i, f"scale-{i % nodes:05d}")
    meta = pod["metadata"]
    meta.update(namespace=_team(i), uid=f"{i:08x}-1111-4000-8000-000000000000", resourceVersion=str(1000 + i))
    meta["ownerReferences"] = [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": f"ci-{i:06d}",
                                "uid": f"{i:08x}-2222-4000-8000-000000000000", "controller": True,
                                "blockOwnerDeletion": True}]
    pod["status"] = {"phase": "Running", "podIP": "10.0.0.1", "startTime": "2026-07-01T00:00:00Z"}
    if tenant:  # what Tekton copies from the run, and what the tenant's CI adds
        meta["labels"].update(TENANT_LABELS)
        meta.setdefault("annotations", {}).update({
            "pipeline.tekton.dev/release": "v1.15.0", "tekton.dev/ready": "READY",
            "ci.example.com/build-info": _blob(i, 2048), "ci.example.com/trace": _blob(i + 1, 512)})
        pod["spec"]["tolerations"] = [{"key": f"ci.example.com/t{j}", "operator": "Exists"} for j in range(8)]
    else:
        meta["labels"] = {k: v for k, v in meta["labels"].items() if k.startswith("tekton.dev/")}
        meta.pop("annotations", None)
    return pod


def sync_taskrun(i: int, tenant: bool) -> dict[str, Any]:
    run = bench_taskrun(_team(i), f"ci-{i:06d}")
    meta = run["metadata"]
    meta.update(uid=f"{i:08x}-2222-4000-8000-000000000000", resourceVersion=str(50_000 + i))
    meta["annotations"] = {"egress-placer.io/decision": json.dumps(
        {"pool": None, "reason": "no-match", "images": ["ghcr.io/tektoncd-catalog/git-clone:v1.1.0"]})}
    run["status"] = {"podName": f"ci-{i:06d}-pod", "startTime": "2026-07-01T00:00:00Z",
                     "conditions": [{"type": "Succeeded", "status": "Unknown", "reason": "Running"}]}
    if tenant:  # applied with kubectl apply: the annotation repeats the run; a CI system's labels and notes
        meta["labels"].update(TENANT_LABELS)
        meta["annotations"].update({LAST_APPLIED: json.dumps(run)[:4096] + _blob(i, 2048),
                                    "ci.example.com/build-info": _blob(i + 2, 2048)})
    return run


def sync_task(i: int, tenant: bool) -> dict[str, Any]:
    task = copy.deepcopy(catalog_task("git-clone"))
    task["metadata"] = {"name": f"task-{i:04d}", "namespace": _team(i), "uid": f"task-{i}", "resourceVersion": "1"}
    for step in task["spec"].get("steps") or []:
        if tenant:
            step["script"] = _blob(i, 8192)
        else:
            step.pop("script", None)
    return task


class PagedApi:
    """Stands in for KubeApi under the informers: pages of generated objects, watches that stay quiet."""

    timeout = 10.0

    def __init__(self, collections: dict[str, tuple[int, Callable[[int], dict[str, Any]]]]) -> None:
        self.collections = collections
        self.quiet = threading.Event()  # never set: a watch that sends nothing until stopped

    def call(self, method: str, path: str, *, query: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        count, make = self.collections.get(path, (0, lambda i: {}))
        start, limit = int((query or {}).get("continue") or 0), int((query or {}).get("limit") or 500)
        end = min(start + limit, count)
        page = {"items": [make(i) for i in range(start, end)],
                "metadata": {"resourceVersion": "1", "continue": str(end) if end < count else None}}
        return decode(json.dumps(page).encode())  # decoded from its JSON, as KubeApi.call does

    def stream(self, path: str, *, query: dict[str, Any], timeout: Any) -> Any:
        api = self

        class Quiet:
            def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
                api.quiet.wait()
                return iter(())

            def close(self) -> None: ...

            def release_conn(self) -> None: ...

        return Quiet()


def first_sync_rss(nodes: int, pods: int, taskruns: int, tenant: bool) -> dict[str, Any]:
    """In this process: the controller's informers list everything into a ClusterState; its memory."""
    from controller.kube.informer import cluster_informers, start_informers
    from controller.runner import Runner
    from controller.settings import Settings

    policy = load_policy(POLICY_FOR_SYNC)
    api = PagedApi({
        "/api/v1/nodes": (nodes, lambda i: scale_node(i)),
        "/api/v1/namespaces": (SYNC_NAMESPACES, lambda i: sync_namespace(i, tenant)),
        "/api/v1/pods": (pods, lambda i: sync_pod(i, nodes, tenant)),
        "/apis/tekton.dev/v1/taskruns": (taskruns, lambda i: sync_taskrun(i, tenant)),
        "/apis/tekton.dev/v1/tasks": (SYNC_TASKS, lambda i: sync_task(i, tenant)),
    })
    gc.collect()
    before = memory(os.getpid())
    state = ClusterState(policy, clock=time.time)
    informers = cluster_informers(api, state, Settings(), Metrics())  # type: ignore[arg-type]
    started = time.monotonic()
    start_informers(Runner(), informers)
    for informer in informers:
        informer.synced.wait(600)
    synced_s = time.monotonic() - started
    gc.collect()
    after = memory(os.getpid())
    kept = {"nodes": len(state.nodes), "pods": len(state.pods), "runs": len(state.stores["TaskRun"].items) + len(state.stores["PipelineRun"].items),
            "tekton": len(state.tekton), "namespaces": len(state.namespaces)}
    return {"tenant": tenant, "rss_before_mb": before.get("VmRSS"), "rss_mb": after.get("VmRSS"),
            "rss_peak_mb": after.get("VmHWM"), "sync_s": round(synced_s, 1), "kept": kept}


POLICY_FOR_SYNC = """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: pool-3
    nodeSelector: {node.kubernetes.io/pool: ci-3}
    namespaces: ["team-00*"]
    images: ["ghcr.io/tektoncd-catalog/*"]
"""


def first_sync_memory(nodes: int, pods: int, taskruns: int, log: Log = print) -> dict[str, Any]:
    """Lean and tenant-sized first syncs, each in a fresh process; the target: tenant RSS at most
    TENANT_EXTRA_LIMIT_MB above lean RSS."""
    import subprocess
    import sys

    out: dict[str, Any] = {"nodes": nodes, "pods": pods, "taskruns": taskruns}
    for mode in ("lean", "tenant"):
        args = [sys.executable, "-m", "bench.scale", "first-sync", str(nodes), str(pods), str(taskruns), mode]
        done = subprocess.run(args, capture_output=True, text=True, timeout=900, check=True)
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        log(f"scale: first sync ({mode}) of {nodes} nodes, {pods} pods, {taskruns} TaskRuns: "
            f"RSS {out[mode]['rss_mb']} MB (peak {out[mode]['rss_peak_mb']} MB)")
    lean, tenant = out["lean"]["rss_mb"], out["tenant"]["rss_mb"]
    out["tenant_extra_mb"] = round(tenant - lean, 1) if lean and tenant else None
    out["met"] = out["tenant_extra_mb"] is not None and out["tenant_extra_mb"] <= TENANT_EXTRA_LIMIT_MB
    return out


if __name__ == "__main__":  # python -m bench.scale first-sync NODES PODS TASKRUNS lean|tenant  (one JSON line)
    import sys

    if len(sys.argv) == 6 and sys.argv[1] == "first-sync":
        n, p, t = (int(a) for a in sys.argv[2:5])
        print(json.dumps(first_sync_rss(n, p, t, sys.argv[5] == "tenant")))
    elif len(sys.argv) == 5 and sys.argv[1] == "first-sync-memory":
        print(json.dumps(first_sync_memory(*(int(a) for a in sys.argv[2:5])), indent=1))
    else:
        raise SystemExit("usage: python -m bench.scale first-sync-memory NODES PODS TASKRUNS")
