"""Replicas share placements: every replica counts the decision records of the runs and pods the API
server stores (load.core.ClaimBook, fed by load.view), keyed so that nothing counts twice.

The abuse tests come first: the decision record is the owner's to edit (a tenant may patch the
annotations of its own runs and pods; the run guard only freezes those of a queued run)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.model import DECISION_ANNOTATION, REVIEW_ANNOTATION
from controller.core.policy import load_policy
from controller.load.core import ClaimBook, LoadLedger, Seen, ledger_key
from controller.queue.core import QUEUE_ANNOTATION, format_time
from controller.state import ClusterState

TTL = 60.0
NOW = 1_780_000_000.0  # wall time: decision records count from the API server's creationTimestamp
POLICY = """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress: "yes"}
    namespaces: ["team-*"]
  - name: other
    nodeSelector: {egress: "other"}
    namespaces: ["other-*"]
"""
POOL = [f"pool-{i}" for i in range(3)]


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def cluster(clock: Clock) -> ClusterState:
    state = ClusterState(load_policy(POLICY), clock=clock, assumption_ttl=TTL)
    nodes = [(n, "yes") for n in POOL] + [("other-1", "other")]
    state.replace("Node", [{"metadata": {"name": n, "labels": {"egress": label}},
                            "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"pods": "110"}}}
                           for n, label in nodes])
    return state


def decision(pool: str | None, node: str | None) -> str:
    return json.dumps({"pool": pool, "node": node, "reason": "image-match", "images": ["x"]})


def taskrun(name: str, node: str | None, ns: str = "team-a", pool: str = "overseas", created: float = NOW, **extra: Any) -> dict[str, Any]:
    annotations = {DECISION_ANNOTATION: decision(pool, node), **extra.pop("annotations", {})}
    return {"kind": "TaskRun", "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}", "annotations": annotations,
                                            "creationTimestamp": format_time(created)},
            "spec": extra.pop("spec", {}), "status": extra.pop("status", {})}


def pod(name: str, node: str | None, run: str | None = None, bound: str | None = None, ns: str = "team-a",
        created: float = NOW, phase: str = "Pending") -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": ns, "name": name, "uid": f"uid-{name}", "creationTimestamp": format_time(created),
                            "annotations": {DECISION_ANNOTATION: decision("overseas", node)}}
    if run:
        meta["labels"] = {"tekton.dev/taskRun": run}
        meta["ownerReferences"] = [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": run, "uid": f"uid-{run}", "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": bound} if bound else {}, "status": {"phase": phase}}


def assumed(state: ClusterState) -> dict[str, int]:
    return {n: state.load.ledger.assumed_on(n) for n in POOL if state.load.ledger.assumed_on(n)}


# -- abuse first -------------------------------------------------------------------------------------


def test_a_forged_record_edited_after_creation_moves_nothing():
    """A tenant patches its run's record to claim one node (to push the others' runs away from it): the
    record is read from the first version seen, so the run still counts once, where admission put it."""
    clock = Clock()
    state = cluster(clock)
    state.apply("TaskRun", "ADDED", taskrun("build", "pool-0"))
    state.apply("TaskRun", "MODIFIED", taskrun("build", "pool-2"))
    assert assumed(state) == {"pool-0": 1}


def test_forged_records_count_only_for_a_while_after_creation():
    """Runs kept pending forever, or old runs, claim nothing: a record counts for the assumption's ttl
    after the API server's creationTimestamp (which no tenant writes), and not while the run is held."""
    clock = Clock()
    state = cluster(clock)
    state.apply("TaskRun", "ADDED", taskrun("old", "pool-1", created=NOW - TTL - 1))
    state.apply("TaskRun", "ADDED", taskrun("pending", "pool-1", spec={"status": "TaskRunPending"}))
    state.apply("TaskRun", "ADDED", taskrun("queued", "pool-1", annotations={QUEUE_ANNOTATION: "{}"}))
    state.apply("TaskRun", "ADDED", taskrun("fresh", "pool-1"))
    assert assumed(state) == {"pool-1": 1}
    clock.now += TTL + 1
    state.load.choose(state.policy.pool("overseas"), "x")  # expires what is old
    assert assumed(state) == {}


