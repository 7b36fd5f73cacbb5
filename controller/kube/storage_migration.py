"""The migration of the pools API's stored objects to `v1beta1` (docs/pools-api.md, "Serving, storing,
converting"): every EgressPool and the EgressPlacerConfig written back unchanged (the API server stores
each anew in the storage version, as kube-storage-version-migrator does), then, only when each write
succeeded, the CRDs' `status.storedVersions` set to `[v1beta1]`. Idempotent; a crash leaves nothing
half done (storedVersions is pruned last). `api`: anything with the API client's `call`.

`StorageMigration` is the leader's reconciler that runs it once after it is elected (until it succeeds).
"""

from __future__ import annotations

from typing import Any, Protocol

from loguru import logger

from controller.core.conversion import V1BETA1
from controller.core.pools import CONFIG_PLURAL, GROUP, POOL_PLURAL

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
    a write refused, the API server away). Done means nothing left until the process restarts."""

    def __init__(self, api: Caller) -> None:
        self.api = api
        self.done = False

    def __call__(self) -> float | None:
        if self.done:
            return None
        try:
            for line in migrate_storage(self.api):
                logger.info("storage migration: {}", line)
        except NotStoringV1beta1 as e:
            logger.warning("storage migration skipped: {}", e)
        except Exception as e:  # noqa: BLE001 - tried again on the next pass
            logger.bind(error=str(e)).warning("storage migration failed, tried again on the next pass")
            return None
        self.done = True
        return None
