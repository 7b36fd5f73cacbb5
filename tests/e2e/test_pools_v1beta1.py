"""The pools API serving v1alpha1 and v1beta1 (docs/pools-api.md, "v1beta1") on the local cluster, as k8s/
installs it (the two-version CRDs of `make generate`; local form: their conversion calls the running
controller's /convert, whose caBundle the leader writes):

- the CRDs serve both versions, store v1beta1, convert by webhook; the leader wrote their caBundle;
- an object of the old docs applied as `v1alpha1` reads back (`kubectl get -o yaml`) as `v1beta1` with the
  same meaning (priority turned over, the renamed fields), and as `v1alpha1` as it was written; the
  controller keeps it in force (its status, written by the leader, reads Ready, with PolicyAccepted and
  NodesReady, as v1beta1); `kubectl get epool` works; the EgressPlacerConfig gets a status too;
- every v1alpha1 example of docs/pools-api.md applies and reads back as v1beta1 objects that make the same
  policy; two pools that claim the same run place it in the same pool whether written as v1alpha1 or as
  v1beta1 (the flipped priority);
- both versions refuse a bad object by the same rule, each naming its own field (kubectl apply's error);
- with every replica stopped and objects stored as v1alpha1, a starting controller converts (its /convert
  answers before its informers' first list), syncs, becomes ready, and its leader migrates the stored
  objects and prunes storedVersions to [v1beta1]; `egress-placer migrate-storage` does the same without it."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.core.conversion import V1BETA1, to_version
from controller.core.pools import custom_resource_definitions, dump_objects, load_any_policy, policy_from_objects
from devcluster.cluster import Cluster
from devcluster.process import free_port
from devplacer.local_placer import NAMESPACE, POOLS_WEBHOOK_CONFIG, start_controller, stop_controller
from tests.e2e.harness import POLICY_FILE, Placer, egress_placer_command
from tests.e2e.tekton_runs import MATCHING_IMAGE, TEAM_CDN, Runs, decision_of, taskrun
from tests.e2e.test_pools_api import PLACEMENT_BY_POOLS, controller, examples, kubectl  # noqa: F401 - the module's controller fixture
from tests.kube import Api
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
POOL_CRD = f"{CRDS}/egresspools.egress-placer.io"


def get(cluster: Cluster, resource: str, name: str) -> dict[str, Any]:
    read = kubectl(cluster, "get", resource, name, "-o", "yaml")
    assert read.returncode == 0, read.stderr
    return yaml.safe_load(read.stdout)


def applied(cluster: Cluster, text: str) -> subprocess.CompletedProcess[str]:
    done = kubectl(cluster, "apply", "-f", "-", stdin=text)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def clean(devcluster: Cluster, controller: Placer) -> Any:
    yield
    kubectl(devcluster, "delete", "egresspools,egressplacerconfigs", "--all", "--wait=false")


def test_the_crds_serve_both_versions_store_v1beta1_and_convert_at_the_controller(api: Api, controller: Placer) -> None:
    for crd in custom_resource_definitions():
        installed = api.get(f"{CRDS}/{crd['metadata']['name']}")
        versions = {v["name"]: (v["served"], v["storage"], v.get("deprecated", False)) for v in installed["spec"]["versions"]}
        assert versions == {"v1alpha1": (True, False, True), "v1beta1": (True, True, False)}
        conversion = installed["spec"]["conversion"]
        assert conversion["strategy"] == "Webhook" and conversion["webhook"]["clientConfig"]["url"].endswith("/convert")
        wait_for(
            f"the leader to write {crd['metadata']['name']}'s conversion caBundle",
            lambda: api.get(f"{CRDS}/{crd['metadata']['name']}")["spec"]["conversion"]["webhook"]["clientConfig"].get("caBundle"),
            timeout=30,
        )
        assert installed["spec"]["names"]["shortNames"] in (["epool"], ["epc"])


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


def test_a_v1alpha1_object_reads_back_as_v1beta1_with_the_same_meaning(devcluster: Cluster, clean: None) -> None:
    done = applied(devcluster, OLD_POOL)
    assert "v1alpha1 is deprecated" in done.stderr  # the CRD's deprecationWarning, as kubectl prints it
    beta = get(devcluster, "egresspools", "overseas")  # kubectl's preferred version: v1beta1
    assert beta["apiVersion"] == "egress-placer.io/v1beta1"
    assert beta["spec"]["priority"] == 999_990 and beta["spec"]["loadCapacityPerNode"] == 2
    assert beta["spec"]["queue"]["maxRunsPerNode"] == 1
    assert beta["spec"]["queue"]["priorities"] == [{"namespaces": ["team-cdn"], "priority": 5}]  # higher-first in both
    assert "capacity" not in beta["spec"] and "runsPerNode" not in beta["spec"]["queue"]
    alpha = get(devcluster, "egresspools.v1alpha1.egress-placer.io", "overseas")
    assert alpha["spec"]["priority"] == 10 and alpha["spec"]["capacity"] == 2 and alpha["spec"]["queue"]["runsPerNode"] == 1

    def conditions() -> dict[str, str]:
        status = get(devcluster, "egresspools", "overseas").get("status") or {}
        return {c["type"]: c["status"] for c in status.get("conditions") or []}

    wait_for("the leader's status, read as v1beta1, to say Ready", lambda: conditions().get("Ready") == "True", timeout=30)
    assert conditions() == {"Ready": "True", "PolicyAccepted": "True", "NodesReady": "True"}
    assert "loadCapacity" in get(devcluster, "egresspools", "overseas")["status"]["load"]
    short = kubectl(devcluster, "get", "epool", "overseas", "-o", "name")
    assert short.returncode == 0 and short.stdout.strip() == "egresspool.egress-placer.io/overseas", short.stderr


def test_the_config_gets_a_status_read_in_either_version(devcluster: Cluster, clean: None) -> None:
    applied(devcluster, "apiVersion: egress-placer.io/v1alpha1\nkind: EgressPlacerConfig\nmetadata: {name: cluster}\nspec: {agentNamespaces: [kube-system]}\n")

    def conditions(resource: str) -> dict[str, str]:
        status = get(devcluster, resource, "cluster").get("status") or {}
        return {c["type"]: c["reason"] for c in status.get("conditions") or []}

    wait_for("the leader to write the config's status", lambda: conditions("egressplacerconfigs") == {"Ready": "PolicyInForce", "PolicyAccepted": "InForce"}, timeout=30)
    assert conditions("egressplacerconfigs.v1alpha1.egress-placer.io") == {"Ready": "PolicyInForce", "PolicyAccepted": "InForce"}
    assert get(devcluster, "epc", "cluster")["status"]["poolsInForce"] >= 0


def test_every_v1alpha1_example_of_the_docs_reads_back_as_v1beta1_making_the_same_policy(devcluster: Cluster, clean: None) -> None:
    docs = [(where, text) for where, text in examples() if "pools-api.md" in where and "v1alpha1" in text]
    assert len(docs) >= 3
    for where, text in docs:
        kubectl(devcluster, "delete", "egresspools,egressplacerconfigs", "--all")
        applied(devcluster, text)
        read = kubectl(devcluster, "get", "egresspools,egressplacerconfigs", "-o", "yaml")
        items = yaml.safe_load(read.stdout)["items"]
        assert {i["apiVersion"] for i in items} == {V1BETA1}, where
        assert policy_from_objects(items) == load_any_policy(text, where), where


TWO_POOLS = """apiVersion: egress-placer.io/v1alpha1
kind: EgressPool
metadata: {name: first}
spec: {priority: 10, nodes: [egress-1], images: ["*/cdn-*"], namespaces: [team-cdn]}
---
apiVersion: egress-placer.io/v1alpha1
kind: EgressPool
metadata: {name: second}
spec: {priority: 20, nodes: [egress-2], images: ["*/cdn-*"], namespaces: [team-cdn]}
"""


def test_runs_are_placed_the_same_whichever_version_the_pools_were_written_in(devcluster: Cluster, api: Api, clean: None) -> None:
    runs = Runs(api)  # dry runs only: nothing to delete

    def placed() -> str | None:
        admitted = runs.create(TEAM_CDN, "taskruns", taskrun(runs.name("probe"), MATCHING_IMAGE), dry_run=True)
        return decision_of(admitted).get("pool")

    applied(devcluster, TWO_POOLS)  # v1alpha1: lower first, so `first`
    wait_for("the v1alpha1 pools in force", lambda: placed() == "first", timeout=30)
    kubectl(devcluster, "delete", "egresspools", "first", "second")
    wait_for("no pool", lambda: placed() is None, timeout=30)
    beta = [to_version(o, V1BETA1) for o in yaml.safe_load_all(TWO_POOLS)]
    assert [o["spec"]["priority"] for o in beta] == [999_990, 999_980]  # v1beta1: higher first, still `first`
    applied(devcluster, dump_objects(beta))
    wait_for("the v1beta1 pools in force", lambda: placed() == "first", timeout=30)


@pytest.mark.parametrize(
    ("version", "spec", "field"),
    [
        ("v1alpha1", "capacity: 0", "spec.capacity"),
        ("v1beta1", "loadCapacityPerNode: 0", "spec.loadCapacityPerNode"),
        ("v1alpha1", "queue: {runsPerNode: 0}", "spec.queue.runsPerNode"),
        ("v1beta1", "queue: {maxRunsPerNode: 0}", "spec.queue.maxRunsPerNode"),
        ("v1alpha1", "priority: 1000001", "spec.priority"),
        ("v1beta1", "priority: -1", "spec.priority"),
        ("v1alpha1", f"namespaces: [{', '.join(f'ns-{i}' for i in range(257))}]", "spec.namespaces: Too many"),
        ("v1beta1", f"namespaces: [{', '.join(f'ns-{i}' for i in range(257))}]", "spec.namespaces: Too many"),
    ],
)
def test_both_versions_refuse_by_the_same_rules_each_naming_its_field(
    devcluster: Cluster, controller: Placer, version: str, spec: str, field: str
) -> None:
    text = f"apiVersion: egress-placer.io/{version}\nkind: EgressPool\nmetadata: {{name: bad}}\nspec:\n  nodes: [egress-1]\n  {spec}\n"
    done = kubectl(devcluster, "apply", "-f", "-", stdin=text)
    assert done.returncode != 0 and field in done.stderr, done.stderr


@pytest.mark.parametrize("version", ["v1alpha1", "v1beta1"])
def test_both_versions_refuse_an_exempt_namespace_that_is_not_a_namespace_name(devcluster: Cluster, controller: Placer, version: str) -> None:
    text = f"apiVersion: egress-placer.io/{version}\nkind: EgressPlacerConfig\nmetadata: {{name: cluster}}\nspec:\n  exemptNamespaces: [Not_A_Name]\n"
    done = kubectl(devcluster, "apply", "-f", "-", stdin=text)
    assert done.returncode != 0 and "spec.exemptNamespaces[0]" in done.stderr, done.stderr


def test_migrate_storage_rewrites_the_objects_and_prunes_stored_versions_without_the_leader(
    devcluster: Cluster, api: Api, controller: Placer, clean: None
) -> None:
    """`egress-placer migrate-storage` as an administrator runs it: `--dry-run -o json` changes nothing, then
    the run writes every object back and prunes storedVersions; the leader (done with its own migration
    since it was elected) takes no part."""
    wait_for("the leader's own migration", lambda: api.get(POOL_CRD)["status"]["storedVersions"] == ["v1beta1"], timeout=60)
    applied(devcluster, OLD_POOL)
    api.json_patch(f"{POOL_CRD}/status", [{"op": "replace", "path": "/status/storedVersions", "value": ["v1alpha1", "v1beta1"]}])
    plan = egress_placer_command(devcluster, "migrate-storage", "--dry-run", "-o", "json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["steps"][:2] == [
        "egresspools/overseas: would be stored as v1beta1",
        "egresspools.egress-placer.io: storedVersions would be [v1beta1] (was [v1alpha1, v1beta1])",
    ]
    assert api.get(POOL_CRD)["status"]["storedVersions"] == ["v1alpha1", "v1beta1"]
    done = egress_placer_command(devcluster, "migrate-storage")
    assert done.returncode == 0 and "egresspools.egress-placer.io: storedVersions [v1beta1]" in done.stdout, (done.stdout, done.stderr)
    assert api.get(POOL_CRD)["status"]["storedVersions"] == ["v1beta1"]
    assert get(devcluster, "egresspools", "overseas")["spec"]["priority"] == 999_990  # the same meaning


def test_with_every_replica_stopped_and_objects_stored_as_v1alpha1_the_controller_starts_and_migrates_them(
    devcluster: Cluster, api: Api, controller: Placer
) -> None:
    """Last in this module: it replaces the running controller (the module's fixture stops this one)."""
    hook = api.get(POOL_CRD)["spec"]["conversion"]["webhook"]["clientConfig"]
    ca = hook["caBundle"]
    stop_controller(devcluster)
    # Objects stored as v1alpha1: the one-version CRDs of before (no conversion), no pools webhook to ask.
    kubectl(devcluster, "delete", "validatingwebhookconfiguration", POOLS_WEBHOOK_CONFIG, "--ignore-not-found")
    kubectl(devcluster, "delete", "egresspools,egressplacerconfigs", "--all")
    # (storedVersions lists v1beta1 now: a CRD that drops it from its versions is refused, so delete them first)
    gone = kubectl(devcluster, "delete", "crd", *(c["metadata"]["name"] for c in custom_resource_definitions()), "--wait=true")
    assert gone.returncode == 0, gone.stderr
    old = kubectl(devcluster, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=dump_objects(custom_resource_definitions()))
    assert old.returncode == 0, old.stderr
    wait_for("the one-version CRDs to store v1alpha1", lambda: kubectl(devcluster, "apply", "-f", "-", stdin=OLD_POOL).returncode == 0, timeout=30)
    # The two-version CRDs over them, converting at the port the next controller listens on, with the CA it
    # serves (its Secret outlives the replicas), as the leader had written it: every replica is down.
    port = free_port()
    two = kubectl(devcluster, "kustomize", str(ROOT / "k8s"))
    crds = [d for d in yaml.safe_load_all(two.stdout) if d and d["kind"] == "CustomResourceDefinition"]
    for crd in crds:
        crd["spec"]["conversion"]["webhook"]["clientConfig"] = {"url": f"https://127.0.0.1:{port}/convert", "caBundle": ca}
    put = kubectl(devcluster, "apply", "--server-side", "--force-conflicts", "--field-manager=upgrade", "-f", "-", stdin=dump_objects(crds))
    assert put.returncode == 0, put.stderr
    assert api.get(POOL_CRD)["status"]["storedVersions"] == ["v1alpha1", "v1beta1"]
    assert base64.b64decode(ca)  # a real CA: the conversion answers only once the replica serves it

    start_controller(devcluster, POLICY_FILE, env=PLACEMENT_BY_POOLS, webhook_port=port, ready_timeout=90)  # ready: synced
    wait_for("the leader to migrate the stored objects", lambda: api.get(POOL_CRD)["status"]["storedVersions"] == ["v1beta1"], timeout=60)
    assert get(devcluster, "egresspools", "overseas")["spec"]["priority"] == 999_990
    assert get(devcluster, "egresspools.v1alpha1.egress-placer.io", "overseas")["spec"]["priority"] == 10
    kubectl(devcluster, "delete", "egresspools", "overseas")
