"""devplacer/pod_exporter.py: the local cluster's pod transmit counters, in cAdvisor's and kube-state-metrics'
shape, driven by the run annotation; what it serves is what `suggest`'s queries read."""

from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from controller.prometheus.egress_source import Sample
from controller.prometheus.history import join
from devplacer.pod_exporter import RATE_ANNOTATION, PodExporter, pod_families, sent

T0 = 1_800_000_000.0


def iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, rate: str | None = "1000", started: float | None = T0, finished: float | None = None, task: str | None = "upload") -> dict:
    labels = {"tekton.dev/taskRun": f"{name}-run", **({"tekton.dev/task": task} if task else {})}
    status: dict = {"phase": "Running"}
    if started is not None:
        status["startTime"] = iso(started)
    if finished is not None:
        status["phase"] = "Succeeded"
        status["containerStatuses"] = [{"name": "step-up", "state": {"terminated": {"finishedAt": iso(finished)}}}]
    return {
        "metadata": {"name": f"{name}-pod", "namespace": "team-a", "labels": labels,
                     "annotations": {RATE_ANNOTATION: rate} if rate is not None else {}},
        "spec": {"nodeName": "egress-1", "containers": [{"name": "step-up", "image": "registry.example/upload:1"}]},
        "status": status,
    }


@pytest.mark.parametrize(
    "the_pod, now, expected",
    [
        (pod("a"), T0 + 10, 10_000.0),  # running: rate x time so far
        (pod("a", finished=T0 + 4), T0 + 10, 4_000.0),  # finished: rate x its run
        (pod("a", rate=None), T0 + 10, 0.0),  # no annotation: sends nothing
        (pod("a", rate="-5"), T0 + 10, 0.0),
        (pod("a", rate="lots"), T0 + 10, 0.0),
        (pod("a", started=None), T0 + 10, None),  # not started: no series
    ],
)
def test_sent(the_pod, now, expected):
    assert sent(the_pod, now) == expected


def samples(pods, now) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for family in pod_families(pods, now):
        for s in family.samples:
            out.setdefault(s.name, []).append(Sample(dict(s.labels), s.value, now))
    return out


def test_a_finished_pod_is_reported_for_a_while_then_gone():
    done = pod("a", finished=T0 + 4)
    assert "container_network_transmit_bytes_total" in samples([done], T0 + 5)
    assert "container_network_transmit_bytes_total" not in samples([done], T0 + 60)
    assert "kube_pod_labels" in samples([done], T0 + 60)  # kube-state-metrics reports the pod while it exists


def test_what_it_serves_is_what_suggest_reads():
    pods = [pod("a", finished=T0 + 4), pod("b", rate="0", finished=T0 + 2, task=None),
            {"metadata": {"name": "web", "namespace": "x", "labels": {"app": "web"}}, "spec": {}, "status": {}}]
    got = samples(pods, T0 + 3)
    answers = {
        "bytes": got["container_network_transmit_bytes_total"],
        "labels": got["kube_pod_labels"],
        "nodes": got["kube_pod_info"],
        "images": got["kube_pod_container_info"],
    }
    history = join(answers, False, ())
    assert [(p.pod, p.task_run, p.task, p.bytes_sent, p.node, p.images) for p in history.pods] == [
        ("a-pod", "a-run", "upload", 3000.0, "egress-1", ("registry.example/upload:1",)),
        ("b-pod", "b-run", None, 0.0, "egress-1", ("registry.example/upload:1",)),
    ]


def test_the_exporter_serves_over_http():
    clock = [T0 + 2]
    exporter = PodExporter(lambda: [pod("a")], clock=lambda: clock[0])
    url = exporter.start()
    try:
        text = requests.get(url, timeout=5).text
    finally:
        exporter.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (sample,) = families["container_network_transmit_bytes"].samples
    assert sample.value == 2000.0 and sample.labels == {"namespace": "team-a", "pod": "a-pod", "container": "", "interface": "eth0"}


def test_a_pod_sends_for_at_most_its_run_duration_and_a_counter_never_goes_down():
    timed = pod("a")
    timed["metadata"]["annotations"]["devcluster.egress-placer.io/run-duration"] = "2s"
    assert sent(timed, T0 + 1) == 1000.0 and sent(timed, T0 + 2.9) == 2000.0  # seen Running past its end
    highest: dict = {}
    seen = [samples_at([timed], T0 + 2.9, highest), samples_at([pod("a", finished=T0 + 1)], T0 + 1.5, highest)]
    assert seen == [2000.0, 2000.0]


@pytest.mark.parametrize("text, seconds", [("2s", 2.0), ("1m30s", 90.0), ("500ms", 0.5), ("1.5h", 5400.0), ("2 s", None), ("x", None), ("", None)])
def test_run_duration(text, seconds):
    from devplacer.pod_exporter import run_duration

    assert run_duration({"metadata": {"annotations": {"devcluster.egress-placer.io/run-duration": text}}}) == seconds


def samples_at(pods, now, highest) -> float:
    (family, *_) = pod_families(pods, now, highest=highest)
    (sample,) = family.samples
    return sample.value