def test_a_record_naming_a_pool_its_namespace_may_not_use_or_a_node_outside_the_pool_counts_nothing():
    clock = Clock()
    state = cluster(clock)
    state.apply("TaskRun", "ADDED", taskrun("a", "pool-0", ns="other-x"))  # other-x may not use overseas
    state.apply("TaskRun", "ADDED", taskrun("b", "other-1"))  # not a node of overseas
    state.apply("TaskRun", "ADDED", taskrun("c", "pool-0", pool="nope"))  # no such pool
    state.apply("TaskRun", "ADDED", taskrun("d", "pool-0", ns="kube-system"))  # exempt
    assert assumed(state) == {} and state.load.ledger.assumed_on("other-1") == 0


def test_a_finished_or_deleted_run_releases_its_place():
    clock = Clock()
    state = cluster(clock)
    state.apply("TaskRun", "ADDED", taskrun("a", "pool-0"))
    state.apply("TaskRun", "ADDED", taskrun("b", "pool-1"))
    state.apply("TaskRun", "MODIFIED", taskrun("a", "pool-0", status={"conditions": [{"type": "Succeeded", "status": "False"}]}))
    state.apply("TaskRun", "DELETED", taskrun("b", "pool-1"))
    assert assumed(state) == {}


# -- one entry per run -------------------------------------------------------------------------------


def test_another_replicas_run_and_pod_count_once_from_the_moment_they_are_stored():
    """Replica B admitted the run and its pod; replica A sees them only through its informers."""
    clock = Clock()
    state = cluster(clock)
    state.apply("TaskRun", "ADDED", taskrun("build", "pool-0"))
    assert assumed(state) == {"pool-0": 1}
    state.apply("Pod", "ADDED", pod("build-pod", "pool-0", run="build"))  # the pod counts, not the run too
    assert assumed(state) == {"pool-0": 1} and len(state.load.ledger) == 1
    state.apply("TaskRun", "MODIFIED", taskrun("build", "pool-0", status={"podName": "build-pod"}))  # a late run event
    assert assumed(state) == {"pool-0": 1}
    state.apply("Pod", "MODIFIED", pod("build-pod", "pool-0", run="build", bound="pool-1"))  # bound: counted as placed
    assert assumed(state) == {} and state.load.placed_counts(POOL) == {"pool-0": 0, "pool-1": 1, "pool-2": 0}


def test_the_replicas_own_assumption_and_the_stored_record_are_one_entry():
    clock = Clock()
    state = cluster(clock)
    pool = state.policy.pool("overseas")
    node = state.load.choose_and_assume(pool, ledger_key("taskrun", "team-a", "build"), "build").node
    state.apply("TaskRun", "ADDED", taskrun("build", node))
    assert assumed(state) == {node: 1}
    state.load.hand_over(ledger_key("taskrun", "team-a", "build"))  # its pod is being made here
    pod_node = state.load.choose_and_assume(pool, ledger_key("pod", "team-a", "build-pod"), "build-pod").node
    state.apply("TaskRun", "MODIFIED", taskrun("build", node))  # the run's record does not come back
    state.apply("Pod", "ADDED", pod("build-pod", pod_node, run="build"))
    assert assumed(state) == {pod_node: 1}


@pytest.mark.parametrize("reinvoked", [False, True])
def test_handing_a_run_over_to_its_pod_is_forgetting_the_run_and_withdrawing_the_pod(reinvoked: bool):
    # One hold of the lock at Pod CREATE (admission): the same ledger as the two steps one after the other.
    run, own = ledger_key("taskrun", "team-a", "build"), ledger_key("pod", "team-a", "build-pod")
    books = []
    for together in (True, False):
        clock = Clock()
        state = cluster(clock)
        pool = state.policy.pool("overseas")
        state.load.choose_and_assume(pool, run, "build")
        if reinvoked:  # the pod's first call assumed it already: the API server calls again
            state.load.choose_and_assume(pool, own, "build-pod")
        if together:
            state.load.hand_over(run, own)
        else:  # the claim book's two steps, one after the other
            state.load.claims.forget(run, clock())
            state.load.claims.withdraw(own, clock())
        ledger = state.load.ledger
        books.append((assumed(state), len(ledger), run in ledger, own in ledger))
    assert books[0] == books[1] == ({}, 0, False, False)


