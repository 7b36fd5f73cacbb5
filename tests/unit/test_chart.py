"""The Helm chart (charts/egress-placer), linted and rendered with the helm built from its Go module.

The chart is `k8s/` for Helm: for the default values `helm template` renders the same objects with the
same fields as `kubectl kustomize k8s/`, and so do its certificate and intruder values and the
kustomize components they stand for (k8s/cert-manager/, k8s/report-only/, k8s/run-guard-warn/), and its `policySource:
configmap` for k8s/policy-configmap/. Normalisation before the
comparison, and nothing else:
  - Helm's own labels (`HELM_LABELS`: helm.sh/chart, app.kubernetes.io/managed-by, /instance, /version)
    are dropped from every object's metadata.labels, and Helm's own annotation (`HELM_ANNOTATIONS`: the
    CRDs' helm.sh/resource-policy, crds.keep) from metadata.annotations;
  - the policy ConfigMap's `policy.yaml` is compared parsed (k8s/policy-configmap/policy.yaml keeps comments, the chart
    writes the `policy` value with toYaml);
  - a container's `env` is compared as a mapping by name: kustomize's strategic merge puts the variables
    a component patches first, and without `$(VAR)` references (checked) their order means nothing;
  - YAML comments and the order of objects do not count (objects are matched by apiVersion, kind,
    namespace and name); names are the same on both sides (fixed names, no release prefix, no hash).
CRDs: the chart's are templates (crds.install), so a CRD in k8s/ without one in the chart is reported as an
object only in k8s/.

The values beyond k8s/ (image, replicas, resources, placement of the controller, labels, the policy and
the pool guard's binding computed from it, the monitoring objects) are rendered and checked one by one.
The helm binary is the local cluster's optional component (`python -m devcluster build --with helm`,
part of `make cluster-build`); like the kubectl rendering checks, these skip, saying so, before it is built.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pytest
import yaml

from controller.core import run_guard
from controller.pool_guard.core import GUARD_NAME, policy_binding
from controller.core.rights import POD_DELETES_NAME, RIGHTS_NAME, controller_rights
from controller.core.run_guard import RUN_GUARD_NAME
from controller.core.policy import load_policy
from controller.settings import env_name, load_settings
from devcluster.build import find_artifacts, find_optional
from devcluster.cluster import ClusterError
from devplacer.chart import CHART_DIR, LOCAL_SETTINGS, RELEASE_NAMESPACE, policy_values, post_render, run_helm, settings_env, template
from devplacer.generate import supported_range
from devplacer.version import IMAGE_REPOSITORY, PUBLISHED_IMAGE
from devplacer.local_placer import K8S_DIR, ONE_ENDPOINT, kustomize

HELM_ANNOTATIONS = frozenset({"helm.sh/resource-policy"})  # crds.keep: Helm's own, an instruction to Helm
HELM_LABELS = frozenset({"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"})
POLICY_CONFIGMAP = ("v1", "ConfigMap", "egress-placer", "egress-placer-policy")
FILES = CHART_DIR / "files"
# The chart's values that stand for the kustomize components of k8s/.
COMPONENT_VALUES: dict[str, dict[str, Any]] = {
    "report-only": {"intruderMode": "report"},
    "cert-manager": {"certificate": {"mode": "cert-manager"}},
    "policy-configmap": {"policySource": "configmap"},
    "controller-rights-warn": {"controllerRights": {"validationActions": ["Warn", "Audit"]}},
    "run-guard-warn": {"runGuard": {"warnOnly": True}},
}
Key = tuple[str, str, str | None, str]


@pytest.fixture(scope="module")
def helm() -> Path:
    """The helm the local cluster's build made; the chart checks are skipped, saying so, before that build."""
    bin_dir = find_optional("helm")
    if bin_dir is None:
        pytest.skip("helm is not built yet (python -m devcluster build --with helm, part of make cluster-build)")
    return bin_dir / "helm"


@pytest.fixture(scope="module")
def kubectl() -> Path:
    artifacts = find_artifacts()
    if artifacts is None:
        pytest.skip("the local cluster's kubectl is not built yet (python -m devcluster build)")
    return artifacts.binary("kubectl")


@pytest.fixture(scope="module")
def default_render(helm: Path) -> list[dict[str, Any]]:
    return template(helm)


# -- the comparison with k8s/ ---------------------------------------------------------------------------
def key(doc: Mapping[str, Any]) -> Key:
    meta = doc["metadata"]
    return doc["apiVersion"], doc["kind"], meta.get("namespace"), meta["name"]


