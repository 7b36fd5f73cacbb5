"""Reliability, a hostile tenant against the pool guard: a minted identity bound to the built-in `edit`
ClusterRole in its own namespace only (rel-team-other, which may not use pool `overseas`) tries, side by
side in ONE shared window of WINDOW_SECONDS, every attack that got onto the pool before:

1. a bare Pod with a pool nodeSelector and a DaemonSet ownerReference the garbage collector cannot
   resolve (`extensions/v1beta1`, a made-up uid);
2. a StatefulSet whose template sets `nodeName` of a pool node (re-created under the same name after
   each eviction);
3. a DaemonSet of its own whose template tolerates the pool taint;
4. a Pod with a day's terminationGracePeriodSeconds whose process ignores SIGTERM (the KWOK stage that
   honours the grace: label devcluster.egress-placer.io/honour-grace), put onto the pool by an UPDATE
   that adds the pool toleration, and deleted by the tenant itself with its day's grace once bound;
5. the same on a node that never confirms its containers stopped (label value `never`): only the
   controller's delete with grace 0 after the eviction's grace removes it;
6. a Pod that gains the pool toleration by an UPDATE after creation.

The API is sampled every SAMPLE_SECONDS (admin client) for the whole window. Done when, for each attack,
no pod of the namespace is Running on a pool node for more than ALLOWED_SECONDS of any 60 s window, the
controller stays healthy (alive, ready, no admission error), and the next eligible run (rel-team-cdn)
is still placed by the webhook (its decision annotation names the pool: the webhook answered within its
timeout). A control proves the grace stage is real: the same day-grace pod, deleted by the tenant on an
ordinary node, is still there (terminating) when the window ends. The measured figures go to
docs/reliability.md ("A hostile tenant").
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest
from kubernetes.client.exceptions import ApiException

from devcluster.cluster import Cluster
from tests.e2e.harness import ControllerSpec, Placer, editor
from tests.e2e.tekton_runs import (
    MATCHING_IMAGE,
    ORDINARY_NODES,
    POOL,
    POOL_LABEL,
    POOL_NODES,
    POOL_TOLERATION,
    TEST_LABEL,
    Runs,
    decision_of,
    events,
    node_of,
    taskrun,
)
from tests.kube import Api, namespaced, pods
from tests.reliability.suite import TEAM_CDN, TEAM_OTHER, Figures
from tests.waiting import WaitTimeout, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

WINDOW_SECONDS = 60.0
SAMPLE_SECONDS = 0.5
ALLOWED_SECONDS = 5.0  # at most this long Running on a pool node in any 60 s window
EVICTION_GRACE_SECONDS = 2  # EGRESS_PLACER_INTRUDER_EVICTION_GRACE_SECONDS of this module's controller
CONTROLLER = ControllerSpec(env=(("EGRESS_PLACER_INTRUDER_EVICTION_GRACE_SECONDS", str(EVICTION_GRACE_SECONDS)),))
TENANT_USER = "tenant-of-rel-team-other"  # a user, not a ServiceAccount: only the RoleBinding below
ATTACK_LABEL = "attack.egress-placer.io/name"
HONOUR_GRACE_LABEL = "devcluster.egress-placer.io/honour-grace"  # devcluster/kwok-stages.yaml
DAY = 86400
APPS = "/apis/apps/v1"
EDIT_ROLE = "built-in `edit` ClusterRole, bound in the tenant's own namespace"


def container() -> list[dict[str, Any]]:
    return [{"name": "app", "image": "busybox", "command": ["sleep", "infinity"]}]


# -- the tenant --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tenant(devcluster: Cluster, api: Api, egress_placer: Placer) -> Iterator[Api]:
    """An API client for a minted identity bound to `edit` in TEAM_OTHER only."""
    with editor(devcluster, api, TEAM_OTHER, TENANT_USER) as tenant_api:
        yield tenant_api


# -- sampling ----------------------------------------------------------------------------------------


@dataclass
class Samples:
    """What the API said every SAMPLE_SECONDS: per attack, the pods (by uid) Running on a pool node."""

    times: list[float] = field(default_factory=list)
    on_pool: list[dict[str, set[str]]] = field(default_factory=list)  # per sample: attack -> uids
    attack_of: dict[str, str] = field(default_factory=dict)  # every pod name seen -> its attack

    def running_seconds(self, attack: str) -> list[tuple[float, float]]:
        """(start, seconds) of each sample interval in which a pod of `attack` was Running on the pool."""
        out = []
        for i, (at, seen) in enumerate(zip(self.times, self.on_pool)):
            if seen.get(attack):
                end = self.times[i + 1] if i + 1 < len(self.times) else at + SAMPLE_SECONDS
                out.append((at, end - at))
        return out

    def worst_window(self, attack: str, window: float = 60.0) -> float:
        """The most seconds Running on a pool node within any `window` s of the sampled time."""
        spans = self.running_seconds(attack)
        return max((sum(s for t, s in spans if start <= t < start + window) for start, _ in spans), default=0.0)

    def longest_stay(self, attack: str) -> float:
        """The longest any one pod (uid) of `attack` was seen Running on a pool node, first to last sample."""
        first: dict[str, float] = {}
        last: dict[str, float] = {}
        for at, seen in zip(self.times, self.on_pool):
            for uid in seen.get(attack, ()):
                first.setdefault(uid, at)
                last[uid] = at + SAMPLE_SECONDS
        return max((last[u] - first[u] for u in first), default=0.0)

    def pods_on_pool(self, attack: str) -> int:
        return len({uid for seen in self.on_pool for uid in seen.get(attack, ())})


def sample(api: Api, until: float, samples: Samples, stop: threading.Event) -> None:
    while time.monotonic() < until and not stop.is_set():
        at = time.monotonic()
        seen: dict[str, set[str]] = {}
        for pod in api.items(pods(TEAM_OTHER)):
            attack = (pod["metadata"].get("labels") or {}).get(ATTACK_LABEL)
            if attack:
                samples.attack_of[pod["metadata"]["name"]] = attack
            if attack and node_of(pod) in POOL_NODES and phase(pod) == "Running":
                seen.setdefault(attack, set()).add(pod["metadata"]["uid"])
        samples.times.append(at)
        samples.on_pool.append(seen)
        stop.wait(max(0.0, at + SAMPLE_SECONDS - time.monotonic()))  # the sampling cadence of the scenario


# -- the attacks (each returns a note on what it did; the sampler judges) -------------------------------


def phase(pod: dict[str, Any]) -> str | None:
    return (pod.get("status") or {}).get("phase")


class Tenant:
    def __init__(self, api: Api, run_id: str) -> None:
        self.api = api
        self.run_id = run_id

    def labels(self, attack: str, **extra: str) -> dict[str, str]:
        return {ATTACK_LABEL: attack, TEST_LABEL: self.run_id, **extra}

    def pod(self, name: str, attack: str, spec: dict[str, Any], labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or self.labels(attack), **meta},
                "spec": {"containers": container(), **spec}}
        return self.api.create(pods(TEAM_OTHER), body)

    def add_pool_toleration(self, name: str) -> str:
        """The UPDATE: append the pool toleration (pods may gain tolerations after creation)."""
        try:
            self.api.json_patch(pods(TEAM_OTHER, name), [{"op": "add", "path": "/spec/tolerations/-", "value": POOL_TOLERATION}])
        except ApiException as e:
            return f"UPDATE refused ({e.status})"
        return "UPDATE accepted"

    def bound_node(self, name: str, timeout: float = 15.0) -> str | None:
        def bound() -> str | None:
            pod = self.api.get(pods(TEAM_OTHER, name))
            return "gone" if pod is None else node_of(pod)
        try:
            return wait_for(f"pod {name} bound", bound, timeout=timeout)
        except WaitTimeout:
            return None

    def delete_pod(self, name: str, grace: int) -> None:
        self.api.delete(pods(TEAM_OTHER, name), gracePeriodSeconds=grace)


def fake_daemonset_owner(t: Tenant) -> str:
    owner = {"apiVersion": "extensions/v1beta1", "kind": "DaemonSet", "name": "node-agent", "uid": str(uuid.uuid4()), "controller": True}
    t.pod("fake-ds", "fake-daemonset-owner", {"nodeSelector": POOL_LABEL}, ownerReferences=[owner])
    return ""


def statefulset_with_node_name(t: Tenant) -> str:
    labels = t.labels("statefulset-node-name", app="sts-pinned")
    body = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "sts-pinned", "labels": labels},
        "spec": {
            "replicas": 1,
            "serviceName": "sts-pinned",
            "selector": {"matchLabels": {"app": "sts-pinned"}},
            "template": {"metadata": {"labels": labels},
                         "spec": {"nodeName": "egress-2", "terminationGracePeriodSeconds": 0, "containers": container()}},
        },
    }
    t.api.create(namespaced(TEAM_OTHER, "statefulsets", group=APPS), body)
    return ""


def daemonset_tolerating_the_pool(t: Tenant) -> str:
    labels = t.labels("own-daemonset", app="own-ds")
    body = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "own-ds", "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app": "own-ds"}},
            "template": {"metadata": {"labels": labels},
                         "spec": {"tolerations": [POOL_TOLERATION], "terminationGracePeriodSeconds": 0, "containers": container()}},
        },
    }
    t.api.create(namespaced(TEAM_OTHER, "daemonsets", group=APPS), body)
    return ""


def day_grace_ignoring_sigterm(t: Tenant) -> str:
    name = "day-grace"
    labels = t.labels("day-grace-ignores-sigterm", **{HONOUR_GRACE_LABEL: "true"})
    t.pod(name, "day-grace-ignores-sigterm", {"nodeSelector": POOL_LABEL, "terminationGracePeriodSeconds": DAY}, labels=labels)
    update = t.add_pool_toleration(name)
    node = t.bound_node(name)
    if node in POOL_NODES:  # on the pool: the tenant deletes it itself with its day's grace (terminating)
        t.delete_pod(name, DAY)
    return f"{update}; bound to {node or 'no node'}"


def node_never_confirms(t: Tenant) -> str:
    """Onto the pool the same way, on a node that never confirms its containers stopped (a kubelet gone:
    KWOK never removes a pod labelled honour-grace=never): the eviction alone never clears it."""
    name = "never-confirmed"
    labels = t.labels("node-never-confirms", **{HONOUR_GRACE_LABEL: "never"})
    t.pod(name, "node-never-confirms", {"nodeSelector": POOL_LABEL, "terminationGracePeriodSeconds": DAY}, labels=labels)
    update = t.add_pool_toleration(name)
    node = t.bound_node(name)
    return f"{update}; " + ("gone before its binding was read" if node == "gone" else f"bound to {node or 'no node'}")


def toleration_added_by_an_update(t: Tenant) -> str:
    name = "late-toleration"
    t.pod(name, "toleration-by-update", {"nodeSelector": POOL_LABEL})
    update = t.add_pool_toleration(name)
    node = t.bound_node(name)
    return f"{update}; " + ("gone before its binding was read" if node == "gone" else f"bound to {node or 'no node'}")


def control_day_grace_on_an_ordinary_node(t: Tenant) -> str:
    """Not an attack: the same day-grace pod on an ordinary node, deleted by the tenant. It must still be
    there when the window ends, or the grace stage is not real and attack 4 proves nothing."""
    name = "control-day-grace"
    labels = t.labels("control", **{HONOUR_GRACE_LABEL: "true"})
    t.pod(name, "control", {"nodeName": "node-1", "terminationGracePeriodSeconds": DAY}, labels=labels)
    wait_for("the control pod Running", lambda: phase(t.api.get(pods(TEAM_OTHER, name)) or {}) == "Running", timeout=15)
    t.delete_pod(name, DAY)
    return "deleted by the tenant with a day's grace"


@dataclass(frozen=True)
class Attack:
    what: str
    rbac: str
    run: Callable[[Tenant], str]


ATTACKS = {
    "fake-daemonset-owner": Attack(
        "bare Pod, pool nodeSelector, ownerReference to a DaemonSet the garbage collector cannot resolve "
        "(extensions/v1beta1, made-up uid)", f"pods: create ({EDIT_ROLE})", fake_daemonset_owner),
    "statefulset-node-name": Attack(
        "StatefulSet whose template sets nodeName of a pool node (re-created under the same name)",
        f"statefulsets: create ({EDIT_ROLE})", statefulset_with_node_name),
    "own-daemonset": Attack(
        "DaemonSet of the tenant's own namespace whose template tolerates the pool taint",
        f"daemonsets: create ({EDIT_ROLE})", daemonset_tolerating_the_pool),
    "day-grace-ignores-sigterm": Attack(
        "Pod with terminationGracePeriodSeconds 86400 ignoring SIGTERM, onto the pool by an UPDATE adding the "
        "toleration, then deleted by the tenant with its day's grace", f"pods: create, patch, delete ({EDIT_ROLE})",
        day_grace_ignoring_sigterm),
    "node-never-confirms": Attack(
        "the same Pod, onto the pool by the UPDATE, on a node that never confirms its containers stopped "
        "(KWOK label honour-grace=never: a kubelet gone)", f"pods: create, patch ({EDIT_ROLE})", node_never_confirms),
    "toleration-by-update": Attack(
        "Pod that gains the pool toleration by an UPDATE after creation", f"pods: create, patch ({EDIT_ROLE})",
        toleration_added_by_an_update),
}


# -- what became of each attack -----------------------------------------------------------------------


@dataclass(frozen=True)
class Removal:
    """What the controller's IntruderRemoved Event says of one pod: the step, and the seconds from
    finding it on a pool node to its being gone (it may have come and gone between two samples)."""

    step: str
    seconds: float


def admission_errors(egress_placer: Placer, replica: Any) -> float:
    """Reviews answered with an internal error (allowed unchanged) or refused as malformed."""
    name = "egress_placer_admission_reviews_total"
    return sum(egress_placer.metric(name, {"outcome": outcome}, replica=replica) for outcome in ("error", "malformed"))


def removals(api: Api, samples: Samples) -> dict[str, list[Removal]]:
    """attack -> what removed its pods from the pool, from the controller's IntruderRemoved Events."""
    out: dict[str, list[Removal]] = {}
    for event in events(api, TEAM_OTHER, "IntruderRemoved"):
        attack = samples.attack_of.get(event["regarding"].get("name", ""))
        found = re.search(r"([0-9.]+) s after it was found \((?:removed by: )?([^)]*)\)", event["note"])
        if attack and found:
            out.setdefault(attack, []).append(Removal(found.group(2), float(found.group(1))))
    return out


