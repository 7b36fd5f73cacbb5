"""The pools API serving v1alpha1 and v1beta1 (docs/pools-api.md, "v1beta1") on the local cluster:

- the CRDs that serve both versions (controller/core/pools_v1beta1.py) are accepted by the real API
  server (a server-side dry run: structural schemas, CEL rules costed, the conversion's configuration);
- installed with the running controller's `/convert` as their conversion webhook (local form: the pools
  webhook's URL and CA), an object of the old docs applied as `v1alpha1` reads back as `v1beta1` with the
  same meaning (priority turned over, the renamed fields), and as `v1alpha1` as it was written; the
  controller, reading `v1alpha1` through the conversion, keeps the pool in force (its status, written
  by the leader, reads Ready as `v1beta1`); `kubectl get epool` works;
- both versions refuse a bad object by the same rule, each naming its own field.

Not installed by k8s/ yet (docs/pools-api.md, "Where it stands"): the fixture puts the one-version CRDs
back afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from controller.cli.migrate_storage import migrate_storage
from controller.core.pools import custom_resource_definitions, dump_objects
from controller.core.pools_v1beta1 import serving_v1beta1
from devcluster.cluster import Cluster
from devplacer.local_placer import NAMESPACE
from tests.e2e.harness import Placer
from tests.e2e.test_pools_api import POOLS, POOLS_WEBHOOK, controller, kubectl  # noqa: F401 - the module's controller fixture
from tests.kube import Api
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]


def test_the_api_server_accepts_the_crds_serving_both_versions(devcluster: Cluster) -> None:
    text = dump_objects(serving_v1beta1(custom_resource_definitions(), NAMESPACE, "egress-placer-conversion"))
    applied = kubectl(devcluster, "apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", "-", stdin=text)
    assert applied.returncode == 0, applied.stderr
    assert "egresspools.egress-placer.io" in applied.stdout and "egressplacerconfigs.egress-placer.io" in applied.stdout


# -- served and converted by the running controller's /convert ----------------------------------------------


def get(cluster: Cluster, resource: str, name: str) -> dict[str, Any]:
    read = kubectl(cluster, "get", resource, name, "-o", "yaml")
    assert read.returncode == 0, read.stderr
    return yaml.safe_load(read.stdout)


def install_two_versions(devcluster: Cluster, api: Api) -> None:
    """The CRDs serving both versions, converted by the running controller's /convert (local form:
    the URL and CA of the pools webhook)."""
    hook = api.get(POOLS_WEBHOOK)["webhooks"][0]["clientConfig"]
    crds = serving_v1beta1(custom_resource_definitions(), NAMESPACE, "unused")
    for crd in crds:
        crd["spec"]["conversion"]["webhook"]["clientConfig"] = {"url": hook["url"].removesuffix("/validate") + "/convert", "caBundle": hook["caBundle"]}
    applied = kubectl(devcluster, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=dump_objects(crds))
    assert applied.returncode == 0, applied.stderr


@pytest.fixture
def one_version_after(devcluster: Cluster, api: Api, controller: Placer) -> Iterator[None]:
    """Afterwards the one-version CRDs of k8s/crds/ again, serving."""
    try:
        yield
    finally:
        kubectl(devcluster, "delete", "egresspools,egressplacerconfigs", "--all")
        kubectl(devcluster, "delete", "crd", "egresspools.egress-placer.io", "egressplacerconfigs.egress-placer.io")
        restored = kubectl(devcluster, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "k8s" / "crds"))
        assert restored.returncode == 0, restored.stderr
        wait_for("the one-version CRDs to serve again", lambda: _serves(api), timeout=30)


@pytest.fixture
def two_versions(devcluster: Cluster, api: Api, one_version_after: None) -> None:
    install_two_versions(devcluster, api)


def _serves(api: Api) -> bool:
    try:
        api.items(POOLS)
    except ApiException:
        return False
    return True


OLD_POOL = """apiVersion: egress-placer.io/v1alpha1
kind: EgressPool
metadata: {name: overseas}
spec:
  priority: 10
  nodes: [egress-1, egress-2]
  images: ["*/cdn-*"]
  namespaces: [team-cdn]
  capacity: 2
  queue: {runsPerNode: 1, priorities: [{namespaces: [team-cdn], priority: 5}]}
