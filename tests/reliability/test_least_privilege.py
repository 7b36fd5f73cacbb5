"""Reliability, least privilege: the rights of egress-placer's ServiceAccount, read back from the API
server (SelfSubjectRulesReview with a kubeconfig minted for the ServiceAccount) in its own namespace,
in Tekton's and its resolvers', in kube-system and in a plain tenant namespace, equal the explicit lists below, no more and no less; and
the controller, running under exactly that identity, does its work on a read-only root filesystem
with only /tmp writable (a private mount namespace, as `readOnlyRootFilesystem` plus an emptyDir on
/tmp), its HOME and working directory unwritable: it becomes ready, leads, restores a pool taint,
places a run, and logs no write refused."""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable

import pytest

from devcluster.cluster import Cluster
from devplacer.local_placer import NAMESPACE, service_account_user
from devplacer.faults import Component, kill_component, start_component
from tests.e2e.harness import Placer, pool_taints, quietly, remove_pool_taint
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL, POOL_NODES, POOL_TAINT, Runs, decision_of, taskrun
from tests.kube import Api, api_for
from tests.reliability.suite import TEAM_CDN, TEAM_OTHER, Figures
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

REPO = Path(__file__).resolve().parents[2]
TEKTON_NAMESPACE = "tekton-pipelines"
RESOLVERS_NAMESPACE = "tekton-pipelines-resolvers"
Rule = tuple[str, str, str, str]  # api group, resource, resource name ("*": any), verb


def rules(groups: Iterable[str], resources: Iterable[str], verbs: Iterable[str], names: Iterable[str] = ("*",)) -> set[Rule]:
    return set(itertools.product(groups, resources, names, verbs))


