"""End to end, the controller's life: it runs under the `k8s/` ServiceAccount's identity; while it is
down runs still finish and the pool taints keep foreign runs off the pool; restarted it is ready,
places runs again and reports each run it missed (log line and `NotAdmitted` Event); an invalid
policy is fatal at start (naming the field and line) and refused on reload (old policy kept,
`PolicyRefused` Event, refused-reloads metric up)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from devcluster.cluster import Cluster
from devcluster.process import free_port
from devplacer.controller import (
    NAMESPACE,
    POLICY_CONFIGMAP,
    apply_policy,
    service_account_user,
    start_controller,
    stop_controller,
)
from tests.e2e.running_controller import INVALID_POLICY_FILE, POLICY_FILE, EgressPlacer
from tests.e2e.tekton_runs import (
    MATCHING_IMAGE,
    POOL,
    POOL_NODES,
    TEAM_CDN,
    TEAM_OTHER,
    Runs,
    decision_of,
    events,
    taskrun,
)
from tests.kube import Api, api_for
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
RUNS_WHILE_DOWN = 5
REFUSED = {"result": "refused"}
LOADED = {"result": "loaded"}
RELOADS = "egress_placer_policy_reloads_total"


def assert_placed_on_pool(runs: Runs, name: str) -> None:
    """Create a matching TaskRun in team-cdn and check it ran on the pool, decided by image."""
    runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name], timeout=60)
    assert runs.nodes_of(TEAM_CDN, [name])[name] in POOL_NODES
    decision = decision_of(done[name])
    assert (decision["pool"], decision["reason"]) == (POOL, "image-match")


def test_the_controller_runs_under_the_k8s_service_account(egress_placer: EgressPlacer) -> None:
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
    egress_placer: EgressPlacer, runs: Runs
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


def test_an_invalid_policy_at_start_is_fatal_and_names_the_field(devcluster: Cluster) -> None:
    kubeconfig = devcluster.mint_kubeconfig(service_account_user())
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGRESS_PLACER_")}
    env.update(
        PYTHONPATH=str(REPO),
        EGRESS_PLACER_POLICY_FILE=str(INVALID_POLICY_FILE),
        EGRESS_PLACER_KUBECONFIG=str(kubeconfig),
        EGRESS_PLACER_IDENTITY="e2e-invalid-policy",
        EGRESS_PLACER_WEBHOOK_HOST="127.0.0.1",
        EGRESS_PLACER_WEBHOOK_PORT=str(free_port()),
        EGRESS_PLACER_HEALTH_HOST="127.0.0.1",
        EGRESS_PLACER_HEALTH_PORT=str(free_port()),
    )
    result = subprocess.run(
        [sys.executable, "-m", "controller", "run"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )

    assert result.returncode != 0
    verdict = [line for line in result.stderr.splitlines() if line.startswith("egress-placer: ")]
    assert verdict, result.stderr
    assert f"{INVALID_POLICY_FILE}:10: pools[0].placment" in verdict[-1]


def test_an_invalid_policy_on_reload_is_refused_and_the_old_one_stays(
    egress_placer: EgressPlacer, api: Api, runs: Runs
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
