"""Egress budgets at Pod CREATE (controller/admission/handlers.py, docs/budgets.md): a run's pod touching
a destination goes to a node whose egress address has room, its REQUIRED affinity keeps off the full
nodes, and the use is recorded; a record the tenant brings is not kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.budgets.core import BUDGETS_ANNOTATION, read_record, record_annotation
from controller.core.policy import load_policy
from tests.unit.test_admission_handlers import TEKTON_USER, Env, tekton_pod

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
POOL = """\
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: egress
    nodeSelector: {egress-placer.io/egress: "fast"}
    images: ["gcr.io/kaniko-project/*"]
    namespaces: ["team-ci", "team-web"]
"""
TOUCHED = """\
    destinations:
      - name: kaniko-pulls
        match: {images: ["gcr.io/kaniko-project/*"]}
        maxConcurrentPerAddress: 1
"""
POLICY = POOL + TOUCHED


def env_with_budgets() -> Env:
    env = Env()
    env.state.set_policy(load_policy(POLICY))
    return env


def running(env: Env, name: str, node: str, run_cached: bool = False) -> None:
    """A run's pod of the pool, bound to `node`, with admission's record (`run_cached`: its TaskRun is in
    the cache already)."""
    if not run_cached:
        env.add_taskrun("team-ci", name, f"uid-{name}")
    pod = tekton_pod(name=f"{name}-pod", taskrun_name=name, annotations={BUDGETS_ANNOTATION: record_annotation("egress", ["kaniko-pulls"], node, env.now)})
    pod["metadata"]["uid"] = f"pod-{name}"
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    env.state.apply("Pod", "ADDED", pod)


def node_of(patched: dict[str, Any]) -> str:
    record = read_record(patched["metadata"]["annotations"][BUDGETS_ANNOTATION])
    assert record is not None
    return record.node


def test_a_pod_goes_where_the_address_has_room_and_its_use_is_recorded() -> None:
    env = env_with_budgets()
    running(env, "a", "egress-1")
    running(env, "b", "egress-2")
    _, patched, _ = env.review(tekton_pod(name="c-pod", taskrun_name="c"))
    assert node_of(patched) == "egress-3"
    terms = patched["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    for term in terms:  # a preferred node alone would let the scheduler put it on a full node
        assert {"key": "metadata.name", "operator": "NotIn", "values": ["egress-1"]} in term["matchFields"]
        assert {"key": "metadata.name", "operator": "NotIn", "values": ["egress-2"]} in term["matchFields"]
    assert json.loads(patched["metadata"]["annotations"][BUDGETS_ANNOTATION])["destinations"] == ["kaniko-pulls"]


def test_a_record_a_tenant_brings_on_a_pod_that_touches_nothing_is_removed() -> None:
    env = env_with_budgets()
    forged = record_annotation("egress", ["kaniko-pulls"], "egress-1", env.now)
    _, patched, _ = env.review(tekton_pod(image="docker.io/library/golang:1.22", annotations={BUDGETS_ANNOTATION: forged}))
    assert BUDGETS_ANNOTATION not in (patched["metadata"].get("annotations") or {})


def test_a_forged_record_is_replaced_by_admissions_own() -> None:
    env = env_with_budgets()
    forged = record_annotation("egress", ["made-up"], "egress-9", 1.0)
    _, patched, _ = env.review(tekton_pod(annotations={BUDGETS_ANNOTATION: forged}))
    record = read_record(patched["metadata"]["annotations"][BUDGETS_ANNOTATION])
    assert record is not None and record.destinations == ("kaniko-pulls",) and record.node.startswith("egress-") and record.node != "egress-9"


def test_with_no_room_anywhere_the_pod_is_placed_and_a_warning_says_so() -> None:
    """The hold belongs before the pod (TaskRun CREATE, the queue's release: not built yet): the pod is
    still placed on its pool, counted, and a Warning names the budget."""
    env = env_with_budgets()
    for name, node in (("a", "egress-1"), ("b", "egress-2"), ("d", "egress-3")):
        running(env, name, node)
    _, patched, _ = env.review(tekton_pod(name="c-pod", taskrun_name="c"))
    assert node_of(patched).startswith("egress-")
    [warning] = [e for e in env.events.sent if e["reason"] == "BudgetExceeded"]
    assert warning["type"] == "Warning"
    assert warning["note"].startswith("placed although budget kaniko-pulls on egress-")
    assert warning["note"].endswith(": 1 of 1 at once had no room")


def test_report_only_never_narrows_and_says_what_would_have_waited() -> None:
    env = Env()
    env.state.set_policy(load_policy(POLICY + "        mode: ReportOnly\n"))
    for name, node in (("a", "egress-1"), ("b", "egress-2"), ("d", "egress-3")):
        running(env, name, node)
    _, patched, _ = env.review(tekton_pod(name="c-pod", taskrun_name="c"))
    terms = patched["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert not any("matchFields" in term for term in terms)
    [report] = [e for e in env.events.sent if e["reason"] == "BudgetReport"]
    assert report["note"].startswith("would have waited for budget kaniko-pulls on egress-")


# -- the hold before the pod: TaskRun CREATE, and the leader's release pass ------------------------------

from controller.queue.core import QUEUE_ANNOTATION, read_entry  # noqa: E402
from controller.queue.reconcile import QueueReconciler  # noqa: E402
from tests.unit.test_admission_handlers import RecordingSink, taskrun  # noqa: E402


def test_a_run_touching_an_enforced_budget_is_held_also_on_a_pool_without_a_queue() -> None:
    env = env_with_budgets()
    env.admission.wall = lambda: env.now
    _, patched, _ = env.review(taskrun())
    assert patched["spec"]["status"] == "TaskRunPending"
    mark = read_entry(patched["metadata"]["annotations"][QUEUE_ANNOTATION], "TaskRun")
    assert mark is not None and mark.pool == "egress" and mark.budgets == ("kaniko-pulls",)
    [queued] = [e for e in env.events.sent if e["reason"] == "Queued"]
    assert queued["note"] == "held for egress budgets of pool egress (kaniko-pulls): room now, released shortly"


def test_report_only_and_untouched_runs_are_not_held() -> None:
    env = Env()
    env.state.set_policy(load_policy(POLICY + "        mode: ReportOnly\n"))
    _, patched, _ = env.review(taskrun())
    assert "status" not in patched["spec"] and QUEUE_ANNOTATION not in patched["metadata"]["annotations"]
    env = env_with_budgets()
    _, patched, _ = env.review(taskrun(task="golang-build"))  # no kaniko image: touches nothing
    assert "status" not in patched["spec"]


class Releaser:
    """Applies each release to the state at once, the entry kept as admission wrote it."""

    def __init__(self, env: Env) -> None:
        self.env, self.released = env, []
        self.entries: dict[str, str | None] = {}

    def release_run(self, kind: str, namespace: str, name: str, uid: str, pending: str, entry: str | None = None) -> bool:
        self.released.append(name)
        self.entries[name] = entry
        run = self.env.runs[name] | {"spec": {}}
        if entry is not None:
            run = run | {"metadata": {**run["metadata"], "annotations": {**run["metadata"]["annotations"], QUEUE_ANNOTATION: entry}}}
        self.env.runs[name] = run
        self.env.state.apply(kind, "MODIFIED", run)
        return True

    def ungate_pod(self, *args: Any) -> bool:
        return False


def held(env: Env, names: list[str]) -> None:
    env.runs = {}
    for name in names:
        _, patched, _ = env.review(taskrun(name=name))
        patched["metadata"]["uid"] = f"uid-{name}"
        env.runs[name] = patched
        env.state.apply("TaskRun", "ADDED", patched)


def test_the_leader_releases_only_what_the_budgets_have_room_for() -> None:
    """Three nodes, each its own address, one run at once per address: 3 of 5 go; the next goes when a
    pod ends; the runs released but without a pod yet keep their room across passes."""
    env = env_with_budgets()
    env.admission.wall = lambda: env.now
    held(env, [f"r{i}" for i in range(5)])
    releaser = Releaser(env)
    reconciler = QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)
    assert reconciler() == 1.0  # runs still wait for a budget: looked at again in a second
    assert releaser.released == ["r0", "r1", "r2"]
    reconciler()
    assert releaser.released == ["r0", "r1", "r2"]  # in flight: no second release into the same room
    for name, node in (("r0", "egress-1"), ("r1", "egress-2"), ("r2", "egress-3")):
        running(env, name, node, run_cached=True)  # their pods came, bound
    reconciler()
    assert releaser.released == ["r0", "r1", "r2"]
    env.state.apply("Pod", "MODIFIED", {**_pod_of(env, "r0"), "status": {"phase": "Succeeded"}})
    reconciler()
    assert releaser.released == ["r0", "r1", "r2"]  # its pod ended, its run not yet: counted until it is done
    env.state.apply("TaskRun", "MODIFIED", env.runs["r0"] | {"spec": {}, "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}})
    reconciler()
    assert releaser.released == ["r0", "r1", "r2", "r3"]


def _pod_of(env: Env, name: str) -> dict[str, Any]:
    pod = tekton_pod(name=f"{name}-pod", taskrun_name=name)
    pod["metadata"]["uid"] = f"pod-{name}"
    return pod


def test_held_runs_are_counted_by_destination_and_mode() -> None:
    env = env_with_budgets()
    env.admission.wall = lambda: env.now
    for name, node in (("a", "egress-1"), ("b", "egress-2"), ("d", "egress-3")):
        running(env, name, node)
    env.review(taskrun(name="held-1"))
    assert env.metrics.budget_waits.labels(pool="egress", destination="kaniko-pulls", mode="Enforce")._value.get() == 1  # noqa: SLF001
    [queued] = [e for e in env.events.sent if e["reason"] == "Queued"]
    assert queued["note"].startswith("held for egress budgets of pool egress: waiting for budget kaniko-pulls on egress-")


def test_pods_admitted_before_the_store_shows_them_count_at_once() -> None:
    """Issue #26, the cluster's 20 runs: the leader releases several runs in one pass and Tekton makes their
    pods within milliseconds; each Pod CREATE must count the pods admission has just placed (not yet in
    the pod store), or the second sees the same room and goes behind the same, now full, address."""
    env = env_with_budgets()
    first = node_of(env.review(tekton_pod(name="a-pod", taskrun_name="a"))[1])
    second = node_of(env.review(tekton_pod(name="b-pod", taskrun_name="b"))[1])
    third = node_of(env.review(tekton_pod(name="c-pod", taskrun_name="c"))[1])
    assert len({first, second, third}) == 3  # 1 at once per address, one node per address
    env.review(tekton_pod(name="d-pod", taskrun_name="d"))
    assert [e["reason"] for e in env.events.sent].count("BudgetExceeded") == 1  # the fourth had no room


def test_a_placed_pod_counts_once_when_the_store_shows_it() -> None:
    env = env_with_budgets()
    _, patched, _ = env.review(tekton_pod(name="a-pod", taskrun_name="a"))
    node = node_of(patched)
    pool = env.state.policy.pool("egress")
    assert pool is not None
    assert len(env.state.budgets.pool_budgets(pool, env.now).uses) == 1
    patched["metadata"]["uid"] = "pod-a"
    patched["spec"]["nodeName"] = node
    patched["status"] = {"phase": "Running"}
    env.state.apply("Pod", "ADDED", patched)
    assert [u.key for u in env.state.budgets.pool_budgets(pool, env.now).uses] == ["pod-a"]


# -- coscheduled runs (Tekton's affinity assistant): the annotation and the labels are the tenant's ------

AFFINITY_ASSISTANT = "pipeline.tekton.dev/affinity-assistant"


def pool_toleration() -> dict[str, Any]:
    from tests.unit.test_admission_handlers import EGRESS_TOLERATION

    return dict(EGRESS_TOLERATION)


def test_a_tenant_writing_the_affinity_assistant_annotation_on_its_run_is_still_held() -> None:
    """A tenant's bare TaskRun claiming coscheduling (the annotation) with the pool's toleration in its pod
    template would go to the pool unheld: it is held for the pool's Enforce budgets like any run. A
    coscheduled run whose template leaves it off the pool is not held (it does not run there)."""
    env = env_with_budgets()
    env.admission.wall = lambda: env.now
    run = taskrun(annotations={AFFINITY_ASSISTANT: "affinity-assistant-abc"}, pod_template={"tolerations": [pool_toleration()]})
    _, patched, _ = env.review(run)
    assert patched["spec"]["status"] == "TaskRunPending"
    mark = read_entry(patched["metadata"]["annotations"][QUEUE_ANNOTATION], "TaskRun")
    assert mark is not None and mark.pool == "egress" and mark.budgets == ("kaniko-pulls",)
    assert patched["spec"]["podTemplate"]["tolerations"] == [pool_toleration()]
    # Not made by Tekton's controller: no coscheduled run, whatever it says; an ordinary run, held all the same.
    _, bare, _ = env.review(taskrun(name="build-2", annotations={AFFINITY_ASSISTANT: "affinity-assistant-abc"}))
    assert bare["spec"]["status"] == "TaskRunPending"


def coscheduled_pod(name: str, forged: str | None = None, label: dict[str, str] | None = None, env: Env | None = None) -> dict[str, Any]:
    """A coscheduled run's pod; with `env`, its TaskRun is cached as a child of PipelineRun whole-1, which
    our admission moved whole to pool egress (review it as Tekton's controller: TEKTON_USER)."""
    if env is not None:
        from tests.unit.test_admission_handlers import WHOLE_OWNER, moved_whole

        moved_whole(env)
        env.add_taskrun("team-ci", name, f"uid-{name}", owner=WHOLE_OWNER)
    annotations = {AFFINITY_ASSISTANT: "aa-1"} | ({BUDGETS_ANNOTATION: forged} if forged else {})
    pod = tekton_pod(name=f"{name}-pod", taskrun_name=name, annotations=annotations, spec_extra={"tolerations": [pool_toleration()]})
    pod["metadata"]["labels"].update(label or {})
    return pod


def test_a_coscheduled_runs_pod_is_counted_and_a_record_it_brings_is_replaced() -> None:
    """A coscheduled pod follows its assistant (never moved nor narrowed) but counts like any run's pod:
    admission writes its record, replacing one the tenant brought (a start dated long ago would leave
    every window at once); the assistant component label on a run's pod changes nothing."""
    env = env_with_budgets()
    env.admission.wall = lambda: env.now
    pool = env.state.policy.pool("egress")
    assert pool is not None
    forged = record_annotation("egress", ["kaniko-pulls"], "egress-1", 1.0)
    for name, label in (("a", None), ("b", {"app.kubernetes.io/component": "affinity-assistant"})):
        _, patched, _ = env.review(coscheduled_pod(name, forged, label, env), user=TEKTON_USER)
        record = read_record(patched["metadata"]["annotations"][BUDGETS_ANNOTATION])
        assert record is not None and record.started == env.now and record.destinations == ("kaniko-pulls",)
        assert "affinity" not in patched["spec"]  # not narrowed: it must follow its assistant
    assert len(env.state.budgets.pool_budgets(pool, env.now).uses) == 2


def test_a_coscheduled_pod_on_its_assistants_full_node_is_recorded_there_with_a_warning() -> None:
    """The assistant (pod aa-1-0) is bound to egress-1, whose address has no room: the pod is recorded on
    egress-1 (where it will run) and a Warning says the budget is overrun there."""
    env = env_with_budgets()
    env.admission.wall = lambda: env.now
    running(env, "a", "egress-1")
    env.state.apply("Pod", "ADDED", {"metadata": {"namespace": "team-ci", "name": "aa-1-0", "uid": "aa-uid",
                                                  "labels": {"app.kubernetes.io/component": "affinity-assistant"}},
                                     "spec": {"nodeName": "egress-1"}, "status": {"phase": "Running"}})
    _, patched, _ = env.review(coscheduled_pod("c", env=env), user=TEKTON_USER)
    assert node_of(patched) == "egress-1"
    [warning] = [e for e in env.events.sent if e["reason"] == "BudgetExceeded"]
    assert warning["type"] == "Warning" and "affinity assistant's node egress-1" in warning["note"], warning["note"]
    assert "kaniko-pulls" in warning["note"]


def test_a_pod_that_is_no_runs_pod_gets_no_record_from_the_coscheduled_path() -> None:
    """A bare pod claiming coscheduling, with a forged record, is no run's pod: nothing counted (its record
    is never read, as on any pod admission did not admit as a run's)."""
    env = env_with_budgets()
    pool = env.state.policy.pool("egress")
    assert pool is not None
    bare = coscheduled_pod("x", record_annotation("egress", ["kaniko-pulls"], "egress-1", env.now))
    bare["metadata"]["ownerReferences"] = []
    _, patched, _ = env.review(bare)
    patched["metadata"]["uid"] = "pod-x"
    patched["spec"]["nodeName"] = "egress-1"
    patched["status"] = {"phase": "Running"}
    env.state.apply("Pod", "ADDED", patched)
    assert env.state.budgets.pool_budgets(pool, env.now).uses == ()


def test_a_coscheduled_run_of_a_pipelinerun_held_whole_by_the_queue_is_not_held_again() -> None:
    """On a queued pool our queue holds a coscheduled PipelineRun whole (one slot while it has no pod
    bound): its TaskRun, held again, would wait for a second slot the PipelineRun keeps taken. Its pod is
    counted at Pod CREATE. The claim is by uid: a made-up uid, or a PipelineRun without our entry, holds."""
    from controller.queue.core import entry_annotation

    env = Env()
    env.admission.wall = lambda: env.now
    env.state.set_policy(load_policy(POLICY + "    queue: {runsPerNode: 1}\n"))
    from controller.core.model import DECISION_ANNOTATION

    entry, decided = entry_annotation("egress", "PipelineRun", env.now - 5), json.dumps({"pool": "egress"})
    for name, annotations in (("whole", {QUEUE_ANNOTATION: entry, DECISION_ANNOTATION: decided}), ("plain", {DECISION_ANNOTATION: decided})):
        env.state.apply("PipelineRun", "ADDED", {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {
            "namespace": "team-ci", "name": name, "uid": f"uid-{name}", "annotations": annotations}, "spec": {}})

    def coscheduled_run(name: str, owner: str, uid: str) -> dict[str, Any]:
        run = taskrun(name=name, annotations={AFFINITY_ASSISTANT: "affinity-assistant-abc"}, pod_template={"tolerations": [pool_toleration()]})
        run["metadata"]["ownerReferences"] = [{"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "name": owner, "uid": uid, "controller": True}]
        return run

    _, released_whole, _ = env.review(coscheduled_run("t1", "whole", "uid-whole"), user=TEKTON_USER)
    assert "status" not in released_whole["spec"]
    assert pool_toleration() in released_whole["spec"]["podTemplate"]["tolerations"]
    for name, owner, uid in (("t2", "whole", "made-up"), ("t3", "plain", "uid-plain")):
        # Tekton's: no PipelineRun moved whole to the pool behind it: no pool for it (nor a hold).
        _, stripped, _ = env.review(coscheduled_run(name, owner, uid), user=TEKTON_USER)
        assert "status" not in stripped["spec"] and "tolerations" not in stripped["spec"].get("podTemplate", {}), name
        # A tenant's: an ordinary run, held.
        _, held_run, _ = env.review(coscheduled_run(f"{name}-own", owner, uid))
        assert held_run["spec"]["status"] == "TaskRunPending", name


# -- two replicas admitting pods at once (the leader's release names the address) ------------------------


def replica(env: Env) -> Env:
    """Another replica: its own state, shown the same runs and pods (not the pods the first admits)."""
    other = env_with_budgets()
    other.admission.wall = lambda: env.now
    for run in env.runs.values():
        other.state.apply("TaskRun", "ADDED", run)
    for key, pod in env.state.pods.items():
        other.state.apply("Pod", "ADDED", {"metadata": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid, "annotations": dict(pod.annotations),
                                                         "ownerReferences": [{"apiVersion": o.api_version, "kind": o.kind, "name": o.name, "uid": o.uid,
                                                                              "controller": o.controller} for o in pod.owners]},
                                            "spec": {"nodeName": pod.node_name}, "status": {"phase": pod.phase}})
    return other


def test_two_replicas_admitting_the_last_rooms_at_once_follow_the_leaders_release() -> None:
    """One run at once per address (each node its own), egress-1 busy: the leader releases r1 and r2, one
    into each address left, and writes each address into the run's entry with the release. Their pods come
    at the same moment to two replicas, neither seeing the other's: each goes behind the address its run
    was released to. Without the address both replicas see the same room and pick the same node."""
    env = env_with_budgets()
    env.admission.wall = lambda: env.now
    running(env, "a", "egress-1")
    held(env, ["r1", "r2"])
    releaser = Releaser(env)
    QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)()
    assert releaser.released == ["r1", "r2"]
    to = {name: read_entry(entry, "TaskRun").address for name, entry in releaser.entries.items()}  # type: ignore[union-attr]
    assert sorted(to.values()) == ["egress-2", "egress-3"]
    other = replica(env)
    first = node_of(env.review(tekton_pod(name="r1-pod", taskrun_name="r1"))[1])
    second = node_of(other.review(tekton_pod(name="r2-pod", taskrun_name="r2"))[1])
    assert (first, second) == (to["r1"], to["r2"])
    # the same moment without the leader's address: both replicas take the same room
    for run in env.runs.values():
        run["metadata"]["annotations"][QUEUE_ANNOTATION] = entry_annotation_without_address(run)
    blind, blind_other = replica(env), replica(env)
    same = {node_of(blind.review(tekton_pod(name="r1-pod", taskrun_name="r1"))[1]), node_of(blind_other.review(tekton_pod(name="r2-pod", taskrun_name="r2"))[1])}
    assert len(same) == 1, same


def ended(env: Env, name: str, node: str) -> None:
    """The pod of `running(env, name, node)` finished (this state sees it Succeeded)."""
    pod = tekton_pod(name=f"{name}-pod", taskrun_name=name, annotations={BUDGETS_ANNOTATION: record_annotation("egress", ["kaniko-pulls"], node, env.now)})
    pod["metadata"]["uid"] = f"pod-{name}"
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Succeeded"}
    env.state.apply("Pod", "MODIFIED", pod)


def released_with_a_lagging_follower() -> tuple[Env, Env]:
    """Every address busy (one run at once each); a follower takes its picture; then the leader sees the pod
    on egress-1 end and releases r1 there. The follower still counts that pod: no room anywhere, by its count."""
    env = env_with_budgets()
    env.admission.wall = lambda: env.now
    for name, node in (("a", "egress-1"), ("b", "egress-2"), ("d", "egress-3")):
        running(env, name, node)
    held(env, ["r1"])
    follower = replica(env)
    for name in ("a", "b", "d"):  # their runs too: only a run's pod counts
        follower.add_taskrun("team-ci", name, f"uid-{name}")
    assert follower.state.budgets.pool_budgets(follower.state.policy.pool("egress"), env.now).uses  # type: ignore[union-attr, arg-type]
    ended(env, "a", "egress-1")
    releaser = Releaser(env)
    QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)()
    assert releaser.released == ["r1"] and read_entry(releaser.entries["r1"], "TaskRun").address == "egress-1"  # type: ignore[union-attr]
    return env, follower


def test_a_follower_that_still_counts_an_ended_pod_puts_the_pod_behind_the_released_address() -> None:
    """Found on the local cluster (CI, two replicas behind the round-robin proxy): a follower whose count
    lagged the leader's saw the released address full and put the pod behind another address, which then
    held 3 at once of 2. The leader's count is the ledger: the pod goes behind its run's address, with no
    BudgetExceeded Warning (the leader had room)."""
    env, follower = released_with_a_lagging_follower()
    follower.state.apply("TaskRun", "MODIFIED", env.runs["r1"])  # the release has reached the follower's cache
    patched = follower.review(tekton_pod(name="r1-pod", taskrun_name="r1"))[1]
    assert node_of(patched) == "egress-1"
    assert not [e for e in follower.events.sent if e["reason"] == "BudgetExceeded"]


@pytest.mark.parametrize("read_fails", [False, True], ids=["the-read-answers", "the-read-fails"])
def test_a_follower_whose_cache_still_holds_the_run_reads_it_for_the_address(read_fails: bool) -> None:
    """Tekton makes the pod right after the release: the follower's informer may still show the run held.
    A held run has no pod, so the TaskRun is read once (off the event loop), and its address followed. A
    read that fails keeps the cached run: the pod is still the run's (placed in its pool, among the nodes
    this replica counts room on), never turned into a stranger's."""
    from controller.admission.handlers import Admission, OwnerReadNeeded
    from tests.unit.test_run_pods import _apply, _review_body

    env, follower = released_with_a_lagging_follower()
    reads: list[str] = []

    def read(namespace: str, name: str) -> dict[str, Any]:
        reads.append(name)
        if read_fails:
            raise RuntimeError("the API server is away")
        return env.runs[name]

    follower.admission = Admission(follower.state, follower.metrics, follower.events, follower.admission.settings, read_taskrun=read)
    follower.admission.wall = lambda: env.now
    pod = tekton_pod(name="r1-pod", taskrun_name="r1")
    with pytest.raises(OwnerReadNeeded):
        follower.admission.review(_review_body(pod))
    owner = follower.admission.read_owner("team-ci", "r1")
    patched = _apply(pod, follower.admission.review(_review_body(pod), owner))
    assert reads == ["r1"]
    expected = ("egress-1", "egress-2", "egress-3") if read_fails else ("egress-1",)
    assert node_of(patched) in expected


def entry_annotation_without_address(run: dict[str, Any]) -> str:
    from controller.queue.core import entry_annotation

    mark = read_entry(run["metadata"]["annotations"][QUEUE_ANNOTATION], "TaskRun")
    assert mark is not None
    return entry_annotation(mark.pool, mark.kind, mark.queued_at, mark.budgets)


def test_an_address_a_tenant_writes_on_its_pod_only_steers_it_among_nodes_with_room() -> None:
    """The entry Tekton copies onto the pod is the pod creator's to write: naming a full address gets the
    pod no room there (it goes where there is room); the run's own entry is the run guard's to keep."""
    from controller.queue.core import entry_annotation

    env = env_with_budgets()
    running(env, "a", "egress-1")
    forged = entry_annotation("egress", "TaskRun", env.now, ("kaniko-pulls",), "egress-1")
    patched = env.review(tekton_pod(name="c-pod", taskrun_name="c", annotations={QUEUE_ANNOTATION: forged}))[1]
    assert node_of(patched) in ("egress-2", "egress-3")
    steered = entry_annotation("egress", "TaskRun", env.now, ("kaniko-pulls",), "egress-3")
    assert node_of(env.review(tekton_pod(name="d-pod", taskrun_name="d", annotations={QUEUE_ANNOTATION: steered}))[1]) in ("egress-2", "egress-3")


def test_the_api_server_calling_again_for_the_same_pod_does_not_count_it_against_itself() -> None:
    """Reinvocation (or a retried call): the pod's own use from the first call is not room taken from it;
    it is placed on the same node, whose address the narrowing never keeps it off (found on the local
    cluster: a pod kept off every pool node, Pending for good)."""
    env = env_with_budgets()
    env.admission.wall = lambda: env.now
    running(env, "a", "egress-1")
    running(env, "b", "egress-3")
    _, first, _ = env.review(tekton_pod(name="c-pod", taskrun_name="c"))
    assert node_of(first) == "egress-2"
    _, again, _ = env.review(first)
    assert node_of(again) == "egress-2" and not [e for e in env.events.sent if e["reason"] == "BudgetExceeded"]
    for term in again["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]:
        assert {"key": "metadata.name", "operator": "NotIn", "values": ["egress-2"]} not in term.get("matchFields", [])


def test_with_no_room_anywhere_the_pod_is_kept_off_no_node() -> None:
    env = env_with_budgets()
    for name, node in (("a", "egress-1"), ("b", "egress-2"), ("d", "egress-3")):
        running(env, name, node)
    _, patched, _ = env.review(tekton_pod(name="c-pod", taskrun_name="c"))
    terms = patched["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert not any("matchFields" in term for term in terms)


QUEUED = POOL + "    queue: {runsPerNode: 1}\n"
UNTOUCHED = """\
    destinations:
      - name: registry-pulls
        match: {images: ["quay.io/*"]}
        maxStartsPerWindowPerAddress: 100
        windowSeconds: 3600
      - name: cdn-publish
        match: {tasks: ["publish-*"]}
        maxConcurrentPerAddress: 1
"""


@pytest.mark.parametrize("destinations, addresses, pictures", [
    ("", [None, None, None], 0),  # no budgets: the queue's release alone
    (UNTOUCHED, [None, None, None], 0),  # budgets the runs never touch: the same release, nothing more
    (TOUCHED, ["egress-1", "egress-2", "egress-3"], 1),  # touched: each counted behind an address, written
])
def test_a_queued_run_touching_no_destination_is_released_as_on_a_pool_without_budgets(
        monkeypatch: pytest.MonkeyPatch, destinations: str, addresses: list[str | None], pictures: int) -> None:
    """Issue #26, "runs that touch no destination are not slowed": on a queued pool whose budgets the
    uploads never touch, the leader's pass releases them exactly as without budgets: the release patch
    writes no entry (before, each run got the first node's address, a metadata write Tekton then reverts
    from its older copy of the run), and the pass builds no budget picture of the pool."""
    env = Env()
    env.state.set_policy(load_policy(QUEUED + destinations))
    env.admission.wall = lambda: env.now
    held(env, [f"r{i}" for i in range(4)])
    built = []
    picture = env.state.budgets.pool_budgets
    monkeypatch.setattr(env.state.budgets, "pool_budgets", lambda *a: built.append(a) or picture(*a))
    releaser = Releaser(env)
    QueueReconciler(env.state, releaser, RecordingSink(), env.metrics, clock=lambda: env.now)()
    assert releaser.released == ["r0", "r1", "r2"]  # 3 nodes, 1 run each: the queue's slots
    written = [releaser.entries[name] for name in releaser.released]
    assert [read_entry(e, "TaskRun").address if e else None for e in written] == addresses  # type: ignore[union-attr]
    assert len(built) == pictures
