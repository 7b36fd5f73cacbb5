"""`egress-placer suggest` on the local cluster ("Mixed history", issue 27): a real Prometheus scraping the
devcluster's pod exporter (devplacer/pod_exporter.py: cAdvisor's transmit counters and kube-state-metrics'
pod series, driven by the run annotation), 6 Tasks x 10 runs with known profiles (2 heavy senders, 1 heavy
once, 3 quiet), half of each on pool nodes and half on ordinary ones (a nodeSelector: no controller runs
here, the pool nodes are plain). `suggest` proposes exactly the 2 heavy ones, flags the occasional one with
its evidence, proposes removing the glob that matched only quiet runs; `-o yaml` applies cleanly with the
cluster's kubectl; `--explain` counts the runs that would move and the pruned ones. Bad input: Prometheus
unreachable is exit 3 in one line, no history is exit 0 and "not enough history"."""

from __future__ import annotations

import json
from typing import Callable, Iterator

import pytest
import yaml

from controller.core.conversion import V1BETA1 as API_VERSION  # the storage version: no controller runs to convert
from controller.prometheus.history import client, queries
from devcluster.cluster import Cluster
from devcluster.prometheus import start_prometheus, stop_prometheus
from devplacer.pod_exporter import RATE_ANNOTATION, PodExporter, sent
from tests.e2e.harness import REPO, as_an_administrator, egress_placer_command
from tests.e2e.tekton_runs import step
from tests.kube import Api, api_for, namespace, namespaced, namespaces_left
from tests.waiting import WaitTimeout, wait_for, wait_gone

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

NAMESPACE = "team-suggest"
POOLS = f"/apis/{API_VERSION}/egresspools"
GIB, MIB = 1024**3, 1024**2
ALPINE = "docker.io/library/alpine:3.20"
LINT_GLOB = "registry.example/lint:*"
# task -> (images, bytes of run i); pool runs take 2 s, ordinary ones 4 s when heavy (the pool is faster)
PROFILES: dict[str, tuple[tuple[str, ...], Callable[[int], float]]] = {
    "upload": (("registry.example/upload:1.4", ALPINE), lambda i: 3 * GIB),
    "mirror": (("registry.example/mirror:2",), lambda i: 2 * GIB),
    "fetch": (("registry.example/fetch:1",), lambda i: 2 * GIB if i == 3 else 10 * MIB),
    "lint": (("registry.example/lint:1", ALPINE), lambda i: 1 * MIB),
    "test": (("registry.example/test:1", ALPINE), lambda i: 2 * MIB),
    "build": (("registry.example/build:1",), lambda i: 5 * MIB),
}
RUNS = 10


def task(name: str, images: tuple[str, ...]) -> dict:
    return {
        "apiVersion": "tekton.dev/v1", "kind": "Task", "metadata": {"name": name},
        "spec": {"steps": [step(image, f"s{i}") for i, image in enumerate(images)]},
    }


def taskrun(name: str, i: int) -> dict:
    heavy = PROFILES[name][1](i) >= GIB
    seconds = (2 if i % 2 == 0 else 4) if heavy else 2
    node = f"egress-{i % 3 + 1}" if i % 2 == 0 else f"node-{i % 3 + 1}"
    return {
        "apiVersion": "tekton.dev/v1", "kind": "TaskRun",
        "metadata": {"name": f"{name}-{i}", "annotations": {
            RATE_ANNOTATION: repr(PROFILES[name][1](i) / seconds),
            "devcluster.egress-placer.io/run-duration": f"{seconds}s",
        }},
        "spec": {"taskRef": {"name": name}, "podTemplate": {"nodeSelector": {"kubernetes.io/hostname": node}}},
    }


def pool() -> dict:
    return {
        "apiVersion": API_VERSION, "kind": "EgressPool", "metadata": {"name": "overseas"},
        "spec": {"priority": 999_990, "nodeSelector": {"egress-placer.io/pool": "overseas"},
                 "namespaces": [NAMESPACE], "images": [LINT_GLOB, "ghcr.io/acme/never-ran:*"]},
    }


