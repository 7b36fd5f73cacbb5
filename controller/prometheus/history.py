"""What Tekton pods sent over a window, read from Prometheus, for `egress-placer suggest` (docs/suggest.md).

Five instant queries, evaluated now over the window (`[7d]`) and, for durations, at the step (`[7d:1m]`):

- bytes: cAdvisor's `container_network_transmit_bytes_total` of the pod's network namespace. The counter
  starts at 0 with the pod sandbox and a Tekton pod is never restarted, so its largest value in the window
  is what the pod sent; cAdvisor may report the same namespace on several containers of a pod, hence
  `max` per interface before the sum over interfaces (loopback left out).
  This counts every byte the pod sent, in-cluster traffic too: an upper bound of internet egress. Where a
  flow exporter gives bytes to destinations outside the cluster per pod, `--bytes-query` takes its query
  instead (one series per namespace and pod, the bytes sent in the window).
- durations: the first and last time the pod's transmit series has a sample, at the query's step;
- labels: kube-state-metrics' `kube_pod_labels` with Tekton's keys (`--metric-labels-allowlist`
  `pods=[tekton.dev/taskRun,tekton.dev/task,tekton.dev/pipeline,tekton.dev/pipelineTask,tekton.dev/pipelineRun]`);
  kube-state-metrics writes `tekton.dev/taskRun` as `label_tekton_dev_task_run`;
- nodes: `kube_pod_info`'s `node`; images: `kube_pod_container_info`'s `image_spec` (as written in the pod;
  `image` on kube-state-metrics before v2.9), the step and sidecar containers, not Tekton's init containers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Mapping
from urllib.parse import urlsplit

from controller.prometheus.auth import PrometheusAuth
from controller.prometheus.egress_source import InstantQuery, PrometheusClient, Sample
from controller.suggest.core import PodHistory

TEKTON_LABELS = {  # the pod label -> kube-state-metrics' label of kube_pod_labels
    "tekton.dev/taskRun": "label_tekton_dev_task_run",
    "tekton.dev/task": "label_tekton_dev_task",
    "tekton.dev/pipeline": "label_tekton_dev_pipeline",
    "tekton.dev/pipelineTask": "label_tekton_dev_pipeline_task",
    "tekton.dev/pipelineRun": "label_tekton_dev_pipeline_run",
}
ALLOWLIST = "pods=[" + ",".join(TEKTON_LABELS) + "]"
TRANSMIT = 'container_network_transmit_bytes_total{pod!="",interface!="lo"}'
_DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")


def client(url: str, auth: PrometheusAuth = PrometheusAuth(), timeout: float = 30.0) -> PrometheusClient:
    return PrometheusClient(url, timeout, auth.session())


def check_url(url: str) -> str:
    """Prometheus' base URL: http or https with a host; ValueError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--prometheus must be an http or https URL with a host, got {url!r}")
    return url


def check_duration(text: str, what: str) -> str:
    """A Prometheus duration ("7d", "1m"); ValueError naming `what` otherwise."""
    if not _DURATION.match(text):
        raise ValueError(f"{what} must be a Prometheus duration like 7d, 12h or 1m, got {text!r}")
    return text


def queries(window: str, step: str, bytes_query: str | None = None) -> dict[str, str]:
    labels = ", ".join(TEKTON_LABELS.values())
    stamp = f"timestamp({TRANSMIT})"
    return {
        "bytes": bytes_query
        or f"sum by (namespace, pod) (max by (namespace, pod, interface) (max_over_time({TRANSMIT}[{window}])))",
        "durations": f"max by (namespace, pod) (max_over_time({stamp}[{window}:{step}])) "
        f"- min by (namespace, pod) (min_over_time({stamp}[{window}:{step}]))",
        "labels": f'max by (namespace, pod, {labels}) (max_over_time(kube_pod_labels{{{TEKTON_LABELS["tekton.dev/taskRun"]}!=""}}[{window}]))',
        "nodes": f'max by (namespace, pod, node) (max_over_time(kube_pod_info{{node!=""}}[{window}]))',
        "images": f"max by (namespace, pod, image_spec, image) (max_over_time(kube_pod_container_info[{window}]))",
    }


