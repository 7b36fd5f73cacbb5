"""Small statistics helpers (nearest-rank percentiles, rounding for the JSON, bootstrap intervals of ratios)."""

from __future__ import annotations

import math
import random
from typing import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q`-th percentile (0 < q <= 100) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, digits)


def mean_per_call(blocks: Sequence[tuple[float, float]]) -> float | None:
    """Seconds per call over `blocks` of (seconds, calls): the sum over the count, None without calls."""
    calls = sum(n for _, n in blocks)
    return sum(s for s, _ in blocks) / calls if calls else None


def bootstrap_ratio(ours: Sequence[tuple[float, float]], theirs: Sequence[tuple[float, float]], *, paired: bool = False,
                    resamples: int = 4000, level: float = 0.95, seed: int = 24) -> tuple[float, float, float] | None:
    """The ratio of the mean time per call of `ours` to `theirs` (each a list of blocks of (seconds, calls):
    a histogram's _sum and _count deltas around one block), and its percentile bootstrap interval at
    `level`: blocks drawn with replacement, `resamples` times, from a seeded generator (the same blocks give
    the same interval). `paired`: block i of each side ran in the same round (as e2e's mirrored rounds do),
    so rounds are drawn, both sides together, and drift that hits a whole round cancels; else each side is
    drawn apart. None when either side has no calls."""
    point_ours, point_theirs = mean_per_call(ours), mean_per_call(theirs)
    if point_ours is None or not point_theirs:
        return None
    if paired and len(ours) != len(theirs):
        raise ValueError(f"paired blocks: {len(ours)} against {len(theirs)}")
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        if paired:
            rounds = rng.choices(range(len(ours)), k=len(ours))
            a, b = mean_per_call([ours[i] for i in rounds]), mean_per_call([theirs[i] for i in rounds])
        else:
            a = mean_per_call(rng.choices(ours, k=len(ours)))
            b = mean_per_call(rng.choices(theirs, k=len(theirs)))
        if a is not None and b:
            ratios.append(a / b)
    return (point_ours / point_theirs, *_interval(ratios, level))


def bootstrap_percentile_ratio(ours: Sequence[Sequence[float]], theirs: Sequence[Sequence[float]], q: float = 99.0, *,
                               resamples: int = 1000, level: float = 0.95, seed: int = 24) -> tuple[float, float, float] | None:
    """The `q`-th percentile of every latency of `ours` (runs of latencies) over that of `theirs`, each over
    its runs pooled, and its percentile bootstrap interval at `level`. The runs are paired (run i of each
    side ran in the same round, alternating) and rounds are drawn with replacement, both sides together, so
    drift that hits a whole round cancels; within a run nothing is drawn apart (its requests share the
    machine's state). A seeded generator: the same runs give the same interval. None without latencies."""
    if len(ours) != len(theirs):
        raise ValueError(f"paired runs: {len(ours)} against {len(theirs)}")
    point_ours = percentile([x for run in ours for x in run], q)
    point_theirs = percentile([x for run in theirs for x in run], q)
    if point_ours is None or not point_theirs:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        rounds = rng.choices(range(len(ours)), k=len(ours))
        a = percentile([x for i in rounds for x in ours[i]], q)
        b = percentile([x for i in rounds for x in theirs[i]], q)
        if a is not None and b:
            ratios.append(a / b)
    return (point_ours / point_theirs, *_interval(ratios, level))


def _interval(ratios: list[float], level: float) -> tuple[float, float]:
    """The percentile interval at `level` of the bootstrap's `ratios` (sorted here)."""
    ratios.sort()
    tail = (1.0 - level) / 2.0
    low = ratios[min(len(ratios) - 1, int(math.floor(tail * len(ratios))))]
    high = ratios[max(0, int(math.ceil((1.0 - tail) * len(ratios))) - 1)]
    return low, high
