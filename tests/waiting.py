"""The one way tests wait: `wait_for(what, probe, timeout=..., interval=...)`.

`probe()` is called until it returns something truthy, which `wait_for` returns. After `timeout`
seconds it raises `WaitTimeout` (an AssertionError, so pytest reports it as a failed check) naming
what was awaited and the probe's last answer. A test that records an outcome instead of failing
(the reliability suite's attempts) catches `WaitTimeout`, whose `.last` is that answer.

Exceptions from the probe propagate; a probe that must outlast an unreachable API server says so
itself (`tests.reliability.cluster_view.quietly`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    def __init__(self, what: str, timeout: float, last: Any) -> None:
        shown = repr(last)
        shown = shown if len(shown) <= 500 else shown[:500] + "..."
        super().__init__(f"timed out after {timeout:g} s waiting for {what}; last value: {shown}")
        self.what = what
        self.last = last


def wait_for(what: str, probe: Callable[[], T], *, timeout: float = 60.0, interval: float = 0.25) -> T:
    """Poll `probe` every `interval` s until it returns something truthy and return that; raise
    `WaitTimeout` (what was awaited, the last value) once `timeout` s have passed."""
    deadline = time.monotonic() + timeout
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise WaitTimeout(what, timeout, last)
        time.sleep(interval)