@dataclass(frozen=True)
class History:
    pods: tuple[PodHistory, ...]
    missing: tuple[str, ...]  # what is missing for a report, in words
    queries: tuple[str, ...]


def read_history(prometheus: InstantQuery, window: str, step: str, bytes_query: str | None = None) -> History:
    """The Tekton pods of the window. Raises PrometheusError when a query fails."""
    asked = queries(window, step, bytes_query)
    answers = {name: prometheus.query(q) for name, q in asked.items()}
    return join(answers, bytes_query is not None, tuple(asked.values()))


def join(answers: Mapping[str, Iterable[Sample]], custom_bytes: bool, asked: tuple[str, ...]) -> History:
    """One PodHistory per pod that has Tekton's labels and a bytes figure; what is missing, in words."""

    def per_pod(name: str) -> dict[tuple[str, str], list[Sample]]:
        out: dict[tuple[str, str], list[Sample]] = {}
        for s in answers.get(name, ()):
            if s.labels.get("namespace") and s.labels.get("pod"):
                out.setdefault((s.labels["namespace"], s.labels["pod"]), []).append(s)
        return out

    sent, durations, labels = per_pod("bytes"), per_pod("durations"), per_pod("labels")
    nodes, images = per_pod("nodes"), per_pod("images")
    missing = []
    if not labels:
        missing.append(
            "no kube_pod_labels series with Tekton's labels in the window (kube-state-metrics needs "
            f"--metric-labels-allowlist={ALLOWLIST})"
        )
    if not sent:
        metric = "--bytes-query" if custom_bytes else "container_network_transmit_bytes_total (cAdvisor)"
        missing.append(f"no series of {metric} in the window")
    pods = []
    no_bytes = 0
    for key, found in sorted(labels.items()):
        tekton = found[0].labels
        if key not in sent:
            no_bytes += 1
            continue
        value = sum(s.value for s in sent[key])
        if not math.isfinite(value):
            continue

        def label(name: str) -> str | None:
            return tekton.get(TEKTON_LABELS[name]) or None

        duration = durations.get(key)
        pods.append(
            PodHistory(
                namespace=key[0],
                pod=key[1],
                task_run=label("tekton.dev/taskRun") or key[1],
                bytes_sent=max(0.0, value),
                task=label("tekton.dev/task"),
                pipeline=label("tekton.dev/pipeline"),
                pipeline_task=label("tekton.dev/pipelineTask"),
                pipeline_run=label("tekton.dev/pipelineRun"),
                images=tuple(sorted({s.labels.get("image_spec") or s.labels.get("image") or "" for s in images.get(key, ())} - {""})),
                node=next((s.labels["node"] for s in nodes.get(key, ()) if s.labels.get("node")), None),
                duration=duration[0].value if duration and math.isfinite(duration[0].value) else None,
            )
        )
    if labels and sent and not pods:
        missing.append(f"none of the {no_bytes} Tekton pods of the window has a transmit series (bytes)")
    return History(tuple(pods), tuple(missing), asked)


SENT_QUERIES = ("bytes", "labels")  # what the controller's history rule reads (no nodes, images nor durations)


def read_sent(prometheus: InstantQuery, window: str, bytes_query: str | None = None) -> History:
    """What each Tekton pod of the window sent, with Tekton's labels: the two queries a pool's `history`
    rule needs (controller.suggest.reconcile). Raises PrometheusError when a query fails."""
    every = queries(window, "1m", bytes_query)
    asked = {name: every[name] for name in SENT_QUERIES}
    answers = {name: prometheus.query(q) for name, q in asked.items()}
    return join(answers, bytes_query is not None, tuple(asked.values()))
