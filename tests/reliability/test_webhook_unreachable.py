"""Reliability, the webhook unreachable: first the webhook configuration points at a dead port while the
controller runs, then the controller is killed with SIGKILL and started again. Checks that runs go on
failing open (all Succeeded, on ordinary nodes, no decision), that no run of any namespace gets onto
the pool (the taints keep them off), that a pod which tolerates the pool taint itself (nothing strips
the toleration while admission is away) is evicted by the leader, and that the restarted controller
reports every run it missed (a NotAdmitted Event each)."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from devcluster.cluster import Cluster
from devcluster.process import free_port
from devplacer.local_placer import WEBHOOK_CONFIG
from devplacer.faults import kill_component, start_component
from tests.e2e.harness import WEBHOOK_CONFIGS, Placer, quietly
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL_LABEL, POOL_NODES, Runs, decision_of, events, succeeded, taskrun
from tests.kube import TEKTON, Api, namespaced
from tests.reliability.burst import all_finished
from tests.reliability.cluster_view import intruder_pod, pod_gone, pod_node
from tests.reliability.suite import TEAM_CDN, TEAM_OTHER, Figures
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

RUNS_PER_NAMESPACE = 10
EVICTION_SECONDS = 10.0  # stated bound: a tolerating pod on the pool is evicted by a running leader
REPORT_SECONDS = 30.0  # stated bound: restarted controller -> a NotAdmitted Event for every missed run
FINISH_SECONDS = 180.0


def create_runs(runs: Runs, prefix: str) -> dict[str, list[str]]:
    """RUNS_PER_NAMESPACE matching TaskRuns in TEAM_CDN and in TEAM_OTHER; their names by namespace."""
    names = {ns: [runs.name(f"{prefix}-{ns.rsplit('-', 1)[-1]}-{i}") for i in range(RUNS_PER_NAMESPACE)] for ns in (TEAM_CDN, TEAM_OTHER)}
    runs.create_all((ns, "taskruns", taskrun(name, MATCHING_IMAGE)) for ns, ns_names in names.items() for name in ns_names)
    return names


def finished_off_pool(runs: Runs, names: dict[str, list[str]]) -> tuple[int, int, int]:
    """(Succeeded, on a pool node, with a decision annotation) over all the runs."""
    ok = on_pool = decided = 0
    for ns, ns_names in names.items():
        wait_for(
            f"the runs in {ns} to finish",
            quietly(lambda: all_finished(runs, ns, ns_names)),
            timeout=FINISH_SECONDS,
            interval=1.0,
        )
        listed = runs.listed(ns, "taskruns")
        nodes = runs.nodes_of(ns, ns_names)
        ok += sum(1 for n in ns_names if succeeded(listed[n]) == "True")
        on_pool += sum(1 for n in ns_names if nodes[n] in POOL_NODES)
        decided += sum(1 for n in ns_names if decision_of(listed[n]))
    return ok, on_pool, decided


def tolerating_pod(name: str) -> dict:
    """A pod of its own: the pool toleration and a nodeSelector for the pool (the scheduler puts it there)."""
    return intruder_pod(name, node=None, nodeSelector=POOL_LABEL)


@pytest.fixture
def dead_webhook_url(api: Api, egress_placer: Placer) -> Iterator[str]:
    """Every webhook of the configuration points at a port nothing listens on; put back afterwards."""
    path = f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}"
    original = [w["clientConfig"]["url"] for w in api.call("GET", path)["webhooks"]]
    dead = f"https://127.0.0.1:{free_port()}/mutate"

    def point_at(urls: list[str]) -> None:
        api.json_patch(path, [{"op": "replace", "path": f"/webhooks/{i}/clientConfig/url", "value": u} for i, u in enumerate(urls)])

    point_at([dead] * len(original))
    try:
        wait_for("the API server to call the dead URL", lambda: not webhook_answers(api), timeout=30)
        yield dead
    finally:
        point_at(original)
        wait_for("the API server to call the webhook again", lambda: webhook_answers(api), timeout=30)


def webhook_answers(api: Api) -> bool:
    """Whether a server-side dry run of a TaskRun in TEAM_CDN comes back decided. The API server reloads
    webhook configurations from its own watch, a moment after the write; the webhooks say sideEffects
    NoneOnDryRun, so a dry run reaches them."""
    body = taskrun("webhook-probe", MATCHING_IMAGE)
    made = api.create(namespaced(TEAM_CDN, "taskruns", group=TEKTON), body, dryRun="All")
    return bool(decision_of(made))


def test_runs_fail_open_and_stay_off_the_pool_while_the_webhook_is_unreachable(
    api: Api, runs: Runs, dead_webhook_url: str, figures: Figures
) -> None:
    figures.fault(
        "the webhook URL points at a dead port (controller running)",
        f"{RUNS_PER_NAMESPACE} matching TaskRuns each in {TEAM_CDN} and {TEAM_OTHER}; a {TEAM_OTHER} pod "
        "with the pool toleration and nodeSelector",
        f"runs Succeeded on ordinary nodes (fail-open), none on the pool; the tolerating pod evicted within {EVICTION_SECONDS:.0f} s",
    )
    pod = runs.name("tolerating")
    created = time.monotonic()
    runs.create_pod(TEAM_OTHER, tolerating_pod(pod))
    names = create_runs(runs, "deadport")

    wait_for(
        f"pod {pod} evicted",
        quietly(lambda: pod_gone(api, TEAM_OTHER, pod)),
        timeout=EVICTION_SECONDS + 20,
        interval=0.1,
    )
    evicted = time.monotonic() - created
    ok, on_pool, decided = finished_off_pool(runs, names)
    total = sum(len(n) for n in names.values())
    figures.measured(
        f"{ok}/{total} Succeeded, {on_pool} on the pool, {decided} decided (no webhook answered); "
        f"the tolerating pod evicted {evicted:.1f} s after creation",
        on_pool,
    )

    assert (ok, on_pool, decided) == (total, 0, 0)
    assert evicted <= EVICTION_SECONDS


def test_a_killed_controller_restarted_reports_every_run_it_missed(
    devcluster: Cluster, api: Api, egress_placer: Placer, runs: Runs, figures: Figures
) -> None:
    figures.fault(
        "the controller (1 replica) SIGKILLed, started again after the runs finished",
        f"{RUNS_PER_NAMESPACE} matching TaskRuns each in {TEAM_CDN} and {TEAM_OTHER}; a {TEAM_OTHER} pod "
        "with the pool toleration and nodeSelector",
        f"runs Succeeded off the pool; after the restart a NotAdmitted Event per missed run within {REPORT_SECONDS:.0f} s "
        f"and the tolerating pod (on the pool meanwhile) evicted within {EVICTION_SECONDS:.0f} s",
    )
    replica = egress_placer.replicas[0]
    killed = kill_component(devcluster, replica.name)
    pod = runs.name("tolerating")
    runs.create_pod(TEAM_OTHER, tolerating_pod(pod))
    names = create_runs(runs, "killed")
    ok, on_pool, decided = finished_off_pool(runs, names)
    wait_for("the tolerating pod scheduled", quietly(lambda: pod_node(api, TEAM_OTHER, pod)), timeout=30, interval=0.1)
    node_while_down = pod_node(api, TEAM_OTHER, pod)

    restarted = time.monotonic()
    start_component(devcluster, killed)
    wait_for(
        f"pod {pod} evicted",
        quietly(lambda: pod_gone(api, TEAM_OTHER, pod)),
        timeout=EVICTION_SECONDS + 20,
        interval=0.1,
    )
    evicted = time.monotonic() - restarted

    def reported() -> set[str]:
        return {e["regarding"]["name"] for ns in names for e in events(api, ns, "NotAdmitted")}

    missed = {n for ns_names in names.values() for n in ns_names}
    wait_for(
        "a NotAdmitted Event for every missed run",
        quietly(lambda: missed <= reported()),
        timeout=REPORT_SECONDS + 30,
        interval=0.1,
    )
    reported_after = time.monotonic() - restarted
    total = len(missed)
    figures.measured(
        f"{ok}/{total} Succeeded, {on_pool} on the pool, {decided} decided; the tolerating pod ran on {node_while_down} "
        f"while the controller was down and was evicted {evicted:.1f} s after the restart; "
        f"{len(missed & reported())}/{total} missed runs reported (NotAdmitted) {reported_after:.1f} s after the restart",
        on_pool,
    )

    assert (ok, on_pool, decided) == (total, 0, 0)
    assert node_while_down in POOL_NODES  # admission was away: nothing stripped its toleration
    assert evicted <= EVICTION_SECONDS
    assert reported_after <= REPORT_SECONDS
