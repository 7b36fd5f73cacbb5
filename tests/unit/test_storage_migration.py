"""The pools API's storage migration (controller/kube/storage_migration.py), on a fake API: every object
written back as v1beta1, storedVersions pruned last, `dry_run` writes nothing; the leader's reconciler tries
a failed migration again after the backoff of controller/retry.py and warns once per distinct error."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from loguru import logger

from controller.core.storage_migration import FAILED, MIGRATED, Crd, MigrationRecord, failed, succeeded
from controller.kube.storage_migration import CRDS, NotStoringV1beta1, StorageMigration, migrate_storage
from controller.metrics import Metrics
from controller.retry import LATER_PASSES, RetryPolicy, backoff_seconds

POOLS = "/apis/egress-placer.io/v1beta1/egresspools"
CONFIGS_STATUS = f"{CRDS}/egressplacerconfigs.egress-placer.io/status"
NO_JITTER = RetryPolicy(attempts=None, initial=5.0, maximum=600.0, jitter=0.0)
CONFIGS = "/apis/egress-placer.io/v1beta1/egressplacerconfigs"


def crd(kind: str, stored: list[str], storage: str = "v1beta1") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{kind.lower()}s.egress-placer.io", "uid": f"uid-{kind}"},
        "spec": {"names": {"kind": kind}, "versions": [{"name": v, "storage": v == storage} for v in ("v1alpha1", "v1beta1")]},
        "status": {"storedVersions": stored},
    }


class FakeApi:
    def __init__(self, refuse: str | None = None) -> None:
        self.objects: dict[str, Any] = {
            f"{CRDS}/egresspools.egress-placer.io": crd("EgressPool", ["v1alpha1", "v1beta1"]),
            f"{CRDS}/egressplacerconfigs.egress-placer.io": crd("EgressPlacerConfig", ["v1alpha1", "v1beta1"]),
            POOLS: {"items": [{"metadata": {"name": "overseas"}, "spec": {}}]},
            CONFIGS: {"items": [{"metadata": {"name": "cluster"}, "spec": {}}]},
        }
        self.writes: list[str] = []
        self.refuse = refuse

    def call(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]:
        if method == "GET":
            return copy.deepcopy(self.objects[path])
        if self.refuse and self.refuse in path:
            raise PermissionError(f"403 {path}")
        self.writes.append(path)
        if path.endswith("/status"):
            self.objects[path.removesuffix("/status")] = body
        return body


def test_every_object_is_written_back_then_stored_versions_pruned() -> None:
    api = FakeApi()
    assert migrate_storage(api) == [
        "egresspools/overseas: stored as v1beta1",
        "egresspools.egress-placer.io: storedVersions [v1beta1] (was [v1alpha1, v1beta1])",
        "egressplacerconfigs/cluster: stored as v1beta1",
        "egressplacerconfigs.egress-placer.io: storedVersions [v1beta1] (was [v1alpha1, v1beta1])",
    ]
    assert api.writes == [
        f"{POOLS}/overseas", f"{CRDS}/egresspools.egress-placer.io/status",
        f"{CONFIGS}/cluster", f"{CRDS}/egressplacerconfigs.egress-placer.io/status",
    ]
    assert migrate_storage(api) == ["egresspools/overseas: stored as v1beta1", "egressplacerconfigs/cluster: stored as v1beta1"]


def test_dry_run_writes_nothing() -> None:
    api = FakeApi()
    assert migrate_storage(api, dry_run=True)[1] == "egresspools.egress-placer.io: storedVersions would be [v1beta1] (was [v1alpha1, v1beta1])"
    assert api.writes == []


def test_a_refused_write_leaves_stored_versions_alone() -> None:
    api = FakeApi(refuse=CONFIGS)
    with pytest.raises(PermissionError):
        migrate_storage(api)
    assert api.objects[f"{CRDS}/egressplacerconfigs.egress-placer.io"]["status"]["storedVersions"] == ["v1alpha1", "v1beta1"]


def test_crds_that_store_v1alpha1_are_said() -> None:
    api = FakeApi()
    api.objects[f"{CRDS}/egresspools.egress-placer.io"] = crd("EgressPool", ["v1alpha1"], storage="v1alpha1")
    with pytest.raises(NotStoringV1beta1, match="stores v1alpha1, not v1beta1"):
        migrate_storage(api)
    assert api.writes == []


# -- the leader's reconciler: a failure is tried again after the backoff, and said once per change ----------
def test_a_failing_migration_backs_off_and_warns_once_per_distinct_error() -> None:
    now = [1000.0]
    api = FakeApi(refuse=CONFIGS)
    migration = StorageMigration(api, Sent(), Metrics(), clock=lambda: now[0], policy=NO_JITTER)
    warned: list[str] = []
    sink = logger.add(lambda m: warned.append(str(m)), level="WARNING", filter="controller.kube.storage_migration")
    try:
        assert migration() == 5.0  # failed: not before 5 s
        writes = len(api.writes)
        for _ in range(20):  # passes in between (every change wakes the loop) do nothing
            assert migration() == 5.0
        assert len(api.writes) == writes
        now[0] += 5.0
        assert migration() == 10.0  # the same error again: doubled, not warned
        now[0] += 10.0
        api.refuse = CONFIGS_STATUS  # another error: warned (the pools, pruned on the first try, are not written again)
        assert migration() == 20.0
        api.refuse = None
        now[0] += 20.0
        assert migration() is None and migration.done
    finally:
        logger.remove(sink)
    assert len(warned) == 2, warned
    assert "storage migration failed (1 in a row), tried again in 5s: PermissionError: 403 " + CONFIGS in warned[0]
    assert "(3 in a row), tried again in 20s: PermissionError: 403 " + CONFIGS_STATUS in warned[1]


def test_backoff_seconds_doubles_up_to_the_maximum() -> None:
    policy = RetryPolicy(attempts=None, initial=5.0, maximum=600.0, jitter=0.0)
    assert [backoff_seconds(policy, n) for n in (1, 2, 3, 8, 9, 30)] == [5.0, 10.0, 20.0, 600.0, 600.0, 600.0]
    assert 5.0 <= backoff_seconds(LATER_PASSES, 1) <= 10.0


# -- what it says: the pure core (controller/core/storage_migration.py) -------------------------------------
POOLS_CRD = Crd("egresspools.egress-placer.io", "uid-EgressPool")
CONFIGS_CRD = Crd("egressplacerconfigs.egress-placer.io", "uid-EgressPlacerConfig")
ERROR = "HTTP 403 Forbidden: egresspools is forbidden"


@pytest.mark.parametrize(
    "record, crd, error, level, record_after",
    [
        # the first failure: a warning and a Warning Event regarding the CRD
        (MigrationRecord(), POOLS_CRD, ERROR, "WARNING", MigrationRecord(failures=1, said=ERROR, warned=(POOLS_CRD,))),
        # the same error again: DEBUG, no Event
        (MigrationRecord(failures=1, said=ERROR, warned=(POOLS_CRD,)), POOLS_CRD, ERROR, "DEBUG",
         MigrationRecord(failures=2, said=ERROR, warned=(POOLS_CRD,))),
        # another error on the other CRD: said, and that CRD is warned too
        (MigrationRecord(failures=2, said=ERROR, warned=(POOLS_CRD,)), CONFIGS_CRD, "HTTP 500", "WARNING",
         MigrationRecord(failures=3, said="HTTP 500", warned=(POOLS_CRD, CONFIGS_CRD))),
        # another error on a CRD already warned: said again, warned once
        (MigrationRecord(failures=1, said=ERROR, warned=(POOLS_CRD,)), Crd(POOLS_CRD.name), "HTTP 500", "WARNING",
         MigrationRecord(failures=2, said="HTTP 500", warned=(POOLS_CRD,))),
    ],
)
def test_a_failure_is_said_once_per_distinct_error(
    record: MigrationRecord, crd: Crd, error: str, level: str, record_after: MigrationRecord
) -> None:
    after, said = failed(record, crd, error, 20.0, "v1beta1")
    assert after == record_after and after.pending
    assert said.level == level
    assert f"storage migration failed ({record_after.failures} in a row), tried again in 20s: {error}" in said.line
    if level == "DEBUG":
        assert said.events == ()
        return
    (event,) = said.events
    assert (event.crd, event.type, event.reason) == (crd, "Warning", FAILED)
    assert event.note.startswith(f"cannot store the objects of {crd.name} as v1beta1 (failure {record_after.failures} in a row")
    assert error in event.note and "egress-placer migrate-storage" in event.note
    assert "docs/troubleshooting.md#egressplacerstoragemigrationfailing" in event.note
    assert len(event.note) <= 1024  # events.k8s.io/v1's limit (the sink cuts, but nothing should be lost)


@pytest.mark.parametrize(
    "record, pruned, line, about",
    [
        # the first migration: the CRDs whose storedVersions were pruned
        (MigrationRecord(), (POOLS_CRD, CONFIGS_CRD), "storage migration done", [POOLS_CRD, CONFIGS_CRD]),
        # a new leader, everything migrated already: no Event
        (MigrationRecord(), (), "storage migration done", []),
        # after failures: the CRDs warned about, too (the pruned one's uid as read)
        (MigrationRecord(failures=3, said=ERROR, warned=(Crd(POOLS_CRD.name), CONFIGS_CRD)), (POOLS_CRD,),
         "storage migration done after 3 failures", [POOLS_CRD, CONFIGS_CRD]),
        (MigrationRecord(failures=1, said=ERROR, warned=(CONFIGS_CRD,)), (), "storage migration done after 1 failures", [CONFIGS_CRD]),
    ],
)
def test_success_is_said_for_the_crds_pruned_and_those_warned_about(
    record: MigrationRecord, pruned: tuple[Crd, ...], line: str, about: list[Crd]
) -> None:
    after, said = succeeded(record, pruned, "v1beta1")
    assert after == MigrationRecord(done=True) and not after.pending
    assert (said.level, said.line) == ("INFO", line)
    assert [e.crd for e in said.events] == about
    assert {(e.type, e.reason) for e in said.events} <= {("Normal", MIGRATED)}
    for e in said.events:
        assert e.note.startswith(f"every object of {e.crd.name} is stored as v1beta1 and status.storedVersions is [v1beta1]")


def test_an_event_regards_the_cluster_scoped_crd_by_uid() -> None:
    """`kubectl describe crd` lists the Events whose regarding has the CRD's kind, name, uid and no namespace."""
    assert POOLS_CRD.regarding() == {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "name": "egresspools.egress-placer.io", "uid": "uid-EgressPool",
    }
    assert "uid" not in Crd("x").regarding()  # not read (a GET refused): no uid rather than a wrong one


