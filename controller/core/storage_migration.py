"""What the leader says about its storage migration of the pools API (controller/kube/storage_migration.py,
`StorageMigration`): plain data in, the log line, its level and the Events out. No I/O; the wait before the
next try (the backoff of controller/retry.py, jittered) is given.

- A failure is said (log WARNING and a Warning Event `StorageMigrationFailed` regarding the CRD that could
  not be migrated) once per distinct error; the same error again: DEBUG, no Event (the log's rule).
- Success says (INFO) what was done; a Normal Event `StorageMigrated` regarding each CRD whose
  `status.storedVersions` this leader pruned (on this try or an earlier one that failed later), and each CRD a Warning Event was about (the Warning's
  answer, in `kubectl describe crd`). A new leader that finds everything migrated already sends no Event.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

FAILED = "StorageMigrationFailed"
MIGRATED = "StorageMigrated"
ACTION = "MigrateStorage"
CRD_API_VERSION = "apiextensions.k8s.io/v1"
CRD_KIND = "CustomResourceDefinition"
RUNBOOK = "docs/troubleshooting.md#egressplacerstoragemigrationfailing"
# What a platform engineer can do, in every Warning's note.
FAILED_HINT = (
    "An HTTP 403: the controller lacks update on egresspools, egressplacerconfigs and customresourcedefinitions/status "
    "(an older chart's RBAC); `egress-placer migrate-storage` does the same from a workstation. See " + RUNBOOK
)


@dataclass(frozen=True)
class Crd:
    """A CRD an Event is about; `uid` as read (empty when it could not be read: `kubectl describe crd`
    matches Events by uid, `kubectl get events -n default` still lists them)."""

    name: str
    uid: str = ""

    def regarding(self) -> dict[str, str]:
        """The Event's `regarding`: cluster-scoped, no namespace (the Event sink puts it in `default`)."""
        return {"apiVersion": CRD_API_VERSION, "kind": CRD_KIND, "name": self.name, **({"uid": self.uid} if self.uid else {})}


@dataclass(frozen=True)
class MigrationEvent:
    crd: Crd
    type: str  # "Warning" or "Normal"
    reason: str
    note: str


@dataclass(frozen=True)
class Said:
    level: str  # a loguru level: "WARNING", "DEBUG", "INFO"
    line: str
    events: tuple[MigrationEvent, ...] = ()


@dataclass(frozen=True)
class MigrationRecord:
    """The leader's migration so far (one per process)."""

    failures: int = 0  # in a row
    said: str | None = None  # the error last said at WARNING, with its Event
    warned: tuple[Crd, ...] = ()  # the CRDs a Warning Event was about, in order
    done: bool = False

    @property
    def pending(self) -> bool:
        return not self.done


def failed(record: MigrationRecord, crd: Crd, error: str, wait: float, stored: str) -> tuple[MigrationRecord, Said]:
    """The try failed on `crd` with `error` (one line); tried again in `wait` seconds."""
    failures = record.failures + 1
    line = f"storage migration failed ({failures} in a row), tried again in {wait:.0f}s: {error}"
    if error == record.said:
        return replace(record, failures=failures), Said("DEBUG", line)
    note = f"cannot store the objects of {crd.name} as {stored} (failure {failures} in a row; tried again with backoff): {error}. {FAILED_HINT}"
    warned = record.warned if any(c.name == crd.name for c in record.warned) else (*record.warned, crd)
    event = MigrationEvent(crd, "Warning", FAILED, note)
    said = Said("WARNING", line + " (said once; the same error again is logged at DEBUG)", (event,))
    return replace(record, failures=failures, said=error, warned=warned), said


def succeeded(record: MigrationRecord, pruned: Sequence[Crd], stored: str) -> tuple[MigrationRecord, Said]:
    """Every object written back; `pruned`: the CRDs whose storedVersions this leader set to [stored]."""
    about: list[Crd] = list(pruned)
    for crd in record.warned:
        if not any(c.name == crd.name for c in about):
            about.append(crd)
    after = f" after {record.failures} failures" if record.failures else ""
    events = tuple(
        MigrationEvent(
            crd, "Normal", MIGRATED,
            f"every object of {crd.name} is stored as {stored} and status.storedVersions is [{stored}]{after}",
        )
        for crd in about
    )
    return MigrationRecord(done=True), Said("INFO", f"storage migration done{after}", events)
