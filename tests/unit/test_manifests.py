"""Checks the content of the deployment manifests in k8s/ (and the Dockerfile), not a cluster.

The webhooks fail open, skip the controller's namespace and send only the pods that matter (the CEL
match condition is evaluated on sample pods); the Deployment runs locked down with the ports, probes
and settings the controller really has; RBAC grants exactly the table below and nothing more;
the names in the manifests agree with the defaults in `controller.settings.Settings`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.pool_guard.core import GUARD_NAME
from controller.core.model import TAINT_KEY, NamespaceState
from controller.core.policy import load_policy
from controller.core.rights import POD_DELETES_NAME, RIGHTS_NAME
from controller.budgets.core import STARTS_CONFIGMAP
from controller.last_good_policy.reconcile import store_name
from controller.settings import Settings
from devcluster.build import find_artifacts
from devplacer.version import PUBLISHED_IMAGE
from devplacer.local_placer import kustomize

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
ENV_PREFIX = "EGRESS_PLACER_"
NAMESPACE = "egress-placer"
SERVICE_ACCOUNT = "egress-placer"
SKIP_LABEL = ("egress-placer.io/webhook", "skip")
POOL_TAINT_KEY = TAINT_KEY  # the fixed key the pod webhook's matchConditions must name
NOT_RESOURCES = {"kustomization.yaml"}  # kustomize input
CLUSTER_SCOPED = {
    "CustomResourceDefinition", "Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
}


def default(field: str) -> Any:
    return Settings.model_fields[field].default


# The source of truth for RBAC: (where, apiGroup, resource, verb, resourceName or None for any).
# "cluster" is the ClusterRole; a namespace is the Role there. Nothing outside this table is granted.
# It follows the API calls of controller/kube (informers: list+watch, single objects by a
# metadata.name field selector; leader: get/create/update; writer: node patch, eviction create, pod delete,
# secret get/create/patch, webhook configuration get/update, events.k8s.io create/patch), plus
# `get` wherever the same objects may already be listed.
ANY = None
TEKTON_NS = default("tekton_namespace")
RESOLVERS_NS = default("tekton_resolvers_namespace")
REQUIRED_GRANTS: set[tuple[str, str, str, str, str | None]] = {
    *{("cluster", "", "nodes", v, ANY) for v in ("get", "list", "watch", "patch")},
    *{("cluster", "", "namespaces", v, ANY) for v in ("get", "list", "watch")},
    *{("cluster", "", "pods", v, ANY) for v in ("get", "list", "watch", "delete", "patch")},
    ("cluster", "", "pods/eviction", "create", ANY),
    *{("cluster", "apps", "daemonsets", v, ANY) for v in ("get", "list", "watch")},
    ("kube-system", "apps", "daemonsets", "patch", ANY),  # opted-in node agents' templates (rbac-agents.yaml)
    *{
        ("cluster", "tekton.dev", r, v, ANY)
        for r in ("tasks", "stepactions", "pipelines", "taskruns", "pipelineruns")
        for v in ("get", "list", "watch")
    },
    *{("cluster", "tekton.dev", r, "patch", ANY) for r in ("taskruns", "pipelineruns")},  # the queue's release
    ("cluster", "kueue.x-k8s.io", "workloads", "list", ANY),  # the queue releases no PipelineRun Kueue holds
    ("cluster", "karpenter.sh", "nodeclaims", "list", ANY),  # a provisioned pool's queue counts the launching nodes
    *{("cluster", "events.k8s.io", "events", v, ANY) for v in ("create", "patch")},
    *{
        ("cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", v, default("webhook_config_name"))
        for v in ("get", "update")
    },
    *{
        ("cluster", "admissionregistration.k8s.io", "validatingwebhookconfigurations", v, default("pools_webhook_config_name"))
        for v in ("get", "update")
    },
    *{(NAMESPACE, "coordination.k8s.io", "leases", v, default("lease_name")) for v in ("get", "update")},
    (NAMESPACE, "coordination.k8s.io", "leases", "create", ANY),
    *{(NAMESPACE, "", "secrets", v, default("tls_secret")) for v in ("get", "patch")},
    (NAMESPACE, "", "secrets", "create", ANY),
    *{(NAMESPACE, "", "configmaps", v, default("policy_configmap")) for v in ("get", "list", "watch")},
    *{(NAMESPACE, "", "configmaps", v, GUARD_NAME) for v in ("get", "update")},
    *{(NAMESPACE, "", "configmaps", v, store_name(default("policy_configmap"))) for v in ("get", "update")},
    # controller/budgets/reconcile.py: the egress budgets' window starts (the leader writes, every replica reads at start)
    *{(NAMESPACE, "", "configmaps", v, STARTS_CONFIGMAP) for v in ("get", "list", "watch", "update")},
    (NAMESPACE, "", "configmaps", "create", ANY),
    *{(TEKTON_NS, "", "configmaps", v, n) for v in ("get", "list", "watch") for n in ("feature-flags", "config-defaults", "pipelines-info")},
    # Tekton's cluster resolver rules (docs/security.md, "Cluster resolver rules")
    *{(RESOLVERS_NS, "", "configmaps", v, n) for v in ("get", "list", "watch")
      for n in ("cluster-resolver-config", "resolvers-feature-flags")},
    # The pools API (k8s/crds/): read and watched; the leader writes each pool's status.
    *{("cluster", "egress-placer.io", r, v, ANY) for r in ("egresspools", "egressplacerconfigs") for v in ("get", "list", "watch")},
    *{("cluster", "egress-placer.io", r, v, ANY) for r in ("egresspools/status", "egressplacerconfigs/status") for v in ("update", "patch")},
    # The pools API's storage migration (controller/kube/storage_migration.py) and the CRDs' conversion caBundle.
    *{("cluster", "egress-placer.io", r, "update", ANY) for r in ("egresspools", "egressplacerconfigs")},
    *{("cluster", "apiextensions.k8s.io", r, v, n) for n in ("egresspools.egress-placer.io", "egressplacerconfigs.egress-placer.io")
      for r, v in (("customresourcedefinitions", "get"), ("customresourcedefinitions/status", "update"), ("customresourcedefinitions", "patch"))},
}

# Which webhook admits what: name -> (apiGroup, versions, resource).
EXPECTED_WEBHOOKS = {
    "taskruns.egress-placer.io": ("tekton.dev", ["v1", "v1beta1"], "taskruns"),
    "pipelineruns.egress-placer.io": ("tekton.dev", ["v1", "v1beta1"], "pipelineruns"),
    "pods.egress-placer.io": ("", ["v1"], "pods"),
    "daemonsets.egress-placer.io": ("apps", ["v1"], "daemonsets"),
}
# The operations each webhook admits: only CREATE, but a DaemonSet's template may be rolled out again.
WEBHOOK_OPERATIONS = {name: ["CREATE"] for name in EXPECTED_WEBHOOKS} | {"daemonsets.egress-placer.io": ["CREATE", "UPDATE"]}


# -- loading ----------------------------------------------------------------------------------
def resource_files() -> list[Path]:
    """The base's resources: k8s/*.yaml and the CRDs in k8s/crds/."""
    return sorted(p for p in [*K8S.glob("*.yaml"), *K8S.glob("crds/*.yaml")] if p.name not in NOT_RESOURCES)


