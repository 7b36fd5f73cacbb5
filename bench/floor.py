"""The end-to-end floor: a no-op mutating webhook in Go (devcluster/tools/floor-webhook, standard library
only) registered on exactly egress-placer's hooks, so that egress-placer's added latency can be read
against what merely being a webhook costs.

Its MutatingWebhookConfiguration `egress-placer-bench-floor` is a copy of egress-placer's as the
cluster holds it (k8s/webhook.yaml: rules, namespaceSelector, matchConditions, failurePolicy,
timeoutSeconds, sideEffects, reinvocationPolicy), with each webhook renamed `<name>.floor` (so the API
server's histograms tell the two apart), `clientConfig.url` at the floor's loopback port and
`caBundle` the cluster CA that signed its serving certificate (devcluster/certs.py). It answers every
review "allowed" with no patch. The same process is also the patching floor (mode "floor_patch"): a
second configuration `egress-placer-bench-floor-patch`, hooks `<name>.floor-patch`, at `/mutate/patch`,
where it answers with a JSON Patch that changes nothing (a `test` of the object's kind). The API server
applies any patch it gets inside the call it times (it encodes the object, applies the patch, decodes
and defaults the result: about 0.8 ms for a Tekton pod) and skips that for an answer with no patch; a
webhook that places pods cannot answer with none, so that is the floor of what it can cost.

Whether it is active is read from the API server's own count of calls to it
(`apiserver_admission_webhook_admission_duration_seconds_count`), probed with dry-run creates of a
Tekton pod (which its matchConditions let through).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from prometheus_client.parser import text_string_to_metric_families

from controller.core.images import taskrun_images
from controller.tekton.core import TektonObjects
from controller.core.model import PLACEMENT_ANNOTATION
from devcluster import build
from devcluster.cluster import Cluster, ClusterError
from devcluster.process import free_port

from bench.cluster import TASK, bench_taskrun
from bench.e2e import FLOOR_SUFFIXES, metric_lines
from bench.kube import Kube
from bench.workload import catalog_task, in_namespace, tekton_pod

PROCESS = "floor-webhook"
CONFIG = "egress-placer-bench-floor"
CONFIGS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
FLOOR, PATCH_FLOOR = "floor", "floor_patch"  # the modes (bench/e2e.py, bench/peers.py)
SUFFIX = FLOOR_SUFFIXES[FLOOR]
# mode -> (configuration name, hook name suffix, URL path)
VARIANTS = {FLOOR: (CONFIG, SUFFIX, "/mutate"), PATCH_FLOOR: (CONFIG + "-patch", FLOOR_SUFFIXES[PATCH_FLOOR], "/mutate/patch")}
WEBHOOK_DURATION = "apiserver_admission_webhook_admission_duration_seconds"
Log = Callable[[str], None]


OWNER_RUN = "bench-pod-owner"  # the TaskRun that owns the benchmarks' dry-run pods (pending, opted out: it never runs)


async def pod_owner(kube: Kube, namespace: str, name: str = OWNER_RUN) -> dict[str, Any]:
    """A real TaskRun to own dry-run pods, created through the API server (and so admitted): egress-placer
    places a pod only when its controller owner resolves by uid to a TaskRun carrying its decision. Made
    pending and opted out of placement, so Tekton never starts it and admission assumes no load for it."""
    run = bench_taskrun(namespace, name)
    run["metadata"].setdefault("annotations", {})[PLACEMENT_ANNOTATION] = "none"
    run["spec"]["status"] = "TaskRunPending"
    path = f"/apis/tekton.dev/v1/namespaces/{namespace}/taskruns"
    return await kube.create(path, run, exist_ok=True) or await kube.get(f"{path}/{name}")


def bench_pod(namespace: str, name: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pod Tekton makes for the benchmarks' git-clone TaskRun `name` (its images match the pools);
    `owner`: the real TaskRun (`pod_owner`) it names as its controller, else a made-up one."""
    task = catalog_task(TASK)
    objects = TektonObjects()
    objects.put(in_namespace(task, namespace))
    run = bench_taskrun(namespace, owner["metadata"]["name"] if owner else name)
    uid = owner["metadata"]["uid"] if owner else f"{abs(hash(name)) % 10**8:08d}-5b1e-4c7e-9d1a-7f2b3c4d5e6f"
    pod = tekton_pod(run, uid, taskrun_images(run, objects).images, task)
    pod["metadata"]["name"] = f"{name}-pod"
    return pod


def webhook_calls(metrics_text: str, names: set[str]) -> float:
    """How many times the API server called the webhooks `names` so far (all operations, rejected or not)."""
    total = 0.0
    for family in text_string_to_metric_families(metric_lines(metrics_text, WEBHOOK_DURATION)):
        if family.name == WEBHOOK_DURATION:
            total += sum(s.value for s in family.samples if s.name.endswith("_count") and s.labels.get("name") in names)
    return total


