"""End to end, the controller's life: it runs under the `k8s/` ServiceAccount's identity; while it is
down runs still finish and the pool taints keep foreign runs off the pool; restarted it is ready,
places runs again and reports each run it missed (log line and `NotAdmitted` Event). A policy
problem is never fatal: restarted with a broken policy it comes up with the last good policy the
leader stored, keeps the taints and says why (`/readyz` body, `egress-placer status`, log line); with
none stored it places nothing and still keeps the taints; an invalid policy on reload is refused (old
policy kept, `PolicyRefused` Event, refused-reloads metric up). A valid policy without the pool
removes the pool's taints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from controller.last_good_policy.reconcile import POLICY_KEY, store_name
from devcluster.cluster import Cluster
from devplacer.local_placer import (
    NAMESPACE,
    POLICY_CONFIGMAP,
    apply_policy,
    service_account_user,
    start_controller,
    stop_controller,
)
from tests.e2e.harness import INVALID_POLICY_FILE, POLICY_FILE, Placer, pool_taints
from tests.e2e.tekton_runs import (
    MATCHING_IMAGE,
    POOL,
    POOL_NODES,
    POOL_TAINT,
    TEAM_CDN,
    TEAM_OTHER,
    Runs,
    decision_of,
    events,
    taskrun,
)
from tests.kube import Api, api_for, namespaced
from tests.waiting import holds_for, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
RUNS_WHILE_DOWN = 5
TAINTS_STAY_SECONDS = 3.0  # with no valid policy, the taints are checked to stay this long
REFUSED = {"result": "refused"}
LOADED = {"result": "loaded"}
RELOADS = "egress_placer_policy_reloads_total"
LAST_GOOD = store_name(POLICY_CONFIGMAP)
WITHOUT_THE_POOL = "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npools: []\n"
PLACMENT = f"configmap {NAMESPACE}/{POLICY_CONFIGMAP}:{POLICY_KEY}:10: pools[0].placment"  # INVALID_POLICY_FILE's error


def assert_placed_on_pool(runs: Runs, name: str) -> None:
    """Create a matching TaskRun in team-cdn and check it ran on the pool, decided by image."""
    runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name], timeout=60)
    assert runs.nodes_of(TEAM_CDN, [name])[name] in POOL_NODES
    decision = decision_of(done[name])
    assert (decision["pool"], decision["reason"]) == (POOL, "image-match")


def test_the_controller_runs_under_the_k8s_service_account(egress_placer: Placer) -> None:
    process = egress_placer.cluster.process(egress_placer.replica.name)
    assert process is not None and process.alive()
    environ = dict(
        item.split("=", 1) for item in Path(f"/proc/{process.pid}/environ").read_text().split("\0") if "=" in item
    )
    review = api_for(environ["EGRESS_PLACER_KUBECONFIG"]).create(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert review["status"]["userInfo"]["username"] == service_account_user() == "system:serviceaccount:egress-placer:egress-placer"


def test_runs_finish_while_the_controller_is_down_and_are_reported_after_restart(
    egress_placer: Placer, runs: Runs
) -> None:
    cluster = egress_placer.cluster
    stop_controller(cluster)
    try:
        while_down = {
            TEAM_CDN: [runs.name(f"down-cdn-{i}") for i in range(RUNS_WHILE_DOWN)],
            TEAM_OTHER: [runs.name(f"down-other-{i}") for i in range(RUNS_WHILE_DOWN)],
        }
        runs.create_all(
            (namespace, "taskruns", taskrun(name, MATCHING_IMAGE)) for namespace, names in while_down.items() for name in names
        )
        for namespace, names in while_down.items():
            done = runs.wait_succeeded(namespace, "taskruns", names)
            assert [decision_of(run) for run in done.values()] == [{}] * RUNS_WHILE_DOWN  # no webhook answered
            nodes = runs.nodes_of(namespace, names)
            assert not POOL_NODES & set(nodes.values()), nodes  # the taints keep untolerated pods off

        log_offset = egress_placer.log.stat().st_size
    finally:
        start_controller(cluster, POLICY_FILE)

    assert requests.get(egress_placer.replica.health_url + "/readyz", timeout=5).status_code == 200
    assert_placed_on_pool(runs, runs.name("after-restart"))

    for namespace, names in while_down.items():
        wait_for(
            f"a NotAdmitted Event regarding each TaskRun created in {namespace} while the controller was down",
            lambda: set(names) <= {e["regarding"]["name"] for e in runs.events(namespace, "NotAdmitted")},
            timeout=20,
        )
    logged = {r.get("name") for r in egress_placer.log_records(log_offset) if r.get("message", "").startswith("run not admitted")}
    assert set(while_down[TEAM_CDN] + while_down[TEAM_OTHER]) <= logged


def taints_of_the_pool(api: Api) -> dict[str, list[dict[str, str]]]:
    """Each pool node's taints with egress-placer's key."""
    return {name: pool_taints(api, name) for name in sorted(POOL_NODES)}


TAINTED = {node: [POOL_TAINT] for node in sorted(POOL_NODES)}


def stored_policy(api: Api) -> str | None:
    return ((api.get(namespaced(NAMESPACE, "configmaps", LAST_GOOD)) or {}).get("data") or {}).get(POLICY_KEY)


def readyz(egress_placer: Placer) -> requests.Response:
    return requests.get(egress_placer.replica.health_url + "/readyz", timeout=5)


def status_of_the_cluster(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    """`egress-placer status` as an administrator runs it for a controller on the ConfigMap form (this
    module's: it changes the policy as a document, broken ones included)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGRESS_PLACER_")}
    env.update(
        PYTHONPATH=str(REPO),
        EGRESS_PLACER_KUBECONFIG=str(cluster.kubeconfig),
        EGRESS_PLACER_NAMESPACE=NAMESPACE,
        EGRESS_PLACER_POLICY_SOURCE="configmap",
    )
    return subprocess.run([sys.executable, "-m", "controller", "status"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)


def restart_with(cluster: Cluster, policy_file: Path) -> None:
    stop_controller(cluster)
    start_controller(cluster, policy_file)  # returns once /readyz answers 200


def test_after_a_restart_with_a_broken_policy_the_last_good_one_stays_with_the_taints(
    egress_placer: Placer, api: Api, runs: Runs
) -> None:
    cluster = egress_placer.cluster
    wait_for("the leader to store the policy it loaded", lambda: stored_policy(api) == POLICY_FILE.read_text(), timeout=20)
    assert taints_of_the_pool(api) == TAINTED
    try:
        log_offset = egress_placer.log.stat().st_size
        restart_with(cluster, INVALID_POLICY_FILE)

        ready = readyz(egress_placer)
        assert ready.status_code == 200 and ready.text.startswith("ready, degraded: ")
        assert PLACMENT in ready.text and f"in force: the last good policy stored in configmap {NAMESPACE}/{LAST_GOOD}" in ready.text
        logged = [r for r in egress_placer.log_records(log_offset) if str(r.get("message", "")).startswith("no valid policy at start")]
        assert logged and PLACMENT in str(logged[-1]["error"]), logged
        status = status_of_the_cluster(cluster)
        assert status.returncode == 2 and "policy: " + PLACMENT in status.stdout, status.stdout + status.stderr
        assert "overseas" in status.stdout and "egress-1" in status.stdout  # the table of the policy in force
        assert_placed_on_pool(runs, runs.name("stored-policy"))
        assert taints_of_the_pool(api) == TAINTED
        assert stored_policy(api) == POLICY_FILE.read_text()  # a refused policy is never stored
    finally:
        restart_with(cluster, POLICY_FILE)


def test_with_no_valid_policy_and_none_stored_nothing_is_placed_and_the_taints_stay(
    egress_placer: Placer, api: Api, runs: Runs
) -> None:
    cluster = egress_placer.cluster
    try:
        stop_controller(cluster)
        api.delete(namespaced(NAMESPACE, "configmaps", LAST_GOOD))
        log_offset = egress_placer.log.stat().st_size
        start_controller(cluster, INVALID_POLICY_FILE)

        ready = readyz(egress_placer)
        assert ready.status_code == 200 and PLACMENT in ready.text
        assert "no valid policy in force: nothing is placed on a pool, the pool taints stay" in ready.text
        wait_for(
            "the replica to lead (the taint reconciler runs)",
            lambda: any(str(r.get("message", "")).startswith("leading:") for r in egress_placer.log_records(log_offset)),
            timeout=30,
        )
        name = runs.name("no-policy")
        runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
        done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name], timeout=60)
        assert decision_of(done[name]).get("pool") is None and runs.nodes_of(TEAM_CDN, [name])[name] not in POOL_NODES
        # The leader has run its reconcilers (after leading, and again for the run above): a wrong
        # removal would show within seconds. The taints must all stay that long.
        holds_for("every pool taint to stay", lambda: taints_of_the_pool(api) == TAINTED, seconds=TAINTS_STAY_SECONDS, interval=0.5)
        assert stored_policy(api) is None
    finally:
        restart_with(cluster, POLICY_FILE)
    wait_for("the valid policy to be stored again", lambda: stored_policy(api) == POLICY_FILE.read_text(), timeout=20)


