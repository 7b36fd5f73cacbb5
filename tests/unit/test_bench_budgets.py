"""bench/queue.py's `budgets_untouched`: the budgeted policy is valid and none of its destinations is
touched by the burst's uploads; the median's bootstrap interval; the verdict on the budgeted side's median."""

from __future__ import annotations

import pytest

from bench.queue import median_interval, policy, slowed_or_not, upload_run
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


@pytest.mark.parametrize(
    ("median", "within", "not_slowed"),
    [(232.3, True, True), (228.1, False, True), (236.5, True, True), (236.6, False, False), (None, None, None)],
    ids=["inside", "below: faster", "at the top", "above: slowed", "no samples"],
)
def test_the_budgeted_median_is_not_slowed_within_or_below_the_interval(median: float | None, within: bool | None, not_slowed: bool | None) -> None:
    without = {"p50": 232.2, "ci_low": 230.2, "ci_high": 236.5}
    assert slowed_or_not(without, {"p50": median}) == {"within_interval": within, "not_slowed": not_slowed}
