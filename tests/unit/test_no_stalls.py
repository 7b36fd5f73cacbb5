"""No stalls (#24): the heap is frozen once after the first sync, and the leader's pool metrics never hold
the load view's lock (which admission's node choice waits for) for more than a chunk of the pool.

Work is counted, not timed: the Python and C calls made while the lock is held (sys.setprofile), and the
freeze hook's calls. bench/under_reconcile.py measures the holds in milliseconds.
"""

from __future__ import annotations

import gc
import inspect
import sys
import threading
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from controller.app import Controller, StartupError, wait_for_first_sync
from controller.core.policy import load_policy
from controller.metrics import Metrics
from controller.pool_status.metrics import CHUNK, PoolMetrics, pool_loads
from controller.state import ClusterState
from tests.unit.test_metrics import POLICY, node, pod, samples

# -- gc.freeze once after the first sync ----------------------------------------------------------


def informer(name: str, required: bool = True, synced: bool = True) -> SimpleNamespace:
    event = threading.Event()
    if synced:
        event.set()
    return SimpleNamespace(resource=SimpleNamespace(name=name), required=required, synced=event)


def test_the_heap_is_frozen_once_after_every_required_cache_synced() -> None:
    nodes, pods = informer("nodes", synced=False), informer("pods")
    optional = informer("daemonsets", required=False, synced=False)  # not waited for
    calls: list[bool] = []
    threading.Timer(0.05, nodes.synced.set).start()  # syncs while it waits

    wait_for_first_sync([nodes, pods, optional], timeout=30.0, freeze=lambda: calls.append(nodes.synced.is_set()))

    assert calls == [True]  # once, and only after the nodes synced


def test_no_freeze_when_a_cache_does_not_sync() -> None:
    calls: list[None] = []
    with pytest.raises(StartupError, match="the pods cache did not sync") as raised:
        wait_for_first_sync([informer("nodes"), informer("pods", synced=False)], timeout=0.0,
                            freeze=lambda: calls.append(None))
    assert raised.value.unreachable and calls == []


def test_the_controller_freezes_with_gc_freeze_by_default_and_after_its_own_sync() -> None:
    assert inspect.signature(Controller).parameters["freeze"].default is gc.freeze
    source = inspect.getsource(Controller.start_watching)
    assert "wait_for_first_sync(self.informers, STARTUP_TIMEOUT, self.freeze)" in source


# -- the pool metrics' holds of the load view's lock ----------------------------------------------


