"""The one way tests wait: `wait_for(what, probe, timeout=..., interval=...)`, and its mirror
`holds_for(what, probe, seconds=..., interval=...)`.

`wait_for`: `probe()` is called until it returns something truthy, which `wait_for` returns. After
`timeout` seconds it raises `WaitTimeout` (an AssertionError, so pytest reports it as a failed check)
naming what was awaited and the probe's last answer. A test that records an outcome instead of failing
(the reliability suite's attempts) catches `WaitTimeout`, whose `.last` is that answer.

`wait_gone`: `probe()` answers what is still there (a list; empty once it is all gone); it is called
until the answer is empty. On timeout the `WaitTimeout` shows what was left, not just `False` (e.g. a
namespace still terminating, with its conditions).

`holds_for`: a test that must show something did NOT happen for a while (a documented grace, an
outage that lasts N seconds) polls what must stay true for that long instead of sleeping: `probe()` is
called until `seconds` have passed, the last call at or after that moment, and must answer something
truthy each time. The first falsy answer raises `StoppedHolding` (an AssertionError too) at once, with
that answer as `.last` and when it came as `.after`.

Exceptions from the probe propagate; a probe that must outlast an unreachable API server says so
itself (`tests.e2e.harness.quietly`). No test sleeps and then asserts (tests/unit/test_no_sleep_then_assert.py).
"""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 500 else shown[:500] + "..."


class WaitTimeout(AssertionError):
    def __init__(self, what: str, timeout: float, last: Any) -> None:
        super().__init__(f"timed out after {timeout:g} s waiting for {what}; last value: {_shown(last)}")
        self.what = what
        self.last = last


class StoppedHolding(AssertionError):
    def __init__(self, what: str, seconds: float, after: float, last: Any) -> None:
        super().__init__(f"{what} stopped holding after {after:.1f} of {seconds:g} s; it answered {_shown(last)}")
        self.what = what
        self.after = after
        self.last = last


def _poll(probe: Callable[[], T], seconds: float, interval: float, stop: Callable[[T], bool]) -> tuple[T, bool, float]:
    """Call `probe` every `interval` s until `stop(answer)` or until a call that began once `seconds`
    had passed; (the last answer, whether it stopped the polling, seconds since the start)."""
    started = time.monotonic()
    while True:
        expired = time.monotonic() - started >= seconds
        last = probe()
        if stop(last):
            return last, True, time.monotonic() - started
        if expired:
            return last, False, time.monotonic() - started
        time.sleep(interval)


def wait_for(what: str, probe: Callable[[], T], *, timeout: float = 60.0, interval: float = 0.25) -> T:
    """Poll `probe` every `interval` s until it returns something truthy and return that; raise
    `WaitTimeout` (what was awaited, the last value) once `timeout` s have passed."""
    last, met, _ = _poll(probe, timeout, interval, bool)
    if not met:
        raise WaitTimeout(what, timeout, last)
    return last


def wait_gone(what: str, probe: Callable[[], list[T]], *, timeout: float = 60.0, interval: float = 0.25) -> None:
    """Poll `probe` (what is left) every `interval` s until it answers an empty list; raise `WaitTimeout`
    with what was left once `timeout` s have passed."""
    last, met, _ = _poll(probe, timeout, interval, lambda left: not left)
    if not met:
        raise WaitTimeout(what, timeout, last)


def holds_for(what: str, probe: Callable[[], T], *, seconds: float, interval: float = 0.25) -> T:
    """Poll `probe` every `interval` s for `seconds` (the last call at or after that moment): each answer
    must be truthy; return the last one. Raise `StoppedHolding` at the first falsy answer."""
    last, broke, after = _poll(probe, seconds, interval, lambda answer: not answer)
    if broke:
        raise StoppedHolding(what, seconds, after, last)
    return last