def normalised(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`doc` less Helm's own labels, with the policy ConfigMap's document parsed (see the module docstring)."""
    doc = copy.deepcopy(dict(doc))
    labels = {k: v for k, v in (doc["metadata"].get("labels") or {}).items() if k not in HELM_LABELS}
    doc["metadata"].pop("labels", None)
    if labels:
        doc["metadata"]["labels"] = labels
    annotations = {k: v for k, v in (doc["metadata"].get("annotations") or {}).items() if k not in HELM_ANNOTATIONS}
    doc["metadata"].pop("annotations", None)
    if annotations:
        doc["metadata"]["annotations"] = annotations
    if key(doc) == POLICY_CONFIGMAP:
        doc["data"] = {name: yaml.safe_load(text) for name, text in doc["data"].items()}
    for container in ((doc.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
        assert "$(" not in json.dumps(container.get("env")), "a variable refers to another: the order of env counts"
        container["env"] = {e["name"]: e for e in container.get("env") or []}
    return doc


def differences(left: Any, right: Any, path: str = "") -> list[str]:
    """Where two parsed documents differ, as `path: left != right` lines."""
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return [line for k in sorted(set(left) | set(right), key=str) for line in differences(left.get(k), right.get(k), f"{path}.{k}")]
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        return [line for i, (a, b) in enumerate(zip(left, right)) for line in differences(a, b, f"{path}[{i}]")]
    return [] if left == right else [f"{path or '.'}: k8s/ {json.dumps(left)} != chart {json.dumps(right)}"]


def compare(kustomized: Iterable[Mapping[str, Any]], charted: Iterable[Mapping[str, Any]]) -> list[str]:
    """What differs between the two renders, object by object; [] when they are the same."""
    ours = {key(d): normalised(d) for d in kustomized}
    theirs = {key(d): normalised(d) for d in charted}
    lines = [f"only in k8s/: {'/'.join(filter(None, k))}" for k in sorted(set(ours) - set(theirs), key=str)]
    lines += [f"only in the chart: {'/'.join(filter(None, k))}" for k in sorted(set(theirs) - set(ours), key=str)]
    for k in sorted(set(ours) & set(theirs), key=str):
        lines += [f"{'/'.join(filter(None, k))} {line}" for line in differences(ours[k], theirs[k])]
    return lines


def merged(*values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in values:
        for k, item in v.items():
            out[k] = merged(out[k], item) if isinstance(item, Mapping) and isinstance(out.get(k), Mapping) else item
    return out


@pytest.mark.parametrize(
    "components",
    [(), ("report-only",), ("cert-manager",), ("cert-manager", "report-only"), ("policy-configmap",), ("cert-manager", "policy-configmap"),
     ("controller-rights-warn", "report-only"), ("run-guard-warn",), ("report-only", "run-guard-warn")],
    ids=lambda c: "+".join(c) or "defaults",
)
def test_the_render_is_k8s_for_the_same_choices(helm: Path, kubectl: Path, components: tuple[str, ...]) -> None:
    kustomized = kustomize(kubectl, components)
    charted = template(helm, merged(*(COMPONENT_VALUES[c] for c in components)))
    assert compare(kustomized, charted) == []
    assert len(kustomized) >= 17  # the comparison compared something


def test_the_comparison_reports_what_differs() -> None:
    """The comparison itself: a changed field, a missing object and an extra one are each named."""
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "a", "namespace": "n"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "n"}, "spec": {"ports": [{"port": 443}]}},
    ]
    changed = copy.deepcopy(docs)
    changed[1]["spec"]["ports"][0]["port"] = 8443
    changed[0]["metadata"]["labels"] = {"helm.sh/chart": "egress-placer-0.1.0"}  # Helm's own: not a difference
    extra = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "pools.egress-placer.io"}}
    assert compare(docs, changed) == ["v1/Service/n/s .spec.ports[0].port: k8s/ 443 != chart 8443"]
    assert compare([*docs, extra], docs) == ["only in k8s/: apiextensions.k8s.io/v1/CustomResourceDefinition/pools.egress-placer.io"]
    assert compare(docs, [*docs, extra]) == ["only in the chart: apiextensions.k8s.io/v1/CustomResourceDefinition/pools.egress-placer.io"]


def test_the_default_policy_is_the_configmap_component_s() -> None:
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert defaults["policy"] == policy_values(K8S_DIR / "policy-configmap" / "policy.yaml")
    assert defaults["policySource"] == "pools"


def test_the_packaged_chart_renders_the_same(helm: Path, tmp_path: Path, default_render: list[dict[str, Any]]) -> None:
    """`helm package` keeps everything the render needs (crds/, files/; .helmignore leaves out none of it)."""
    run_helm(helm, "package", str(CHART_DIR), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("egress-placer-*.tgz")
    out = run_helm(helm, "template", "egress-placer", str(archive), "--namespace", RELEASE_NAMESPACE, "--include-crds",
                   "--set", "prometheusRule.enabled=true,grafanaDashboard.enabled=true")
    packaged = [d for d in yaml.safe_load_all(out) if d]
    assert compare(default_render, [d for d in packaged if d["kind"] != "PrometheusRule" and d["metadata"]["name"] != "egress-placer-dashboard"]) == []
    assert the(packaged, "PrometheusRule")["spec"] == yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())


# -- helm lint, and values it refuses -------------------------------------------------------------------
@pytest.mark.parametrize(
    "values",
    [
        {},
        {"certificate": {"mode": "cert-manager"}, "intruderMode": "report"},
        {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
        {"replicas": 1, "createNamespace": False, "poolGuard": {"enabled": False}, "agentRbac": {"namespaces": []},
         "controllerRights": {"enabled": False}},
        {"controllerRights": {"validationActions": ["Warn", "Audit"]}},
        {"prometheus": {"auth": {"existingSecret": "prometheus-auth", "tokenKey": "token", "caKey": "ca.crt"}}},
        {"prometheus": {"auth": {"existingSecret": "prometheus-auth", "username": "egress-placer", "passwordKey": "password"}},
         "extraVolumes": [{"name": "extra", "emptyDir": {}}], "extraVolumeMounts": [{"name": "extra", "mountPath": "/extra"}]},
    ],
    ids=["defaults", "cert-manager+report", "monitoring", "minimal", "rights-warn-only", "prometheus-token+ca", "prometheus-basic+extra-volumes"],
)
def test_helm_lint_passes_strictly(helm: Path, tmp_path: Path, values: dict[str, Any]) -> None:
    (tmp_path / "values.json").write_text(json.dumps(values))
    out = run_helm(helm, "lint", "--strict", str(CHART_DIR), "--values", str(tmp_path / "values.json"))
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


@pytest.mark.parametrize(
    "values, named",
    [
        ({"intruderMode": "evcit"}, "'/intruderMode'"),
        ({"certificate": {"mode": "vault"}}, "'/certificate/mode'"),
        ({"replicas": 0}, "'/replicas'"),
        ({"image": {"repository": ""}}, "'/image/repository'"),
        ({"image": {"repository": "egress-placer"}}, "'/image/repository'"),  # the 0.1.0 placeholder: no registry
        ({"image": {"repository": "ghcr.io/Egress/placer"}}, "'/image/repository'"),  # repositories are lower case
        ({"intruderMdoe": "report"}, "'intruderMdoe' not allowed"),  # a misspelt key is refused, not ignored
        ({"extraEnv": {"RESYNC_SECONDS": "60"}}, "'RESYNC_SECONDS'"),  # settings are EGRESS_PLACER_* variables
        ({"controllerRights": {"validationActions": ["Refuse"]}}, "'/controllerRights/validationActions/0'"),
        ({"controllerRights": {"validationActions": []}}, "'/controllerRights/validationActions'"),
        ({"controllerRights": {"validationActions": ["Deny", "Warn"]}}, "'/controllerRights/validationActions'"),
        ({"controllerRights": {"enabeld": True}}, "'enabeld' not allowed"),
    ],
)
def test_the_values_schema_refuses_wrong_values(helm: Path, values: dict[str, Any], named: str) -> None:
    with pytest.raises(ClusterError, match="values don't meet the specifications of the schema") as refused:
        template(helm, values)
    assert named in str(refused.value)


# -- values beyond k8s/ ---------------------------------------------------------------------------------
def by_kind(docs: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def the(docs: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> Mapping[str, Any]:
    (doc,) = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    return doc


def pod_spec(docs: Iterable[Mapping[str, Any]]) -> Mapping[str, Any]:
    return the(docs, "Deployment")["spec"]["template"]["spec"]


def container(docs: Iterable[Mapping[str, Any]]) -> Mapping[str, Any]:
    (c,) = pod_spec(docs)["containers"]
    return c


def env(docs: Iterable[Mapping[str, Any]]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container(docs)["env"]}


def test_image_replicas_and_resources(helm: Path) -> None:
    """Helm merges maps with the defaults: null takes a default out (here the CPU limit)."""
    resources = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": None, "memory": "512Mi"}}
    docs = template(helm, {"image": {"repository": "registry.example.com/egress-placer", "tag": "0.1.1", "pullPolicy": "Always"},
                           "replicas": 3, "resources": resources})
    assert container(docs)["image"] == "registry.example.com/egress-placer:0.1.1"
    assert container(docs)["imagePullPolicy"] == "Always"
    assert the(docs, "Deployment")["spec"]["replicas"] == 3
    assert container(docs)["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}


def test_the_default_image_is_the_published_one_at_the_app_version(default_render: list[dict[str, Any]]) -> None:
    """Issue 28: the default is what the release workflow pushes (docs/releasing.md), not a placeholder."""
    app_version = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["appVersion"]
    assert container(default_render)["image"] == f"{IMAGE_REPOSITORY}:{app_version}" == PUBLISHED_IMAGE


def test_one_replica_has_no_disruption_budget(helm: Path, default_render: list[dict[str, Any]]) -> None:
    assert by_kind(default_render, "PodDisruptionBudget")
    assert not by_kind(template(helm, {"replicas": 1}), "PodDisruptionBudget")  # it would block every drain


def test_one_replica_does_not_recycle_its_connections(helm: Path, default_render: list[dict[str, Any]]) -> None:
    """Recycling makes the Service pick a replica again; with one there is nothing to pick, and each recycle
    costs the API server's next call a TLS handshake (config/settings.md). extraEnv still decides."""
    recycling = ("EGRESS_PLACER_WEBHOOK_CONNECTION_MAX_REQUESTS", "EGRESS_PLACER_WEBHOOK_CONNECTION_MAX_SECONDS")
    assert not set(recycling) & set(env(default_render))  # two replicas: the settings' defaults
    one = env(template(helm, {"replicas": 1}))
    assert [one.get(name) for name in recycling] == ["0", "0"]
    # the local cluster does the same with one endpoint, and the names are the settings'
    assert {name: one[name] for name in recycling} == ONE_ENDPOINT
    assert ONE_ENDPOINT == {env_name("webhook_connection_max_requests"): "0", env_name("webhook_connection_max_seconds"): "0"}
    kept = template(helm, {"replicas": 1, "extraEnv": {"EGRESS_PLACER_WEBHOOK_CONNECTION_MAX_SECONDS": "3"}})
    assert [env(kept).get(name) for name in recycling] == ["0", "3"]
    assert [e["name"] for e in container(kept)["env"]].count(recycling[1]) == 1


def test_where_the_controller_itself_runs(helm: Path) -> None:
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "platform", "effect": "NoSchedule"}]
    docs = template(helm, {"nodeSelector": {"node-role.example.com/platform": "true"}, "tolerations": tolerations,
                           "priorityClassName": "platform-critical"})
    spec = pod_spec(docs)
    assert spec["nodeSelector"] == {"node-role.example.com/platform": "true"}
    assert spec["tolerations"] == tolerations
    assert spec["priorityClassName"] == "platform-critical"


