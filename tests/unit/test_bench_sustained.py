"""bench.admission.sustained: the highest offered rate kept with p99 under the limit, 0 when rates were
tried and none was kept (so the target reads "missed", not "not measured"), None when none was tried."""

from __future__ import annotations

from typing import Any

import pytest

from bench.admission import sustained


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
