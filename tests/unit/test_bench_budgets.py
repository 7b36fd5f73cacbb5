"""bench/queue.py's `budgets_untouched`: the budgeted policy is valid and none of its destinations is
touched by the burst's uploads; the median's bootstrap interval."""

from __future__ import annotations

from bench.queue import median_interval, policy, upload_run
from controller.budgets.core import match, taskrun_facts
from controller.core.policy import load_policy


def test_the_budgeted_policy_is_valid_and_the_uploads_touch_none_of_its_destinations() -> None:
    pool = load_policy(policy(budgets=True)).pools[0]
    assert len(pool.destinations) == 2 and not load_policy(policy()).pools[0].destinations
    run = upload_run("up-000")
    images = [s["image"] for s in run["spec"]["taskSpec"]["steps"]]
    assert match(pool.destinations, taskrun_facts(run, images)) == ()


def test_the_median_interval_holds_the_median_and_is_seeded() -> None:
    values = [float(v) for v in range(1, 101)]
    median, low, high = median_interval(values) or (0, 0, 0)
    assert low <= median <= high and median == 50.5 and median_interval(values) == median_interval(values)
    assert median_interval([]) is None and median_interval([7.0]) == (7.0, 7.0, 7.0)