def test_a_relist_leaves_what_the_events_left():
    clock = Clock()
    events, relisted = cluster(clock), cluster(clock)
    runs = [taskrun("a", "pool-0"), taskrun("b", "pool-1"), taskrun("c", "pool-2")]
    pods = [pod("a-pod", "pool-2", run="a"), pod("x", "pool-1")]
    for obj in runs:
        events.apply("TaskRun", "ADDED", obj)
    for obj in pods:
        events.apply("Pod", "ADDED", obj)
    relisted.apply("TaskRun", "ADDED", taskrun("gone", "pool-0"))
    relisted.replace("Pod", pods)
    relisted.replace("TaskRun", runs)
    assert assumed(events) == assumed(relisted) == {"pool-1": 2, "pool-2": 2}



class CountingLock:
    """The load view's lock, counting the claims the book takes per hold (a relist's, #22)."""

    def __init__(self, state: ClusterState) -> None:
        self.lock, self.book, self.holds = state.load._lock, state.load.claims, []  # noqa: SLF001
        for name in ("seen", "removed"):
            setattr(self.book, name, self._counted(getattr(self.book, name)))

    def _counted(self, step: Any) -> Any:
        def counted(*args: Any) -> None:
            self.holds[-1] += 1
            step(*args)
        return counted

    def __enter__(self) -> None:
        self.lock.acquire()
        self.holds.append(0)

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_relist_claims_a_chunk_of_pods_per_hold_and_leaves_what_one_hold_left():
    """Admission's node choice waits for the load view's lock: a relist of 20,000 pods took it for its
    whole claim pass (~8 ms, #22). Its claims go `chunk` pods per hold; the counts are those of one pass."""
    clock = Clock()
    whole, chunked = cluster(clock), cluster(clock)
    runs = [taskrun(f"r{i}", POOL[i % 3]) for i in range(7)]
    pods = [pod(f"r{i}-pod", POOL[i % 3], run=f"r{i}") for i in range(0, 7, 2)] + [pod(f"p{i}", POOL[i % 3]) for i in range(5)]
    for state in (whole, chunked):
        state.replace("TaskRun", runs)
        state.apply("Pod", "ADDED", pod("gone", "pool-0"))  # not listed again: removed by the relist
    whole.replace("Pod", pods)
    lock = CountingLock(chunked)
    chunked.load._lock = lock  # type: ignore[assignment]  # noqa: SLF001
    chunked.load.pods_replaced(chunked.load.count_pods(chunked.stores["Pod"].build(pods).items.values(), pods), chunk=3)
    assert max(lock.holds) == 3 and sum(lock.holds) == len(pods) + 1
    # the runs whose pods came count no more; the pods, and the runs without a pod, count; "gone" no more
    assert assumed(chunked) == assumed(whole) == {"pool-0": 5, "pool-1": 4, "pool-2": 3}

# -- properties of the pure book --------------------------------------------------------------------

KEYS = [ledger_key("taskrun", "ns", f"r{i}") for i in range(3)] + [ledger_key("pod", "ns", f"p{i}") for i in range(3)]
AGES = [0.0, 10.0, TTL + 1]  # how long before NOW each object was created (one creationTimestamp per object)
version = st.builds(
    lambda key, node, active, run: Seen(
        key, f"uid-{key}", NOW - AGES[KEYS.index(key) % len(AGES)], ("pool", node) if node else None, active,
        ((KEYS[run], f"uid-{KEYS[run]}"),) if key.startswith("pod/") and run is not None else ()),
    key=st.sampled_from(KEYS), node=st.sampled_from([None, "n0", "n1", "n2"]), active=st.booleans(),
    run=st.none() | st.integers(0, 2),
)