READ = ("get", "list", "watch")
POOLS_API_CRDS = ["egresspools.egress-placer.io", "egressplacerconfigs.egress-placer.io"]
# Granted to every authenticated user by Kubernetes' default ClusterRoles (system:basic-user and others).
EVERY_USER = (
    rules(["authorization.k8s.io"], ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], ["create"])
    | rules(["authentication.k8s.io"], ["selfsubjectreviews"], ["create"])
    | rules(["certificates.k8s.io"], ["clustertrustbundles"], READ)
)
# k8s/rbac-cluster.yaml: caches, the pool taint, evictions, the queue's release of runs, Events, its own webhooks' caBundle (placement and the pools
# API's), the pools API (and its status).
CLUSTER_WIDE = (
    rules([""], ["nodes"], [*READ, "patch"])
    | rules([""], ["namespaces"], READ)
    | rules([""], ["pods"], [*READ, "delete", "patch"])
    | rules([""], ["pods/eviction"], ["create"])
    | rules(["apps"], ["daemonsets"], READ)
    | rules(["tekton.dev"], ["tasks", "stepactions", "pipelines", "taskruns", "pipelineruns"], READ)
    | rules(["tekton.dev"], ["taskruns", "pipelineruns"], ["patch"])  # the queue: release (spec.status only)
    | rules(["kueue.x-k8s.io"], ["workloads"], ["list"])  # the queue: releases no PipelineRun Kueue holds
    | rules(["karpenter.sh"], ["nodeclaims"], ["list"])  # the queue: a provisioned pool's launching nodes
    | rules(["events.k8s.io"], ["events"], ["create", "patch"])
    | rules(["admissionregistration.k8s.io"], ["mutatingwebhookconfigurations"], ["get", "update"], ["egress-placer"])
    | rules(["egress-placer.io"], ["egresspools", "egressplacerconfigs"], READ)
    | rules(["egress-placer.io"], ["egresspools/status"], ["update", "patch"])
    | rules(["admissionregistration.k8s.io"], ["validatingwebhookconfigurations"], ["get", "update"], ["egress-placer-pools"])
    # v1beta1: the CRDs' conversion caBundle (patch), the storage migration (objects rewritten, storedVersions
    # pruned through the CRDs' status), the config's status.
    | rules(["apiextensions.k8s.io"], ["customresourcedefinitions"], ["get", "patch"], POOLS_API_CRDS)
    | rules(["apiextensions.k8s.io"], ["customresourcedefinitions/status"], ["update"], POOLS_API_CRDS)
    | rules(["egress-placer.io"], ["egresspools", "egressplacerconfigs"], ["update"])
    | rules(["egress-placer.io"], ["egressplacerconfigs/status"], ["update", "patch"])
)
# k8s/rbac-namespace.yaml: the leader Lease, the webhook's TLS Secret, the policy ConfigMap, the pool guard's params, the stored last good policy, the budgets' window starts.
OWN_NAMESPACE = (
    rules(["coordination.k8s.io"], ["leases"], ["get", "update"], ["egress-placer-leader"])
    | rules(["coordination.k8s.io"], ["leases"], ["create"])
    | rules([""], ["secrets"], ["get", "patch"], ["egress-placer-webhook-tls"])
    | rules([""], ["secrets"], ["create"])
    | rules([""], ["configmaps"], READ, ["egress-placer-policy"])
    | rules([""], ["configmaps"], ["get", "update"], ["egress-placer-pool-guard"])
    | rules([""], ["configmaps"], ["get", "update"], ["egress-placer-policy-last-good"])
    | rules([""], ["configmaps"], ["get", "list", "watch", "update"], ["egress-placer-budget-starts"])
    | rules([""], ["configmaps"], ["create"])
)
# k8s/rbac-tekton.yaml: Tekton's feature flags (the affinity assistant's coschedule mode) and defaults.
TEKTON = rules([""], ["configmaps"], READ, ["feature-flags", "config-defaults", "pipelines-info"])
# k8s/rbac-tekton.yaml: Tekton's cluster resolver rules (which namespaces `resolver: cluster` may read).
RESOLVERS = rules([""], ["configmaps"], READ, ["cluster-resolver-config", "resolvers-feature-flags"])
# k8s/rbac-agents.yaml: patch node agents' templates, where their owner opted in, in kube-system only.
AGENTS_NAMESPACE = "kube-system"
AGENTS = rules(["apps"], ["daemonsets"], ["patch"])
EXPECTED = {
    NAMESPACE: EVERY_USER | CLUSTER_WIDE | OWN_NAMESPACE,
    TEKTON_NAMESPACE: EVERY_USER | CLUSTER_WIDE | TEKTON,
    RESOLVERS_NAMESPACE: EVERY_USER | CLUSTER_WIDE | RESOLVERS,
    AGENTS_NAMESPACE: EVERY_USER | CLUSTER_WIDE | AGENTS,
    TEAM_OTHER: EVERY_USER | CLUSTER_WIDE,
}
# Non-resource URLs every authenticated user may GET (discovery, health, version, OIDC discovery).
NON_RESOURCE = {
    (url, "get")
    for url in [
        "/.well-known/openid-configuration", "/.well-known/openid-configuration/", "/openid/v1/jwks", "/openid/v1/jwks/",
        "/healthz", "/livez", "/readyz", "/version", "/version/", "/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*",
    ]
}


def granted(review: dict[str, Any]) -> tuple[set[Rule], set[tuple[str, str]]]:
    resource = set()
    for r in review["status"].get("resourceRules") or []:
        resource |= rules(r.get("apiGroups") or [""], r.get("resources") or [], r["verbs"], r.get("resourceNames") or ["*"])
    non_resource = {
        (u, v) for r in review["status"].get("nonResourceRules") or [] for u in r.get("nonResourceURLs") or [] for v in r["verbs"]
    }
    return resource, non_resource


