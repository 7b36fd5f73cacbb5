"""End to end, the pools API (docs/pools-api.md) on the local cluster, with egress-placer installed
from `k8s/` (the CRDs included) and running with `EGRESS_PLACER_POLICY_SOURCE=pools`:

- the built kubectl's `kubectl apply` refuses each object of a table of bad ones, the message naming
  the field (every CEL rule of the CRDs, schema rules, and the validating webhook's: what the loader
  refuses and CEL lets through);
- the webhook is fail-closed: with no controller, writes are refused (deletions are not), and deleting
  its configuration lets them through;
- every example (the YAML of docs/pools-api.md, and each policy file of the repository migrated with
  `egress-placer migrate-policy`) applies cleanly (server-side dry run: the API server's whole check);
- `kubectl explain` prints the fields' descriptions;
- creating, editing and deleting EgressPools changes admission's decisions and the pool taints within
  10 s, with no restart; deleting every pool leaves no taint of egress-placer's;
- within 10 s of a change, a pool's status (written by the leader) shows its nodes, taints and load,
  and `kubectl get egresspools` prints them in its columns;
- a restart with an object the loader refuses (stored while the webhook was not there) never exits: the
  replica is ready, says what is wrong, and keeps the last good policy it stored, taints included."""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import requests
import yaml
from kubernetes.client.exceptions import ApiException

