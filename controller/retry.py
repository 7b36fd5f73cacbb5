"""The one retry policy of the adapters: exponential backoff with jitter (tenacity), built here only.

`RetryPolicy` holds the timings (data; tests shrink them); `retrying(policy, ...)` builds the
`tenacity.Retrying` every adapter uses: the writer (API writes, at least the server's Retry-After),
the informers (list and watch, until stopped), the Lease (bounded by the renew deadline) and the
Prometheus client of the egress source; `backoff_seconds` the same waits for a reconciler's task tried
again on later passes (the storage migration). What is worth retrying is the caller's to say: for the API
server, `writer.classify`; for Prometheus, `PrometheusUnavailable`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import tenacity


@dataclass(frozen=True)
class RetryPolicy:
    """Waits between tries: exponential from `initial` up to `maximum`, plus up to `jitter` at random;
    at most `attempts` tries in all (None: until the caller stops retrying)."""

    attempts: int | None = 6
    initial: float = 0.2
    maximum: float = 10.0
    jitter: float = 0.5


WRITES = RetryPolicy()  # API writes (and the reads they depend on)
WATCHES = RetryPolicy(attempts=None, initial=0.5, maximum=30.0, jitter=1.0)  # list + watch, for ever
# A pod's TaskRun read at Pod CREATE (admission.server waits OWNER_READ_SECONDS at most for it).
OWNER_READS = RetryPolicy(attempts=2, initial=0.1, maximum=0.3, jitter=0.1)
PROMETHEUS = RetryPolicy(attempts=3, initial=0.2, maximum=2.0, jitter=0.2)  # one egress query
# A reconciler's task that failed, tried again on a later pass (the storage migration): not before this.
LATER_PASSES = RetryPolicy(attempts=None, initial=5.0, maximum=600.0, jitter=5.0)


def lease_policy(retry_period: float) -> RetryPolicy:
    """A Lease request is tried twice at most, the second time within half a `retry_period`: the
    election loop itself tries again every `retry_period`, and must see a failure in time to step down."""
    return RetryPolicy(attempts=2, initial=retry_period / 4, maximum=retry_period / 2, jitter=retry_period / 10)


def backoff_seconds(policy: RetryPolicy, failures: int) -> float:
    """The wait after `failures` failures in a row (1, 2, ...), as `retrying` would wait: for a task a
    reconciler tries again on a later pass rather than in a loop of its own."""
    state = tenacity.RetryCallState(None, None, (), {})
    state.attempt_number = max(1, failures)
    return float(tenacity.wait_exponential_jitter(multiplier=policy.initial, max=policy.maximum, jitter=policy.jitter)(state))


def retrying(
    policy: RetryPolicy,
    retry_if: Callable[[BaseException], bool],
    *,
    sleep: Callable[[float], None] = time.sleep,
    before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
    at_least: Callable[[BaseException | None], float] | None = None,
) -> tenacity.Retrying:
    """A Retrying that retries the errors `retry_if` accepts, waiting as `policy` says (and never less
    than `at_least(error)`, capped at `policy.maximum`: e.g. the server's Retry-After), then re-raises
    the last error."""
    backoff = tenacity.wait_exponential_jitter(multiplier=policy.initial, max=policy.maximum, jitter=policy.jitter)

    def wait(state: tenacity.RetryCallState) -> float:
        if at_least is None:
            return backoff(state)
        error = state.outcome.exception() if state.outcome else None
        return max(backoff(state), min(at_least(error), policy.maximum))

    stop = tenacity.stop_never if policy.attempts is None else tenacity.stop_after_attempt(policy.attempts)
    options = {"before_sleep": before_sleep} if before_sleep is not None else {}
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(retry_if),
        wait=wait,
        stop=stop,
        sleep=sleep,
        reraise=True,
        **options,
    )
