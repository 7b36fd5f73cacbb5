"""The end of `make demo` (devplacer/demo): it printed "see why: kubectl --kubeconfig .../kubeconfig get
events..." and then "cluster stopped", a hint at a cluster that was gone (issue 28). Now it prints
egress-placer's Events itself before it stops the cluster; with --keep the cluster stays and the last
lines say how to look further and how to stop it. The whole demo runs on the local cluster
(`make demo`); here its last step, on a stand-in cluster whose kubectl answers from a list."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import devplacer.demo as demo

EVENTS = [
    {
        "metadata": {"namespace": "team-cdn", "creationTimestamp": "2026-01-01T00:00:02Z"},
        "eventTime": "2026-01-01T00:00:02.000000Z",
        "reportingController": "egress-placer.io/controller",
        "regarding": {"kind": "TaskRun", "name": "upload-1"},
        "type": "Normal",
        "reason": "Placed",
        "note": "pool overseas:\n image registry.example.com/cdn-uploader:1.2 matches",
    },
    {
        "metadata": {"namespace": "team-web", "creationTimestamp": "2026-01-01T00:00:01Z"},
        "eventTime": "2026-01-01T00:00:01.000000Z",
        "reportingController": "egress-placer.io/controller",
        "regarding": {"kind": "TaskRun", "name": "lab-run"},
        "type": "Warning",
        "reason": "NamespaceNotAllowed",
        "note": "namespace team-web may not use pool overseas",
    },
    {
        "metadata": {"namespace": "team-cdn"},
        "reportingController": "tekton.dev/taskrun",
        "regarding": {"kind": "TaskRun", "name": "upload-1"},
        "type": "Normal",
        "reason": "Started",
        "note": "not ours",
    },
]


class StandIn:
    def __init__(self, tmp_path: Path) -> None:
        self.kubeconfig = tmp_path / "kubeconfig"
        self.stopped = False

    def down(self) -> None:
        self.stopped = True


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StandIn:
    def kubectl(cluster: Any, *args: str, **kwargs: Any) -> str:
        assert args[:3] == ("get", "events.events.k8s.io", "-A")
        return json.dumps({"items": EVENTS})

    monkeypatch.setattr(demo, "kubectl", kubectl)
    return StandIn(tmp_path)


def test_the_events_are_shown_before_the_cluster_stops(cluster: StandIn, tmp_path: Path) -> None:
    lines: list[str] = []

    def log(line: str) -> None:
        assert not cluster.stopped or line.startswith("[demo] cluster stopped"), f"after the stop: {line}"
        lines.append(line)

    demo.finish(cluster, tmp_path, keep=False, log=log)  # type: ignore[arg-type]
    assert cluster.stopped
    text = "\n".join(lines)
    assert "kubectl --kubeconfig" not in text  # no hint at a cluster that is gone
    shown = lines[2:4]  # after the heading and the table's header, oldest first, egress-placer's only
    assert "team-web" in shown[0] and "TaskRun/lab-run" in shown[0] and shown[0].endswith("namespace team-web may not use pool overseas")
    assert "Placed" in shown[1] and shown[1].endswith("pool overseas: image registry.example.com/cdn-uploader:1.2 matches")
    assert "not ours" not in text
    assert lines[-1] == "[demo] cluster stopped (python -m devcluster demo --keep leaves it running)"


def test_keep_leaves_the_cluster_and_says_how_to_stop_it(cluster: StandIn, tmp_path: Path) -> None:
    lines: list[str] = []
    demo.finish(cluster, tmp_path, keep=True, log=lines.append)  # type: ignore[arg-type]
    assert not cluster.stopped
    assert any("Placed" in line for line in lines)
    assert lines[-2] == f"[demo] the cluster keeps running; look around: kubectl --kubeconfig {cluster.kubeconfig} get events.events.k8s.io -A"
    assert lines[-1] == f"[demo] stop it: python -m devcluster down --dir {tmp_path}"


def test_a_cluster_that_cannot_be_read_is_still_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> str:
        raise RuntimeError("connection refused")

    monkeypatch.setattr(demo, "kubectl", broken)
    cluster, lines = StandIn(tmp_path), []
    demo.finish(cluster, tmp_path, keep=False, log=lines.append)  # type: ignore[arg-type]
    assert cluster.stopped and "  (cannot read the Events: connection refused)" in lines
