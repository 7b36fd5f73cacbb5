"""The runner (controller/runner.py): tasks start in the order given and stop newest first, each ended
before the next is told; a stop hook wakes a task blocked elsewhere; a task that raises, or returns
before it was stopped, is reported as dead; readiness and a cancelled task show in the health. No
sleeps: every wait is on an event or a join with a deadline. `GiveWay`: a walk waits while a review is in
flight, at most its bound each time, on an injected clock."""

from __future__ import annotations

import queue
import threading

import pytest

from controller.runner import GiveWay, Runner, unpaced

DEADLINE = 10.0


class Recorded:
    """A task that says when it began and ends when stopped, noting what had ended before its stop."""

    def __init__(self, name: str, ended: list[str]) -> None:
        self.name, self.ended = name, ended
        self.began = threading.Event()
        self.ended_before_my_stop: list[str] | None = None

    def run(self, stop: threading.Event) -> None:
        self.began.set()
        stop.wait()
        self.ended.append(self.name)

    def on_stop(self) -> None:
        self.ended_before_my_stop = list(self.ended)


def test_tasks_start_in_order_and_stop_newest_first_each_ended_before_the_next_is_told() -> None:
    runner, ended = Runner(), []
    tasks = [Recorded(name, ended) for name in ("recorder", "informers", "leader", "loop")]
    for task in tasks:
        runner.start(task.name, task.run, on_stop=task.on_stop)
    assert all(task.began.wait(DEADLINE) for task in tasks)
    assert list(runner.health()) == ["recorder", "informers", "leader", "loop"]
    assert set(runner.health().values()) == {"running"} and runner.problem() is None
    runner.stop(timeout=DEADLINE)
    assert ended == ["loop", "leader", "informers", "recorder"]
    assert [t.ended_before_my_stop for t in tasks] == [["loop", "leader", "informers"], ["loop", "leader"], ["loop"], []]
    assert runner.health() == {}


def test_the_stop_hook_wakes_a_task_blocked_on_something_else() -> None:
    runner, items, handled = Runner(), queue.Queue(), []

    def drain(stop: threading.Event) -> None:
        while True:
            item = items.get()  # not the stop event: only the hook's mark wakes it when idle
            if item is None:
                if stop.is_set():
                    return
                continue
            handled.append(item)

    task = runner.start("drain", drain, on_stop=lambda: items.put(None))
    items.put("written before the stop")
    runner.stop(timeout=DEADLINE)
    assert not task.thread.is_alive()
    assert handled == ["written before the stop"]


def test_a_task_that_raises_or_returns_unasked_is_reported_dead_and_the_others_run_on() -> None:
    runner = Runner()
    alive = Recorded("alive", [])
    runner.start("alive", alive.run)

    def boom(stop: threading.Event) -> None:
        raise ValueError("boom")

    raising = runner.start("raising", boom)
    returning = runner.start("returning", lambda stop: None)
    for task in (raising, returning):
        task.thread.join(DEADLINE)
    assert alive.began.wait(DEADLINE)
    assert runner.health() == {
        "alive": "running",
        "raising": "died: ValueError: boom",
        "returning": "died: it returned before it was stopped",
    }
    assert runner.problem() == (
        "background task died: raising (died: ValueError: boom); returning (died: it returned before it was stopped)"
    )
    runner.stop(timeout=DEADLINE)
    assert alive.ended == ["alive"]


def test_a_task_waits_until_ready_and_a_failing_hook_does_not_keep_the_others_running() -> None:
    runner, ended, ready = Runner(), [], threading.Event()
    first, second = Recorded("first", ended), Recorded("second", ended)
    runner.start("first", first.run, ready=ready)

    def failing_hook() -> None:
        raise RuntimeError("hook failed")

    runner.start("second", second.run, on_stop=failing_hook)
    assert first.began.wait(DEADLINE) and second.began.wait(DEADLINE)
    assert runner.health() == {"first": "waiting", "second": "running"}
    ready.set()
    assert runner.health()["first"] == "running"
    runner.stop(timeout=DEADLINE)
    assert ended == ["second", "first"]


