"""Pod-level transmit counters for the local cluster, where KWOK's pods send nothing (`egress-placer suggest`).

A run says what it "sends" with the annotation `devcluster.egress-placer.io/transmit-bytes-per-second`
(on the TaskRun; Tekton copies it to the pod), as `devcluster.egress-placer.io/run-duration` says how long
it runs (devcluster/kwok-stages.yaml). `PodExporter` serves, for every Tekton pod, what the cluster's
Prometheus would scrape from the kubelet's cAdvisor and from kube-state-metrics
(`--metric-labels-allowlist` with Tekton's keys, `controller/prometheus/history.py`):

- `container_network_transmit_bytes_total{namespace, pod, container="", interface="eth0"}`: the rate times
  the time the pod has run (from `status.startTime` to now, or to its containers' last `finishedAt`; at most
  its run-duration, so a run of rate R and duration D sends R x D; never going down), on the
  pod sandbox (`container=""`), while the pod runs and for `linger` seconds after it finished (cAdvisor
  reports a sandbox until the kubelet removes it); a pod with no annotation sends 0;
- `kube_pod_labels{namespace, pod, label_tekton_dev_*}` for Tekton's keys (kube-state-metrics' names);
- `kube_pod_info{namespace, pod, node}`;
- `kube_pod_container_info{namespace, pod, container, image, image_spec}` of the step and sidecar containers.

`pod_families(pods, now)` is the pure part; `PodExporter(list_pods)` serves it on 127.0.0.1 (a thread of
the calling process); the devcluster's optional Prometheus scrapes it as one more target
(`devcluster.prometheus.start_prometheus`, whose jobs honour the exporter's own `node` label).
"""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from controller.prometheus.history import TEKTON_LABELS
from devplacer.egress_exporter import LoopbackExporter

RATE_ANNOTATION = "devcluster.egress-placer.io/transmit-bytes-per-second"
DURATION_ANNOTATION = "devcluster.egress-placer.io/run-duration"  # KWOK's stage reads it (devcluster/kwok-stages.yaml)
_GO_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
INTERFACE = "eth0"
LINGER_SECONDS = 2.0  # a finished pod's sandbox is still reported this long


def _time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rate_of(pod: Mapping[str, Any]) -> float:
    """The annotation's bytes per second; 0 when absent or not a finite, non-negative number."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(RATE_ANNOTATION)
    try:
        rate = float(text) if text is not None else 0.0
    except ValueError:
        return 0.0
    return rate if 0 <= rate < float("inf") else 0.0


def run_duration(pod: Mapping[str, Any]) -> float | None:
    """The run-duration annotation (a Go duration such as "2s" or "1m30s") in seconds; None when absent or
    not one."""
    text = str(((pod.get("metadata") or {}).get("annotations") or {}).get(DURATION_ANNOTATION) or "")
    parts = _GO_DURATION.findall(text)
    if not text or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def finished_at(pod: Mapping[str, Any]) -> float | None:
    """The last `finishedAt` of its containers, once every container has terminated."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    ends = [_time(((s.get("state") or {}).get("terminated") or {}).get("finishedAt")) for s in statuses]
    if not ends or any(e is None for e in ends):
        return None
    return max(e for e in ends if e is not None)


def sent(pod: Mapping[str, Any], now: float) -> float | None:
    """Bytes the pod has sent by `now`; None when it has not started. It sends for at most its run-duration
    (the API's times have whole seconds, and a pod is seen Running a little past its end): a pod of rate R
    and run-duration D has sent R x D once it is done, whatever the scrapes saw."""
    start = _time((pod.get("status") or {}).get("startTime"))
    if start is None:
        return None
    end = finished_at(pod)
    elapsed = max(0.0, min(now, end if end is not None else now) - start)
    limit = run_duration(pod)
    return rate_of(pod) * (min(elapsed, limit) if limit is not None else elapsed)


def pod_families(
    pods: Iterable[Mapping[str, Any]],
    now: float,
    linger: float = LINGER_SECONDS,
    highest: dict[tuple[str, str], float] | None = None,
) -> list[Metric]:
    """The families for `pods` at `now`. `highest` (kept by the caller across scrapes, updated here): a
    counter never goes down, whatever a later look at the pod says."""
    highest = {} if highest is None else highest
    transmit = CounterMetricFamily(
        "container_network_transmit_bytes", "Cumulative count of bytes transmitted",
        labels=["namespace", "pod", "container", "interface"],
    )
    labels = GaugeMetricFamily("kube_pod_labels", "Kubernetes labels converted to Prometheus labels.",
                               labels=["namespace", "pod", *TEKTON_LABELS.values()])
    info = GaugeMetricFamily("kube_pod_info", "Information about pod.", labels=["namespace", "pod", "node"])
    containers = GaugeMetricFamily("kube_pod_container_info", "Information about a container in a pod.",
                                   labels=["namespace", "pod", "container", "image", "image_spec"])
    for pod in pods:
        meta = pod.get("metadata") or {}
        pod_labels = meta.get("labels") or {}
        if "tekton.dev/taskRun" not in pod_labels:
            continue
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        labels.add_metric([ns, name, *(str(pod_labels.get(key, "")) for key in TEKTON_LABELS)], 1.0)
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if node:
            info.add_metric([ns, name, node], 1.0)
        for container in (pod.get("spec") or {}).get("containers") or []:
            image = str(container.get("image") or "")
            containers.add_metric([ns, name, str(container.get("name") or ""), image, image], 1.0)
        value = sent(pod, now)
        end = finished_at(pod)
        if value is not None:
            value = highest[(ns, name)] = max(value, highest.get((ns, name), 0.0))
            if end is None or now <= end + linger:
                transmit.add_metric([ns, name, "", INTERFACE], value)
    return [transmit, labels, info, containers]


class PodExporter(LoopbackExporter):
    """Serves `pod_families` of the pods `list_pods()` returns (read at most once per `cache_seconds`)."""

    def __init__(
        self,
        list_pods: Callable[[], Iterable[Mapping[str, Any]]],
        clock: Callable[[], float] = time.time,
        cache_seconds: float = 0.5,
    ) -> None:
        super().__init__()
        self._list_pods = list_pods
        self._clock = clock
        self._cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._pods: list[Mapping[str, Any]] = []
        self._read_at = float("-inf")
        self._highest: dict[tuple[str, str], float] = {}
        self._registry.register(self)

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        with self._lock:
            if now - self._read_at >= self._cache_seconds:
                self._pods, self._read_at = list(self._list_pods()), now
            yield from pod_families(self._pods, now, highest=self._highest)
