"""A pool's opt-in `history` rule on the local cluster (issue 27, "the same signal in the controller"): the
real Prometheus the `suggest` e2e uses scrapes the devcluster's pod exporter (cAdvisor's transmit counters
and kube-state-metrics' pod series, driven by the run annotation); egress-placer reads the pools API, and its
EgressPool `overseas` takes by measured history the Tasks whose p90 sent at least 1 GiB over the window.

History first: 3 heavy runs of Task `upload` in team-cdn (may use the pool) and in team-other (may not), 3
quiet runs of Task `lint` in team-cdn, none of them matching a glob. Then, once the controller's reader has
the set (its metric, and the MeasuredSetChanged Event): a new team-cdn `upload` run is placed on the pool
with reason measured-history and its evidence in its decision and Event; a `lint` run is not; team-other's
`upload` run, heavy in its own history, is not (the namespace allow-list still applies); a team-other run
labelled like team-cdn's Task is not either. What users see: the pool's `status.history` (kubectl), and
`egress-placer explain` given `kubectl get egresspools -o yaml` deciding a next run as admission would."""

from __future__ import annotations

import json
import re
import shutil
from typing import Any, Iterator

import pytest
import yaml

from devcluster.cluster import Cluster
from devcluster.prometheus import PROCESS_NAME, start_prometheus, stop_prometheus
from devplacer.pod_exporter import DURATION_ANNOTATION, RATE_ANNOTATION, PodExporter
from controller.core.pools import API_VERSION, POOL_PLURAL
from devplacer.local_placer import start_controller
from tests.e2e.harness import POLICY_FILE, Placer, as_an_administrator, egress_placer_command, make_plain
from tests.e2e.tekton_runs import POOL, POOL_NODES, TEAM_CDN, TEAM_OTHER, Runs, decision_of, step
from tests.kube import Api, api_for, namespaced
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

GIB = 1024**3
IMAGE = "docker.io/library/alpine:3.20"  # matches no glob of the e2e policy
HEAVY = {RATE_ANNOTATION: repr(3 * GIB / 2), DURATION_ANNOTATION: "2s"}  # 3 GiB in 2 s
QUIET = {RATE_ANNOTATION: "1000", DURATION_ANNOTATION: "2s"}
EVENTS = "/apis/events.k8s.io/v1/events"
POOLS = f"/apis/{API_VERSION}/{POOL_PLURAL}"


def history_pool(url: str) -> dict[str, Any]:
    """The e2e policy's pool `overseas` as an EgressPool, with the history rule."""
    (pool,) = [p for p in yaml.safe_load(POLICY_FILE.read_text())["pools"] if p["name"] == POOL]
    spec = {k: v for k, v in pool.items() if k != "name"}
    spec["history"] = {"p90BytesAtLeast": GIB, "window": "30m", "minRuns": 3, "prometheus": {"url": url, "interval": "2s", "timeout": "5s"}}
    return {"apiVersion": API_VERSION, "kind": "EgressPool", "metadata": {"name": POOL}, "spec": spec}


def delete_pools(api: Api) -> None:
    for obj in api.items(POOLS):
        api.delete(f"{POOLS}/{obj['metadata']['name']}")


def forget_history(cluster: Cluster) -> None:
    """Prometheus' stored series of the cluster gone: what another module's runs sent (the suggest e2e's
    team-suggest Tasks) must not enter this module's sets, nor this module's runs another's report."""
    shutil.rmtree(cluster.dir / PROCESS_NAME / "data", ignore_errors=True)


@pytest.fixture(scope="module")
def prometheus(devcluster: Cluster, tenants: tuple[str, ...]) -> Iterator[str]:
    reader = api_for(devcluster.kubeconfig)  # the exporter's own client: it reads from its server's thread
    exporter = PodExporter(lambda: [p for ns in (TEAM_CDN, TEAM_OTHER) for p in reader.items(namespaced(ns, "pods"))])
    stop_prometheus(devcluster)
    forget_history(devcluster)
    try:
        yield start_prometheus(devcluster, {"pods": exporter.start()})
    finally:
        stop_prometheus(devcluster)
        forget_history(devcluster)
        exporter.stop()
        reader.api_client.close()