@pytest.fixture(scope="module")
def rig(devcluster: Cluster, api: Api, make_namespace: Callable[[str], str]) -> Iterator[str]:
    """The namespace with its Tasks, the pool object, the pod exporter and Prometheus scraping it; its URL."""
    wait_gone(f"namespace {NAMESPACE} of an earlier run to be gone", lambda: namespaces_left(api, NAMESPACE), timeout=180)
    crds = as_an_administrator(devcluster, str(devcluster.binary("kubectl")), "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "k8s" / "crds"))
    assert crds.returncode == 0, crds.stderr
    make_namespace(NAMESPACE)
    reader = api_for(devcluster.kubeconfig)  # the exporter's own client: it reads from its server's thread
    exporter = PodExporter(lambda: reader.items(namespaced(NAMESPACE, "pods")))
    try:
        for name, (images, _) in PROFILES.items():
            api.create(namespaced(NAMESPACE, "tasks", group="/apis/tekton.dev/v1"), task(name, images))
        api.delete(f"{POOLS}/overseas")
        api.create(POOLS, pool())
        yield start_prometheus(devcluster, {"pods": exporter.start()})
    finally:
        stop_prometheus(devcluster)
        exporter.stop()
        reader.api_client.close()
        api.delete(f"{POOLS}/overseas")
        api.delete(namespace(NAMESPACE))


def suggest(cluster: Cluster, url: str, *args: str):
    return egress_placer_command(cluster, "suggest", "--prometheus", url, "--window", "30m", "--step", "1s", *args)


def test_bad_input_says_so_in_one_line(devcluster: Cluster, rig: str) -> None:
    unreachable = suggest(devcluster, "http://127.0.0.1:1")
    assert unreachable.returncode == 3, unreachable.stderr
    assert unreachable.stderr.startswith("egress-placer suggest: cannot read Prometheus at http://127.0.0.1:1: ")
    assert len(unreachable.stderr.strip().splitlines()) == 1 and unreachable.stdout == ""

    empty = suggest(devcluster, rig)  # no run yet
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.startswith("not enough history in the last 30m")
    as_json = suggest(devcluster, rig, "-o", "json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["enough_history"] is False


def test_mixed_history(devcluster: Cluster, api: Api, rig: str) -> None:
    runs = namespaced(NAMESPACE, "taskruns", group="/apis/tekton.dev/v1")
    for name in PROFILES:
        for i in range(RUNS):
            api.create(runs, taskrun(name, i))
    total = len(PROFILES) * RUNS

    def finished() -> list[dict] | None:
        pods = api.items(namespaced(NAMESPACE, "pods"))
        done = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
        return done if len(done) == total else None

    pods = wait_for(f"{total} pods to succeed", finished, timeout=600, interval=2)
    expected = {p["metadata"]["name"]: sent(p, float("inf")) for p in pods}
    prometheus = client(rig)
    bytes_query = queries("30m", "1s")["bytes"]

    def differences() -> dict[str, tuple[float | None, float | None]]:
        held = {s.labels["pod"]: s.value for s in prometheus.query(bytes_query)}
        return {pod: (held.get(pod), want) for pod, want in expected.items() if held.get(pod) != pytest.approx(want, rel=1e-9)}

    try:
        wait_for("Prometheus to hold every pod's final count", lambda: not differences(), timeout=60, interval=1)
    except WaitTimeout:
        pytest.fail(f"pods whose count Prometheus does not hold (held, expected): {dict(list(differences().items())[:8])}")

    done = suggest(devcluster, rig, "-o", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["enough_history"] is True
    assert {(p["action"], p["glob"]) for p in report["proposals"]} == {
        ("add-image", "registry.example/upload[:@]*"), ("add-image", "registry.example/mirror[:@]*"),
        ("flag", None), ("remove-image", LINT_GLOB),
    }
    flag = next(p for p in report["proposals"] if p["action"] == "flag")
    assert flag["evidence"]["groups"] == [f"{NAMESPACE}/Task:fetch"] and flag["evidence"]["heavy_runs"] == 1
    upload = next(p for p in report["proposals"] if p["glob"] == "registry.example/upload[:@]*")
    assert upload["evidence"]["pool_runs"] == 5 and upload["evidence"]["ordinary_runs"] == 5
    assert upload["evidence"]["pool_duration_median"] < upload["evidence"]["ordinary_duration_median"]

    # Three lint runs pruned: the replay says so, and counts the moves of the others.
    for i in range(3):
        api.delete(f"{runs}/lint-{i}")
    wait_for("3 lint runs gone", lambda: len(api.items(runs)) == total - 3, timeout=60)
    explained = suggest(devcluster, rig, "--explain", "-o", "json")
    assert explained.returncode == 0, explained.stderr
    replay = json.loads(explained.stdout)["explain"]
    assert {k: replay[k] for k in ("runs", "replayed", "pruned", "moved", "onto_pool", "off_pool")} == {
        "runs": total, "replayed": total - 3, "pruned": 3, "moved": 27, "onto_pool": 20, "off_pool": 7,
    }

    proposal = suggest(devcluster, rig, "-o", "yaml")
    assert proposal.returncode == 0, proposal.stderr
    path = devcluster.dir / "suggest-proposal.yaml"
    path.write_text(proposal.stdout)
    applied = as_an_administrator(
        devcluster, str(devcluster.binary("kubectl")), "apply", "--server-side", "--force-conflicts", "-f", str(path)
    )
    assert applied.returncode == 0, applied.stderr
    assert "egresspool.egress-placer.io/overseas serverside-applied" in applied.stdout
    images = api.get(f"{POOLS}/overseas")["spec"]["images"]
    assert images == ["ghcr.io/acme/never-ran:*", "registry.example/mirror[:@]*", "registry.example/upload[:@]*"]
    assert yaml.safe_load(proposal.stdout)["spec"]["namespaces"] == [NAMESPACE]