"""


def test_a_v1alpha1_object_reads_back_as_v1beta1_with_the_same_meaning(devcluster: Cluster, api: Api, two_versions: None) -> None:
    applied = kubectl(devcluster, "apply", "-f", "-", stdin=OLD_POOL)
    assert applied.returncode == 0, applied.stderr
    beta = get(devcluster, "egresspools.v1beta1.egress-placer.io", "overseas")
    assert beta["apiVersion"] == "egress-placer.io/v1beta1"
    assert beta["spec"]["priority"] == 999_990 and beta["spec"]["loadCapacityPerNode"] == 2
    assert beta["spec"]["queue"]["maxRunsPerNode"] == 1
    assert beta["spec"]["queue"]["priorities"] == [{"namespaces": ["team-cdn"], "priority": 5}]  # higher-first in both
    assert "capacity" not in beta["spec"] and "runsPerNode" not in beta["spec"]["queue"]
    alpha = get(devcluster, "egresspools.v1alpha1.egress-placer.io", "overseas")
    assert alpha["spec"]["priority"] == 10 and alpha["spec"]["capacity"] == 2 and alpha["spec"]["queue"]["runsPerNode"] == 1
    wait_for(
        "the leader's status of the converted pool, read as v1beta1, to say Ready",
        lambda: any(c["type"] == "Ready" and c["status"] == "True"
                    for c in (get(devcluster, "egresspools.v1beta1.egress-placer.io", "overseas").get("status") or {}).get("conditions", [])),
        timeout=30,
    )
    short = kubectl(devcluster, "get", "epool", "overseas", "-o", "name")
    assert short.returncode == 0 and short.stdout.strip() == "egresspool.egress-placer.io/overseas", short.stderr


@pytest.mark.parametrize(
    ("version", "spec", "field"),
    [
        ("v1alpha1", "capacity: 0", "spec.capacity"),
        ("v1beta1", "loadCapacityPerNode: 0", "spec.loadCapacityPerNode"),
        ("v1alpha1", "queue: {runsPerNode: 0}", "spec.queue.runsPerNode"),
        ("v1beta1", "queue: {maxRunsPerNode: 0}", "spec.queue.maxRunsPerNode"),
    ],
)
def test_both_versions_refuse_by_the_same_rules_each_naming_its_field(devcluster: Cluster, two_versions: None, version: str, spec: str, field: str) -> None:
    text = f"apiVersion: egress-placer.io/{version}\nkind: EgressPool\nmetadata: {{name: bad}}\nspec:\n  nodes: [egress-1]\n  {spec}\n"
    applied = kubectl(devcluster, "apply", "-f", "-", stdin=text)
    assert applied.returncode != 0 and field in applied.stderr, applied.stderr


def test_objects_stored_as_v1alpha1_are_migrated_and_stored_versions_pruned(devcluster: Cluster, api: Api, one_version_after: None) -> None:
    applied = kubectl(devcluster, "apply", "-f", "-", stdin=OLD_POOL)  # stored as v1alpha1: the one-version CRDs
    assert applied.returncode == 0, applied.stderr
    install_two_versions(devcluster, api)
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/egresspools.egress-placer.io"
    assert api.get(crd)["status"]["storedVersions"] == ["v1alpha1", "v1beta1"]
    done = migrate_storage(api)
    assert "egresspools/overseas: stored as v1beta1" in done
    assert api.get(crd)["status"]["storedVersions"] == ["v1beta1"]
    assert get(devcluster, "egresspools.v1beta1.egress-placer.io", "overseas")["spec"]["priority"] == 999_990
    assert get(devcluster, "egresspools.v1alpha1.egress-placer.io", "overseas")["spec"]["priority"] == 10
    assert migrate_storage(api) == ["egresspools/overseas: stored as v1beta1"]  # again: nothing left to prune