def test_the_service_account_has_exactly_the_listed_rights(devcluster: Cluster, egress_placer: Placer, figures: Figures) -> None:
    figures.fault(
        "least privilege: the ServiceAccount's rights read back (SelfSubjectRulesReview)",
        f"namespaces {NAMESPACE}, {TEKTON_NAMESPACE}, {RESOLVERS_NAMESPACE}, {AGENTS_NAMESPACE} and {TEAM_OTHER}",
        "exactly the rules the test lists (k8s/rbac-*.yaml plus Kubernetes' defaults for authenticated users)",
    )
    controller_api = api_for(devcluster.mint_kubeconfig(service_account_user()))
    reviews = {
        ns: controller_api.create(
            "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": ns}},
        )
        for ns in EXPECTED
    }
    differences = {}
    for ns, review in reviews.items():
        resource, non_resource = granted(review)
        extra, missing = resource - EXPECTED[ns], EXPECTED[ns] - resource
        if extra or missing or non_resource != NON_RESOURCE or review["status"].get("incomplete"):
            differences[ns] = {"extra": sorted(extra), "missing": sorted(missing), "non-resource": sorted(non_resource ^ NON_RESOURCE)}
    figures.measured(
        "; ".join(f"{ns}: {len(granted(r)[0])} resource rules" for ns, r in reviews.items())
        + (f"; DIFFERENT: {differences}" if differences else ", all as listed"),
        0,
    )

    assert differences == {}


READ_ONLY_ROOT = 'mount --bind /tmp /tmp && mount -o remount,bind,ro / && cd "$0" && exec "$@"'


def read_only_root_available() -> bool:
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", READ_ONLY_ROOT, "/", "true"],
                           capture_output=True)
    return probe.returncode == 0


def test_the_controller_works_with_a_read_only_root_home_and_working_directory(
    devcluster: Cluster, api: Api, egress_placer: Placer, runs: Runs, figures: Figures
) -> None:
    if not read_only_root_available():
        pytest.skip("needs `unshare --mount` (root or CAP_SYS_ADMIN) to give the controller a read-only root")
    figures.fault(
        "the controller on a read-only root filesystem (only /tmp writable), HOME and cwd unwritable",
        "the only replica, swapped for one in a private mount namespace; a pool taint removed; a matching TaskRun",
        "ready, leading, taint restored, run placed, no write refused in its log",
    )
    replica = egress_placer.replicas[0]
    normal = kill_component(devcluster, replica.name)
    argv = ("unshare", "--mount", "--propagation", "private", "sh", "-c", READ_ONLY_ROOT, str(REPO), *normal.argv)
    read_only = Component(normal.name, argv, {**normal.env, "HOME": "/root"}, normal.port, normal.health_url)
    log = devcluster.dir / "logs" / f"{replica.name}.log"
    offset = log.stat().st_size
    started = time.monotonic()
    start_component(devcluster, read_only)
    wait_for("the read-only replica ready", quietly(lambda: egress_placer.ready(replica)), timeout=60, interval=0.1)
    ready = time.monotonic() - started
    mounts = Path(f"/proc/{egress_placer.pid(replica)}/mounts").read_text().splitlines()
    root_options = next(line.split()[3] for line in mounts if line.split()[1] == "/")

    remove_pool_taint(api, "egress-3")
    restored_from = time.monotonic()
    wait_for(
        "the pool taint back",
        quietly(lambda: pool_taints(api, "egress-3") == [POOL_TAINT]),
        timeout=20,
        interval=0.1,
    )
    restored = time.monotonic() - restored_from
    name = runs.name("read-only")
    runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name], timeout=90)
    node = runs.nodes_of(TEAM_CDN, [name])[name]
    leader = egress_placer.metric("egress_placer_leader", replica=replica)
    with open(log, "rb") as f:
        f.seek(offset)
        written = f.read().decode(errors="replace")
    refused = [line for line in written.splitlines() if "Read-only file system" in line or "Errno 30" in line or "Permission denied" in line]
    figures.measured(
        f"root mounted {root_options.split(',')[0]}; ready in {ready:.1f} s, leader {leader:.0f}, taint restored in "
        f"{restored:.1f} s, run placed on {node}; {len(refused)} refused writes logged",
        0 if node in POOL_NODES else 1,
    )

    assert root_options.split(",")[0] == "ro"
    assert leader == 1
    assert node in POOL_NODES and decision_of(done[name])["pool"] == POOL
    assert refused == [], refused[:5]