@pytest.fixture(scope="module")
def egress_placer(devcluster: Cluster, api: Api, tenants: tuple[str, ...], prometheus: str) -> Iterator[Placer]:
    """egress-placer reading the pools API (overrides the e2e fixture), pool overseas with the history rule."""
    try:
        start_controller(devcluster, POLICY_FILE, env={"EGRESS_PLACER_POLICY_SOURCE": "pools"})
        placer = Placer(devcluster)
        delete_pools(api)
        api.create(POOLS, history_pool(prometheus))
        wait_for("the controller's first read of the pool's history",
                 lambda: placer.metric("egress_placer_history_reads_total", {"pool": POOL, "result": "success"}) >= 1, timeout=60, interval=0.5)
        yield placer
    finally:
        delete_pools(api)
        make_plain(api, devcluster)


def task(name: str) -> dict[str, Any]:
    return {"apiVersion": "tekton.dev/v1", "kind": "Task", "metadata": {"name": name}, "spec": {"steps": [step(IMAGE)]}}


def run(name: str, task_name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "metadata": {"name": name, "annotations": annotations},
            "spec": {"taskRef": {"name": task_name}}}


def test_a_pool_takes_runs_by_measured_history_only_for_namespaces_it_allows(api: Api, runs: Runs, egress_placer: Placer) -> None:
    for namespace, name in ((TEAM_CDN, "upload"), (TEAM_CDN, "lint"), (TEAM_OTHER, "upload")):
        runs.create(namespace, "tasks", task(name))
    history = [(TEAM_CDN, "upload", HEAVY), (TEAM_CDN, "lint", QUIET), (TEAM_OTHER, "upload", HEAVY)]
    made: dict[str, list[str]] = {TEAM_CDN: [], TEAM_OTHER: []}
    for namespace, name, annotations in history:
        for i in range(3):
            made[namespace].append(runs.name(f"{name}-h{i}"))
            runs.create(namespace, "taskruns", run(made[namespace][-1], name, annotations))
    for namespace, names in made.items():
        runs.wait_succeeded(namespace, "taskruns", names, timeout=180)
    before = {n: decision_of(r).get("reason") for ns in made for n, r in runs.listed(ns, "taskruns").items()}
    assert set(before.values()) == {"no-match"}  # no glob matches, no set yet

    # The reader's set: team-cdn's upload and team-other's upload (measured), not lint (quiet).
    wait_for("the controller's measured set", lambda: egress_placer.metric("egress_placer_history_groups", {"pool": POOL}) == 2,
             timeout=120, interval=1)
    assert egress_placer.metric("egress_placer_history_reads_total", {"pool": POOL, "result": "success"}) >= 1
    def told() -> list[dict[str, Any]] | None:  # the set may have grown over two reads: one Event each
        changed = [e for e in api.items(EVENTS) if e.get("reason") == "MeasuredSetChanged"]
        notes = " ".join(e["note"] for e in changed)
        return changed if all(f"{g}/Task:upload" in notes for g in (TEAM_CDN, TEAM_OTHER)) else None

    changed = wait_for("the MeasuredSetChanged Events", told, timeout=60, interval=1)
    assert all(e["regarding"]["kind"] == "EgressPool" and e["regarding"]["name"] == POOL for e in changed)
    assert "now takes" in changed[0]["note"] and "lint" not in " ".join(e["note"] for e in changed)

    placed, quiet, refused = runs.name("upload-new"), runs.name("lint-new"), runs.name("other-new")
    runs.create(TEAM_CDN, "taskruns", run(placed, "upload", QUIET))
    runs.create(TEAM_CDN, "taskruns", run(quiet, "lint", QUIET))
    runs.create(TEAM_OTHER, "taskruns", run(refused, "upload", QUIET))
    # team-other labels an inline run like team-cdn's measured Task (and its own): still its own namespace's, not allowed
    forged = runs.name("other-forged")
    body = {**run(forged, "upload", QUIET), "spec": {"taskSpec": {"steps": [step(IMAGE)]}}}
    body["metadata"]["labels"] = {"tekton.dev/task": "upload"}
    runs.create(TEAM_OTHER, "taskruns", body)

    decided = {**runs.listed(TEAM_CDN, "taskruns"), **runs.listed(TEAM_OTHER, "taskruns")}
    assert decision_of(decided[placed])["reason"] == "measured-history"
    assert decision_of(decided[placed])["pool"] == POOL
    # the p90 of what the set was computed from (a run still sending counts what it had sent when read)
    assert re.search(rf"{TEAM_CDN}/Task:upload sent [0-9.]+ GiB at p90 over its 3 runs of the last 30m", decision_of(decided[placed])["message"])
    assert decision_of(decided[quiet])["reason"] == "no-match" and decision_of(decided[quiet]).get("pool") is None
    for name in (refused, forged):
        assert decision_of(decided[name])["reason"] == "no-match" and decision_of(decided[name]).get("pool") is None

    nodes = wait_for("the new runs' pods bound", lambda: (lambda n: n if all(n.values()) else None)(
        {**runs.nodes_of(TEAM_CDN, [placed, quiet]), **runs.nodes_of(TEAM_OTHER, [refused, forged])}), timeout=90, interval=0.5)
    assert nodes[placed] in POOL_NODES, nodes
    assert not {nodes[quiet], nodes[refused], nodes[forged]} & POOL_NODES, nodes
    pod = runs.pods_by_taskrun(TEAM_CDN)[placed]
    assert decision_of(pod)["reason"] == "measured-history"
    note = wait_for("the run's Placed Event", lambda: [e["note"] for e in runs.events(TEAM_CDN, "Placed") if e["regarding"].get("name") == placed],
                    timeout=60, interval=1)
    assert "by measured history" in note[0]

    # What users see: the pool's status.history (kubectl), and explain reading it back from `kubectl get -o yaml`.
    status = wait_for("status.history", lambda: (lambda h: h if h and h.get("groups") == 2 else None)(
        ((api.get(f"{POOLS}/{POOL}") or {}).get("status") or {}).get("history")), timeout=60, interval=1)
    # the new runs count too (the forged one in team-other's own group: its label names its own namespace's Task)
    assert {(g["namespace"], g["name"]) for g in status["measured"]} == {(TEAM_CDN, "upload"), (TEAM_OTHER, "upload")}
    assert all(g["runs"] >= 3 and g["p90Bytes"] >= GIB for g in status["measured"]), status
    assert status["readAt"] and "lastError" not in status
    listed = as_an_administrator(egress_placer.cluster, str(egress_placer.cluster.binary("kubectl")), "get", "egresspools", "-o", "yaml")
    assert listed.returncode == 0, listed.stderr
    pools_file = egress_placer.cluster.dir / "history-pools.yaml"
    pools_file.write_text(listed.stdout)
    manifest = egress_placer.cluster.dir / "history-runs.yaml"
    manifest.write_text(yaml.safe_dump_all([
        {**run("next-upload", "upload", {}), "metadata": {"name": "next-upload", "namespace": TEAM_CDN}},
        {**run("next-other", "upload", {}), "metadata": {"name": "next-other", "namespace": TEAM_OTHER}},
    ]))
    explained = egress_placer_command(egress_placer.cluster, "explain", "--policy", str(pools_file), str(manifest), "-o", "json")
    assert explained.returncode == 0, explained.stderr
    lines = {line["name"]: line for line in json.loads(explained.stdout)}
    assert lines["next-upload"]["reason"] == "measured-history" and lines["next-upload"]["pool"] == POOL
    assert "by measured history" in lines["next-upload"]["message"]
    assert lines["next-other"]["pool"] is None
