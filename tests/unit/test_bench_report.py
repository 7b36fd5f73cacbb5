"""bench/report.py's target for the Pod calls' split between replicas (#24): the smallest replica's share
at 2 replicas, over both pools, against a floor of 0.25."""

from __future__ import annotations

from typing import Any

import pytest

from bench import schema
from bench.report import POD_CALL_SHARE_FLOOR, targets

NAME = "balance (2 replicas) smallest replica's share of the Pod calls, worst pool"


def _row(replicas: int, pool: str, share: float | None) -> dict[str, Any]:
    return {"replicas": replicas, "pool": pool, "min_pod_call_share": share}


@pytest.mark.parametrize(("rows", "value", "met"), [
    ([], None, None),  # the section did not run
    ([_row(1, "even", 1.0), _row(2, "even", 0.27), _row(2, "uneven", 0.483)], 0.27, True),
    ([_row(2, "even", 0.213), _row(2, "uneven", 0.477)], 0.213, False),  # the worst pool decides
    ([_row(2, "even", 0.25), _row(2, "uneven", 0.5)], 0.25, True),  # the floor itself is met
    ([_row(2, "even", 0.4), _row(3, "even", 0.1)], 0.4, True),  # 3 replicas: no floor asked
    ([_row(2, "even", None), _row(2, "uneven", 0.3)], 0.3, True),  # a burst with no Pod call counted
])
def test_the_split_target_is_the_worst_share_at_two_replicas(rows: list[dict[str, Any]], value: float | None, met: bool | None) -> None:
    results = schema.empty()
    results["balance"]["replicas"] = rows
    (target,) = [t for t in targets(results) if t["name"] == NAME]
    assert (target["value"], target["met"], target["target"]) == (value, met, f">= {POD_CALL_SHARE_FLOOR}")