def reference(versions: list[Seen]) -> dict[str, int]:
    """What must count, from the set of objects alone: an active object's first claim (of the versions
    that follow its last inactive one), fresh, whose run no pod replaces."""
    first: dict[str, Seen] = {}
    for v in versions:
        if not v.active:
            first.pop(v.key, None)
        else:
            first.setdefault(v.key, v)
    replaced = {run for v in versions for run in v.runs}
    counts: dict[str, int] = {}
    for key, v in first.items():
        if v.claim and NOW - v.created <= TTL and (key, v.uid) not in replaced:
            counts[v.claim[1]] = counts.get(v.claim[1], 0) + 1
    return counts


def book_counts(versions: list[Seen]) -> dict[str, int]:
    ledger = LoadLedger()
    book = ClaimBook(ledger, TTL)
    for v in versions:
        book.seen(v, NOW)
    return {n: ledger.assumed_on(n) for n in ("n0", "n1", "n2") if ledger.assumed_on(n)}


@settings(max_examples=300, deadline=None)
@given(st.lists(version, max_size=20), st.randoms(use_true_random=False))
def test_order_across_objects_and_repeats_change_nothing(versions, random):
    """Each object's versions in order, the objects interleaved any way, any version seen twice (a
    relist after a watch): the same counts, those of the reference."""
    by_key: dict[str, list[Seen]] = {}
    for v in versions:
        by_key.setdefault(v.key, []).append(v)
    queues = [list(vs) for vs in by_key.values()]
    shuffled: list[Seen] = []
    while queues:
        q = random.choice(queues)
        item = q.pop(0)
        shuffled += [item, item] if random.random() < 0.3 else [item]
        if not q:
            queues.remove(q)
    assert book_counts(versions) == book_counts(shuffled) == reference(versions)


@settings(max_examples=300, deadline=None)
@given(st.lists(version, max_size=20), st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(["n0", "n1"])), max_size=6))
def test_a_run_counts_at_most_once(versions, own):
    """Own assumptions (admission, first) and stored records together: never more entries than objects,
    and never a run beside a pod of its own."""
    ledger = LoadLedger()
    book = ClaimBook(ledger, TTL)
    for key, node in own:
        book.assume(key, "pool", node, NOW)
    for v in versions:
        book.seen(v, NOW)
    assert len(ledger) <= len({k for k, _ in own} | {v.key for v in versions})
    replaced = {run[0] for v in versions for run in v.runs}
    assert not any(key in ledger for key in replaced)



def test_a_copied_review_uid_settles_nothing_the_real_run_does_not():
    """Admission assumes a run created with generateName under generateName + the review's uid (it has no
    name nor uid yet); the stored run naming that review uid settles it. The uid is an annotation: a tenant
    may copy it, with the generateName, onto an object of its own (#23; admission overwrites the review uid
    of the runs and runs' pods it answers for, so while the webhook is away, or on a bare pod). But the
    uid is known to no one before the real run is stored, and one watch brings a kind's objects in the
    order stored: the real run settles the assumption first, and the copy finds nothing left to settle.
    The review uid of an admission whose object was never stored is shown nowhere."""
    clock = Clock()
    state = cluster(clock)
    state.load.claims.assume(ledger_key("taskrun", "team-a", "build-U"), "overseas", "pool-0", NOW)  # admission's own
    real = taskrun("build-x1", "pool-0", annotations={REVIEW_ANNOTATION: "U"})
    real["metadata"]["generateName"] = "build-"
    state.apply("TaskRun", "ADDED", real)
    assert assumed(state) == {"pool-0": 1} and len(state.load.ledger) == 1  # the stored run replaced the assumption
    copy = taskrun("build-x2", "pool-1", annotations={REVIEW_ANNOTATION: "U"})  # its own record counts, as any run's
    copy["metadata"]["generateName"] = "build-"
    state.apply("TaskRun", "ADDED", copy)
    assert assumed(state) == {"pool-0": 1, "pool-1": 1}
    held = taskrun("build-x3", "pool-2", spec={"status": "TaskRunPending"}, annotations={REVIEW_ANNOTATION: "V"})
    held["metadata"]["generateName"] = "build-"
    state.load.claims.assume(ledger_key("taskrun", "team-a", "build-V"), "overseas", "pool-2", NOW)
    state.apply("TaskRun", "ADDED", held)  # held: it counts nothing, nor does admission's assumption of it
    assert assumed(state) == {"pool-0": 1, "pool-1": 1}