def test_common_labels_and_annotations_reach_every_templated_object_and_pod_ones_the_pods(helm: Path) -> None:
    docs = template(helm, {"commonLabels": {"team": "platform"}, "commonAnnotations": {"owner": "platform@example.com"},
                           "podLabels": {"sidecar.example.com/inject": "false"}, "podAnnotations": {"example.com/note": "x"}})
    for doc in (d for d in docs if d["kind"] != "CustomResourceDefinition"):  # Helm does not template crds/
        assert doc["metadata"]["labels"]["team"] == "platform", key(doc)
        assert doc["metadata"]["annotations"]["owner"] == "platform@example.com", key(doc)
    template_meta = the(docs, "Deployment")["spec"]["template"]["metadata"]
    assert template_meta["labels"]["sidecar.example.com/inject"] == "false"
    assert template_meta["annotations"]["example.com/note"] == "x"
    assert template_meta["annotations"]["prometheus.io/scrape"] == "true"  # kept beside them


def test_pod_annotations_may_turn_the_scrape_annotation_off(helm: Path) -> None:
    """With a ServiceMonitor, a Prometheus that also scrapes annotated pods would scrape twice."""
    docs = template(helm, {"serviceMonitor": {"enabled": True}, "podAnnotations": {"prometheus.io/scrape": "false"}})
    assert the(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "false"


def test_common_labels_do_not_change_what_selects_the_pods(helm: Path, default_render: list[dict[str, Any]]) -> None:
    docs = template(helm, {"commonLabels": {"app.kubernetes.io/name": "other"}, "podLabels": {"app.kubernetes.io/component": "x"}})
    deployment = the(docs, "Deployment")
    assert deployment["spec"]["selector"] == the(default_render, "Deployment")["spec"]["selector"]
    assert deployment["spec"]["template"]["metadata"]["labels"] == {"app.kubernetes.io/name": "egress-placer", "app.kubernetes.io/component": "controller"}
    assert the(docs, "Service", "egress-placer-webhook")["spec"]["selector"] == the(default_render, "Service", "egress-placer-webhook")["spec"]["selector"]


def test_extra_settings_are_added_and_may_replace_the_chart_s(helm: Path, default_render: list[dict[str, Any]]) -> None:
    docs = template(helm, {"extraEnv": {"EGRESS_PLACER_RESYNC_SECONDS": 60, "EGRESS_PLACER_LOG_FORMAT": "text"}, "logLevel": "DEBUG"})
    assert env(docs) == {**env(default_render), "EGRESS_PLACER_RESYNC_SECONDS": "60", "EGRESS_PLACER_LOG_FORMAT": "text",
                         "EGRESS_PLACER_LOG_LEVEL": "DEBUG"}
    assert [e["name"] for e in container(docs)["env"]].count("EGRESS_PLACER_LOG_FORMAT") == 1


def test_the_tekton_namespaces_move_the_roles_and_the_settings(helm: Path) -> None:
    docs = template(helm, {"tektonNamespace": "tekton", "tektonResolversNamespace": "tekton-resolvers"})
    assert env(docs)["EGRESS_PLACER_TEKTON_NAMESPACE"] == "tekton"
    assert env(docs)["EGRESS_PLACER_TEKTON_RESOLVERS_NAMESPACE"] == "tekton-resolvers"
    tekton_role = [d for d in by_kind(docs, "Role") if "config-defaults" in json.dumps(d["rules"])]
    assert [d["metadata"]["namespace"] for d in tekton_role] == ["tekton"]
    resolvers_role = [d for d in by_kind(docs, "Role") if "cluster-resolver-config" in json.dumps(d["rules"])]
    assert [d["metadata"]["namespace"] for d in resolvers_role] == ["tekton-resolvers"]
    assert sorted(d["metadata"]["namespace"] for d in by_kind(docs, "RoleBinding") if d["roleRef"]["name"] == "egress-placer"
                  and d["metadata"]["namespace"] != "egress-placer") == ["tekton", "tekton-resolvers"]


@pytest.mark.parametrize("namespaces", [[], ["kube-system", "monitoring"]])
def test_agent_rbac_goes_to_each_agent_namespace(helm: Path, namespaces: list[str]) -> None:
    docs = template(helm, {"agentRbac": {"namespaces": namespaces}})
    for kind in ("Role", "RoleBinding"):
        assert sorted(d["metadata"]["namespace"] for d in by_kind(docs, kind) if d["metadata"]["name"] == "egress-placer-agents") == namespaces


def test_without_the_namespace_and_the_pool_guard(helm: Path, default_render: list[dict[str, Any]]) -> None:
    docs = template(helm, {"createNamespace": False, "poolGuard": {"enabled": False}})
    gone = {(k[1], k[-1]) for k in {key(d) for d in default_render} - {key(d) for d in docs}}
    assert gone == {("Namespace", "egress-placer"), *{(kind, GUARD_NAME) for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")}}


def test_the_controller_rights_are_the_render_and_may_only_warn(helm: Path, default_render: list[dict[str, Any]]) -> None:
    def rights(docs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        names = {RIGHTS_NAME, POD_DELETES_NAME}
        return [{k: d[k] for k in ("apiVersion", "kind", "spec")} for d in docs if d["metadata"]["name"] in names]

    assert rights(default_render) == [{k: d[k] for k in ("apiVersion", "kind", "spec")} for d in controller_rights()]
    warn = rights(template(helm, {"controllerRights": {"validationActions": ["Warn", "Audit"]}}))
    assert warn == [{k: d[k] for k in ("apiVersion", "kind", "spec")} for d in controller_rights(actions=("Warn", "Audit"))]
    off = template(helm, {"controllerRights": {"enabled": False}})
    assert rights(off) == [] and by_kind(off, "ValidatingAdmissionPolicyBinding") != []


@pytest.mark.parametrize(
    "values, actions",
    [({}, None), ({"runGuard": {"enabled": True}}, ["Deny"]), ({"runGuard": {"warnOnly": True}}, ["Warn", "Audit"]),
     ({"runGuard": {"enabled": False}}, "none"), ({"runGuard": {"enabled": False, "warnOnly": True}}, "none")],
    ids=["defaults", "enabled", "warn-only", "disabled", "disabled-warn-only"],
)
def test_the_run_guard_values(helm: Path, values: dict[str, Any], actions: Any) -> None:
    """runGuard.enabled (default true) renders the policy and its binding as run_guard.py makes them;
    runGuard.warnOnly (default false) makes the binding warn and audit instead of refusing."""
    docs = [d for d in template(helm, values) if d["metadata"]["name"] == RUN_GUARD_NAME]
    if actions == "none":
        assert docs == []
        return
    policy, binding = the(docs, "ValidatingAdmissionPolicy"), the(docs, "ValidatingAdmissionPolicyBinding")
    assert policy["spec"] == run_guard.validating_admission_policy()["spec"]
    warn = bool(values.get("runGuard", {}).get("warnOnly"))
    assert binding["spec"] == run_guard.policy_binding(warn_only=warn)["spec"]
    assert binding["spec"]["validationActions"] == (actions or ["Deny"])


@pytest.mark.parametrize("values", [{"runGuard": {"warnonly": True}}, {"runGuard": {"enabled": "yes"}}, {"runGuard": {"warnOnly": 1}}])
def test_the_run_guard_values_are_checked(helm: Path, values: dict[str, Any]) -> None:
    with pytest.raises(ClusterError, match="runGuard"):
        template(helm, values)


def test_an_issuer_of_one_s_own_replaces_the_self_signed_one(helm: Path) -> None:
    issuer = {"kind": "ClusterIssuer", "name": "corporate-ca", "group": "cert-manager.io"}
    docs = template(helm, {"certificate": {"mode": "cert-manager", "certManager": {"issuerRef": issuer, "duration": "720h", "renewBefore": "240h"}}})
    assert not by_kind(docs, "Issuer")
    certificate = the(docs, "Certificate")["spec"]
    assert (certificate["issuerRef"], certificate["duration"], certificate["renewBefore"]) == (issuer, "720h", "240h")


# -- the policy, and the pool guard's (static) binding ---------------------------------------------------
POLICIES = {
    "k8s/policy-configmap/policy.yaml": policy_values(K8S_DIR / "policy-configmap" / "policy.yaml"),
    "exempt namespaces of one's own": {"pools": [{"name": "gpu", "nodeSelector": {"pool": "gpu"}}], "exemptNamespaces": ["kube-system", "ops"]},
    "agent namespaces apart": {"pools": [{"name": "gpu", "nodeSelector": {"pool": "gpu"}}], "agentNamespaces": ["monitoring", "kube-system"]},
    "no exempt and no agent namespaces": {"pools": [{"name": "gpu", "nodeSelector": {"pool": "gpu"}}], "exemptNamespaces": [], "agentNamespaces": []},
}


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
def test_the_policy_value_is_the_configmap_and_the_guard_binding_is_static(helm: Path, policy: dict[str, Any]) -> None:
    docs = template(helm, {"policySource": "configmap", "policy": policy})
    (configmap,) = [d for d in docs if key(d) == POLICY_CONFIGMAP]
    loaded = load_policy(configmap["data"]["policy.yaml"], "the chart's ConfigMap")  # raises when the controller would refuse it
    assert yaml.safe_load(configmap["data"]["policy.yaml"]) == {"apiVersion": "egress-placer.io/v1alpha1", "kind": "PlacementPolicy", **policy}
    binding = the(docs, "ValidatingAdmissionPolicyBinding", GUARD_NAME)
    expected = policy_binding("egress-placer")  # static: what follows the policy is in the params
    assert {k: binding[k] for k in ("apiVersion", "kind", "spec")} == {k: expected[k] for k in ("apiVersion", "kind", "spec")}


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
def test_with_the_pools_api_the_policy_value_is_not_rendered_and_the_binding_is_static(helm: Path, policy: dict[str, Any]) -> None:
    docs = template(helm, {"policy": policy})  # policySource: pools, the default
    assert POLICY_CONFIGMAP not in {key(d) for d in docs}
    env = {e["name"]: e.get("value") for e in the(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["EGRESS_PLACER_POLICY_SOURCE"] == "pools"
    binding = the(docs, "ValidatingAdmissionPolicyBinding", GUARD_NAME)
    assert binding["spec"] == policy_binding("egress-placer")["spec"]


# -- monitoring objects --------------------------------------------------------------------------------
def test_the_monitoring_objects_are_off_by_default(default_render: list[dict[str, Any]]) -> None:
    assert not {"ServiceMonitor", "PrometheusRule"} & {d["kind"] for d in default_render}
    assert "egress-placer-dashboard" not in {d["metadata"]["name"] for d in default_render}


def test_the_service_monitor_scrapes_the_metrics_port_of_the_controller_service(helm: Path) -> None:
    docs = template(helm, {"serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kube-prometheus-stack"}}})
    monitor, service = the(docs, "ServiceMonitor"), the(docs, "Service", "egress-placer-webhook")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    # ... and picks no other Service of the chart (there is one)
    assert [s["metadata"]["name"] for s in by_kind(docs, "Service") if selector.items() <= s["metadata"]["labels"].items()] == ["egress-placer-webhook"]
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["targetPort"] == "health" and endpoint["path"] == "/metrics" and endpoint["interval"] == "15s"
    scrape = the(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert (scrape["prometheus.io/path"], int(scrape["prometheus.io/port"])) == (endpoint["path"], next(
        p["containerPort"] for p in container(docs)["ports"] if p["name"] == port["targetPort"]))


def test_the_prometheus_rule_carries_the_shipped_rule_file(helm: Path) -> None:
    docs = template(helm, {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}})
    rule = the(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())


def test_the_dashboard_configmap_carries_the_shipped_dashboard(helm: Path) -> None:
    docs = template(helm, {"grafanaDashboard": {"enabled": True}})
    (configmap,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "egress-placer-dashboard"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar looks for by default
    assert json.loads(configmap["data"]["egress-placer.json"]) == json.loads((FILES / "grafana-dashboard.json").read_text())


# -- the local form the e2e install uses -----------------------------------------------------------------
def test_the_post_renderer_only_points_the_webhooks_at_the_local_url(default_render: list[dict[str, Any]]) -> None:
    url = "https://127.0.0.1:18443/mutate"
    local = [d for d in yaml.safe_load_all(post_render(yaml.safe_dump_all(default_render), url)) if d]
    assert [key(d) for d in local] == [key(d) for d in default_render]
    webhooks = the(local, "MutatingWebhookConfiguration")["webhooks"]
    assert {json.dumps(w["clientConfig"]) for w in webhooks} == {json.dumps({"url": url})}
    (pools,) = the(local, "ValidatingWebhookConfiguration")["webhooks"]  # the pools API's, the same server's /validate
    assert pools["clientConfig"] == {"url": "https://127.0.0.1:18443/validate"}
    for crd in by_kind(local, "CustomResourceDefinition"):  # the pools API's conversion: the same server's /convert
        assert crd["spec"]["conversion"]["webhook"]["clientConfig"] == {"url": "https://127.0.0.1:18443/convert"}
    webhook_kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "CustomResourceDefinition")
    assert [d for d in local if d["kind"] not in webhook_kinds] == [d for d in default_render if d["kind"] not in webhook_kinds]


def test_the_local_process_gets_the_deployment_s_settings_but_its_own_ports(default_render: list[dict[str, Any]]) -> None:
    settings = settings_env(default_render)
    assert settings["EGRESS_PLACER_INTRUDER_MODE"] == "evict"
    assert not LOCAL_SETTINGS & set(settings)
    assert "EGRESS_PLACER_NAMESPACE" not in settings  # from the downward API in a cluster; the local process sets it


# -- the release namespace -------------------------------------------------------------------------------
OTHER_NAMESPACE = "ci-system"


def test_every_object_follows_the_release_namespace(helm: Path) -> None:
    """`helm template -n ci-system`: every namespaced object of the chart is there, and the cluster-wide
    objects that name the namespace (webhook Service references, binding subjects, the policies' controller
    user, the binding's params) name ci-system; the literal egress-placer namespace is nowhere."""
    values = {"certificate": {"mode": "cert-manager"}, "serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
              "grafanaDashboard": {"enabled": True}, "networkPolicy": {"enabled": True, "ipBlocks": ["10.0.0.0/28"]},
              "policySource": "configmap", "agentRbac": {"namespaces": []}}
    docs = template(helm, values, namespace=OTHER_NAMESPACE)
    outside = {"tekton-pipelines", "tekton-pipelines-resolvers"}  # the Tekton Roles, by design
    namespaced = [d for d in docs if "namespace" in d["metadata"]]
    assert {d["metadata"]["namespace"] for d in namespaced} - outside == {OTHER_NAMESPACE}
    assert the(docs, "Namespace")["metadata"]["name"] == OTHER_NAMESPACE
    text = json.dumps([d for d in docs if d["kind"] != "CustomResourceDefinition"])
    assert "egress-placer.svc" not in text and ":egress-placer:" not in text and '"namespace": "egress-placer"' not in text
    assert f"system:serviceaccount:{OTHER_NAMESPACE}:egress-placer" in json.dumps(the(docs, "ValidatingAdmissionPolicy", RUN_GUARD_NAME))
    assert f"system:serviceaccount:{OTHER_NAMESPACE}:egress-placer" in json.dumps(the(docs, "ValidatingAdmissionPolicy", RIGHTS_NAME))
    for webhook in the(docs, "MutatingWebhookConfiguration")["webhooks"] + the(docs, "ValidatingWebhookConfiguration")["webhooks"]:
        assert webhook["clientConfig"]["service"]["namespace"] == OTHER_NAMESPACE
    for webhook in the(docs, "MutatingWebhookConfiguration")["webhooks"]:
        (by_name,) = [e for e in webhook["namespaceSelector"]["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"]
        assert by_name["values"][0] == OTHER_NAMESPACE
    subjects = [s for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in d["subjects"]]
    assert subjects and {s["namespace"] for s in subjects} == {OTHER_NAMESPACE}
    assert the(docs, "ValidatingAdmissionPolicyBinding", GUARD_NAME)["spec"]["paramRef"]["namespace"] == OTHER_NAMESPACE
    assert the(docs, "Certificate")["spec"]["dnsNames"][0] == f"egress-placer-webhook.{OTHER_NAMESPACE}.svc"
    assert the(docs, "MutatingWebhookConfiguration")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{OTHER_NAMESPACE}/egress-placer-webhook"
    assert the(docs, "ServiceMonitor")["spec"]["namespaceSelector"] == {"matchNames": [OTHER_NAMESPACE]}


def test_the_literal_namespace_is_in_no_template() -> None:
    """Only the helper names the namespace; no template writes egress-placer as one."""
    for template_file in (CHART_DIR / "templates").glob("*"):
        text = template_file.read_text()
        for needle in ("namespace: egress-placer", "serviceaccount:egress-placer:", "egress-placer.svc", "egress-placer/egress-placer-webhook"):
            assert needle not in text, f"{template_file.name}: {needle}"


# -- the values of Kyverno's and Kueue's charts, each on and off -------------------------------------------
DIGEST = "sha256:" + "ab" * 32


def pdb(docs: Iterable[Mapping[str, Any]]) -> Any:
    found = by_kind(docs, "PodDisruptionBudget")
    return found[0]["spec"] if found else None


NEW_VALUES: list[tuple[str, dict[str, Any], Callable[[list[dict[str, Any]]], Any], Any]] = [
    ("image.digest", {"image": {"repository": "ghcr.io/x/egress-placer", "tag": "0.2.0", "digest": DIGEST}},
     lambda d: container(d)["image"], f"ghcr.io/x/egress-placer@{DIGEST}"),
    ("imagePullSecrets", {"imagePullSecrets": [{"name": "registry"}]}, lambda d: pod_spec(d)["imagePullSecrets"], [{"name": "registry"}]),
    ("affinity", {"affinity": {"podAntiAffinity": None, "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "platform", "operator": "Exists"}]}]}}}},
     lambda d: list(pod_spec(d)["affinity"]), ["nodeAffinity"]),
    ("affinity.off", {"affinity": None}, lambda d: "affinity" in pod_spec(d), False),
    ("topologySpreadConstraints", {"topologySpreadConstraints": [{"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]},
     lambda d: pod_spec(d)["topologySpreadConstraints"], [{"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]),
    ("topologySpreadConstraints.off", {"topologySpreadConstraints": []}, lambda d: "topologySpreadConstraints" in pod_spec(d), False),
    ("podDisruptionBudget.minAvailable", {"podDisruptionBudget": {"minAvailable": 2}, "replicas": 3}, pdb,
     {"minAvailable": 2, "selector": {"matchLabels": {"app.kubernetes.io/name": "egress-placer", "app.kubernetes.io/component": "controller"}}}),
    ("podDisruptionBudget.maxUnavailable", {"podDisruptionBudget": {"maxUnavailable": "50%"}}, lambda d: sorted(pdb(d)), ["maxUnavailable", "selector"]),
    ("podDisruptionBudget.enabled.off", {"podDisruptionBudget": {"enabled": False}}, pdb, None),
    ("startupProbe", {"startupProbe": {"failureThreshold": 120}}, lambda d: container(d)["startupProbe"]["failureThreshold"], 120),
    ("livenessProbe.off", {"livenessProbe": None}, lambda d: "livenessProbe" in container(d), False),
    ("readinessProbe", {"readinessProbe": {"periodSeconds": 2}}, lambda d: (container(d)["readinessProbe"]["periodSeconds"],
                                                                            container(d)["readinessProbe"]["httpGet"]["path"]), (2, "/readyz")),
    ("podSecurityContext", {"podSecurityContext": {"fsGroup": 65532}}, lambda d: pod_spec(d)["securityContext"]["fsGroup"], 65532),
    ("securityContext", {"securityContext": {"runAsUser": 1001, "runAsGroup": 1001}},
     lambda d: (container(d)["securityContext"]["runAsUser"], container(d)["securityContext"]["readOnlyRootFilesystem"]), (1001, True)),
    ("serviceAccount.annotations", {"serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}}},
     lambda d: the(d, "ServiceAccount")["metadata"]["annotations"], {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}),
    ("webhook.failurePolicy", {"webhook": {"failurePolicy": "Fail"}},
     lambda d: {w["failurePolicy"] for w in the(d, "MutatingWebhookConfiguration")["webhooks"]}, {"Fail"}),
    ("webhook.timeoutSeconds", {"webhook": {"timeoutSeconds": 10}},
     lambda d: {w["timeoutSeconds"] for w in the(d, "MutatingWebhookConfiguration")["webhooks"]}, {10}),
    ("webhook.excludeNamespaces", {"webhook": {"excludeNamespaces": ["legacy-ci", "kube-system"]}},
     lambda d: [[e["values"] for e in w["namespaceSelector"]["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"][0]
                for w in the(d, "MutatingWebhookConfiguration")["webhooks"]],
     [["egress-placer", "kube-system", "legacy-ci"]] * 3 + [["egress-placer", "legacy-ci", "kube-system"]]),
    ("webhook.namespaceSelector", {"webhook": {"namespaceSelector": {"matchExpressions": [{"key": "ci.example.com/tekton", "operator": "Exists"}]}}},
     lambda d: {json.dumps(w["namespaceSelector"]["matchExpressions"][-1]) for w in the(d, "MutatingWebhookConfiguration")["webhooks"]},
     {json.dumps({"key": "ci.example.com/tekton", "operator": "Exists"})}),
    ("serviceMonitor.namespace", {"serviceMonitor": {"enabled": True, "namespace": "monitoring"}},
     lambda d: (the(d, "ServiceMonitor")["metadata"]["namespace"], the(d, "ServiceMonitor")["spec"]["namespaceSelector"]),
     ("monitoring", {"matchNames": ["egress-placer"]})),
    ("serviceMonitor.tlsConfig", {"serviceMonitor": {"enabled": True, "secure": True, "tlsConfig": {"insecureSkipVerify": False, "serverName": "x"}}},
     lambda d: {k: the(d, "ServiceMonitor")["spec"]["endpoints"][0].get(k) for k in ("scheme", "tlsConfig")},
     {"scheme": "https", "tlsConfig": {"insecureSkipVerify": False, "serverName": "x"}}),
    ("crds.install.off", {"crds": {"install": False}}, lambda d: by_kind(d, "CustomResourceDefinition"), []),
    ("crds.keep.off", {"crds": {"keep": False}},
     lambda d: [c["metadata"].get("annotations") for c in by_kind(d, "CustomResourceDefinition")], [None, None]),
]


@pytest.mark.parametrize("values, field, expected", [(v, f, e) for _, v, f, e in NEW_VALUES], ids=[n for n, *_ in NEW_VALUES])
def test_each_new_value_renders_its_field(helm: Path, values: dict[str, Any], field: Callable[[list[dict[str, Any]]], Any], expected: Any) -> None:
    assert field(template(helm, values)) == expected


def test_the_new_values_off_render_the_defaults(default_render: list[dict[str, Any]]) -> None:
    """Their defaults are today's fields: the webhooks fail open in 3 s, one replica of two kept, the image by tag."""
    spec, c = pod_spec(default_render), container(default_render)
    assert "imagePullSecrets" not in spec and "@" not in c["image"]
    assert pdb(default_render)["minAvailable"] == 1 and "maxUnavailable" not in pdb(default_render)
    assert {(w["failurePolicy"], w["timeoutSeconds"]) for w in the(default_render, "MutatingWebhookConfiguration")["webhooks"]} == {("Ignore", 3)}
    assert "annotations" not in the(default_render, "ServiceAccount")["metadata"]
    assert {"startupProbe", "livenessProbe", "readinessProbe", "securityContext"} <= set(c)
    assert [t["topologyKey"] for t in spec["topologySpreadConstraints"]] == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    crds = by_kind(default_render, "CustomResourceDefinition")
    assert len(crds) == 2 and all(c["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"} for c in crds)


@pytest.mark.parametrize("namespace", [RELEASE_NAMESPACE, OTHER_NAMESPACE])
def test_helm_lint_passes_strictly_with_every_new_value(helm: Path, tmp_path: Path, namespace: str) -> None:
    values = merged(*(v for name, v, _, _ in NEW_VALUES if not name.endswith(".off")))
    (tmp_path / "values.json").write_text(json.dumps(values))
    out = run_helm(helm, "lint", "--strict", str(CHART_DIR), "--namespace", namespace, "--values", str(tmp_path / "values.json"))
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


@pytest.mark.parametrize(
    "values, named",
    [
        ({"image": {"digest": "latest"}}, "'/image/digest'"),
        ({"webhook": {"failurePolicy": "Open"}}, "'/webhook/failurePolicy'"),
        ({"webhook": {"timeoutSeconds": 31}}, "'/webhook/timeoutSeconds'"),
        ({"webhook": {"excludeNamespaces": ["Not_A_Name"]}}, "'/webhook/excludeNamespaces/0'"),
        ({"webhook": {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}}, "operator"),
        ({"imagePullSecrets": ["registry"]}, "'/imagePullSecrets/0'"),
        ({"podDisruptionBudget": {"minAvailable": "one"}}, "'/podDisruptionBudget/minAvailable'"),
        ({"serviceAccount": {"name": "other"}}, "'name' not allowed"),
        ({"affinity": {"podAntiAfinity": {}}}, "'podAntiAfinity' not allowed"),
        ({"serviceMonitor": {"namespace": "Monitoring"}}, "'/serviceMonitor/namespace'"),
        ({"prometheus": {"auth": {"existingSecret": "Prometheus_Auth"}}}, "'/prometheus/auth/existingSecret'"),
        ({"prometheus": {"auth": {"existingSecret": "p", "tokenKey": "a/token"}}}, "'/prometheus/auth/tokenKey'"),
        ({"prometheus": {"auth": {"tokenFile": "/token"}}}, "'tokenFile' not allowed"),
        ({"prometheus": {"url": "http://prometheus:9090"}}, "'url' not allowed"),
        ({"extraVolumes": {"name": "x"}}, "'/extraVolumes'"),
        ({"extraVolumes": [{"emptyDir": {}}]}, "'/extraVolumes/0'"),
        ({"extraVolumeMounts": [{"name": "x"}]}, "'/extraVolumeMounts/0'"),
        ({"extraVolumeMounts": [{"name": "x", "mountPath": "relative"}]}, "'/extraVolumeMounts/0/mountPath'"),
    ],
)
def test_the_schema_refuses_wrong_new_values(helm: Path, values: dict[str, Any], named: str) -> None:
    with pytest.raises(ClusterError, match="values don't meet the specifications of the schema") as refused:
        template(helm, values)
    assert named in str(refused.value)


# -- Prometheus' credentials (docs/suggest.md, "Prometheus behind auth"), and volumes of one's own ---------
AUTH_DIR = "/etc/egress-placer/prometheus"
SECRET = "prometheus-auth"
AUTH_CASES: dict[str, tuple[dict[str, Any], dict[str, str], list[dict[str, str]]]] = {
    # values.prometheus.auth: (the settings the chart sets, the Secret's keys projected as files)
    "token+ca": ({"existingSecret": SECRET, "tokenKey": "bearer", "caKey": "ca.crt"},
                 {"EGRESS_PLACER_PROMETHEUS_TOKEN_FILE": f"{AUTH_DIR}/token", "EGRESS_PLACER_PROMETHEUS_CA_FILE": f"{AUTH_DIR}/ca.crt"},
                 [{"key": "bearer", "path": "token"}, {"key": "ca.crt", "path": "ca.crt"}]),
    "basic": ({"existingSecret": SECRET, "username": "egress-placer", "passwordKey": "password"},
              {"EGRESS_PLACER_PROMETHEUS_USERNAME": "egress-placer", "EGRESS_PLACER_PROMETHEUS_PASSWORD_FILE": f"{AUTH_DIR}/password"},
              [{"key": "password", "path": "password"}]),
    "ca-only": ({"existingSecret": SECRET, "caKey": "tls.ca"}, {"EGRESS_PLACER_PROMETHEUS_CA_FILE": f"{AUTH_DIR}/ca.crt"},
                [{"key": "tls.ca", "path": "ca.crt"}]),
}


def volume(docs: Iterable[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    return next((v for v in pod_spec(docs)["volumes"] if v["name"] == name), None)


def mount(docs: Iterable[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    return next((m for m in container(docs)["volumeMounts"] if m["name"] == name), None)


@pytest.mark.parametrize("auth, settings, items", AUTH_CASES.values(), ids=AUTH_CASES.keys())
def test_prometheus_auth_mounts_the_secret_read_only_and_names_its_files(
    helm: Path, default_render: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
    auth: dict[str, Any], settings: dict[str, str], items: list[dict[str, str]],
) -> None:
    docs = template(helm, {"prometheus": {"auth": auth}})
    assert env(docs) == {**env(default_render), **settings}
    assert volume(docs, SECRET) == {"name": SECRET, "secret": {"secretName": SECRET, "items": items, "defaultMode": 0o444}}
    assert mount(docs, SECRET) == {"name": SECRET, "mountPath": AUTH_DIR, "readOnly": True}
    assert "subPath" not in json.dumps(container(docs)["volumeMounts"])  # a rotated Secret reaches the files
    # ... and the controller takes that combination (its settings refuse what the template refuses)
    for name, value in settings_env(docs).items():
        monkeypatch.setenv(name, value)
    loaded = load_settings()
    assert {env_name(f): getattr(loaded, f) for f in ("prometheus_token_file", "prometheus_username", "prometheus_password_file",
                                                      "prometheus_ca_file") if getattr(loaded, f)} == settings


def test_extra_env_may_replace_a_prometheus_auth_setting(helm: Path) -> None:
    """As for the chart's other settings: e.g. a projected ServiceAccount token of extraVolumes, the CA from the Secret."""
    token = "/var/run/prometheus/token"
    docs = template(helm, {"prometheus": {"auth": {"existingSecret": SECRET, "tokenKey": "token", "caKey": "ca.crt"}},
                           "extraEnv": {"EGRESS_PLACER_PROMETHEUS_TOKEN_FILE": token}})
    assert env(docs)["EGRESS_PLACER_PROMETHEUS_TOKEN_FILE"] == token
    assert [e["name"] for e in container(docs)["env"]].count("EGRESS_PLACER_PROMETHEUS_TOKEN_FILE") == 1


BASIC = {"existingSecret": SECRET, "username": "u", "passwordKey": "password"}
BOTH = "a bearer token (prometheus.auth.tokenKey) or basic auth (prometheus.auth.username and passwordKey), not both"
HALF = "basic auth needs both prometheus.auth.username and prometheus.auth.passwordKey"


@pytest.mark.parametrize(
    "values, message",
    [
        ({"prometheus": {"auth": {**BASIC, "tokenKey": "token"}}}, BOTH),
        ({"prometheus": {"auth": {"existingSecret": SECRET, "tokenKey": "token", "username": "u"}}}, BOTH),
        ({"prometheus": {"auth": {"existingSecret": SECRET, "tokenKey": "token"}}, "extraEnv": {"EGRESS_PLACER_PROMETHEUS_USERNAME": "u"}}, BOTH),
        ({"prometheus": {"auth": BASIC}, "extraEnv": {"EGRESS_PLACER_PROMETHEUS_TOKEN_FILE": "/token"}}, BOTH),
        ({"prometheus": {"auth": {"existingSecret": SECRET, "username": "u"}}}, HALF),
        ({"prometheus": {"auth": {"existingSecret": SECRET, "passwordKey": "password"}}}, HALF),
        ({"extraEnv": {"EGRESS_PLACER_PROMETHEUS_USERNAME": "u"}}, HALF),
        ({"prometheus": {"auth": {"tokenKey": "token"}}}, "are keys of prometheus.auth.existingSecret: set it too"),
        ({"prometheus": {"auth": {"existingSecret": SECRET}}}, f"prometheus.auth.existingSecret {SECRET}: name its keys"),
        ({"extraVolumes": [{"name": "tmp", "emptyDir": {}}]}, "extraVolumes: tmp is the name of one of the chart's volumes"),
        ({"extraVolumes": [{"name": SECRET, "emptyDir": {}}]}, f"extraVolumes: {SECRET} is the name of one of the chart's volumes"),
    ],
    ids=["token+basic", "token+username", "token+username-in-extraEnv", "basic+token-in-extraEnv", "username-only", "password-only",
         "username-only-in-extraEnv", "keys-without-secret", "secret-without-keys", "extra-volume-tmp", "extra-volume-prometheus-auth"],
)
def test_prometheus_auth_the_controller_would_refuse_fails_the_render(helm: Path, values: dict[str, Any], message: str) -> None:
    with pytest.raises(ClusterError, match="execution error") as refused:
        template(helm, values)
    assert message in str(refused.value)


def test_extra_volumes_and_mounts_follow_the_chart_s(helm: Path) -> None:
    volumes = [{"name": "prometheus-token", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "audience": "prometheus"}}]}}]
    mounts = [{"name": "prometheus-token", "mountPath": "/var/run/prometheus", "readOnly": True}]
    docs = template(helm, {"extraVolumes": volumes, "extraVolumeMounts": mounts, "certificate": {"mode": "cert-manager"},
                           "prometheus": {"auth": {"existingSecret": SECRET, "caKey": "ca.crt"}}})
    assert [v["name"] for v in pod_spec(docs)["volumes"]] == ["serving-cert", "tmp", SECRET, "prometheus-token"]
    assert pod_spec(docs)["volumes"][-1] == volumes[0]
    assert [m["name"] for m in container(docs)["volumeMounts"]] == ["serving-cert", "tmp", SECRET, "prometheus-token"]
    assert container(docs)["volumeMounts"][-1] == mounts[0]


def test_without_prometheus_auth_and_extra_volumes_the_pod_is_k8s_s(default_render: list[dict[str, Any]]) -> None:
    """The defaults add nothing: no Secret mounted, no EGRESS_PLACER_PROMETHEUS_* setting."""
    assert [v["name"] for v in pod_spec(default_render)["volumes"]] == ["tmp"]
    assert container(default_render)["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert not [name for name in env(default_render) if name.startswith("EGRESS_PLACER_PROMETHEUS_")]
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert defaults["prometheus"] == {"auth": dict.fromkeys(("existingSecret", "tokenKey", "username", "passwordKey", "caKey"), "")}
    assert (defaults["extraVolumes"], defaults["extraVolumeMounts"]) == ([], [])


def test_namespace_override_replaces_the_release_namespace(helm: Path) -> None:
    """Kyverno's namespaceOverride: a 0.1.0 release recorded in `default` keeps its objects in egress-placer."""
    docs = template(helm, {"namespaceOverride": OTHER_NAMESPACE}, namespace="default")
    assert {d["metadata"]["namespace"] for d in docs if "namespace" in d["metadata"]} - {"tekton-pipelines", "tekton-pipelines-resolvers", "kube-system"} \
        == {OTHER_NAMESPACE}
    assert the(docs, "Namespace")["metadata"]["name"] == OTHER_NAMESPACE
    assert f"system:serviceaccount:{OTHER_NAMESPACE}:egress-placer" in json.dumps(the(docs, "ValidatingAdmissionPolicy", RUN_GUARD_NAME))
    assert compare(template(helm), template(helm, {"namespaceOverride": RELEASE_NAMESPACE}, namespace="default")) == []


def test_the_runbook_base_is_a_value(helm: Path) -> None:
    """Issue 28: runbook_url on a base of the user's choosing (their own copy of docs/troubleshooting.md)."""
    base = "https://wiki.example.com/egress-placer/alerts"
    rule = the(template(helm, {"prometheusRule": {"enabled": True, "runbookBaseURL": base}}), "PrometheusRule")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts and all(r["annotations"]["runbook_url"] == f"{base}#{r['alert'].lower()}" for r in alerts)



def test_the_crds_template_checks_stored_versions_against_the_versions_it_serves() -> None:
    """The pre-upgrade check (docs/pools-api.md, "Deprecation policy", point 3): for each CRD, a lookup and a
    fail on a stored version the chart does not serve, its list the served versions (generated, so the chart
    that drops v1alpha1 checks for it with nothing more to write). tests/e2e/test_helm_install.py runs it."""
    from devplacer.generate import stored_versions_check
    from controller.core.pools_v1beta1 import served_crds

    text = (Path(__file__).resolve().parents[2] / "charts/egress-placer/templates/crds.yaml").read_text()
    for crd in served_crds():
        check = stored_versions_check(crd)
        assert check in text
        assert f'"{crd["metadata"]["name"]}" }}}}' in check and '(has . (list "v1alpha1" "v1beta1"))' in check
        assert "`egress-placer migrate-storage`" in check
    later = {"metadata": {"name": "egresspools.egress-placer.io"}, "spec": {"versions": [{"name": "v1beta1"}]}}
    assert '(has . (list "v1beta1"))' in stored_versions_check(later)


# -- kubeVersion: the supported range ---------------------------------------------------------------------
def test_the_chart_installs_on_the_proven_kubernetes_minors_only(helm: Path) -> None:
    """Chart.yaml's kubeVersion (written by `make generate` from docs/compatibility.json): every proven minor, its
    providers' versions too (a pre-release part: `-eks-...`, `-gke...`); not the minor below, nor the one above,
    nor that one's pre-releases."""
    minors = supported_range().kubernetes_minors
    for major, minor in minors:
        for version in (f"v{major}.{minor}.0", f"v{major}.{minor}.4-eks-abc123", f"v{major}.{minor}.9-gke.100"):
            run_helm(helm, "template", "egress-placer", str(CHART_DIR), "--kube-version", version)
    (major, lowest), (_, highest) = minors[0], minors[-1]
    for version in (f"v{major}.{lowest - 1}.9", f"v{major}.{highest + 1}.0", f"v{major}.{highest + 1}.0-alpha.1"):
        with pytest.raises(ClusterError, match="incompatible with Kubernetes"):
            run_helm(helm, "template", "egress-placer", str(CHART_DIR), "--kube-version", version)