class CountingLock:
    """The load view's lock, counting the calls (Python and C) this thread makes while holding it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._calls = 0
        self.holds: list[int] = []  # calls made during each outermost hold

    def __enter__(self) -> "CountingLock":
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            self._calls = 0
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.holds.append(self._calls)
        self._lock.release()

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if self._depth and event in ("call", "c_call"):
            self._calls += 1


@pytest.fixture
def counting() -> Iterator[tuple[ClusterState, CountingLock]]:
    state = ClusterState(load_policy(POLICY), clock=lambda: 1000.0, assumption_ttl=60)
    names = [f"pool-{i:04d}" for i in range(2000)]
    state.replace("Node", [node(n) for n in names] + [node("plain-1", pool=False)])
    state.replace("Pod", [pod(f"p-{i}", names[i % len(names)]) for i in range(4000)])
    (pool,) = state.policy.pools
    for i in range(50):
        state.load.choose_and_assume(pool, f"taskrun/team-a/r{i}", salt=f"r{i}")
    lock = CountingLock()
    state.load._lock = lock  # type: ignore[assignment]  # noqa: SLF001
    sys.setprofile(lock.profile)
    try:
        yield state, lock
    finally:
        sys.setprofile(None)


def test_pool_loads_are_what_loads_gives(counting: tuple[ClusterState, CountingLock]) -> None:
    state, _ = counting
    (pool,) = state.policy.pools
    assert pool_loads(state.load, pool, state.nodes, chunk=7) == state.load.loads(pool)


def test_the_pool_metrics_hold_the_load_views_lock_a_chunk_at_a_time(counting: tuple[ClusterState, CountingLock]) -> None:
    state, lock = counting
    (pool,) = state.policy.pools
    state.load.loads(pool)  # what the pass did before: the whole pool in one hold
    whole = lock.holds.pop()
    assert whole >= 2000

    metrics = Metrics()
    PoolMetrics(state, metrics, min_interval=0)()

    assert len(lock.holds) >= 2000 // CHUNK  # the lock was let go between chunks
    assert max(lock.holds) <= 2 * CHUNK + 40  # two calls per node of a chunk (and the names, in one hold)
    assert max(lock.holds) < whole / 4
    load = samples(metrics, "pool_node_load")
    assert sum(v for (_, _, kind), v in load.items() if kind == "assumed") == 50
    assert sum(v for (_, _, kind), v in load.items() if kind == "placed") == 4000
    assert samples(metrics, "pool_ready_nodes") == {("overseas",): 2000}


def test_a_node_relist_moves_the_load_view_node_by_node_as_a_rebuild_would() -> None:
    state = ClusterState(load_policy(POLICY), clock=lambda: 1000.0, assumption_ttl=60)
    names = [f"pool-{i:04d}" for i in range(600)]
    state.replace("Node", [node(n) for n in names] + [node("plain-1", pool=False)])
    state.replace("Pod", [pod(f"p-{i}", names[i % len(names)]) for i in range(1200)])
    (pool,) = state.policy.pools
    state.load.choose_and_assume(pool, "taskrun/team-a/r", salt="r")
    lock = CountingLock()
    state.load._lock = lock  # type: ignore[assignment]  # noqa: SLF001
    relisted = [node(n) for n in names[2:]] + [node(names[1], ready=False), node("plain-1"), node("pool-new")]
    sys.setprofile(lock.profile)
    try:
        state.replace("Node", relisted)  # pool-0000 gone, pool-0001 not Ready, plain-1 and pool-new join
    finally:
        sys.setprofile(None)
    assert len(lock.holds) == 4 and max(lock.holds) < 60  # the four nodes that changed, one short hold each
    seen = state.load.loads(pool)
    state.load.rebuild(state.policy)
    assert seen == state.load.loads(pool)
    assert {"plain-1", "pool-new"} <= set(seen) and not {"pool-0000", "pool-0001"} & set(seen)


def test_an_egress_poll_is_taken_in_a_chunk_at_a_time_and_ranks_as_one_hold_would() -> None:
    from controller.core.egress import Measurement
    from controller.load.view import HOLD_CHUNK
    from tests.unit.test_egress_wiring import NOW, policy_text
    from tests.unit.test_egress_wiring import node as egress_node

    names = [f"egress-{i:04d}" for i in range(1000)]
    figures = {n: Measurement(1_000_000.0 * (i % 97), NOW - 1) for i, n in enumerate(names)}
    states = []
    for chunk in (len(names), HOLD_CHUNK):
        state = ClusterState(load_policy(policy_text()), clock=lambda: NOW)
        state.replace("Node", [egress_node(n) for n in names])
        lock = CountingLock()
        state.load._lock = lock  # type: ignore[assignment]  # noqa: SLF001
        sys.setprofile(lock.profile)
        try:
            state.load.set_egress_figures("overseas", figures, chunk=chunk)
        finally:
            sys.setprofile(None)
        states.append((state, lock.holds))
    (whole, one_hold), (chunked, holds) = states
    assert len(holds) >= len(names) // HOLD_CHUNK + 1  # let go between chunks
    assert max(holds) < max(one_hold) / 2
    pool = whole.policy.pool("overseas")
    assert chunked.load.loads(pool) == whole.load.loads(pool)
    assert [chunked.load.choose(pool, f"s{i}").node for i in range(20)] == [whole.load.choose(pool, f"s{i}").node for i in range(20)]


def test_a_policy_rebuild_holds_the_lock_a_chunk_at_a_time_and_keeps_what_changed_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.load.index import PoolLoads
    from controller.load.view import HOLD_CHUNK

    state = ClusterState(load_policy(POLICY), clock=lambda: 1000.0, assumption_ttl=60)
    names = [f"pool-{i:04d}" for i in range(2000)]
    state.replace("Node", [node(n) for n in names] + [node("plain-1", pool=False)])
    state.replace("Pod", [pod(f"p-{i}", names[i % len(names)]) for i in range(4000)])
    (pool,) = state.policy.pools
    for i in range(50):
        state.load.choose_and_assume(pool, f"taskrun/team-a/r{i}", salt=f"r{i}")
    lock = CountingLock()
    state.load._lock = lock  # type: ignore[assignment]  # noqa: SLF001
    sys.setprofile(lock.profile)
    try:
        state.load.rebuild(state.policy, chunk=10**6)  # the whole pool in one hold, as before #24
        whole = max(lock.holds)
        lock.holds.clear()
        state.load.rebuild(state.policy)
    finally:
        sys.setprofile(None)
    assert len(lock.holds) >= 2000 // HOLD_CHUNK and max(lock.holds) < whole / 4  # let go between chunks
    before = state.load.loads(pool)

    # Admission goes on with the old index while the new one is built: what it assumes meanwhile counts.
    put, admitted = PoolLoads.put, []

    def put_and_admit(self: PoolLoads, *args: object, **kwargs: object) -> None:
        put(self, *args, **kwargs)
        if len(admitted) < 3 and len(self) == 300:  # mid-rebuild, between holds of earlier chunks
            admitted.append(state.load.choose_and_assume(pool, f"taskrun/team-a/late-{len(admitted)}", salt="late").node)

    monkeypatch.setattr(PoolLoads, "put", put_and_admit)
    state.load.rebuild(state.policy)
    monkeypatch.setattr(PoolLoads, "put", put)
    after = state.load.loads(pool)
    assert len(admitted) == 1 and admitted[0] is not None
    assert sum(v.assumed for v in after.values()) == sum(v.assumed for v in before.values()) + 1
    assert after[admitted[0]].assumed == before[admitted[0]].assumed + 1
    assert sum(v.placed for v in after.values()) == 4000
