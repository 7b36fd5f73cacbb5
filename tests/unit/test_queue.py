"""The pool queue's pure core (controller/queue/core.py): release order, slots, wait bound, entries."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.policy import load_policy
from controller.queue.core import (
    PoolPod,
    over_cap,
    QUEUE_ANNOTATION,
    GatedPod,
    PoolQueue,
    QueueEntry,
    QueueSetting,
    ReleaseReason,
    RunFacts,
    entry_annotation,
    gates_pod,
    plan,
    position,
    read_any_entry,
    decided_placement,
    read_entry,
    release_all,
    ungate,
    release_order,
    slots,
)

SETTING = QueueSetting.model_validate({"runsPerNode": 2, "maxQueueSeconds": 600})
NOW = 1_800_000_000.0


def entry(ns: str, name: str, at: float, *, pending: bool = True, done: bool = False, has_pod: bool = False) -> QueueEntry:
    return QueueEntry("TaskRun", ns, name, "overseas", at, pending, done, has_pod)


def queue(slots_: int = 6, pods: dict[str, int] | None = None, placement: str = "required", setting: QueueSetting = SETTING) -> PoolQueue:
    return PoolQueue("overseas", setting, placement, slots_, pods or {})


@pytest.mark.parametrize(
    ("runs_per_node", "nodes", "expected"),
    [(2, 3, 6), (1, 0, 0), (5, 1, 5), (0, 3, 0)],
)
def test_slots_are_runs_per_node_times_nodes(runs_per_node: int, nodes: int, expected: int) -> None:
    assert slots(runs_per_node, nodes) == expected


@pytest.mark.parametrize(
    ("waiting", "occupied", "expected"),
    [
        # FIFO within one namespace
        ([("a", "a2", 2), ("a", "a1", 1), ("a", "a3", 3)], {}, ["a1", "a2", "a3"]),
        # round-robin: a's later runs wait behind b's first, even though a came first
        ([("a", "a1", 1), ("a", "a2", 2), ("a", "a3", 3), ("b", "b1", 10), ("b", "b2", 11)], {}, ["a1", "b1", "a2", "b2", "a3"]),
        # a namespace already occupying slots has its turn later
        ([("a", "a1", 1), ("a", "a2", 2), ("b", "b1", 10)], {"a": 2}, ["b1", "a1", "a2"]),
        # three namespaces
        ([("a", "a1", 1), ("a", "a2", 2), ("b", "b1", 3), ("c", "c1", 4), ("c", "c2", 5)], {}, ["a1", "b1", "c1", "a2", "c2"]),
    ],
)
def test_release_order(waiting: list[tuple[str, str, float]], occupied: dict[str, int], expected: list[str]) -> None:
    entries = [entry(ns, name, at) for ns, name, at in waiting]
    assert [e.name for e in release_order(entries, lambda ns: 0, occupied)] == expected


def test_priority_from_the_policy_goes_first() -> None:
    setting = QueueSetting.model_validate(
        {"runsPerNode": 1, "priorities": [{"namespaces": ["prod-*"], "priority": 10}, {"namespaces": ["batch"], "priority": -5}]}
    )
    entries = [entry("batch", "x1", 1), entry("dev", "d1", 2), entry("prod-eu", "p1", 3), entry("prod-eu", "p2", 4)]
    assert [e.name for e in release_order(entries, setting.priority_of, {})] == ["p1", "p2", "d1", "x1"]
    assert (setting.priority_of("prod-us"), setting.priority_of("dev"), setting.priority_of("batch")) == (10, 0, -5)


@pytest.mark.parametrize(
    ("pods", "released", "expected"),
    [
        ({}, 0, 6),  # empty pool: six slots
        ({"x": 4}, 0, 2),  # pool pods take slots
        ({"x": 4}, 1, 1),  # a released run without a bound pod takes one too
        ({"x": 7}, 0, 0),  # more pods than slots (runs that were not queued): nothing
    ],
)
def test_releases_fill_free_slots_only(pods: dict[str, int], released: int, expected: int) -> None:
    entries = [entry("a", f"r{i}", i) for i in range(10)]
    entries += [entry("a", f"in-flight{i}", i, pending=False) for i in range(released)]
    result = plan(queue(6, pods), entries, NOW)
    assert len(result.releases) == expected
    assert all(r.reason is ReleaseReason.SLOT for r in result.releases)
    assert result.occupied == sum(pods.values()) + released
    assert len(result.line) == 10 - expected


def test_released_runs_with_a_bound_pod_or_done_take_no_extra_slot() -> None:
    entries = [entry("a", "running", 1, pending=False, has_pod=True), entry("a", "done", 2, pending=False, done=True)]
    entries += [entry("a", "w", 3)]
    result = plan(queue(1, {"a": 1}), entries, NOW)  # the running one is counted through its pod
    assert result.releases == ()
    assert plan(queue(2, {"a": 1}), entries, NOW).releases[0].entry.name == "w"


@pytest.mark.parametrize(
    ("placement", "released", "overdue"),
    [("preferred", ["old"], []), ("required", [], ["old"])],
)
def test_wait_bound_follows_the_placement(placement: str, released: list[str], overdue: list[str]) -> None:
    entries = [entry("a", "old", NOW - 601), entry("a", "young", NOW - 10)]
    result = plan(queue(0, placement=placement), entries, NOW)  # no free slot
    assert [r.entry.name for r in result.releases] == released
    assert all(r.reason is ReleaseReason.TIMEOUT for r in result.releases)
    assert [e.name for e in result.overdue] == overdue


def test_a_preferred_run_released_past_its_wait_takes_no_slot() -> None:
    entries = [entry("a", "gone-elsewhere", NOW - 700, pending=False), entry("a", "w", NOW - 1)]
    assert [r.entry.name for r in plan(queue(1, placement="preferred"), entries, NOW).releases] == ["w"]
    assert plan(queue(1, placement="required"), entries, NOW).releases == ()


def test_unqueued_pool_releases_every_waiting_run() -> None:
    entries = [entry("a", "w2", 2), entry("a", "w1", 1), entry("a", "r", 0, pending=False)]
    assert [(r.entry.name, r.reason) for r in release_all(entries)] == [("w1", ReleaseReason.UNQUEUED), ("w2", ReleaseReason.UNQUEUED)]


def test_position_in_line() -> None:
    entries = [entry("a", "a1", 1), entry("a", "a2", 2), entry("b", "b1", 3)]
    line = plan(queue(0), entries, NOW).line
    assert position(line, ("TaskRun", "b", "b1")) == 2
    assert position(line, ("TaskRun", "b", "nope")) is None


# -- the annotation ---------------------------------------------------------------------------------


def test_entry_round_trip_and_kind() -> None:
    value = entry_annotation("overseas", "TaskRun", NOW)
    mark = read_entry(value, "TaskRun")
    assert mark is not None and mark.pool == "overseas" and mark.queued_at == pytest.approx(NOW, abs=0.001)
    # A PipelineRun's entry, copied by Tekton onto its TaskRuns, is not theirs.
    assert read_entry(entry_annotation("overseas", "PipelineRun", NOW), "TaskRun") is None
    assert read_any_entry({QUEUE_ANNOTATION: entry_annotation("p", "PipelineRun", NOW)}) is not None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('{"pool":"p","node":"n1"}', ("p", "n1")),
        ('{"pool":"p","node":null}', ("p", None)),
        ('{"pool":null,"node":"n1"}', (None, None)),  # no pool: no node either
        ("[" * 100_000, (None, None)),  # nested past the reader's depth: anyone writes annotations
        ("not json", (None, None)),
        (None, (None, None)),
    ],
)
def test_decided_placement(value: object, expected: tuple) -> None:
    assert decided_placement(value) == expected


@pytest.mark.parametrize("value", [None, "", "x", "[]", "[" * 100_000, '{"pool":' * 50_000, '{"pool":"p","kind":"TaskRun"}', '{"pool":"","kind":"TaskRun","time":"2026-01-01T00:00:00Z"}', '{"pool":"p","kind":"TaskRun","time":"yesterday"}', '{"pool":"p","kind":"TaskRun","time":"2026-01-01T00:00:00"}'])
def test_not_an_entry(value: object) -> None:
    assert read_entry(value, "TaskRun") is None


@pytest.mark.parametrize(
    ("spec_status", "done", "pending", "finished"),
    [
        ("TaskRunPending", False, True, False),
        ("", False, False, False),
        ("TaskRunCancelled", False, False, True),
        ("", True, False, True),
    ],
)
def test_run_facts_to_entry(spec_status: str, done: bool, pending: bool, finished: bool) -> None:
    facts = RunFacts("TaskRun", "a", "r", "uid", entry_annotation("p", "TaskRun", NOW), spec_status, done, '{"pool":"p"}')
    e = facts.queue_entry(has_pod=False)
    assert e is not None and (e.pending, e.done) == (pending, finished)
    assert RunFacts("TaskRun", "a", "r", spec_status="TaskRunPending").queue_entry(False) is None  # the user's own pending


def test_policy_parses_the_queue_setting() -> None:
    text = """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress: fast}
    queue: {runsPerNode: 2, maxQueueSeconds: 30, priorities: [{namespaces: [prod], priority: 5}]}
  - name: plain
    nodes: [n1]