def floor_configuration(egress_placer: dict[str, Any], url: str, ca_pem: bytes, mode: str = FLOOR) -> dict[str, Any]:
    """egress-placer's MutatingWebhookConfiguration with every hook renamed and pointed at the floor (`url`, its
    /mutate; for the patching floor, `mode` PATCH_FLOOR, its /mutate/patch)."""
    name, suffix, path = VARIANTS[mode]
    hooks = []
    for hook in copy.deepcopy(egress_placer["webhooks"]):
        hook["name"] = hook["name"] + suffix
        hook["clientConfig"] = {"url": url.removesuffix("/mutate") + path, "caBundle": base64.b64encode(ca_pem).decode()}
        hooks.append(hook)
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "egress-placer-bench"}}, "webhooks": hooks}


@dataclass
class FloorWebhook:
    cluster: Cluster
    probe_namespace: str
    configurations: dict[str, dict[str, Any]]  # mode (FLOOR, PATCH_FLOOR) -> its MutatingWebhookConfiguration
    pid: int

    def hook_names(self, mode: str = FLOOR) -> set[str]:
        return {h["name"] for h in self.configurations[mode]["webhooks"]}

    async def _calls_after_probe(self, kube: Kube, mode: str) -> tuple[float, float]:
        before = webhook_calls(await kube.text("/metrics"), self.hook_names(mode))
        pod = bench_pod(self.probe_namespace, f"floor-probe-{int(time.monotonic() * 1000)}")
        await kube.request("POST", f"/api/v1/namespaces/{self.probe_namespace}/pods", pod, params={"dryRun": "All"})
        return before, webhook_calls(await kube.text("/metrics"), self.hook_names(mode))

    async def wait(self, kube: Kube, active: bool, timeout: float = 30, mode: str = FLOOR) -> None:
        """Until a dry-run Tekton pod create does (or does not) call the floor of `mode`."""
        deadline = time.monotonic() + timeout
        while True:
            before, after = await self._calls_after_probe(kube, mode)
            if (after > before) == active:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"the {mode} webhook did not become {'active' if active else 'inactive'} in {timeout:.0f} s")
            await asyncio.sleep(0.3)

    async def register(self, kube: Kube, mode: str = FLOOR) -> None:
        path = f"{CONFIGS}/{VARIANTS[mode][0]}"
        if await kube.get(path) is None:
            await kube.create(CONFIGS, self.configurations[mode])
        await self.wait(kube, active=True, mode=mode)

    async def unregister(self, kube: Kube, mode: str = FLOOR) -> None:
        path = f"{CONFIGS}/{VARIANTS[mode][0]}"
        if await kube.get(path) is not None:
            await kube.delete(path)
            await self.wait(kube, active=False, mode=mode)

    def stop(self) -> None:
        self.cluster.stop_process(PROCESS)


async def start(cluster: Cluster, kube: Kube, egress_placer_config_path: str, probe_namespace: str, log: Log) -> FloorWebhook:
    """Build (on demand) and start the floor webhook; its configuration is made but not registered."""
    bin_dir = build.ensure_optional(PROCESS, log)
    cluster.stop_process(PROCESS)  # one left by an interrupted run on a kept cluster (--cluster-dir)
    cert, key = cluster.serving_cert(PROCESS)
    port = free_port()
    record = cluster.start_process(
        PROCESS, [str(bin_dir / PROCESS), "--listen", f"127.0.0.1:{port}", "--cert", str(cert), "--key", str(key)],
        port=port)
    await listening(port, "the floor webhook", record.log, record.pid)
    live = await kube.get(egress_placer_config_path)
    if live is None:
        raise ClusterError("egress-placer's MutatingWebhookConfiguration is not registered: nothing to copy")
    url, ca = f"https://127.0.0.1:{port}/mutate", cluster.ca_file.read_bytes()
    configurations = {mode: floor_configuration(live, url, ca, mode) for mode in VARIANTS}
    return FloorWebhook(cluster, probe_namespace, configurations, record.pid)


async def listening(port: int, what: str, log_file: str, pid: int, timeout: float = 20) -> None:
    """Until 127.0.0.1:`port` accepts connections; fails with the log's tail if process `pid` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if not os.path.exists(f"/proc/{pid}"):
                tail = Path(log_file).read_text(errors="replace")[-3000:] if os.path.exists(log_file) else ""
                raise ClusterError(f"{what} exited; its log {log_file}:\n{tail}") from None
            if time.monotonic() > deadline:
                raise ClusterError(f"{what} does not listen on {port} after {timeout:.0f} s (log: {log_file})") from None
            await asyncio.sleep(0.2)