def outcome(api: Api, attack: str, samples: Samples, removed: list[Removal]) -> str:
    where: dict[str, int] = {}
    for pod in api.items(pods(TEAM_OTHER), labelSelector=f"{ATTACK_LABEL}={attack}"):
        state = "terminating" if pod["metadata"].get("deletionTimestamp") else phase(pod)
        key = f"{state} on {'a pool node' if node_of(pod) in POOL_NODES else (node_of(pod) or 'no node')}"
        where[key] = where.get(key, 0) + 1
    now = ", ".join(f"{n} {k}" for k, n in sorted(where.items())) or "no pod left"
    if not removed and not samples.pods_on_pool(attack):
        return f"never on a pool node (stopped at admission); at the end: {now}"
    steps = ", ".join(sorted({r.step for r in removed})) or "not seen by the controller"
    reached = max(len(removed), samples.pods_on_pool(attack))
    return f"{reached} pod(s) reached the pool, cleared (removed by: {steps}); at the end: {now}"


@pytest.fixture
def tenant_workloads(api: Api, runs: Runs) -> Iterator[None]:
    """Deletes what the tenant made (its StatefulSet and DaemonSet first, so they make no more pods)."""
    yield
    selector = f"{TEST_LABEL}={runs.id}"
    for plural in ("statefulsets", "daemonsets"):
        collection = namespaced(TEAM_OTHER, plural, group=APPS)
        for workload in api.items(collection, labelSelector=selector):
            api.delete(f"{collection}/{workload['metadata']['name']}")
    api.delete(pods(TEAM_OTHER), labelSelector=selector, gracePeriodSeconds=0)


