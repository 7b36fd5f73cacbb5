"""bench/stats.py's bootstrap of a ratio of mean times per call over blocks (e2e.call_latency)."""

from __future__ import annotations

import random

import pytest

from bench.stats import bootstrap_percentile_ratio, bootstrap_ratio, mean_per_call


def test_the_mean_per_call_weighs_blocks_by_their_calls() -> None:
    assert mean_per_call([(1.0, 10), (3.0, 10)]) == pytest.approx(0.2)
    assert mean_per_call([(1.0, 1), (3.0, 99)]) == pytest.approx(0.04)  # not the mean of the blocks' means (0.515)
    assert mean_per_call([]) is None and mean_per_call([(0.0, 0)]) is None


def test_blocks_that_agree_give_an_interval_of_one_point() -> None:
    ratio, low, high = bootstrap_ratio([(0.06, 20)] * 5, [(0.02, 20)] * 5)  # type: ignore[misc]
    assert ratio == pytest.approx(3.0) and low == pytest.approx(3.0) and high == pytest.approx(3.0)


def test_the_interval_holds_the_true_ratio_of_noisy_blocks_and_is_repeatable() -> None:
    rng = random.Random(1)

    def blocks(ms: float) -> list[tuple[float, float]]:
        return [(sum(rng.gauss(ms, ms / 2) for _ in range(20)) / 1000, 20) for _ in range(8)]

    ours, floor = blocks(4.0), blocks(2.0)
    ratio, low, high = bootstrap_ratio(ours, floor)  # type: ignore[misc]
    assert low < ratio < high and low < 2.0 < high and high - low < 1.5
    assert bootstrap_ratio(ours, floor) == (ratio, low, high)  # seeded: the same blocks, the same interval
    assert bootstrap_ratio(ours, floor, seed=2) != (ratio, low, high)


def test_no_ratio_without_calls() -> None:
    assert bootstrap_ratio([(0.1, 10)], []) is None
    assert bootstrap_ratio([], [(0.1, 10)]) is None
    assert bootstrap_ratio([(0.1, 10)], [(0.0, 0)]) is None


def test_paired_rounds_cancel_drift_that_hits_both_sides_of_a_round() -> None:
    slow = [1.0, 5.0, 1.0, 8.0, 1.0, 3.0]  # the machine's load, round by round
    ours = [(0.003 * f * 10, 10) for f in slow]
    floor = [(0.001 * f * 10, 10) for f in slow]
    ratio, low, high = bootstrap_ratio(ours, floor, paired=True)  # type: ignore[misc]
    assert ratio == pytest.approx(3.0) and low == pytest.approx(3.0) and high == pytest.approx(3.0)
    _, low, high = bootstrap_ratio(ours, floor)  # type: ignore[misc]
    assert high - low > 1.0  # drawn apart, the drift shows as noise
    with pytest.raises(ValueError):
        bootstrap_ratio(ours, floor[:-1], paired=True)


def test_the_pooled_percentile_ratio_holds_the_true_ratio_and_cancels_a_rounds_drift() -> None:
    rng = random.Random(3)
    slow = [1.0, 1.4, 1.0, 2.0, 1.1, 1.0, 1.3, 1.0, 1.2]  # the machine's state, round by round
    ours = [[1.2 * f * rng.lognormvariate(0, 0.3) for _ in range(400)] for f in slow]
    floor = [[1.0 * f * rng.lognormvariate(0, 0.3) for _ in range(400)] for f in slow]
    ratio, low, high = bootstrap_percentile_ratio(ours, floor)  # type: ignore[misc]
    assert low <= ratio <= high and low < 1.2 < high and high - low < 0.3
    assert bootstrap_percentile_ratio(ours, floor) == (ratio, low, high)  # seeded: the same runs, the same interval
    same, same_low, same_high = bootstrap_percentile_ratio(floor, floor)  # type: ignore[misc]
    assert same == same_low == same_high == 1.0  # each round drawn whole: the two sides move together


def test_no_pooled_ratio_without_latencies_and_runs_must_pair() -> None:
    assert bootstrap_percentile_ratio([[]], [[1.0]]) is None
    assert bootstrap_percentile_ratio([[1.0]], [[]]) is None
    with pytest.raises(ValueError):
        bootstrap_percentile_ratio([[1.0]], [[1.0], [2.0]])
