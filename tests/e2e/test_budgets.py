"""End to end, egress budgets (docs/budgets.md, issue #26) on the local cluster: pool `overseas` (3 KWOK
nodes), egress-1 and egress-2 labelled with one egress address, egress-3 its own.

- Concurrency: a destination allows 2 runs at once per address; 20 runs never have more than 2 Running
  behind the shared address nor more than 2 on egress-3 at any sampled moment, and all 20 Succeed.
- Window: a destination allows 5 starts per 60 s per address (2 addresses): of 12 runs created at once,
  at most 10 start within the first window; the rest wait and then Succeed.
- Window across a leader kill (two replicas): the issue's 30 runs, the leader killed once some have
  started; behind each address no 58 s holds more than 5
  starts, and all Succeed.
- Two replicas admitting at once (round-robin proxy): 12 uploads, still at most 2 Running behind each
  address; every run's entry names the address the leader released it to.
- The window outlives its runs: 4 runs fill a window of 2 starts per 600 s per address; the leader's
  record (ConfigMap egress-placer-budget-starts) holds their starts; with every replica stopped the runs
  are deleted (their pods with them), the controller started again: a fifth run is held for the full
  window."""

from __future__ import annotations

import threading
from typing import Any, Iterator

import pytest

from controller.queue.core import QUEUE_ANNOTATION, read_entry
from devcluster.cluster import Cluster
from devplacer.faults import kill_component
from devplacer.local_placer import start_controller, stop_controller
from tests.e2e.harness import DATA, ControllerSpec, Placer, lease_holder, quietly
from tests.e2e.tekton_runs import POOL_NODES, TEAM_CDN, Runs, taskrun
from tests.kube import Api, node, pods
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

CONTROLLER = ControllerSpec(policy=DATA / "policy-budgets.yaml", run_guard=True)
ADDRESS_LABEL = "egress-placer.io/egress-address"
SHARED = "203.0.113.7"
UPLOAD_IMAGE = "registry.example.com/cdn-uploader:1.4"
WINDOW_IMAGE = "registry.example.com/window-puller:1"
RECORD_IMAGE = "registry.example.com/record-puller:1"


@pytest.fixture(scope="module", autouse=True)
def shared_address(api: Api, egress_placer: Placer) -> Iterator[None]:
    """egress-1 and egress-2 behind one address; the labels removed afterwards."""
    for name in ("egress-1", "egress-2"):
        api.merge_patch(node(name), {"metadata": {"labels": {ADDRESS_LABEL: SHARED}}})
    yield
    for name in ("egress-1", "egress-2"):
        api.merge_patch(node(name), {"metadata": {"labels": {ADDRESS_LABEL: None}}})


class AddressSampler:
    """Lists the Tekton pods over and over; keeps the most Running at once behind each address."""

    def __init__(self, api: Api, namespace: str, interval: float = 0.2) -> None:
        self.api, self.namespace, self.interval = api, namespace, interval
        self.most: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now: dict[str, int] = {}
            for pod in self.api.items(pods(self.namespace), labelSelector="tekton.dev/taskRun"):
                where = pod["spec"].get("nodeName")
                if pod["status"].get("phase") == "Running" and where in POOL_NODES:
                    address = SHARED if where in ("egress-1", "egress-2") else where
                    now[address] = now.get(address, 0) + 1
            for address, count in now.items():
                self.most[address] = max(self.most.get(address, 0), count)
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> "AddressSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_two_at_once_per_address_across_twenty_runs_all_succeed(api: Api, runs: Runs) -> None:
    names = [runs.name(f"upload-{i:02d}") for i in range(20)]
    with AddressSampler(api, TEAM_CDN) as sampler:
        for name in names:
            runs.create(TEAM_CDN, "taskruns", taskrun(name, UPLOAD_IMAGE))
        held = runs.listed(TEAM_CDN, "taskruns")
        runs.wait_succeeded(TEAM_CDN, "taskruns", names, timeout=600)
    assert sampler.samples > 10
    assert sampler.most.get(SHARED, 0) <= 2 and sampler.most.get("egress-3", 0) <= 2, sampler.most
    assert sampler.most.get(SHARED, 0) >= 1, sampler.most  # the burst did reach the pool
    marks = [read_entry(o["metadata"]["annotations"].get(QUEUE_ANNOTATION), "TaskRun") for n, o in held.items() if n in names]
    assert marks and all(m is not None and m.budgets == ("cdn-uploads",) for m in marks)
    assert set(runs.nodes_of(TEAM_CDN, names).values()) <= POOL_NODES
    print(f"\nconcurrency: {sampler.samples} samples, most Running at once per address {sampler.most}")