def test_a_valid_policy_without_the_pool_removes_its_taints(egress_placer: Placer, api: Api) -> None:
    cluster = egress_placer.cluster
    assert taints_of_the_pool(api) == TAINTED
    apply_policy(cluster, WITHOUT_THE_POOL)
    try:
        wait_for("the pool's taints to be removed", lambda: taints_of_the_pool(api) == {node: [] for node in sorted(POOL_NODES)}, timeout=20)
        wait_for("the policy without the pool to be stored", lambda: stored_policy(api) == WITHOUT_THE_POOL, timeout=20)
    finally:
        apply_policy(cluster, POLICY_FILE.read_text())
    wait_for("the pool's taints back", lambda: taints_of_the_pool(api) == TAINTED, timeout=20)


def test_an_invalid_policy_on_reload_is_refused_and_the_old_one_stays(
    egress_placer: Placer, api: Api, runs: Runs
) -> None:
    cluster = egress_placer.cluster
    refused_before = egress_placer.metric(RELOADS, REFUSED)
    loaded_before = egress_placer.metric(RELOADS, LOADED)
    events_before = {e["metadata"]["name"] for e in events(api, NAMESPACE, "PolicyRefused")}

    apply_policy(cluster, INVALID_POLICY_FILE.read_text())
    try:
        wait_for("the refused-reloads metric to go up", lambda: egress_placer.metric(RELOADS, REFUSED) > refused_before, timeout=15)
        refusals = wait_for(
            "a PolicyRefused Event on the policy ConfigMap",
            lambda: [
                e for e in events(api, NAMESPACE, "PolicyRefused")
                if e["metadata"]["name"] not in events_before and e["regarding"]["kind"] == "ConfigMap"
                and e["regarding"]["name"] == POLICY_CONFIGMAP
            ],
            timeout=15,
        )
        assert "pools[0].placment" in refusals[0]["note"]
        assert_placed_on_pool(runs, runs.name("after-refusal"))
    finally:
        apply_policy(cluster, POLICY_FILE.read_text())
    wait_for("the valid policy to be loaded again", lambda: egress_placer.metric(RELOADS, LOADED) > loaded_before, timeout=15)
