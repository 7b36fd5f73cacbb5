"""The placement log's rule: a run's pod bound to a pool node counts from its creation time
(`creationTimestamp`, a metav1.Time) for `PLACEMENT_WINDOW_SECONDS`. Pure: the time is given."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

PLACEMENT_WINDOW_SECONDS = 3600.0


@dataclass(frozen=True)
class Placed:
    """A run's pod bound to `node`, created at `at` (epoch seconds)."""

    node: str
    at: float


def placed_within(placed: Iterable[Placed], nodes: Collection[str], now: float) -> int:
    """The runs' pods placed on `nodes` within the window before `now`."""
    since = now - PLACEMENT_WINDOW_SECONDS
    return sum(1 for p in placed if p.node in nodes and since < p.at <= now)


def rfc3339(ts: float) -> str:
    """A metav1.Time: seconds, UTC (2026-07-01T12:00:00Z)."""
    return datetime.fromtimestamp(int(ts), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: Any) -> float | None:
    """Epoch seconds of a metav1.Time, None when it is not one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