def _start(run: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(run["status"]["startTime"].replace("Z", "+00:00")).timestamp()


def test_five_starts_per_window_per_address(api: Api, runs: Runs) -> None:
    names = [runs.name(f"window-{i:02d}") for i in range(12)]
    for name in names:
        runs.create(TEAM_CDN, "taskruns", taskrun(name, WINDOW_IMAGE))
    done = runs.wait_succeeded(TEAM_CDN, "taskruns", names, timeout=600)
    starts = sorted(_start(done[n]) for n in names)
    first = starts[0]
    assert sum(1 for s in starts if s < first + 55) <= 10, starts  # 2 addresses x 5 (startTime: 1 s resolution)
    assert starts[-1] >= first + 55, "the last runs waited for the window"
    print(f"\nwindow: {len(starts)} starts, first window {sum(1 for s in starts if s < first + 55)}, last at +{starts[-1] - first:.0f} s")


def test_the_window_is_kept_across_a_leader_kill(devcluster: Cluster, api: Api, runs: Runs, egress_placer: Placer) -> None:
    stop_controller(devcluster)
    start_controller(devcluster, CONTROLLER.policy, replicas=2, proxy=True)
    wait_for("a leader", quietly(lambda: lease_holder(api)), timeout=60, interval=0.2)
    names = [runs.name(f"kill-{i:02d}") for i in range(30)]
    for name in names:
        runs.create(TEAM_CDN, "taskruns", taskrun(name, WINDOW_IMAGE))
    leader = egress_placer.named(lease_holder(api) or "")
    wait_for("some starts", lambda: sum(1 for n in names if (runs.get(TEAM_CDN, "taskruns", n).get("status") or {}).get("startTime")) >= 3,
             timeout=240, interval=0.5)
    kill_component(devcluster, leader.name)
    done = runs.wait_succeeded(TEAM_CDN, "taskruns", names, timeout=1200)
    nodes = runs.nodes_of(TEAM_CDN, names)
    by_address: dict[str, list[float]] = {}
    for name in names:
        address = SHARED if nodes[name] in ("egress-1", "egress-2") else str(nodes[name])
        by_address.setdefault(address, []).append(_start(done[name]))
    for address, starts in by_address.items():
        starts.sort()
        worst = max(sum(1 for u in starts if t <= u < t + 58) for t in starts)
        assert worst <= 5, (address, starts)
    print(f"\nleader kill: starts per address {({a: len(s) for a, s in by_address.items()})}")


def test_two_replicas_admitting_at_once_keep_two_at_once_per_address(devcluster: Cluster, api: Api, runs: Runs) -> None:
    """Two replicas behind the round-robin proxy answer the Pod CREATEs of one burst: each pod goes behind
    the address the leader released its run to (written in the run's entry), so no address holds more
    than 2 Running at once though neither replica sees the other's pods at once."""
    stop_controller(devcluster)
    start_controller(devcluster, CONTROLLER.policy, replicas=2, proxy=True, run_guard=True)
    wait_for("a leader", quietly(lambda: lease_holder(api)), timeout=60, interval=0.2)
    names = [runs.name(f"pair-{i:02d}") for i in range(12)]
    with AddressSampler(api, TEAM_CDN) as sampler:
        for name in names:
            runs.create(TEAM_CDN, "taskruns", taskrun(name, UPLOAD_IMAGE))
        done = runs.wait_succeeded(TEAM_CDN, "taskruns", names, timeout=600)
    assert sampler.most.get(SHARED, 0) <= 2 and sampler.most.get("egress-3", 0) <= 2, sampler.most
    marks = [read_entry(done[n]["metadata"]["annotations"].get(QUEUE_ANNOTATION), "TaskRun") for n in names]
    released_to = [m.address for m in marks if m is not None]
    assert set(released_to) <= {SHARED, "egress-3"} and len(released_to) == len(names), released_to
    nodes = runs.nodes_of(TEAM_CDN, names)
    behind = sum(1 for n, m in zip(names, marks) if m is not None and (SHARED if nodes[n] in ("egress-1", "egress-2") else nodes[n]) == m.address)
    print(f"\ntwo replicas: {sampler.samples} samples, most Running at once per address {sampler.most}; "
          f"{behind} of {len(names)} pods behind the address their run was released to")


def test_a_window_outlives_its_runs_deleted_while_no_replica_watched(devcluster: Cluster, api: Api, runs: Runs) -> None:
    """What a tenant could try: delete its finished runs (and pods) while no replica watches, to free the
    window. The leader's record keeps their starts; a replica started afterwards holds the next run."""
    from controller.budgets.core import STARTS_CONFIGMAP, STARTS_KEY, decode_starts
    from devplacer.local_placer import NAMESPACE

    names = [runs.name(f"record-{i}") for i in range(4)]  # 2 addresses x 2 starts: the window full
    for name in names:
        runs.create(TEAM_CDN, "taskruns", taskrun(name, RECORD_IMAGE))
    runs.wait_succeeded(TEAM_CDN, "taskruns", names, timeout=300)
    uids = {p["metadata"]["uid"] for n, p in runs.pods_by_taskrun(TEAM_CDN).items() if n in names}

    def recorded() -> dict[str, Any] | None:
        cm = api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{STARTS_CONFIGMAP}") or {}
        kept = decode_starts((cm.get("data") or {}).get(STARTS_KEY))
        return kept if uids <= set(kept) else None

    kept = wait_for("the leader's record of the 4 starts", recorded, timeout=60, interval=0.5)
    assert all(pool == "overseas" and [s.destination for s in starts] == ["record-pulls"] for uid, (pool, starts) in kept.items() if uid in uids)
    stop_controller(devcluster)
    for name in names:  # what `kubectl delete taskrun` does, the pods deleted with them
        api.delete(f"/apis/tekton.dev/v1/namespaces/{TEAM_CDN}/taskruns/{name}")
        api.delete(pods(TEAM_CDN), labelSelector=f"tekton.dev/taskRun={name}", gracePeriodSeconds=0)
    wait_for("the runs and their pods gone", lambda: not (set(names) & set(runs.pods_by_taskrun(TEAM_CDN)) or set(names) & set(runs.listed(TEAM_CDN, "taskruns"))),
             timeout=120, interval=0.5)
    start_controller(devcluster, CONTROLLER.policy, replicas=1, run_guard=True)
    late = runs.name("record-late")
    runs.create(TEAM_CDN, "taskruns", taskrun(late, RECORD_IMAGE))
    held = runs.get(TEAM_CDN, "taskruns", late)
    entry = read_entry(held["metadata"]["annotations"].get(QUEUE_ANNOTATION), "TaskRun")
    assert held["spec"].get("status") == "TaskRunPending" and entry is not None and entry.budgets == ("record-pulls",)
    waiting = wait_for("the Queued Event naming the full window", lambda: [
        e for e in runs.events(TEAM_CDN, "Queued") if (e.get("regarding") or {}).get("name") == late and "waiting for budget record-pulls" in (e.get("note") or "")],
        timeout=60, interval=0.5)
    assert "2 of 2 in the last 10 min" in waiting[0]["note"], waiting[0]["note"]
    assert runs.get(TEAM_CDN, "taskruns", late)["spec"].get("status") == "TaskRunPending"
    print(f"\nrecord: {len(kept)} starts kept; after the restart: {waiting[0]['note']}")


# -- a real tenant (edit + Tekton's aggregated roles) against its budgets --------------------------------

TENANT = "tenant"
LONG_RUN = {"devcluster.egress-placer.io/run-duration": "120s"}


@pytest.fixture(scope="module")
def tenant(devcluster: Cluster, api: Api, egress_placer: Placer) -> Iterator[Api]:
    from tests.e2e.harness import editor
    from tests.reliability.test_hostile_tenant_runs import can_i

    with editor(devcluster, api, TEAM_CDN, TENANT, service_account=True) as client:
        wait_for("edit to aggregate Tekton's rights", lambda: can_i(devcluster, "patch", "taskruns.tekton.dev", TEAM_CDN), timeout=60)
        yield client


def test_a_tenant_cannot_free_room_by_removing_its_pods_budget_record(api: Api, runs: Runs, tenant: Api) -> None:
    """`edit` may patch pods: removing (or rewriting) the record that counts its upload is refused by the
    run guard, so the room its pod takes stays taken; a held run's spec.status stays egress-placer's."""
    from kubernetes.client.exceptions import ApiException

    from controller.budgets.core import BUDGETS_ANNOTATION
    from controller.core.run_guard import RUN_GUARD_NAME

    name = runs.name("abuse-upload")
    runs.create(TEAM_CDN, "taskruns", taskrun(name, UPLOAD_IMAGE, annotations=LONG_RUN), api=tenant)
    pod = wait_for(f"the pod of {name}", lambda: runs.pods_by_taskrun(TEAM_CDN).get(name), timeout=120)
    assert BUDGETS_ANNOTATION in pod["metadata"]["annotations"]
    path = pods(TEAM_CDN) + "/" + pod["metadata"]["name"]
    for change in ({"metadata": {"annotations": {BUDGETS_ANNOTATION: None}}},
                   {"metadata": {"annotations": {BUDGETS_ANNOTATION: '{"pool":"overseas","destinations":[],"node":"x","time":1}'}}}):
        with pytest.raises(ApiException) as refused:
            tenant.merge_patch(path, change)
        assert refused.value.status in (403, 422) and RUN_GUARD_NAME in str(refused.value.body), refused.value.body
    assert api.get(path)["metadata"]["annotations"][BUDGETS_ANNOTATION] == pod["metadata"]["annotations"][BUDGETS_ANNOTATION]
