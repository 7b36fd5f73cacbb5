"""The migration of the pools API's stored objects to `v1beta1` (docs/pools-api.md, "Serving, storing,
converting"): every EgressPool and the EgressPlacerConfig written back unchanged (the API server stores
each anew in the storage version, as kube-storage-version-migrator does), then, only when each write
succeeded, the CRDs' `status.storedVersions` set to `[v1beta1]`. Idempotent; a crash leaves nothing
half done (storedVersions is pruned last). `api`: anything with the API client's `call`.

`StorageMigration` is the leader's reconciler that runs it once after it is elected (until it succeeds).
A failure (a write refused for want of rights, the API server away, CRDs that do not store v1beta1 yet) is
tried again with the backoff of controller/retry.py (LATER_PASSES: 5 s doubling up to 10 min), not on every
pass, and said once per distinct error (the same error again: DEBUG), so that the log stays readable: a log
warning and a Warning Event `StorageMigrationFailed` regarding the CRD (`kubectl describe crd
egresspools.egress-placer.io`), then a Normal `StorageMigrated` when it succeeds (controller/core/
storage_migration.py decides). `egress_placer_storage_migration_pending` is 1 until it succeeded,
`egress_placer_storage_migration_failures_total` counts the failed tries (alert
EgressPlacerStorageMigrationFailing).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from loguru import logger

from controller.core.conversion import V1BETA1
from controller.core.pools import CONFIG_PLURAL, GROUP, POOL_PLURAL
from controller.core.storage_migration import ACTION, Crd, MigrationRecord, Said, failed, succeeded
from controller.event_sink import EventSink
from controller.kube.client import describe_error
from controller.metrics import Metrics
from controller.retry import LATER_PASSES, RetryPolicy, backoff_seconds

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
STORED = V1BETA1.rpartition("/")[2]
PLURALS = (POOL_PLURAL, CONFIG_PLURAL)


class NotStoringV1beta1(Exception):
    """The CRDs installed do not store v1beta1 (an older k8s/crds/ or chart)."""


class Caller(Protocol):
    def call(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]: ...


def read_crd(api: Caller, plural: str) -> dict[str, Any]:
    """The CRD of `plural`; NotStoringV1beta1 when it does not store v1beta1."""
    crd = api.call("GET", f"{CRDS}/{plural}.{GROUP}")
    storage = [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
    if storage != [STORED]:
        raise NotStoringV1beta1(f"{plural}.{GROUP} stores {', '.join(storage)}, not {STORED}: install the CRDs that serve {STORED} first")
    return crd


def migrate_crd(api: Caller, plural: str, crd: dict[str, Any], dry_run: bool = False) -> tuple[list[str], bool]:
    """The objects of `plural` (its CRD as `read_crd` read it) written back, then its storedVersions pruned:
    what was done, one line each, and whether storedVersions was (or, `dry_run`, would be) pruned."""
    done: list[str] = []
    would = "would be " if dry_run else ""
    path = f"/apis/{V1BETA1}/{plural}"
    for obj in api.call("GET", path).get("items") or []:
        name = obj["metadata"]["name"]
        if not dry_run:
            api.call("PUT", f"{path}/{name}", body={**obj, "apiVersion": V1BETA1, "kind": crd["spec"]["names"]["kind"]})
        done.append(f"{plural}/{name}: {would}stored as {STORED}")
    if not dry_run:
        crd = api.call("GET", f"{CRDS}/{plural}.{GROUP}")
    stored = crd.get("status", {}).get("storedVersions")
    if stored == [STORED]:
        return done, False
    if not dry_run:
        crd["status"]["storedVersions"] = [STORED]
        api.call("PUT", f"{CRDS}/{plural}.{GROUP}/status", body=crd)
    done.append(f"{plural}.{GROUP}: storedVersions {would}[{STORED}] (was [{', '.join(stored or [])}])")
    return done, True


def migrate_storage(api: Caller, dry_run: bool = False) -> list[str]:
    """What was done, one line each; NotStoringV1beta1 when the CRDs do not store v1beta1. `dry_run`:
    reads only, and says what it would write (`egress-placer migrate-storage --dry-run`)."""
    done: list[str] = []
    for plural in PLURALS:
        done += migrate_crd(api, plural, read_crd(api, plural), dry_run)[0]
    return done


class StorageMigration:
    """The leader's reconciler: `migrate_storage` once per process (again on a later pass after a failure:
    a write refused, the API server away, CRDs that do not store v1beta1 yet, not before the backoff's
    wait), skipping a CRD whose storedVersions is [v1beta1] already (nothing stored otherwise: an earlier
    leader or `egress-placer migrate-storage` did it; so a controller without the rights stops failing once
    an admin ran that command). Done means nothing left until the process restarts. What it says (log, Events regarding the
    CRDs) is decided by controller/core/storage_migration.py; `metrics.storage_migration_pending` is 1
    until it is done, set on every pass (a replica that leads again exports it again)."""

    def __init__(
        self,
        api: Caller,
        events: EventSink,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        policy: RetryPolicy = LATER_PASSES,
    ) -> None:
        self.api = api
        self.events = events
        self.metrics = metrics
        self.clock = clock
        self.policy = policy
        self.record = MigrationRecord()
        self.next_try = 0.0
        self.pruned: list[Crd] = []  # the CRDs whose storedVersions a try pruned, said on success

    @property
    def done(self) -> bool:
        return self.record.done

    def __call__(self) -> float | None:
        self.metrics.storage_migration_pending.set(1 if self.record.pending else 0)
        if self.record.done:
            return None
        now = self.clock()
        if now < self.next_try:
            return self.next_try - now
        for plural in PLURALS:
            crd = Crd(f"{plural}.{GROUP}")
            try:
                read = read_crd(self.api, plural)
                crd = Crd(crd.name, str(read.get("metadata", {}).get("uid") or ""))
                if read.get("status", {}).get("storedVersions") == [STORED]:
                    continue  # migrated already (by an earlier leader, or `egress-placer migrate-storage`)
                lines, pruning = migrate_crd(self.api, plural, read)
            except Exception as e:  # noqa: BLE001 - tried again on a later pass
                return self._failed(now, crd, describe_error(e))
            for line in lines:
                logger.info("storage migration: {}", line)
            self.pruned += [crd] if pruning else []
        self.record, said = succeeded(self.record, self.pruned, STORED)
        self._say(said)
        self.metrics.storage_migration_pending.set(0)
        return None

    def _failed(self, now: float, crd: Crd, error: str) -> float:
        self.metrics.storage_migration_failures.inc()
        wait = backoff_seconds(self.policy, self.record.failures + 1)
        self.next_try = now + wait
        self.record, said = failed(self.record, crd, error, wait, STORED)
        self._say(said)
        return wait

    def _say(self, said: Said) -> None:
        logger.log(said.level, said.line)
        for event in said.events:
            self.events.emit(event.crd.regarding(), event.type, event.reason, event.note, action=ACTION)
