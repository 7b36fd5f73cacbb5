"""The pools API's storage migration (controller/kube/storage_migration.py), on a fake API: every object
written back as v1beta1, storedVersions pruned last, `dry_run` writes nothing."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from controller.kube.storage_migration import CRDS, NotStoringV1beta1, migrate_storage

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