def test_a_cancelled_task_stops_alone_and_is_forgotten() -> None:
    runner, ended = Runner(), []
    kept, replaced = Recorded("kept", ended), Recorded("replaced", ended)
    runner.start("kept", kept.run)
    task = runner.start("replaced", replaced.run)
    assert kept.began.wait(DEADLINE) and replaced.began.wait(DEADLINE)
    runner.cancel(task)
    task.thread.join(DEADLINE)
    assert ended == ["replaced"] and runner.health() == {"kept": "running"}
    runner.stop(timeout=DEADLINE)
    assert ended == ["replaced", "kept"]


def test_a_task_that_does_not_end_in_time_does_not_hold_up_the_others() -> None:
    runner, ended, release = Runner(), [], threading.Event()
    first = Recorded("first", ended)
    runner.start("first", first.run)
    stuck = runner.start("stuck", lambda stop: release.wait(DEADLINE))
    assert first.began.wait(DEADLINE)
    try:
        runner.stop(timeout=0.05)
        assert ended == ["first"]
        assert stuck.thread.is_alive()
    finally:
        release.set()


def test_a_task_not_waited_for_is_told_to_stop_and_left_to_end_alone() -> None:
    runner, told, release = Runner(), threading.Event(), threading.Event()
    task = runner.start("egress pool", lambda stop: release.wait(DEADLINE), on_stop=told.set, wait=False)
    try:
        runner.stop(timeout=DEADLINE)  # waiting for it would last until DEADLINE, and the thread would be over
        assert told.is_set()
        assert task.thread.is_alive()
    finally:
        release.set()


def test_a_task_started_while_the_runner_stops_is_never_run() -> None:
    # e.g. an egress poller a policy event starts while the policy source waits for its own stop
    runner, ran, late = Runner(), threading.Event(), []
    runner.start("policy source", lambda stop: stop.wait(), on_stop=lambda: late.append(runner.start("poller", lambda stop: ran.set())))
    runner.stop(timeout=DEADLINE)
    assert late and late[0].stop_event.is_set() and not late[0].thread.is_alive() and not ran.is_set()
    assert runner.health() == {}
    runner.start("after the stop", lambda stop: ran.set())  # stopped, it may start again
    assert ran.wait(DEADLINE)
    runner.stop(timeout=DEADLINE)


# -- GiveWay: background walks give way to the reviews in flight (#24) --------------------------------


class Ticking:
    """An injected clock and sleep: each sleep moves the clock; `in_flight` answers from a script of counts,
    one per look (the last one repeats)."""

    def __init__(self, counts: list[int]) -> None:
        self.now, self.counts, self.looks, self.slept = 0.0, counts, 0, []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def in_flight(self) -> int:
        count = self.counts[min(self.looks, len(self.counts) - 1)]
        self.looks += 1
        return count


@pytest.mark.parametrize(
    ("counts", "items", "every", "waits", "sleeps"),
    [
        pytest.param([0], 100, None, 0, 0, id="no-review-in-flight: never waits"),
        pytest.param([1, 1, 0], 10, None, 1, 1, id="a-review-answered-during-the-wait: waits once, until it is answered"),
        pytest.param([1], 65, None, 3, 96, id="reviews-never-end: waits at items 0, 32, 64, each at most its bound"),
        pytest.param([1], 3, 1, 3, 96, id="every-item: a chunk per item"),
        pytest.param([0, 0, 1, 1, 1, 0], 70, 32, 1, 2, id="a-review-begins-mid-walk: waits at the next check"),
    ],
)
def test_a_walk_gives_way_to_reviews_in_flight_for_at_most_its_bound(counts: list[int], items: int, every: int | None,
                                                                     waits: int, sleeps: int) -> None:
    ticking = Ticking(counts)
    # A bound of 2**-7 s polled every 2**-12 s: 32 polls at most per wait (binary fractions: exact sums).
    give_way = GiveWay(every=32, most_seconds=2**-7, poll_seconds=2**-12, sleep=ticking.sleep, clock=ticking.clock)
    give_way.follow(ticking.in_flight)
    assert list(give_way.paced(range(items), every)) == list(range(items))  # every item, in order, once
    assert give_way.waits == waits and len(ticking.slept) == sleeps
    assert all(s == 2**-12 for s in ticking.slept)


def test_before_it_follows_a_server_and_unpaced_nothing_waits() -> None:
    give_way = GiveWay(sleep=lambda s: pytest.fail("slept"))
    assert list(give_way.paced(iter("abc"))) == ["a", "b", "c"] and give_way.waits == 0
    assert list(unpaced([3, 1, 2], every=1)) == [3, 1, 2]
