"""End to end, the pool queue (docs/queue.md) on the local cluster: pool `overseas` (3 nodes) with
`queue: {runsPerNode: 2}` (6 slots), runs of KWOK pods that last a few seconds.

- Cap: a burst of matching TaskRuns never has more than 6 pool pods Running at any sampled moment
  (a sampler lists the pods all along), and every run ends Succeeded on a pool node. The last run of
  the burst has a short Tekton timeout: it waits in the queue longer than that and still succeeds
  (the timeout counts from the release).
- Not ours: runs their owner created pending and releases while our line fills the pool run on the
  pool, their pods let in (schedulingGate removed) as slots free, within the cap.
- Cancel: a queued run cancelled while pending ends cancelled with no pod, and the others all run.
- Fairness: namespace A submits 50 runs, then namespace B 10: B's last release comes before A's 30th,
  in the leader's release order.
- Pipelines: a PipelineRun whose task is queued behind a full pool: its own timeout counts the wait
  (measured: docs/queue.md). A coscheduled PipelineRun is queued whole; its TaskRuns' pods (owned, by
  uid, by TaskRuns the PipelineRun owns by uid) go in ungated.
- Leader: two replicas; the leader is killed mid-queue: every run ends Succeeded, none released twice.
The sizes are the issue's: 60 runs in the burst, 3 nodes x 2 slots."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from controller.queue.core import QUEUE_ANNOTATION, read_entry
from devcluster.cluster import Cluster, pod_seconds_default
from devplacer.local_placer import LEADER_TIMINGS, start_controller, stop_controller
from devplacer.faults import kill_component
from tests.e2e.harness import DATA, ControllerSpec, Placer, lease_holder, quietly, tekton_holds_taskruns, tekton_version
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL_NODES, TEAM_CDN, TEAM_OTHER, Runs, decision_of, step, succeeded, taskrun
from tests.e2e.test_placement import tekton_coschedule, two_task_pipelinerun
from tests.kube import TEKTON, Api, namespaced, pods
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

POLICY_FILE = DATA / "policy-queue.yaml"
CONTROLLER = ControllerSpec(policy=POLICY_FILE, run_guard=True)  # egress-placer with the queue policy and the run guard
LEASE_SECONDS = float(LEADER_TIMINGS["EGRESS_PLACER_LEASE_DURATION_SECONDS"])
RETRY_SECONDS = float(LEADER_TIMINGS["EGRESS_PLACER_RETRY_PERIOD_SECONDS"])
# After a leader kill the follower sees the last renewal up to one (jittered) retry period late and takes the
# lease at its first try after it expired; its first release then waits at most for a slot to free (one run).
RELEASE_AFTER_KILL_SECONDS = LEASE_SECONDS + 2 * 1.2 * RETRY_SECONDS + pod_seconds_default() + 5.0
SLOTS = 6  # 3 pool nodes x runsPerNode 2
BURST = 60  # the burst
SHORT_TIMEOUT = "8s"
# Without TaskRunPending (Tekton before v1.11.0) egress-placer holds no TaskRun (controller/compat): these need no TaskRun
# held; the others are skipped there, and tests/e2e/test_compat_on_the_cluster.py shows what happens instead.
WITHOUT_TASKRUN_PENDING = {"test_a_coscheduled_pipelinerun_is_queued_whole_and_its_taskruns_pods_go_in_ungated"}


@pytest.fixture(autouse=True)
def _tekton_holds_taskruns(request: pytest.FixtureRequest, devcluster: Cluster) -> None:
    if request.node.originalname not in WITHOUT_TASKRUN_PENDING and not tekton_holds_taskruns(devcluster):
        pytest.skip(f"Tekton {tekton_version(devcluster)} has no TaskRunPending: egress-placer queues no TaskRun there "
                    "(controller/compat; tests/e2e/test_compat_on_the_cluster.py)")


class PoolSampler:
    """Lists the Tekton pods of the namespaces over and over; keeps the most Running on pool nodes at once."""

    def __init__(self, api: Api, namespaces: tuple[str, ...], interval: float = 0.2) -> None:
        self.api = api
        self.namespaces = namespaces
        self.interval = interval
        self.most = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            running = 0
            for ns in self.namespaces:
                for pod in self.api.items(pods(ns), labelSelector="tekton.dev/taskRun"):
                    if pod["status"].get("phase") == "Running" and pod["spec"].get("nodeName") in POOL_NODES:
                        running += 1
            self.most = max(self.most, running)
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> "PoolSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def uploads(runs: Runs, namespace: str, prefix: str, count: int) -> list[str]:
    names = [runs.name(f"{prefix}-{i:02d}") for i in range(count)]
    for name in names:  # one at a time: the order of creation is the queue's order
        runs.create(namespace, "taskruns", taskrun(name, MATCHING_IMAGE))
    return names


def released_order(placer: Placer, offset: int = 0) -> list[str]:
    """Names of the runs the leader released, in its order (its log)."""
    return [str(r.get("name")) for r in placer.log_records(offset) if str(r.get("message", "")).startswith("released from pool")]


def start_seconds(run: dict[str, Any]) -> float:
    return time.mktime(time.strptime(run["status"]["startTime"], "%Y-%m-%dT%H:%M:%SZ"))


def created_seconds(run: dict[str, Any]) -> float:
    return time.mktime(time.strptime(run["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))


def test_cap_a_burst_never_runs_more_than_the_slots_and_all_succeed(api: Api, runs: Runs) -> None:
    with PoolSampler(api, (TEAM_CDN,)) as sampler:
        names = uploads(runs, TEAM_CDN, "cap", BURST)
        late = runs.name("cap-late")
        body = taskrun(late, MATCHING_IMAGE)
        body["spec"]["timeout"] = SHORT_TIMEOUT
        runs.create(TEAM_CDN, "taskruns", body)
        queued = runs.listed(TEAM_CDN, "taskruns")
        done = runs.wait_succeeded(TEAM_CDN, "taskruns", [*names, late], timeout=600)
    assert sampler.samples > 10
    assert 0 < sampler.most <= SLOTS, f"at most {SLOTS} pool pods Running at once, sampled {sampler.most}"
    # Every run was queued at admission (pending with the entry), none lost.
    assert all(read_entry(o["metadata"]["annotations"].get(QUEUE_ANNOTATION), "TaskRun") for o in queued.values())
    nodes = runs.nodes_of(TEAM_CDN, [*names, late])
    assert set(nodes.values()) <= POOL_NODES, nodes
    # The late run's 8 s Tekton timeout did not count its wait: it waited longer and still succeeded.
    waited = start_seconds(done[late]) - created_seconds(done[late])
    assert waited > 8, f"the burst was too short to show it: the late run waited {waited:.0f}s"


def test_runs_their_owner_created_pending_wait_for_a_slot_then_run_on_the_pool(api: Api, runs: Runs, egress_placer: Placer) -> None:
    """Not ours (no entry: we never release them); released by their owner while our line fills the
    pool, their pods wait with the gate egress-placer.io/pool-slot, the leader lets each in as a slot
    frees, and the cap holds."""
    offset = egress_placer.log.stat().st_size
    with PoolSampler(api, (TEAM_CDN,)) as sampler:
        ours = uploads(runs, TEAM_CDN, "mixed", SLOTS)
        own = [runs.name(f"own-pending-{i}") for i in range(3)]
        for name in own:
            body = taskrun(name, MATCHING_IMAGE)
            body["spec"]["status"] = "TaskRunPending"
            runs.create(TEAM_CDN, "taskruns", body)
        for name in own:  # its owner (here the admin) releases it
            api.json_patch(namespaced(TEAM_CDN, "taskruns", name, group=TEKTON), [{"op": "remove", "path": "/spec/status"}])
        runs.wait_succeeded(TEAM_CDN, "taskruns", [*ours, *own], timeout=300)
    assert 0 < sampler.most <= SLOTS, f"at most {SLOTS} pool pods Running at once, sampled {sampler.most}"
    assert set(runs.nodes_of(TEAM_CDN, own).values()) <= POOL_NODES
    let_in = {str(r.get("name")) for r in egress_placer.log_records(offset) if r.get("message") == "a pool slot is free: pod let in"}
    assert all(any(pod.startswith(name) for pod in let_in) for name in own), let_in


def test_a_coscheduled_pipelinerun_is_queued_whole_and_its_taskruns_pods_go_in_ungated(api: Api, runs: Runs, egress_placer: Placer) -> None:
    """Its TaskRuns are Tekton's: each one's controller owner is the PipelineRun, by uid, which carries our
    entry and was released (the queue counted its slot then), so their pods are never gated. Nothing
    reads the pods' `tekton.dev/pipelineRun` label (a tenant's TaskRun may carry it: tests/reliability/
    test_hostile_tenant_runs.py, h)."""
    offset = egress_placer.log.stat().st_size
    name = runs.name("coscheduled")
    body = two_task_pipelinerun(name, {"emptyDir": {}})
    with tekton_coschedule(api, "pipelineruns"):
        wait_for("egress-placer to see coschedule=pipelineruns",
                 lambda: "coscheduled" in decision_of(runs.create(TEAM_CDN, "pipelineruns", body, dry_run=True))["message"], timeout=20)
        made = runs.create(TEAM_CDN, "pipelineruns", body)
        assert made["spec"].get("status") == "PipelineRunPending", made["spec"]
        assert read_entry(made["metadata"]["annotations"].get(QUEUE_ANNOTATION), "PipelineRun") is not None
        runs.wait_succeeded(TEAM_CDN, "pipelineruns", [name], timeout=180)
    children = [f"{name}-upload", f"{name}-build"]
    assert set(runs.nodes_of(TEAM_CDN, children).values()) <= POOL_NODES
    let_in = {str(r.get("name")) for r in egress_placer.log_records(offset) if r.get("message") == "a pool slot is free: pod let in"}
    assert not any(pod.startswith(name) for pod in let_in), let_in


def test_cancel_a_queued_run_frees_its_place(api: Api, runs: Runs, egress_placer: Placer) -> None:
    blockers = uploads(runs, TEAM_CDN, "block", SLOTS + 2)
    target = runs.name("cancelled")
    runs.create(TEAM_CDN, "taskruns", taskrun(target, MATCHING_IMAGE))
    after = runs.name("after")
    runs.create(TEAM_CDN, "taskruns", taskrun(after, MATCHING_IMAGE))
    # Cancelled while still pending (the test op fails if the leader released it first: it is last but one in line).
    path = f"/apis/tekton.dev/v1/namespaces/{TEAM_CDN}/taskruns/{target}"
    api.json_patch(path, [{"op": "test", "path": "/spec/status", "value": "TaskRunPending"},
                          {"op": "replace", "path": "/spec/status", "value": "TaskRunCancelled"}])
    runs.wait_succeeded(TEAM_CDN, "taskruns", [*blockers, after], timeout=300)
    cancelled = wait_for("the cancelled run to finish", lambda: succeeded(runs.get(TEAM_CDN, "taskruns", target)) == "False")
    assert cancelled
    assert runs.nodes_of(TEAM_CDN, [target])[target] is None  # it never had a pod
    wait_for("the queue to be empty", lambda: egress_placer.metric("egress_placer_queue_length", {"pool": "overseas"}) == 0)


def test_fairness_b_is_not_stuck_behind_a(runs: Runs, egress_placer: Placer) -> None:
    offset = egress_placer.log.stat().st_size
    a = uploads(runs, TEAM_CDN, "fair-a", 50)
    b = uploads(runs, TEAM_OTHER, "fair-b", 10)
    runs.wait_succeeded(TEAM_CDN, "taskruns", a, timeout=600)
    runs.wait_succeeded(TEAM_OTHER, "taskruns", b, timeout=300)
    order = released_order(egress_placer, offset)
    assert set(order) >= set(a) | set(b), "every run was released by the leader"
    last_b = max(order.index(name) for name in b)
    a_30th = sorted(order.index(name) for name in a)[29]
    assert last_b < a_30th, f"B's last release at {last_b}, A's 30th at {a_30th}: {order}"


def test_a_pipelineruns_own_timeout_counts_its_tasks_wait(runs: Runs) -> None:
    """Measured for docs/queue.md: a PipelineRun's timeout starts when the PipelineRun does; a task queued
    behind a full pool waits inside it."""
    blockers = uploads(runs, TEAM_CDN, "pblock", 4 * SLOTS)
    name = runs.name("pipeline")
    body = {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": name},
        "spec": {
            "timeouts": {"pipeline": "5s"},
            "pipelineSpec": {"tasks": [{"name": "upload", "taskSpec": {"steps": [step(MATCHING_IMAGE)]}}]},
        },
    }
    runs.create(TEAM_CDN, "pipelineruns", body)
    finished = wait_for("the PipelineRun to finish", lambda: (r := runs.get(TEAM_CDN, "pipelineruns", name)) and succeeded(r) and r, timeout=300)
    runs.wait_succeeded(TEAM_CDN, "taskruns", blockers, timeout=600)
    reason = next(c["reason"] for c in finished["status"]["conditions"] if c["type"] == "Succeeded")
    # Behind 24 runs of 6 slots the task waits far longer than 5 s: the PipelineRun times out.
    assert reason == "PipelineRunTimeout", finished["status"]["conditions"]


def test_leader_killed_mid_queue_no_run_stuck_none_released_twice(
    devcluster: Cluster, api: Api, runs: Runs, egress_placer: Placer
) -> None:
    stop_controller(devcluster)
    start_controller(devcluster, POLICY_FILE, replicas=2, proxy=True)
    wait_for("a leader", quietly(lambda: lease_holder(api)), timeout=60, interval=0.2)
    names = uploads(runs, TEAM_CDN, "leader", 18)
    leader = egress_placer.named(lease_holder(api) or "")
    wait_for("some releases", lambda: sum(1 for n in names if "status" not in (runs.get(TEAM_CDN, "taskruns", n).get("spec") or {})) >= SLOTS, timeout=120)
    killed_at = time.time()
    kill_component(devcluster, leader.name)
    runs.wait_succeeded(TEAM_CDN, "taskruns", names, timeout=600)
    logs = {replica.identity: released_from(egress_placer.log_of(replica), names) for replica in egress_placer.replicas}
    by_replica = {identity: [name for name, _ in logged] for identity, logged in logs.items()}
    released = [n for logged in by_replica.values() for n in logged]
    duplicates = {n for n in released if released.count(n) > 1}
    assert not duplicates, f"released twice: {duplicates}"
    # The new leader rebuilt the queue from the cluster and released the rest (the killed one may have
    # released a run and died before logging it: that run is not released again, as the test patch says).
    assert any(logged for identity, logged in by_replica.items() if identity != leader.identity), by_replica
    # Releases were delayed by at most the lease time: the new leader's first release came within the takeover
    # and one run's length (the slots were full when the leader died) of the kill.
    first = min(at for identity, logged in logs.items() if identity != leader.identity for _, at in logged)
    assert first - killed_at <= RELEASE_AFTER_KILL_SECONDS, (
        f"first release {first - killed_at:.1f} s after the kill (lease {LEASE_SECONDS} s)")


def released_from(log: Path, names: list[str]) -> list[tuple[str, float]]:
    """The runs of `names` a replica's JSON log says it released, with when (epoch seconds)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if str(record.get("message", "")).startswith("released from pool") and record.get("name") in names:
            out.append((str(record.get("name")), datetime.fromisoformat(str(record["time"])).timestamp()))
    return out