"""
    policy = load_policy(text)
    assert policy.pools[0].queue is not None and policy.pools[0].queue.runs_per_node == 2
    assert policy.pools[1].queue is None
    with pytest.raises(Exception, match="runsPerNode"):
        load_policy(text.replace("runsPerNode: 2", "runsPerNode: 0"))


# -- properties -------------------------------------------------------------------------------------

entries_st = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.floats(min_value=0, max_value=1000), st.booleans(), st.booleans(), st.booleans()),
    max_size=40,
).map(
    lambda rows: [
        QueueEntry("TaskRun", ns, f"r{i}", "overseas", NOW - 500 + at, pending, done, has_pod and not pending)  # pending: no pod
        for i, (ns, at, pending, done, has_pod) in enumerate(rows)
    ]
)
pods_st = st.dictionaries(st.sampled_from(["a", "b", "c", "x"]), st.integers(0, 5), max_size=4)


@settings(max_examples=300, deadline=None)
@given(entries_st, pods_st, st.integers(0, 20), st.sampled_from(["required", "preferred"]))
def test_never_more_released_for_slots_than_free(entries: list[QueueEntry], pods: dict[str, int], n: int, placement: str) -> None:
    q = queue(n, pods, placement)
    result = plan(q, entries, NOW)
    by_slot = [r for r in result.releases if r.reason is ReleaseReason.SLOT]
    assert len(by_slot) <= max(0, n - result.occupied)
    assert all(r.entry.waiting for r in result.releases)
    assert len({r.entry.key for r in result.releases}) == len(result.releases)


@settings(max_examples=300, deadline=None)
@given(entries_st, pods_st, st.integers(0, 20))
def test_idempotent_once_released(entries: list[QueueEntry], pods: dict[str, int], n: int) -> None:
    """Applying a plan (the released runs now in flight) and planning again releases nothing more."""
    q = queue(n, pods)
    first = plan(q, entries, NOW)
    released = {r.entry.key for r in first.releases}
    after = [replace(e, pending=False) if e.key in released else e for e in entries]
    again = plan(q, after, NOW)
    assert again.releases == ()
    assert plan(q, entries, NOW) == first  # the same picture, the same plan


@settings(max_examples=300, deadline=None)
@given(entries_st)
def test_round_robin_between_namespaces(entries: list[QueueEntry]) -> None:
    """In release order, a namespace's (k+1)-th run never comes before the k-th of another namespace
    that has at least k runs waiting (equal priority, nothing occupied)."""
    waiting = [e for e in entries if e.waiting]
    order = release_order(waiting, lambda ns: 0, {})
    counts = {ns: sum(1 for e in waiting if e.namespace == ns) for ns in {e.namespace for e in waiting}}
    seen: dict[str, int] = {}
    for e in order:
        k = seen.get(e.namespace, 0)
        for other, total in counts.items():
            if other != e.namespace and total >= k:
                assert seen.get(other, 0) >= k
        seen[e.namespace] = k + 1
    # FIFO within each namespace
    for ns in counts:
        times = [e.queued_at for e in order if e.namespace == ns]
        assert times == sorted(times)


@settings(max_examples=300, deadline=None)
@given(entries_st, pods_st, st.sampled_from(["a", "b", "c", "d", "e"]))
def test_the_place_from_counts_is_the_place_in_the_line(entries: list[QueueEntry], pods: dict[str, int], namespace: str) -> None:
    """Admission's O(namespaces) place of a new run equals its place in the full release order."""
    from controller.queue.core import LineSummary

    setting = QueueSetting.model_validate({"runsPerNode": 1, "priorities": [{"namespaces": ["a"], "priority": 3}, {"namespaces": ["d"], "priority": -1}]})
    q = queue(0, pods, setting=setting)
    new = QueueEntry("TaskRun", namespace, "new", "overseas", NOW + 600, True)  # the newest
    full = plan(q, [*entries, new], NOW + 600)
    summary = LineSummary.of(q, entries, NOW + 600)
    assert summary.place_of_new(namespace, NOW + 600) == (position(full.line, new.key), len(full.line))