from controller.cli.migrate import run_migrate
from controller.core.conversion import V1BETA1, to_version
from controller.core.model import TAINT_KEY
from controller.core.policy import Pool
from controller.core.pools import CONFIG_PLURAL, GROUP, POOL_PLURAL, VERSION
from devcluster.cluster import Cluster
from controller.core.policy import load_policy
from controller.last_good_policy.reconcile import POLICY_KEY, store_name
from controller.settings import Settings
from devplacer.local_placer import NAMESPACE, POOLS_WEBHOOK_CONFIG, start_controller, stop_controller
from tests.e2e.harness import POLICY_FILE, VALIDATING_WEBHOOK_CONFIGS, Placer, make_plain, pool_taints
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL_NODES, TEAM_CDN, TEAM_OTHER, Runs, decision_of, taskrun
from tests.kube import Api, namespaced
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
API_VERSION = f"{GROUP}/{VERSION}"
POOLS = f"/apis/{API_VERSION}/{POOL_PLURAL}"
CONFIGS = f"/apis/{API_VERSION}/{CONFIG_PLURAL}"
POOLS_WEBHOOK = f"{VALIDATING_WEBHOOK_CONFIGS}/{POOLS_WEBHOOK_CONFIG}"
CHANGE_SECONDS = 10.0  # what the issue asks: a change is in force within 10 s
ALL_NODES = sorted(POOL_NODES | {"node-1", "node-2", "node-3"})


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The cluster's own kubectl (built by devcluster), its exit status and output as they are."""
    return subprocess.run(
        [str(cluster.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


PLACEMENT_BY_POOLS = {"EGRESS_PLACER_POLICY_SOURCE": "pools"}
LAST_GOOD = store_name(Settings.model_fields["policy_configmap"].default)


def delete_every_object(api: Api) -> None:
    for path in (POOLS, CONFIGS):
        for obj in api.items(path):
            api.delete(f"{path}/{obj['metadata']['name']}")


@pytest.fixture(scope="module")
def controller(devcluster: Cluster, api: Api, tenants: tuple[str, str]) -> Iterator[Placer]:
    """egress-placer reading the pools API (k8s/ applied, CRDs included), with no pool to begin with."""
    try:
        start_controller(devcluster, POLICY_FILE, env=PLACEMENT_BY_POOLS)
        running = Placer(devcluster)
        delete_every_object(api)
        wait_for(
            "the controller to load the policy of the pools API",
            lambda: running.metric("egress_placer_policy_reloads_total", {"result": "loaded"}) >= 1,
            timeout=60,
        )
        yield running
    finally:
        delete_every_object(api)
        make_plain(api, devcluster)


# -- refused at apply time ---------------------------------------------------------------------------


def egress_pool(name: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "EgressPool", "metadata": {"name": name}, "spec": spec}


def pool(name: str = "bad", **spec: Any) -> dict[str, Any]:
    """A pool of egress-1 with `spec`."""
    return egress_pool(name, {"nodes": ["egress-1"], **spec})


def config(name: str = "cluster", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "EgressPlacerConfig", "metadata": {"name": name}, "spec": spec}


PROMETHEUS = {"url": "http://prometheus.monitoring:9090"}
BAD_OBJECTS: list[tuple[str, dict[str, Any], str]] = [
    # (what, the object, what the message must name)
    ("reserved name auto (CEL)", pool("auto"), "metadata.name: auto and none are reserved"),
    ("reserved name none (CEL)", pool("none"), "metadata.name: auto and none are reserved"),
    ("a name with a dot", pool("a.b"), "metadata.name"),
    ("no spec", egress_pool("bad", None), "spec: Required value"),
    ("no members (CEL)", egress_pool("bad", {"images": ["*/cdn-*"]}), "spec: Required value: a pool needs nodeSelector or nodes"),
    ("a node name in capitals", pool(nodes=["Egress-1"]), "spec.nodes[0]"),
    ("a blank image glob", pool(images=["  "]), "spec.images[0]"),
    ("an empty namespace glob", pool(namespaces=[""]), "spec.namespaces[0]"),
    ("an empty namespace selector (CEL)", pool(namespaceSelector={}), "spec.namespaceSelector: Invalid value: a selector needs matchLabels"),
    ("In without values (CEL)", pool(namespaceSelector={"matchExpressions": [{"key": "tier", "operator": "In"}]}),
     "spec.namespaceSelector.matchExpressions[0].values: Required value"),
    ("Exists with values (CEL)", pool(namespaceSelector={"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["x"]}]}),
     "spec.namespaceSelector.matchExpressions[0].values: Forbidden"),
    ("an unknown operator", pool(namespaceSelector={"matchExpressions": [{"key": "tier", "operator": "Maybe"}]}),
     "spec.namespaceSelector.matchExpressions[0].operator"),
    ("a bad label key in nodeSelector (CEL)", pool(nodeSelector={"-bad-": "x"}), "spec.nodeSelector: Invalid value: every key must be a label key"),
    ("a bad label key in matchLabels (CEL)", pool(namespaceSelector={"matchLabels": {"a/b/c": "x"}}),
     "spec.namespaceSelector.matchLabels: Invalid value: every key must be a label key"),
    ("a bad label value", pool(nodeSelector={"pool": "not ok!"}), "spec.nodeSelector.pool"),
    ("an unknown placement", pool(placement="sometimes"), "spec.placement"),
    ("capacity 0", pool(capacity=0), "spec.capacity"),
    ("a negative priority", pool(priority=-1), "spec.priority"),
    ("a system taint key", pool(taint={"key": "node-role.kubernetes.io/control-plane"}), "spec.taint.key"),
    ("an unknown taint effect", pool(taint={"effect": "NoEntry"}), "spec.taint.effect"),
    # a taint that does not keep pods off the pool's nodes (docs/pools-api.md, "Taint effect")
    ("taint effect PreferNoSchedule (CEL)", pool(taint={"effect": "PreferNoSchedule"}),
     "spec.taint.effect: Forbidden: taint effect PreferNoSchedule is refused: the scheduler may still put any pod "
     "on the pool's nodes"),
    ("an unknown field", pool(imagez=["x"]), 'unknown field "spec.imagez"'),
    ("egressLoad without prometheus", pool(egressLoad={"bandwidthBytesPerSecond": 1000}), "spec.egressLoad.prometheus: Required value"),
    ("an ftp URL (CEL)", pool(egressLoad={"prometheus": {"url": "ftp://prometheus"}}), "spec.egressLoad.prometheus.url"),
    ("a duration in words (CEL)", pool(egressLoad={"prometheus": {**PROMETHEUS, "timeout": "5 minutes"}}), "spec.egressLoad.prometheus.timeout"),
    ("a zero duration (CEL)", pool(egressLoad={"prometheus": {**PROMETHEUS, "interval": 0}}), "spec.egressLoad.prometheus.interval"),
    ("maxAge not above interval (CEL)", pool(egressLoad={"prometheus": {**PROMETHEUS, "interval": "2m", "maxAge": 60}}),
     "spec.egressLoad.prometheus.maxAge: Invalid value: maxAge must be longer than interval"),
    ("a zero bandwidth", pool(egressLoad={"prometheus": PROMETHEUS, "bandwidthBytesPerSecond": 0}), "spec.egressLoad.bandwidthBytesPerSecond"),
    ("a config not named cluster (CEL)", config("default"), "metadata.name: there is one EgressPlacerConfig, named cluster"),
    ("a bad agent namespace", config(agentNamespaces=["Monitoring"]), "spec.agentNamespaces[0]"),
    ("patching a non-agent namespace (CEL)", config(agentNamespaces=["monitoring"], patchExistingAgents=["kube-system"]),
     "spec.patchExistingAgents: Invalid value: every namespace of patchExistingAgents must be an agent namespace"),
    # What the schema and CEL let through (Go's URL parser takes it) and the loader refuses: the validating
    # webhook (k8s/pools-webhook.yaml) denies it, its message naming the object and the field.
    ("a port above 65535 (webhook)", pool(egressLoad={"prometheus": {"url": "http://prometheus:99999"}}),
     'admission webhook "pools.egress-placer.io" denied the request: EgressPool bad: spec.egressLoad.prometheus.url: invalid port number'),
    ("an IPv4 address with five parts (webhook)", pool(egressLoad={"prometheus": {"url": "http://10.0.0.1.5:9090"}}),
     'admission webhook "pools.egress-placer.io" denied the request: EgressPool bad: spec.egressLoad.prometheus.url: invalid IPv4 address'),
    ("an IPv4 address out of range (webhook)", pool(egressLoad={"prometheus": {"url": "http://10.0.0.256:9090"}}),
     'admission webhook "pools.egress-placer.io" denied the request: EgressPool bad: spec.egressLoad.prometheus.url: invalid IPv4 address'),
]


@pytest.mark.parametrize(("what", "obj", "names"), BAD_OBJECTS, ids=[b[0] for b in BAD_OBJECTS])
def test_kubectl_apply_refuses_a_bad_object_naming_the_field(
    devcluster: Cluster, api: Api, controller: Placer, what: str, obj: dict[str, Any], names: str
) -> None:
    done = kubectl(devcluster, "apply", "-f", "-", stdin=yaml.safe_dump(obj))
    assert done.returncode != 0, f"{what}: applied: {done.stdout}"
    assert names in done.stderr, f"{what}: {done.stderr}"
    plural = POOLS if obj["kind"] == "EgressPool" else CONFIGS
    assert api.get(f"{plural}/{obj['metadata']['name']}") is None


def patched(api: Api, path: str, body: dict[str, Any]) -> bool:
    """Merge-patch `path`; False when the API server refuses it (422), as a webhook being removed still may."""
    try:
        api.merge_patch(path, body)
    except ApiException as e:
        if e.status == 422:
            return False
        raise
    return True


def test_fail_closed_while_no_controller_answers_and_deleting_the_webhook_configuration_recovers(
    devcluster: Cluster, api: Api, controller: Placer
) -> None:
    """docs/pools-api.md, "When the controller is down": writes are refused, deletions are not, and
    deleting the ValidatingWebhookConfiguration lets writes through; the next install puts it back."""
    api.create(POOLS, pool("kept"))
    stop_controller(devcluster)
    # As v1beta1, the storage version: a v1alpha1 write needs the controller's /convert too, which is down.
    lab = to_version(pool("lab"), V1BETA1)
    try:
        done = kubectl(devcluster, "apply", "-f", "-", stdin=yaml.safe_dump(lab))
        assert done.returncode != 0 and 'failed calling webhook "pools.egress-placer.io"' in done.stderr, done.stderr
        assert api.get(f"{POOLS}/lab") is None
        done = kubectl(devcluster, "delete", "egresspool", "kept")
        assert done.returncode == 0, done.stderr  # DELETE is not sent to the webhook
        done = kubectl(devcluster, "delete", "validatingwebhookconfiguration", POOLS_WEBHOOK_CONFIG)
        assert done.returncode == 0, done.stderr
        wait_for(
            "kubectl apply to work without the webhook configuration",
            lambda: kubectl(devcluster, "apply", "-f", "-", stdin=yaml.safe_dump(lab)).returncode == 0,
            timeout=10,
        )
        done = kubectl(devcluster, "apply", "-f", "-", stdin=yaml.safe_dump(pool("alpha")))  # stored as v1beta1: converted
        assert done.returncode != 0 and "conversion webhook" in done.stderr, done.stderr
    finally:
        start_controller(devcluster, POLICY_FILE, env=PLACEMENT_BY_POOLS)  # the install puts the configuration back
        delete_every_object(api)
    assert api.get(POOLS_WEBHOOK) is not None
    done = kubectl(devcluster, "apply", "-f", "-", stdin=yaml.safe_dump(pool(egressLoad={"prometheus": {"url": "http://prometheus:99999"}})))
    assert done.returncode != 0 and "denied the request" in done.stderr, done.stderr


# -- every example applies cleanly -------------------------------------------------------------------


def examples() -> list[tuple[str, str]]:
    """(where, YAML): the objects of docs/pools-api.md, the example and the demo's objects, and every
    policy file of the repository migrated."""
    doc = (ROOT / "docs" / "pools-api.md").read_text()
    out = [(f"docs/pools-api.md block {i}", b) for i, b in enumerate(re.findall(r"```yaml\n(.*?)```", doc, re.S)) if API_VERSION in b]
    out += [(path, (ROOT / path).read_text()) for path in ("config/pools.example.yaml", "devplacer/demo/pools.yaml")]
    for path in ("config/policy.example.yaml", "k8s/policy-configmap/policy.yaml", "tests/data/e2e/policy.yaml"):
        migrated = io.StringIO()
        assert run_migrate(str(ROOT / path), out=migrated) == 0
        out.append((f"{path} migrated", migrated.getvalue()))
    return out


def test_every_example_applies_cleanly(devcluster: Cluster, controller: Placer) -> None:
    found = examples()
    assert len(found) >= 8
    for where, text in found:
        done = kubectl(devcluster, "apply", "--dry-run=server", "-f", "-", stdin=text)
        assert done.returncode == 0, f"{where}: {done.stderr}"
        assert "(server dry run)" in done.stdout


def test_kubectl_explain_describes_the_fields(devcluster: Cluster, controller: Placer) -> None:
    done = kubectl(devcluster, "explain", "egresspool.spec.images")
    assert done.returncode == 0, done.stderr
    first_words = " ".join(str(Pool.model_fields["images"].description).split()[:8])
    assert first_words in " ".join(done.stdout.split())
    for field in ("egresspool.spec.egressLoad.prometheus.maxAge", "egresspool.spec.priority", "egressplacerconfig.spec.agentNamespaces"):
        done = kubectl(devcluster, "explain", field)
        assert done.returncode == 0 and "DESCRIPTION:" in done.stdout, (field, done.stderr)


# -- changes are in force within 10 s, with no restart ---------------------------------------------------


def decision(runs: Runs, namespace: str) -> tuple[str | None, str]:
    """(pool, reason) admission decides now for a TaskRun of MATCHING_IMAGE in `namespace` (dry run)."""
    admitted = runs.create(namespace, "taskruns", taskrun(runs.name("probe"), MATCHING_IMAGE), dry_run=True)
    found = decision_of(admitted)
    return found.get("pool"), str(found.get("reason"))


Taints = dict[str, list[tuple[str | None, str]]]


def taints(api: Api) -> Taints:
    """Each node's taints with egress-placer's key, as (value, effect)."""
    return {name: [(t["value"], t["effect"]) for t in pool_taints(api, name)] for name in ALL_NODES}


def only(tainted: Taints) -> Taints:
    """These nodes' taints, and none on every other node."""
    return {name: tainted.get(name, []) for name in ALL_NODES}


def within_10s(what: str, probe: Callable[[], bool]) -> None:
    wait_for(what, probe, timeout=CHANGE_SECONDS, interval=0.2)


def test_editing_pools_changes_decisions_and_taints_within_10s_and_deleting_every_pool_removes_the_taints(
    devcluster: Cluster, api: Api, controller: Placer
) -> None:
    runs = Runs(api)  # dry runs only: nothing to delete
    replica = devcluster.process(controller.replica.name)
    assert replica is not None
    within_10s("no pool: nothing placed", lambda: decision(runs, TEAM_CDN) == (None, "no-match"))
    within_10s("no pool: no taint of ours", lambda: taints(api) == only({}))

    overseas = {"nodeSelector": {TAINT_KEY: "overseas"}, "images": ["*/cdn-*"], "namespaces": [TEAM_CDN]}
    api.create(POOLS, egress_pool("overseas", overseas))
    within_10s("a new pool places", lambda: decision(runs, TEAM_CDN) == ("overseas", "image-match"))
    on_pool = [("overseas", "NoSchedule")]
    within_10s("a new pool taints its nodes", lambda: taints(api) == only({n: on_pool for n in POOL_NODES}))

    api.merge_patch(f"{POOLS}/overseas", {"spec": {"images": ["*/other-*"]}})
    within_10s("edited images", lambda: decision(runs, TEAM_CDN) == (None, "no-match"))

    api.merge_patch(f"{POOLS}/overseas", {"spec": {"images": ["*uploader*"], "namespaces": [TEAM_OTHER]}})
    within_10s("edited namespaces: now team-other's", lambda: decision(runs, TEAM_OTHER) == ("overseas", "image-match"))
    assert decision(runs, TEAM_CDN) == (None, "namespace-not-allowed")

    api.merge_patch(f"{POOLS}/overseas", {"spec": {"nodeSelector": None, "nodes": ["egress-1", "egress-2"], "taint": {"effect": "NoExecute"}}})
    soft = [("overseas", "NoExecute")]
    within_10s("edited members and taint", lambda: taints(api) == only({"egress-1": soft, "egress-2": soft}))

    lab = [("lab", "NoSchedule")]
    api.create(POOLS, pool("lab", priority=20, nodes=["egress-2", "egress-3"], namespaces=[TEAM_CDN]))
    within_10s("a second pool", lambda: taints(api) == only({"egress-1": soft, "egress-2": soft, "egress-3": lab}))
    api.merge_patch(f"{POOLS}/lab", {"spec": {"priority": 5}})
    api.merge_patch(f"{POOLS}/overseas", {"spec": {"priority": 10}})
    within_10s(
        "a node two pools claim belongs to the one of lower priority",
        lambda: taints(api) == only({"egress-1": soft, "egress-2": lab, "egress-3": lab}),
    )

    delete_every_object(api)
    within_10s("every pool deleted: no taint of ours", lambda: taints(api) == only({}))
    within_10s("every pool deleted: nothing placed", lambda: decision(runs, TEAM_OTHER) == (None, "no-match"))
    after = devcluster.process(controller.replica.name)
    assert after is not None and after.pid == replica.pid and after.alive()


# -- the status the leader writes -------------------------------------------------------------------


def pool_status(api: Api, name: str) -> dict[str, Any]:
    return (api.get(f"{POOLS}/{name}") or {}).get("status") or {}


def ready_of(status: dict[str, Any]) -> tuple[str, str] | None:
    return next(((c["status"], c["reason"]) for c in status.get("conditions") or [] if c["type"] == "Ready"), None)


def shows(api: Api, name: str, **wanted: Any) -> dict[str, Any] | None:
    """The pool's status when it shows `wanted` (nodes, tainted, placed, capacity, ready, runs), else None."""
    status = pool_status(api, name)
    load = status.get("load") or {}
    seen = {
        "nodes": status.get("nodes"),
        "tainted": status.get("taintedNodes"),
        "placed": load.get("placed"),
        "capacity": load.get("capacity"),
        "ready": ready_of(status),
        "runs": status.get("runsPlacedLastHour", 0),
    }
    return status if all(seen[k] == v for k, v in wanted.items()) else None


def kubectl_get(cluster: Cluster, *args: str) -> list[dict[str, str]]:
    """`kubectl get egresspools ARGS`: each row as {column: value}."""
    done = kubectl(cluster, "get", "egresspools", *args)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]  # "LAST HOUR" is one column
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
    return [{n: row[a:b].strip() for n, a, b in zip(names, starts, [*starts[1:], None])} for row in rows]


def test_within_10s_the_status_shows_nodes_taints_and_load_and_kubectl_get_prints_them(
    devcluster: Cluster, api: Api, controller: Placer
) -> None:
    runs = Runs(api)
    spec = {"nodeSelector": {TAINT_KEY: "overseas"}, "images": ["*/cdn-*"], "namespaces": [TEAM_CDN], "capacity": 2}
    try:
        api.create(POOLS, egress_pool("overseas", spec))
        within_10s("a new pool's status: 3 nodes, tainted, ready", lambda: shows(api, "overseas", nodes=3, tainted=3, placed=0, capacity=6, ready=("True", "NodesTainted")))
        status = pool_status(api, "overseas")
        assert status["conditions"][0]["observedGeneration"] == api.call("GET", f"{POOLS}/overseas")["metadata"]["generation"]

        # A pod of team-cdn (may use the pool) that stays on egress-1, and a run placed on the pool.
        runs.create_pod(TEAM_CDN, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": runs.name("stays")},
                                   "spec": {"nodeName": "egress-1", "containers": [{"name": "c", "image": "busybox"}]}})
        runs.create(TEAM_CDN, "taskruns", taskrun(runs.name("placed"), MATCHING_IMAGE))
        busiest = [{"node": "egress-1", "placed": 1, "assumed": 0, "capacity": 2}]
        within_10s(
            "the load (the pod on egress-1) and the run placed (its pod finished)",
            lambda: (shows(api, "overseas", placed=1, runs=1) or {}).get("load", {}).get("mostLoaded") == busiest,
        )
        (row,) = kubectl_get(devcluster)
        # kubectl prints v1beta1 (the preferred version): v1alpha1's priority 0 (first) is 1000000 (first) there.
        assert row == {**row, "NAME": "overseas", "PLACEMENT": "required", "PRIORITY": "1000000", "NODES": "3", "TAINTED": "3",
                       "LOAD": "1", "CAPACITY": "6", "READY": "True"}
        (wide,) = kubectl_get(devcluster, "-o", "wide")
        assert (wide["REASON"], wide["LAST HOUR"]) == ("NodesTainted", "1")

        api.merge_patch(f"{POOLS}/overseas", {"spec": {"nodeSelector": None, "nodes": ["egress-2"]}})
        within_10s("an edited pool's status: 1 node", lambda: shows(api, "overseas", nodes=1, tainted=1, placed=0, capacity=2))
        (row,) = kubectl_get(devcluster)
        assert (row["NODES"], row["TAINTED"], row["LOAD"], row["CAPACITY"], row["READY"]) == ("1", "1", "0", "2", "True")

        api.merge_patch(f"{POOLS}/overseas", {"spec": {"nodes": ["no-such-node"]}})
        within_10s("a pool without members", lambda: shows(api, "overseas", nodes=0, ready=("False", "NoMembers")))
        (row,) = kubectl_get(devcluster)
        assert (row["NODES"], row["TAINTED"], row["READY"]) == ("0", "0", "False")
    finally:
        runs.cleanup()
        delete_every_object(api)
    within_10s("every pool deleted: no taint of ours", lambda: taints(api) == only({}))


def test_a_pool_of_listed_nodes_sends_its_runs_there_by_hostname_as_kubectl_shows(
    devcluster: Cluster, api: Api, controller: Placer
) -> None:
    """The local cluster's nodes carry the kubelet's hostname label, equal to their names: a pool that lists
    its nodes is written into the run as one `kubernetes.io/hostname In [...]` requirement (docs/pools-api.md),
    which the real scheduler reads as those nodes: the run's pod runs on one of them."""
    runs = Runs(api)
    listed = ["egress-2", "egress-3"]
    try:
        api.create(POOLS, egress_pool("listed", {"nodes": listed, "images": ["*/cdn-*"], "namespaces": [TEAM_CDN]}))
        within_10s("the listed pool places", lambda: decision(runs, TEAM_CDN) == ("listed", "image-match"))
        name = runs.name("listed")
        runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
        runs.wait_succeeded(TEAM_CDN, "taskruns", [name])
        assert runs.nodes_of(TEAM_CDN, [name])[name] in listed
        path = "{.spec.podTemplate.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms}"
        shown = kubectl(devcluster, "get", "taskrun", name, "-n", TEAM_CDN, "-o", f"jsonpath={path}")
        assert shown.returncode == 0, shown.stderr
        assert yaml.safe_load(shown.stdout) == [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": listed}]}
        ]
    finally:
        runs.cleanup()
        delete_every_object(api)
    within_10s("every pool deleted: no taint of ours", lambda: taints(api) == only({}))


def test_a_restart_with_an_object_the_loader_refuses_never_exits_and_keeps_the_last_good_policy(
    devcluster: Cluster, api: Api, controller: Placer
) -> None:
    overseas = {"priority": 10, "nodeSelector": {TAINT_KEY: "overseas"}, "images": ["*/cdn-*"], "namespaces": [TEAM_CDN]}
    api.create(POOLS, egress_pool("overseas", overseas))
    on_pool = only({n: [("overseas", "NoSchedule")] for n in POOL_NODES})

    def stored() -> list[str]:
        text = ((api.get(namespaced(NAMESPACE, "configmaps", LAST_GOOD)) or {}).get("data") or {}).get(POLICY_KEY)
        return [p.name for p in load_policy(text).pools] if text else []

    within_10s("the pool's taints", lambda: taints(api) == on_pool)
    wait_for("the leader to store the policy it loaded", lambda: stored() == ["overseas"], timeout=40)
    try:
        # Go's URL parser (the API server's CEL) takes a port above 65535; the loader does not. The validating
        # webhook refuses it at apply time: an object stored before it existed (or while it was deleted, as
        # here) is what a restart must survive.
        api.delete(POOLS_WEBHOOK)
        bad = {"spec": {"egressLoad": {"prometheus": {"url": "http://prometheus:99999"}}}}
        wait_for("the API server to stop calling the deleted webhook", lambda: patched(api, f"{POOLS}/overseas", bad), timeout=10)
        within_10s("the refusal", lambda: controller.metric("egress_placer_policy_reloads_total", {"result": "refused"}) >= 1)
        stop_controller(devcluster)
        start_controller(devcluster, POLICY_FILE, env=PLACEMENT_BY_POOLS)  # returns once /readyz answers 200
        ready = requests.get(controller.replica.health_url + "/readyz", timeout=5)
        assert ready.status_code == 200 and ready.text.startswith("ready, degraded: "), ready.text
        assert "EgressPool overseas: spec.egressLoad.prometheus.url" in ready.text
        assert f"in force: the last good policy stored in configmap {NAMESPACE}/{LAST_GOOD}" in ready.text
        assert taints(api) == on_pool and stored() == ["overseas"]
        uid = api.call("GET", f"{POOLS}/overseas")["metadata"]["uid"]
        refusals = [e for e in api.items("/apis/events.k8s.io/v1/namespaces/default/events") if e["regarding"].get("uid") == uid]
        assert refusals and all(e["reason"] == "PolicyRefused" for e in refusals)
    finally:
        delete_every_object(api)
    within_10s("every pool deleted: no taint of ours", lambda: taints(api) == only({}))