def test_a_hostile_tenant_with_the_edit_role_does_not_keep_a_pool_node(
    egress_placer: Placer,
    api: Api,
    tenant: Api,
    runs: Runs,
    tenant_workloads: None,
    figures: Figures,
) -> None:
    figures.fault(
        "a hostile tenant with the built-in `edit` role in its own namespace (every attack side by side)",
        f"one {WINDOW_SECONDS:.0f} s window sampled every {SAMPLE_SECONDS} s; eviction grace cap {EVICTION_GRACE_SECONDS} s",
        f"no pod of the namespace Running on a pool node more than {ALLOWED_SECONDS:.0f} s of any 60 s; controller healthy; "
        "the next eligible run placed",
    )
    replica = egress_placer.replicas[0]
    errors_before = admission_errors(egress_placer, replica)
    attacker = Tenant(tenant, runs.id)

    samples, stop = Samples(), threading.Event()
    sampler = threading.Thread(target=sample, args=(api, time.monotonic() + WINDOW_SECONDS, samples, stop), daemon=True)
    sampler.start()
    try:
        with ThreadPoolExecutor(max_workers=len(ATTACKS) + 1) as pool:
            launched = {name: pool.submit(a.run, attacker) for name, a in ATTACKS.items()}
            control = pool.submit(control_day_grace_on_an_ordinary_node, attacker)
            notes = {name: f.result() for name, f in launched.items()}
            control.result()
        sampler.join(WINDOW_SECONDS + 30)
    finally:
        stop.set()

    removed = removals(api, samples)
    held = {}
    for name, attack in ATTACKS.items():
        worst, gone = samples.worst_window(name), removed.get(name, [])
        text = outcome(api, name, samples, gone) + (f" ({notes[name]})" if notes[name] else "")
        # Until cleared: the longer of what the samples saw and what the controller measured (a pod can
        # come and go between two samples).
        seconds = max([samples.longest_stay(name), *(r.seconds for r in gone)])
        figures.attack(attack.what, attack.rbac, text, seconds, worst, worst <= ALLOWED_SECONDS)
        if worst > ALLOWED_SECONDS:
            held[name] = f"{worst:.1f} s Running on a pool node within 60 s: {text}"

    # The control: the grace stage keeps a day-grace pod the tenant deleted (else attack 4 proves nothing).
    control_pod = api.get(pods(TEAM_OTHER, "control-day-grace")) or {"metadata": {}}
    grace_is_real = bool(control_pod["metadata"].get("deletionTimestamp")) and phase(control_pod) == "Running"
    # The controller stays healthy, and the next eligible run is placed by the webhook.
    alive, ready = egress_placer.pid(replica) > 0, egress_placer.ready(replica)
    errors = admission_errors(egress_placer, replica) - errors_before
    name = runs.name("after-attacks")
    runs.create_retrying(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name], timeout=90)
    placed = decision_of(done[name]).get("pool") == POOL and runs.nodes_of(TEAM_CDN, [name])[name] in POOL_NODES
    figures.set("eviction grace cap (s)", EVICTION_GRACE_SECONDS)
    figures.measured(
        f"{len(ATTACKS) - len(held)}/{len(ATTACKS)} held to {ALLOWED_SECONDS:.0f} s in 60 s (worst: "
        + ", ".join(f"{n} {samples.worst_window(n):.1f} s" for n in ATTACKS)
        + f"); control day-grace pod still terminating: {grace_is_real}; controller ready: {ready}, admission errors: "
        f"{errors:.0f}; next eligible run placed on the pool: {placed}",
        len(held) + (0 if placed else 1),
    )

    assert held == {}, held
    assert grace_is_real, "the KWOK grace stage did not keep the control pod: attack 4 was not real"
    assert alive and ready and errors == 0
    assert placed, decision_of(done[name])
    assert node_of(control_pod) in ORDINARY_NODES
