"""bench.admission.sustained: the highest offered rate kept with p99 under the limit, 0 when rates were
tried and none was kept (so the target reads "missed", not "not measured"), None when none was tried."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.admission import after_idle, sustained


def row(rate: float, p99_ms: float | None, throughput: float | None = None, errors: int = 0, target: str = "egress-placer") -> dict[str, Any]:
    return {"target": target, "rate_rps": rate, "p99_ms": p99_ms, "throughput_rps": rate if throughput is None else throughput, "errors": errors}


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([row(200, 2.0), row(500, 4.0), row(1000, 30.0)], 500),
        ([row(200, 2.0), row(500, 4.0, throughput=400)], 200),  # 500 offered, not kept
        ([row(200, 2.0), row(500, 4.0, errors=1)], 200),
        ([row(200, 31.0), row(500, 40.0)], 0.0),  # tried, none kept: a missed target
        ([row(200, None)], 0.0),
        ([row(200, 2.0, target="floor")], None),  # none tried for egress-placer
        ([], None),
    ],
)
def test_sustained_rate(rows: list[dict[str, Any]], expected: float | None) -> None:
    assert sustained(rows, "egress-placer") == expected


class Echo:
    """An Admission that allows everything, counting its reviews."""

    def __init__(self) -> None:
        self.reviews: list[str] = []

    def review(self, body: dict[str, Any]) -> dict[str, Any]:
        self.reviews.append(body["request"]["kind"]["kind"])
        return {"response": {"uid": body["request"]["uid"], "allowed": True}}


def test_after_idle_times_each_kind_after_a_pause_and_back_to_back() -> None:
    bodies = [json.dumps({"request": {"uid": str(i), "kind": {"kind": kind}}}).encode()
              for i, kind in enumerate(["TaskRun", "Pod", "DaemonSet"] * 3)]
    admission = Echo()
    out = after_idle(admission, bodies, idle=0.0, reviews=2)  # type: ignore[arg-type]
    assert set(out) == {"TaskRun", "Pod", "TaskRun_hot", "Pod_hot"} and all(v >= 0 for v in out.values())
    assert admission.reviews == ["TaskRun"] * 4 + ["Pod"] * 4  # two of each kind, back to back then after the pause