@pytest.mark.parametrize(
    ("timeouts", "warned"),
    [(None, False), ({"pipeline": "5s"}, True), ({"pipeline": "10m"}, True), ({"pipeline": "11m"}, False), ({"pipeline": "0s"}, False), ({"pipeline": "x"}, False)],
)
def test_a_pipeline_timeout_shorter_than_the_wait_is_named(timeouts: object, warned: bool) -> None:
    from controller.queue.core import pipeline_timeout_problem

    assert bool(pipeline_timeout_problem(timeouts, "overseas", SETTING)) is warned  # maxQueueSeconds 600


@pytest.mark.parametrize(("queues", "ours", "gated"), [(True, False, True), (True, True, False), (False, False, False), (False, True, False)])
def test_a_pod_is_gated_when_its_pool_queues_and_its_run_is_not_ours(queues: bool, ours: bool, gated: bool) -> None:
    assert gates_pod(queues, ours) is gated


def _gated(name: str, created: str, *pools: str) -> GatedPod:
    return GatedPod("ns", name, f"uid-{name}", created, pools)


@pytest.mark.parametrize(
    ("free", "pods", "expected"),
    [
        ({"p": 0}, [("a", "1", ("p",))], []),  # full: it waits
        ({"p": 1}, [("b", "2", ("p",)), ("a", "1", ("p",))], ["a"]),  # the oldest first
        ({"p": 2}, [("b", "2", ("p",)), ("a", "1", ("p",))], ["a", "b"]),
        ({"p": 1, "q": 0}, [("a", "1", ("p", "q")), ("b", "2", ("p",))], ["b"]),  # a free slot in every pool it tolerates
        ({"p": 1, "q": 1}, [("a", "1", ("p", "q")), ("b", "2", ("p",)), ("c", "3", ("q",))], ["a"]),  # one in each
        ({}, [("a", "1", ())], ["a"]),  # tolerates no queued pool (the pool no longer queues)
        ({"p": 1}, [("a", "1", ("gone",))], []),  # a pool not counted has no free slot
    ],
)
def test_ungate(free: dict[str, int], pods: list[tuple[str, str, tuple[str, ...]]], expected: list[str]) -> None:
    assert [p.name for p in ungate(free, [_gated(n, c, *ps) for n, c, ps in pods])] == expected


def _pool_pod(name: str, created: str) -> PoolPod:
    return PoolPod("team-ci", name, f"uid-{name}", created)


@pytest.mark.parametrize(
    "pods, slots, expected",
    [
        pytest.param([("a", "t1"), ("b", "t2")], 3, [], id="under-the-cap"),
        pytest.param([("a", "t1"), ("b", "t2"), ("c", "t3")], 3, [], id="at-the-cap"),
        pytest.param([("a", "t1"), ("late", "t9"), ("b", "t2"), ("c", "t3")], 3, ["late"], id="one-came-in-past-the-cap"),
        pytest.param([("a", "t1"), ("b", "t2")], 0, ["b", "a"], id="the-pool-lost-its-nodes"),
        pytest.param([("b", "t1"), ("a", "t1")], 1, ["b"], id="same-time-by-name"),
    ],
)
def test_run_pods_over_the_cap_are_the_newest(pods: list[tuple[str, str]], slots: int, expected: list[str]) -> None:
    assert [p.name for p in over_cap([_pool_pod(*p) for p in pods], slots)] == expected