# -- the reconciler: Events through the sink, the metrics ---------------------------------------------------
class Sent(list[tuple[Any, ...]]):
    def emit(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "") -> None:
        self.append((regarding.get("name"), regarding.get("uid"), type, reason, action))


def gauge(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(f"egress_placer_{name}")


@pytest.mark.parametrize(
    "refusals, events, failures",
    [
        # succeeds at once: each CRD pruned, a Normal Event each
        ([None], [("egresspools.egress-placer.io", "uid-EgressPool", "Normal", MIGRATED),
                  ("egressplacerconfigs.egress-placer.io", "uid-EgressPlacerConfig", "Normal", MIGRATED)], 0),
        # refused twice on the configs (the same error), then done: one Warning, then Normals (the pools pruned on
        # the first try and skipped after, the configs on the last)
        ([CONFIGS, CONFIGS, None], [
            ("egressplacerconfigs.egress-placer.io", "uid-EgressPlacerConfig", "Warning", FAILED),
            ("egresspools.egress-placer.io", "uid-EgressPool", "Normal", MIGRATED),
            ("egressplacerconfigs.egress-placer.io", "uid-EgressPlacerConfig", "Normal", MIGRATED),
        ], 2),
        # the CRD's status refused, then the pools: two errors, two Warnings, regarding the CRD each was about
        (["egresspools.egress-placer.io/status", POOLS, POOLS], [
            ("egresspools.egress-placer.io", "uid-EgressPool", "Warning", FAILED),
            ("egresspools.egress-placer.io", "uid-EgressPool", "Warning", FAILED),
        ], 3),
    ],
)
def test_the_reconciler_sends_events_through_the_sink_and_sets_the_metrics(
    refusals: list[str | None], events: list[tuple[str, str, str, str]], failures: int
) -> None:
    now = [0.0]
    api, sent, metrics = FakeApi(), Sent(), Metrics()
    migration = StorageMigration(api, sent, metrics, clock=lambda: now[0], policy=NO_JITTER)
    for refusal in refusals:
        api.refuse = refusal
        wait = migration()
        assert gauge(metrics, "storage_migration_pending") == (0.0 if refusal is None else 1.0)
        now[0] += wait or 0.0
    assert [e[:4] for e in sent] == events and {e[4] for e in sent} == {"MigrateStorage"}
    assert gauge(metrics, "storage_migration_failures_total") == failures
    assert migration.done is (refusals[-1] is None)


def test_a_crd_that_cannot_be_read_is_named_without_uid_and_crds_not_storing_v1beta1_are_tried_again() -> None:
    now = [0.0]
    api, sent, metrics = FakeApi(), Sent(), Metrics()
    api.objects[f"{CRDS}/egresspools.egress-placer.io"] = crd("EgressPool", ["v1alpha1"], storage="v1alpha1")
    migration = StorageMigration(api, sent, metrics, clock=lambda: now[0], policy=NO_JITTER)
    assert migration() == 5.0 and api.writes == []
    assert sent[-1][:4] == ("egresspools.egress-placer.io", None, "Warning", FAILED)  # failed in read_crd: uid unknown
    api.objects[f"{CRDS}/egresspools.egress-placer.io"] = crd("EgressPool", ["v1alpha1", "v1beta1"])  # the newer CRDs applied
    now[0] += 5.0
    assert migration() is None and migration.done
    assert sent[-1][2:4] == ("Normal", MIGRATED) and gauge(metrics, "storage_migration_pending") == 0.0


def test_a_new_leader_writes_nothing_when_stored_versions_are_pruned_already() -> None:
    """An earlier leader, or `egress-placer migrate-storage` run by an admin, did it: a controller without the
    rights to write stops failing (and its alert resolves) on its next try."""
    api, sent, metrics = FakeApi(refuse="/"), Sent(), Metrics()  # every write refused
    for plural, kind in (("egresspools", "EgressPool"), ("egressplacerconfigs", "EgressPlacerConfig")):
        api.objects[f"{CRDS}/{plural}.egress-placer.io"] = crd(kind, ["v1beta1"])
    migration = StorageMigration(api, sent, metrics, clock=lambda: 0.0, policy=NO_JITTER)
    assert migration() is None and migration.done
    assert api.writes == [] and sent == [] and gauge(metrics, "storage_migration_pending") == 0.0


def test_the_pending_gauge_is_zero_on_a_follower_and_set_again_on_the_next_pass_as_leader() -> None:
    api, metrics = FakeApi(refuse=POOLS), Metrics()
    migration = StorageMigration(api, Sent(), metrics, clock=lambda: 0.0, policy=NO_JITTER)
    migration()
    assert gauge(metrics, "storage_migration_pending") == 1.0
    metrics.clear_leader_series()  # stopped leading
    assert gauge(metrics, "storage_migration_pending") == 0.0
    migration()  # leading again: still pending (waiting out the backoff)
    assert gauge(metrics, "storage_migration_pending") == 1.0
