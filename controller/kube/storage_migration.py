"""The migration of the pools API's stored objects to `v1beta1` (docs/pools-api.md, "Serving, storing,
converting"): every EgressPool and the EgressPlacerConfig written back unchanged (the API server stores
each anew in the storage version, as kube-storage-version-migrator does), then, only when each write
succeeded, the CRDs' `status.storedVersions` set to `[v1beta1]`. Idempotent; a crash leaves nothing
half done (storedVersions is pruned last). `api`: anything with the API client's `call`.

`StorageMigration` is the leader's reconciler that runs it once after it is elected (until it succeeds).
A failure (a write refused for want of rights, the API server away) is tried again with the backoff of
controller/retry.py (LATER_PASSES: 5 s doubling up to 10 min), not on every pass, and logged as a warning
once per distinct error (the same error again: DEBUG), so that the log stays readable.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from loguru import logger

from controller.core.conversion import V1BETA1
from controller.core.pools import CONFIG_PLURAL, GROUP, POOL_PLURAL
from controller.kube.client import describe_error
from controller.retry import LATER_PASSES, RetryPolicy, backoff_seconds

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
STORED = V1BETA1.rpartition("/")[2]


class NotStoringV1beta1(Exception):
    """The CRDs installed do not store v1beta1 (an older k8s/crds/ or chart)."""


class Caller(Protocol):
    def call(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]: ...


def migrate_storage(api: Caller, dry_run: bool = False) -> list[str]:
    """What was done, one line each; NotStoringV1beta1 when the CRDs do not store v1beta1. `dry_run`:
    reads only, and says what it would write (`egress-placer migrate-storage --dry-run`)."""
    done: list[str] = []
    would = "would be " if dry_run else ""
    for plural in (POOL_PLURAL, CONFIG_PLURAL):
        crd = api.call("GET", f"{CRDS}/{plural}.{GROUP}")
        storage = [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
        if storage != [STORED]:
            raise NotStoringV1beta1(f"{plural}.{GROUP} stores {', '.join(storage)}, not {STORED}: install the CRDs that serve {STORED} first")
        path = f"/apis/{V1BETA1}/{plural}"
        for obj in api.call("GET", path).get("items") or []:
            name = obj["metadata"]["name"]
            if not dry_run:
                api.call("PUT", f"{path}/{name}", body={**obj, "apiVersion": V1BETA1, "kind": crd["spec"]["names"]["kind"]})
            done.append(f"{plural}/{name}: {would}stored as {STORED}")
        if not dry_run:
            crd = api.call("GET", f"{CRDS}/{plural}.{GROUP}")
        stored = crd.get("status", {}).get("storedVersions")
        if stored != [STORED]:
            if not dry_run:
                crd["status"]["storedVersions"] = [STORED]
                api.call("PUT", f"{CRDS}/{plural}.{GROUP}/status", body=crd)
            done.append(f"{plural}.{GROUP}: storedVersions {would}[{STORED}] (was [{', '.join(stored or [])}])")
    return done


class StorageMigration:
    """The leader's reconciler: `migrate_storage` once per process (again on a later pass after a failure:
    a write refused, the API server away, not before the backoff's wait). Done means nothing left until
    the process restarts."""

    def __init__(self, api: Caller, clock: Callable[[], float] = time.monotonic, policy: RetryPolicy = LATER_PASSES) -> None:
        self.api = api
        self.clock = clock
        self.policy = policy
        self.done = False
        self.failures = 0  # in a row
        self.next_try = 0.0
        self.last_error: str | None = None  # the error last logged as a warning

    def __call__(self) -> float | None:
        if self.done:
            return None
        now = self.clock()
        if now < self.next_try:
            return self.next_try - now
        try:
            for line in migrate_storage(self.api):
                logger.info("storage migration: {}", line)
        except NotStoringV1beta1 as e:
            logger.warning("storage migration skipped: {}", e)
        except Exception as e:  # noqa: BLE001 - tried again on a later pass
            self.failures += 1
            wait = backoff_seconds(self.policy, self.failures)
            self.next_try = now + wait
            error = describe_error(e)
            said = "storage migration failed ({} in a row), tried again in {:.0f}s: {}"
            if error != self.last_error:
                logger.warning(said + " (said once; the same error again is logged at DEBUG)", self.failures, wait, error)
                self.last_error = error
            else:
                logger.debug(said, self.failures, wait, error)
            return wait
        if self.failures:
            logger.info("storage migration done after {} failures", self.failures)
        self.done = True
        return None