def load_objects() -> list[dict[str, Any]]:
    return [doc for p in resource_files() for doc in yaml.safe_load_all(p.read_text()) if doc]


OBJECTS = load_objects()
KUSTOMIZATION = yaml.safe_load((K8S / "kustomization.yaml").read_text())


def key(obj: Mapping[str, Any]) -> tuple[str, str | None, str]:
    return obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]


def objects(kind: str) -> list[dict[str, Any]]:
    return [o for o in OBJECTS if o["kind"] == kind]


def one(kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    found = [
        o
        for o in objects(kind)
        if o["metadata"]["name"] == name and o["metadata"].get("namespace") == namespace
    ]
    assert len(found) == 1, f"expected one {kind} {namespace}/{name}, found {len(found)}"
    return found[0]


DEPLOYMENT = one("Deployment", "egress-placer", NAMESPACE)
POD_SPEC = DEPLOYMENT["spec"]["template"]["spec"]
CONTAINER = POD_SPEC["containers"][0]
WEBHOOKS = {w["name"]: w for w in one("MutatingWebhookConfiguration", default("webhook_config_name"))["webhooks"]}
SERVICE = one("Service", "egress-placer-webhook", NAMESPACE)


def walk_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from walk_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk_strings(v)


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector (matchLabels and matchExpressions) against a label set."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def container_port(name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    return next(p["containerPort"] for p in CONTAINER["ports"] if p["name"] == name_or_number)


def env_value(name: str) -> str | None:
    return next((e.get("value") for e in CONTAINER["env"] if e["name"] == name), None)


def effective_setting(field: str) -> Any:
    """The value the controller will run with: the Deployment's variable, or the default."""
    raw = env_value(ENV_PREFIX + field.upper())
    return default(field) if raw is None else getattr(Settings(**{field: raw}), field)


# -- the kustomize base -----------------------------------------------------------------------
def test_kustomization_lists_every_resource_file() -> None:
    assert sorted(KUSTOMIZATION["resources"]) == sorted(str(p.relative_to(K8S)) for p in resource_files())


def test_kustomization_sets_no_namespace_so_the_tekton_role_stays_in_tekton_namespace() -> None:
    assert "namespace" not in KUSTOMIZATION


@pytest.mark.parametrize("obj", OBJECTS, ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_namespaced_objects_name_their_namespace(obj: dict[str, Any]) -> None:
    ns = obj["metadata"].get("namespace")
    if obj["kind"] in CLUSTER_SCOPED:
        assert ns is None
    else:
        assert ns in {NAMESPACE, TEKTON_NS, RESOLVERS_NS, "kube-system"}


POLICY_CONFIGMAP_COMPONENT = yaml.safe_load((K8S / "policy-configmap" / "kustomization.yaml").read_text())


def test_the_base_reads_the_pools_api_and_ships_no_policy() -> None:
    assert effective_setting("policy_source") == "pools" == default("policy_source")
    assert "configMapGenerator" not in KUSTOMIZATION


def test_policy_configmap_is_generated_under_the_fixed_name_the_controller_watches() -> None:
    (gen,) = POLICY_CONFIGMAP_COMPONENT["configMapGenerator"]
    assert gen["name"] == default("policy_configmap")
    assert gen["namespace"] == NAMESPACE
    assert gen["options"]["disableNameSuffixHash"] is True
    assert gen["files"] == [default("policy_key")]


def test_shipped_policy_is_valid_and_sends_cdn_and_uploader_images_to_overseas() -> None:
    policy = load_policy((K8S / "policy-configmap" / "policy.yaml").read_text(), "k8s/policy-configmap/policy.yaml")
    (pool,) = policy.pools
    assert pool.name == "overseas"
    assert dict(pool.node_selector) == {POOL_TAINT_KEY: "overseas"}
    assert pool.taint_for().key == POOL_TAINT_KEY
    assert pool.allows(NamespaceState(name="team-cdn")) and not pool.allows(NamespaceState(name="default"))
    assert pool.matches_image("ghcr.io/acme/cdn-sync:1.2")
    assert pool.matches_image("docker.io/acme/s3-uploader:latest")
    assert not pool.matches_image("docker.io/library/ubuntu:24.04")


@pytest.fixture(scope="module")
def kubectl() -> Path:
    """The kubectl (with kustomize) the local cluster's build made (`python -m devcluster build`, part of
    `make test`); the rendering checks are skipped, saying so, only before that build."""
    artifacts = find_artifacts()
    if artifacts is None:
        pytest.skip("the local cluster's kubectl is not built yet (python -m devcluster build)")
    return artifacts.binary("kubectl")


def rendered_env(docs: list[dict[str, Any]]) -> dict[str, str | None]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_kustomize_renders_every_object(kubectl: Path) -> None:
    out = subprocess.run([str(kubectl), "kustomize", str(K8S)], check=True, capture_output=True, text=True).stdout
    rendered = [d for d in yaml.safe_load_all(out) if d]
    assert {key(d) for d in rendered} == {key(o) for o in OBJECTS}


@pytest.mark.parametrize("components", [("policy-configmap",), ("policy-configmap", "cert-manager", "report-only")])
def test_the_policy_configmap_component_adds_the_configmap_and_reads_it(kubectl: Path, components: tuple[str, ...]) -> None:
    without = kustomize(kubectl, [c for c in components if c != "policy-configmap"])
    with_it = kustomize(kubectl, components)
    assert rendered_env(with_it) == {**rendered_env(without), ENV_PREFIX + "POLICY_SOURCE": "configmap"}
    assert rendered_env(without)[ENV_PREFIX + "POLICY_SOURCE"] == "pools"
    (cm,) = [d for d in with_it if d["kind"] == "ConfigMap"]
    assert (cm["metadata"]["name"], cm["metadata"]["namespace"]) == (default("policy_configmap"), NAMESPACE)
    assert cm["metadata"]["labels"] == {"app.kubernetes.io/part-of": "egress-placer"}
    assert yaml.safe_load(cm["data"][default("policy_key")]) == yaml.safe_load((K8S / "policy-configmap" / "policy.yaml").read_text())
    others = lambda docs: {key(d): d for d in docs if d["kind"] != "Deployment"}  # noqa: E731
    assert others(with_it) == {**others(without), key(cm): cm}


def test_the_base_evicts_intruders() -> None:
    assert effective_setting("intruder_mode") == "evict"


@pytest.mark.parametrize("components", [("report-only",), ("report-only", "cert-manager"), ("cert-manager", "report-only")])
def test_the_report_only_component_only_reports_and_changes_nothing_else(kubectl: Path, components: tuple[str, ...]) -> None:
    without = kustomize(kubectl, [c for c in components if c != "report-only"])
    with_it = kustomize(kubectl, components)
    assert rendered_env(with_it) == {**rendered_env(without), ENV_PREFIX + "INTRUDER_MODE": "report"}
    assert rendered_env(without)[ENV_PREFIX + "INTRUDER_MODE"] == "evict"
    others = lambda docs: [d for d in docs if d["kind"] != "Deployment"]  # noqa: E731
    assert others(with_it) == others(without)


@pytest.mark.parametrize("components", [("controller-rights-warn",), ("controller-rights-warn", "cert-manager", "report-only")])
def test_the_controller_rights_warn_component_only_makes_the_two_bindings_warn(kubectl: Path, components: tuple[str, ...]) -> None:
    without = kustomize(kubectl, [c for c in components if c != "controller-rights-warn"])
    with_it = kustomize(kubectl, components)
    names = {RIGHTS_NAME, POD_DELETES_NAME}
    warned = {d["metadata"]["name"]: d["spec"]["validationActions"] for d in with_it if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert {n: warned[n] for n in names} == {n: ["Warn", "Audit"] for n in names}
    assert warned[GUARD_NAME] == ["Deny"]
    others = lambda docs: [d for d in docs if not (d["kind"] == "ValidatingAdmissionPolicyBinding" and d["metadata"]["name"] in names)]  # noqa: E731
    assert others(with_it) == others(without)


# -- namespace and webhooks -------------------------------------------------------------------
def test_own_namespace_is_labelled_for_the_webhooks_to_skip() -> None:
    assert one("Namespace", NAMESPACE)["metadata"]["labels"][SKIP_LABEL[0]] == SKIP_LABEL[1]


def test_the_four_webhooks_are_there() -> None:
    assert set(WEBHOOKS) == set(EXPECTED_WEBHOOKS)


@pytest.mark.parametrize("name", sorted(EXPECTED_WEBHOOKS))
def test_webhook_fails_open_fast_and_has_no_side_effects_on_a_dry_run(name: str) -> None:
    """A review writes an Event (and counts an assumed placement); a dry run does neither
    (tests/unit/test_admission_handlers.py: the dry-run tests), hence NoneOnDryRun."""
    w = WEBHOOKS[name]
    assert w["failurePolicy"] == "Ignore"
    assert 1 <= w["timeoutSeconds"] <= 5
    assert w["sideEffects"] == "NoneOnDryRun"
    assert w["admissionReviewVersions"] == ["v1"]
    # Called again after a later webhook (Kyverno) changes a pod or DaemonSet; runs never (k8s/webhook.yaml).
    assert w["reinvocationPolicy"] == ("IfNeeded" if name.startswith(("pods.", "daemonsets.")) else "Never")


POOLS_WEBHOOK = one("ValidatingWebhookConfiguration", default("pools_webhook_config_name"))


def test_the_pools_api_webhook_is_fail_closed_for_its_objects_only() -> None:
    """Fail-closed (an EgressPool the loader would refuse never gets stored), and scoped by its rules to
    CREATE and UPDATE of the pools API's two resources: not their status (the leader writes it), not
    DELETE (deleting a pool works while the controller is down), nothing else of the cluster."""
    (hook,) = POOLS_WEBHOOK["webhooks"]
    assert (hook["failurePolicy"], hook["sideEffects"], hook["admissionReviewVersions"]) == ("Fail", "None", ["v1"])
    assert 1 <= hook["timeoutSeconds"] <= 10
    assert hook["rules"] == [{
        "apiGroups": ["egress-placer.io"], "apiVersions": ["v1alpha1", "v1beta1"], "operations": ["CREATE", "UPDATE"],
        "resources": ["egresspools", "egressplacerconfigs"], "scope": "Cluster",
    }]
    assert hook["clientConfig"]["service"] == {**WEBHOOKS["pods.egress-placer.io"]["clientConfig"]["service"], "path": "/validate"}
    assert "caBundle" not in hook["clientConfig"]  # the controller keeps it (as the mutating webhooks')
    assert "namespaceSelector" not in hook and "objectSelector" not in hook


def name_label(namespace: str) -> dict[str, str]:
    """The label the API server sets on every namespace (and that nobody can change)."""
    return {"kubernetes.io/metadata.name": namespace}


# Which namespaces each webhook sees, by the name label alone: never the controller's own; kube-system
# only for DaemonSets (its node agents are placed through their template, not pod by pod; its critical
# pods and any run there never wait on this webhook).
@pytest.mark.parametrize(
    ("namespace", "seen_by"),
    [
        (NAMESPACE, set()),
        ("kube-system", {"daemonsets.egress-placer.io"}),
        ("team-cdn", set(EXPECTED_WEBHOOKS)),
        ("tekton-pipelines", set(EXPECTED_WEBHOOKS)),
    ],
)
def test_webhooks_leave_out_namespaces_by_their_name(namespace: str, seen_by: set[str]) -> None:
    assert {name for name, w in WEBHOOKS.items() if selector_matches(w["namespaceSelector"], name_label(namespace))} == seen_by


@pytest.mark.parametrize("name", sorted(EXPECTED_WEBHOOKS))
def test_webhook_skips_the_labelled_namespaces_and_its_own_even_unlabelled(name: str) -> None:
    selector = WEBHOOKS[name]["namespaceSelector"]
    own = one("Namespace", NAMESPACE)["metadata"]
    assert own["name"] == default("namespace")
    assert not selector_matches(selector, {**own["labels"], **name_label(NAMESPACE)})
    assert not selector_matches(selector, name_label(NAMESPACE))  # someone removed the skip label
    assert not selector_matches(selector, {SKIP_LABEL[0]: SKIP_LABEL[1], **name_label("team-cdn")})
    assert selector_matches(selector, {})


@pytest.mark.parametrize("name", sorted(EXPECTED_WEBHOOKS))
def test_webhook_calls_the_service_and_leaves_ca_bundle_to_the_controller(name: str) -> None:
    cc = WEBHOOKS[name]["clientConfig"]
    assert "url" not in cc
    assert not cc.get("caBundle")
    svc = cc["service"]
    assert (svc["name"], svc["namespace"], svc["path"]) == (SERVICE["metadata"]["name"], NAMESPACE, "/mutate")
    assert svc["port"] in {p["port"] for p in SERVICE["spec"]["ports"]}


@pytest.mark.parametrize("name", sorted(EXPECTED_WEBHOOKS))
def test_webhook_admits_only_its_operations_on_its_resource(name: str) -> None:
    group, versions, resource = EXPECTED_WEBHOOKS[name]
    (rule,) = WEBHOOKS[name]["rules"]
    assert rule == {
        "apiGroups": [group],
        "apiVersions": versions,
        "operations": WEBHOOK_OPERATIONS[name],
        "resources": [resource],
        "scope": "Namespaced",
    }


def test_tls_hosts_name_the_webhook_service() -> None:
    assert f"{SERVICE['metadata']['name']}.{NAMESPACE}.svc" == default("tls_hosts")[0]


def pod(
    labels: dict[str, str] | None = None,
    owners: list[str] | None = None,
    tolerations: list[dict[str, str]] | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "team-cdn"}
    if labels is not None:
        meta["labels"] = labels
    if owners is not None:
        meta["ownerReferences"] = [{"kind": k, "name": "o", "apiVersion": "apps/v1", "uid": "u"} for k in owners]
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if node_name is not None:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


TEKTON = {"app.kubernetes.io/managed-by": "tekton-pipelines", "tekton.dev/taskRun": "r"}
POD_CASES = [
    ("bare pod", pod(), False),
    ("other labels", pod(labels={"app": "web"}), False),
    ("managed by someone else", pod(labels={"app.kubernetes.io/managed-by": "helm"}), False),
    ("managed-by tekton alone", pod(labels={"app.kubernetes.io/managed-by": "tekton-pipelines"}), False),
    ("tekton pod", pod(labels=TEKTON), True),
    ("pipelines-as-code pod", pod(labels={"app.kubernetes.io/managed-by": "pipelinesascode.tekton.dev",
                                          "tekton.dev/taskRun": "r"}), True),
    ("owned by a taskrun", pod(owners=["TaskRun"]), True),
    ("daemonset pod", pod(owners=["DaemonSet"]), True),
    ("replicaset pod", pod(owners=["ReplicaSet"]), False),
    ("daemonset among owners", pod(owners=["ReplicaSet", "DaemonSet"]), True),
    ("pool toleration Equal", pod(tolerations=[{"key": POOL_TAINT_KEY, "operator": "Equal", "value": "x"}]), True),
    ("pool toleration Exists", pod(tolerations=[{"key": POOL_TAINT_KEY, "operator": "Exists"}]), True),
    ("tolerate everything", pod(tolerations=[{"operator": "Exists"}]), True),
    ("tolerate everything, empty key", pod(tolerations=[{"key": "", "operator": "Exists"}]), True),
    ("other toleration", pod(tolerations=[{"key": "gpu", "operator": "Exists"}]), False),
    ("empty tolerations", pod(tolerations=[]), False),
    ("keyless toleration without Exists", pod(tolerations=[{"effect": "NoSchedule"}]), False),
    ("nodeName", pod(node_name="egress-1"), True),  # skips the scheduler: a pool node's is removed
    ("empty nodeName", pod(node_name=""), False),
]


@pytest.mark.parametrize(("case", "obj", "expected"), POD_CASES, ids=[c[0] for c in POD_CASES])
def test_pod_match_condition_sends_only_the_pods_that_matter(case: str, obj: dict[str, Any], expected: bool) -> None:
    celpy = pytest.importorskip("celpy")
    (condition,) = WEBHOOKS["pods.egress-placer.io"]["matchConditions"]
    env = celpy.Environment()
    program = env.program(env.compile(condition["expression"]))
    result = program.evaluate({"object": celpy.json_to_cel(obj)})
    assert isinstance(result, celpy.celtypes.BoolType), f"{case}: evaluation error {result!r}"
    assert bool(result) is expected


# -- the Deployment ---------------------------------------------------------------------------
def test_deployment_runs_two_replicas_of_the_controller() -> None:
    assert DEPLOYMENT["spec"]["replicas"] == 2
    assert CONTAINER["image"] == PUBLISHED_IMAGE  # what the release publishes (devplacer/version.py, make generate)
    assert [*CONTAINER.get("command", []), *CONTAINER.get("args", [])] == ["egress-placer", "run"]
    assert POD_SPEC["serviceAccountName"] == SERVICE_ACCOUNT
    assert "priorityClassName" not in POD_SPEC


def test_deployment_runs_non_root_read_only_without_privileges() -> None:
    pod_sc, sc = POD_SPEC["securityContext"], CONTAINER["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and sc["runAsNonRoot"] is True
    assert pod_sc["runAsUser"] == sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(c.get("securityContext", {}).get("privileged") for c in POD_SPEC["containers"])


def test_tmp_is_a_writable_empty_dir() -> None:
    (mount,) = [m for m in CONTAINER["volumeMounts"] if m["mountPath"] == "/tmp"]
    (volume,) = [v for v in POD_SPEC["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume


@pytest.mark.parametrize(
    ("probe", "path"), [("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]
)
def test_probes_hit_the_health_server(probe: str, path: str) -> None:
    get = CONTAINER[probe]["httpGet"]
    assert get["path"] == path
    assert container_port(get["port"]) == effective_setting("health_port")


FIRST_SYNC_SECONDS = 12.0  # measured: the first sync at 5,000 nodes and 20,000 pods on 2 cores (README)


def probe_budget(probe: Mapping[str, Any]) -> float:
    """Seconds of failures the kubelet accepts before acting on a probe."""
    return probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"]


def test_the_startup_probe_outlasts_the_controller_s_own_start_deadline() -> None:
    """The health server answers only once the caches have synced. The startup probe holds liveness off
    longer than the controller waits itself (the policy, then the caches: STARTUP_TIMEOUT each, then it
    exits), and far longer than the measured first sync: the kubelet never kills a replica that syncs."""
    from controller.app import STARTUP_TIMEOUT

    startup = CONTAINER["startupProbe"]
    assert probe_budget(startup) >= 2 * STARTUP_TIMEOUT + 30
    assert probe_budget(startup) >= 10 * FIRST_SYNC_SECONDS
    assert probe_budget(startup) <= 600  # a replica that cannot start is restarted within 10 minutes
    assert "initialDelaySeconds" not in CONTAINER["livenessProbe"]  # the startup probe gates it
    assert probe_budget(CONTAINER["livenessProbe"]) < probe_budget(startup)


def test_the_pre_stop_delay_and_the_grace_period_agree() -> None:
    """preStop keeps serving while the API server learns the pod left the endpoints; then SIGTERM: the
    webhook server finishes in-flight reviews (its shutdown timeout), the leader releases its Lease
    (within the renew deadline); the grace period covers all of it."""
    import inspect

    from controller.admission.server import AdmissionServer

    delay = CONTAINER["lifecycle"]["preStop"]["sleep"]["seconds"]
    shutdown = inspect.signature(AdmissionServer).parameters["shutdown_timeout"].default
    webhook_timeout = max(w["timeoutSeconds"] for w in WEBHOOKS.values())
    assert webhook_timeout < delay <= 15
    assert POD_SPEC["terminationGracePeriodSeconds"] >= delay + shutdown + effective_setting("renew_deadline_seconds") + 5


def test_the_two_replicas_spread_over_hosts_and_zones() -> None:
    """Spread constraints and anti-affinity count exactly the controller's pods, per host and zone."""
    labels = DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    constraints = POD_SPEC["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in constraints} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for c in constraints:
        assert c["maxSkew"] == 1 and c["whenUnsatisfiable"] == "ScheduleAnyway"  # a one-node cluster still runs both
        assert selector_matches(c["labelSelector"], labels)
        assert not selector_matches(c["labelSelector"], {**labels, "app.kubernetes.io/component": "other"})
    (term,) = POD_SPEC["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selector_matches(term["podAffinityTerm"]["labelSelector"], labels)


@pytest.mark.parametrize(("port_name", "field"), [("webhook", "webhook_port"), ("health", "health_port")])
def test_container_ports_are_the_ports_the_controller_listens_on(port_name: str, field: str) -> None:
    assert container_port(port_name) == effective_setting(field)


@pytest.mark.parametrize(("service_port", "field"), [(443, "webhook_port"), (8080, "health_port")])
def test_service_ports_map_to_the_container_ports(service_port: int, field: str) -> None:
    (port,) = [p for p in SERVICE["spec"]["ports"] if p["port"] == service_port]
    assert container_port(port["targetPort"]) == effective_setting(field)


def test_scrape_annotations_point_at_the_metrics_endpoint() -> None:
    ann = DEPLOYMENT["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == effective_setting("health_port")
    assert ann["prometheus.io/path"] == "/metrics"


def test_resources_are_the_agreed_requests_and_limits() -> None:
    assert CONTAINER["resources"] == {
        "requests": {"cpu": "50m", "memory": "96Mi"},
        "limits": {"cpu": "500m", "memory": "320Mi"},
    }


@pytest.mark.parametrize("kind", ["Service", "PodDisruptionBudget"])
def test_selectors_pick_the_controller_pods(kind: str) -> None:
    for obj in objects(kind):  # the Services: the webhooks' and the conversion's
        selector = obj["spec"]["selector"]
        selector = selector if "matchLabels" in selector else {"matchLabels": selector}
        assert selector_matches(selector, DEPLOYMENT["spec"]["template"]["metadata"]["labels"])


def test_deployment_selector_picks_its_own_pods() -> None:
    assert selector_matches(DEPLOYMENT["spec"]["selector"], DEPLOYMENT["spec"]["template"]["metadata"]["labels"])


def test_pdb_keeps_one_replica() -> None:
    assert one("PodDisruptionBudget", "egress-placer", NAMESPACE)["spec"]["minAvailable"] == 1


def test_every_env_var_is_a_setting() -> None:
    names = [e["name"] for e in CONTAINER["env"]]
    assert len(names) == len(set(names))
    unknown = [
        n for n in names if not n.startswith(ENV_PREFIX) or n[len(ENV_PREFIX) :].lower() not in Settings.model_fields
    ]
    assert unknown == []


def test_env_values_are_valid_settings() -> None:
    values = {e["name"][len(ENV_PREFIX) :].lower(): e["value"] for e in CONTAINER["env"] if "value" in e}
    Settings(**values)  # raises pydantic.ValidationError on a bad value


@pytest.mark.parametrize(
    ("variable", "field_path"), [("NAMESPACE", "metadata.namespace"), ("IDENTITY", "metadata.name")]
)
def test_namespace_and_identity_come_from_the_downward_api(variable: str, field_path: str) -> None:
    (env,) = [e for e in CONTAINER["env"] if e["name"] == ENV_PREFIX + variable]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == field_path


def test_settings_reference_documents_every_setting() -> None:
    text = (ROOT / "config" / "settings.md").read_text()
    missing = [f for f in Settings.model_fields if f"`{ENV_PREFIX}{f.upper()}`" not in text]
    assert missing == []


# -- RBAC -------------------------------------------------------------------------------------
def granted(docs: list[dict[str, Any]] | None = None) -> set[tuple[str, str, str, str, str | None]]:
    out: set[tuple[str, str, str, str, str | None]] = set()
    roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role")] if docs else objects("ClusterRole") + objects("Role")
    for role in roles:
        where = role["metadata"].get("namespace") or "cluster"
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [ANY]:
                            out.add((where, group, resource, verb, name))
    return out


def test_rbac_has_no_wildcards() -> None:
    for role in objects("ClusterRole") + objects("Role"):
        assert not [s for s in walk_strings(role["rules"]) if "*" in s], role["metadata"]


def test_rbac_grants_exactly_what_the_controller_needs() -> None:
    have = granted()
    assert sorted(REQUIRED_GRANTS - have, key=str) == [], "missing"
    assert sorted(have - REQUIRED_GRANTS, key=str) == [], "more than needed"


def test_roles_live_where_the_controller_uses_them() -> None:
    assert {(r["metadata"].get("namespace"), r["metadata"]["name"]) for r in objects("Role")} == {
        (NAMESPACE, "egress-placer"),
        (TEKTON_NS, "egress-placer"),
        (RESOLVERS_NS, "egress-placer"),
        ("kube-system", "egress-placer-agents"),
    }
    assert [r["metadata"]["name"] for r in objects("ClusterRole")] == ["egress-placer"]


BINDINGS = objects("RoleBinding") + objects("ClusterRoleBinding")


@pytest.mark.parametrize("binding", BINDINGS, ids=lambda b: "/".join(filter(None, key(b))))
def test_every_binding_gives_its_role_to_the_controller_service_account(binding: dict[str, Any]) -> None:
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]
    ref = binding["roleRef"]
    role_ns = None if ref["kind"] == "ClusterRole" else binding["metadata"]["namespace"]
    one(ref["kind"], ref["name"], role_ns)  # the role it names exists
    one("ServiceAccount", SERVICE_ACCOUNT, NAMESPACE)


def test_every_role_is_bound() -> None:
    bound = {
        (ref["kind"], b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None, ref["name"])
        for b in BINDINGS
        for ref in [b["roleRef"]]
    }
    roles = {key(r) for r in objects("Role") + objects("ClusterRole")}
    assert roles <= bound


# -- the image --------------------------------------------------------------------------------
def dockerfile_instructions() -> list[tuple[str, str]]:
    lines = (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    words = [line.split(None, 1) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return [(op.upper(), rest.strip()) for op, rest in words]


def test_image_runs_as_the_deployment_user_with_exec_form_entrypoint() -> None:
    final_stage = dockerfile_instructions()
    final_stage = final_stage[max(i for i, (op, _) in enumerate(final_stage) if op == "FROM") :]
    ops = dict(final_stage)
    assert ops["USER"].split(":")[0] == str(CONTAINER["securityContext"]["runAsUser"])
    assert yaml.safe_load(ops["ENTRYPOINT"]) == ["egress-placer"]
    assert yaml.safe_load(ops["CMD"]) == ["run"]
    assert "PYTHONDONTWRITEBYTECODE=1" in ops["ENV"]
    assert not [v for op, v in final_stage if op == "RUN"], "the final stage should only copy the venv"


def test_the_builder_stage_makes_a_wheel_with_the_whole_controller(tmp_path: Path) -> None:
    """What the builder stage does, without a Docker engine: copy what it COPYs, build the wheel with
    pip, and check the wheel holds every controller module and the `egress-placer` entry point that
    answers --help (run from the wheel itself, the dependencies from this venv)."""
    instructions = dockerfile_instructions()
    builder = instructions[: max(i for i, (op, _) in enumerate(instructions) if op == "FROM")]
    context = tmp_path / "context"
    context.mkdir()
    for op, args in builder:
        if op == "COPY" and not args.startswith("--from="):  # --from: out of another stage, not the context
            *sources, _ = args.split()
            for source in sources:
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, context / source, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copyfile(ROOT / source, context / source)
    assert (context / "controller").is_dir() and (context / "pyproject.toml").is_file()
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--wheel-dir", str(wheels), str(context)],
                   check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = wheels.glob("egress_placer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "controller").rglob("*.py")}
    assert modules - names == set()
    assert "egress-placer = controller.cli:main" in entry_points
    assert "kubectl-egress_placer = controller.cli:main" in entry_points  # `kubectl egress-placer`
    (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(license_file) == (ROOT / "LICENSE").read_bytes()
    helped = subprocess.run(
        [sys.executable, "-c", "import sys; from controller.cli import main; sys.argv[0] = 'egress-placer'; main()", "--help"],
        env={**os.environ, "PYTHONPATH": str(wheel)}, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert helped.returncode == 0, helped.stderr
    assert "explain" in helped.stdout and str(wheel) in subprocess.run(
        [sys.executable, "-c", "import controller; print(controller.__file__)"],
        env={**os.environ, "PYTHONPATH": str(wheel)}, cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout


def test_the_license_is_the_one_the_package_declares() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    text = (ROOT / "LICENSE").read_text()
    assert project["license"] == "Apache-2.0"
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) == 201  # the whole text, appendix too


# -- the cert-manager component ---------------------------------------------------------------------
OWN_CERTIFICATE_GRANTS = {
    g for g in REQUIRED_GRANTS if g[2] in ("secrets", "mutatingwebhookconfigurations", "validatingwebhookconfigurations")
    or g[2:4] == ("customresourcedefinitions", "patch")
}  # what only the controller's own certificate upkeep needs


def test_the_cert_manager_component_mounts_the_certificate_and_drops_the_rights_for_the_own_one(
    kubectl: Path, tmp_path: Path
) -> None:
    """Rendered as its header says to use it: an overlay of one's own beside the repository."""
    (tmp_path / "egress-placer").symlink_to(ROOT)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../egress-placer/k8s"], "components": ["../egress-placer/k8s/cert-manager"],
    }))
    out = subprocess.run([str(kubectl), "kustomize", str(overlay)], check=True, capture_output=True, text=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    by_kind = {d["kind"]: d for d in docs}
    certificate, issuer = by_kind["Certificate"], by_kind["Issuer"]
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuer["metadata"]["name"]}
    assert issuer["metadata"]["namespace"] == certificate["metadata"]["namespace"] == NAMESPACE

    # The Service every webhook calls is in the certificate, and the CA injector is pointed at it: the
    # placement webhooks' and the pools API's.
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = by_kind[kind]
        services = {(w["clientConfig"]["service"]["name"], w["clientConfig"]["service"]["namespace"]) for w in config["webhooks"]}
        assert {f"{name}.{namespace}.svc" for name, namespace in services} <= set(certificate["spec"]["dnsNames"])
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{certificate['metadata']['name']}"

    # The controller serves the Certificate's Secret from files in a read-only mount of it.
    pod = by_kind["Deployment"]["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == CONTAINER["name"]]
    env = {e["name"]: e.get("value") for e in container["env"]}
    files = [Path(env[f"{ENV_PREFIX}TLS_CERT_FILE"]), Path(env[f"{ENV_PREFIX}TLS_KEY_FILE"])]
    assert [f.name for f in files] == ["tls.crt", "tls.key"]  # the keys cert-manager writes
    (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == files[0].parent == files[1].parent]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert mount["readOnly"] and volume["secret"]["secretName"] == certificate["spec"]["secretName"]
    assert {m["mountPath"] for m in CONTAINER["volumeMounts"]} < {m["mountPath"] for m in container["volumeMounts"]}

    # The same rights as the base, less those of the controller's own certificate.
    assert granted(docs) == REQUIRED_GRANTS - OWN_CERTIFICATE_GRANTS
    assert OWN_CERTIFICATE_GRANTS
