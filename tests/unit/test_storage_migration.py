"""The pools API's storage migration (controller/kube/storage_migration.py), on a fake API: every object
written back as v1beta1, storedVersions pruned last, `dry_run` writes nothing; the leader's reconciler tries
a failed migration again after the backoff of controller/retry.py and warns once per distinct error."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from loguru import logger

from controller.kube.storage_migration import CRDS, NotStoringV1beta1, StorageMigration, migrate_storage
from controller.retry import LATER_PASSES, RetryPolicy, backoff_seconds

POOLS = "/apis/egress-placer.io/v1beta1/egresspools"
CONFIGS = "/apis/egress-placer.io/v1beta1/egressplacerconfigs"


def crd(kind: str, stored: list[str], storage: str = "v1beta1") -> dict[str, Any]:
    return {
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
    migration = StorageMigration(api, clock=lambda: now[0], policy=RetryPolicy(attempts=None, initial=5.0, maximum=600.0, jitter=0.0))
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
        api.refuse = POOLS  # another error: warned
        assert migration() == 20.0
        api.refuse = None
        now[0] += 20.0
        assert migration() is None and migration.done
    finally:
        logger.remove(sink)
    assert len(warned) == 2, warned
    assert "storage migration failed (1 in a row), tried again in 5s: PermissionError: 403 " + CONFIGS in warned[0]
    assert "(3 in a row), tried again in 20s: PermissionError: 403 " + POOLS in warned[1]


def test_backoff_seconds_doubles_up_to_the_maximum() -> None:
    policy = RetryPolicy(attempts=None, initial=5.0, maximum=600.0, jitter=0.0)
    assert [backoff_seconds(policy, n) for n in (1, 2, 3, 8, 9, 30)] == [5.0, 10.0, 20.0, 600.0, 600.0, 600.0]
    assert 5.0 <= backoff_seconds(LATER_PASSES, 1) <= 10.0
