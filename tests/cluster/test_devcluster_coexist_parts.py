"""Checks, without a cluster, of the optional components Karpenter, Kueue and tekton-kueue (issue #25): their
pins, toolchain and cache keys, what `tekton-kueue` implies, the NodePools `devcluster.karpenter` writes, and the
webhook configurations `devcluster.kueue` registers by URL."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from devcluster import build, karpenter, kueue
from devcluster.__main__ import parser
from devcluster.cluster import KWOK_NODE_SELECTOR, UP_OPTIONAL, Cluster


@pytest.mark.parametrize(
    ("name", "pin", "version"),
    [
        ("karpenter", "sigs.k8s.io/karpenter", "v1.15.0"),
        ("kueue", "sigs.k8s.io/kueue", "v0.14.5"),
        ("tekton-kueue", "github.com/konflux-ci/tekton-kueue", "v0.3.0"),
    ],
)
def test_the_coexistence_components_are_optional_and_pinned(name: str, pin: str, version: str) -> None:
    component = build.OPTIONAL_COMPONENTS[name]
    assert component.pin == pin and build.pinned_version(component) == version
    assert component.module not in {c.module for c in build.COMPONENTS}  # never in the core cache key
    assert name in UP_OPTIONAL
    assert build.optional_key(component).startswith(f"{name}-{version}_")


def test_tekton_kueue_uses_the_kueue_it_pins_and_its_own_replace() -> None:
    go_mod = (build.TOOLS_DIR / "tekton-kueue" / "go.mod").read_text()
    assert build.required_version(build.TEKTON_KUEUE, "sigs.k8s.io/kueue") == build.pinned_version(build.KUEUE)
    assert "replace github.com/google/cel-go => github.com/google/cel-go v0.22.0" in go_mod


def test_karpenter_builds_with_the_toolchain_its_go_mod_asks_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """GOTOOLCHAIN for Karpenter's build only, and that toolchain (not the local Go) names its cache key."""
    assert build.KARPENTER.toolchain == "go1.26.9"
    assert "\ngo 1.26.9\n" in (build.TOOLS_DIR / "karpenter" / "go.mod").read_text()
    assert build._go_env(build.KARPENTER)["GOTOOLCHAIN"] == "go1.26.9"
    assert build._go_env(build.KUEUE)["GOTOOLCHAIN"] == build._go_env()["GOTOOLCHAIN"] == "local"
    seen: list[str] = []
    monkeypatch.setattr(build, "go_version", lambda: "go1.26.8")
    monkeypatch.setattr(build, "_optional_complete", lambda root, component: seen.append(root.name) or False)
    assert build.find_optional("karpenter") is None
    assert seen == [f"{build.optional_key(build.KARPENTER)}_go1.26.9"]


def test_patches_bind_loopback_and_change_only_their_own_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    operator = (build.TOOLS_DIR / "karpenter" / "_patches" / "karpenter-operator" / "operator.go").read_text()
    assert 'fmt.Sprintf("127.0.0.1:%d", options.FromContext(ctx).MetricsPort)' in operator
    assert 'fmt.Sprintf("127.0.0.1:%d", options.FromContext(ctx).HealthProbePort)' in operator
    assert '":%d"' not in operator
    tools = tmp_path / "tools"
    shutil.copytree(build.TOOLS_DIR, tools)
    monkeypatch.setattr(build, "TOOLS_DIR", tools)
    keys = {c.module: build.optional_key(c) for c in (build.KARPENTER, build.KUEUE, build.TEKTON_KUEUE)}
    core = build.key_prefix()
    with open(tools / "kueue" / "_patches" / "kueue-cmd" / "main.go", "a") as main_go:
        main_go.write("\n// changed\n")
    assert build.key_prefix() == core
    assert build.optional_key(build.KUEUE) != keys["kueue"]
    assert {c.module: build.optional_key(c) for c in (build.KARPENTER, build.TEKTON_KUEUE)} == {
        "karpenter": keys["karpenter"], "tekton-kueue": keys["tekton-kueue"]
    }


def test_tekton_kueue_implies_kueue_for_build_and_up(tmp_path: Path) -> None:
    assert build.with_implied(["tekton-kueue"]) == ("kueue", "tekton-kueue")
    assert build.with_implied(["kueue", "tekton-kueue", "karpenter"]) == ("kueue", "tekton-kueue", "karpenter")
    assert Cluster(tmp_path, optional=("tekton-kueue",)).optional == ("kueue", "tekton-kueue")
    args = parser({}).parse_args(["up", "--dir", str(tmp_path), "--with", "karpenter", "--with", "tekton-kueue"])
    assert args.optional == ["karpenter", "tekton-kueue"]
    args = parser({}).parse_args(["build", "--with", "karpenter", "--with", "kueue", "--with", "tekton-kueue"])
    assert args.optional == ["karpenter", "kueue", "tekton-kueue"]


def test_a_nodepool_carries_the_pools_labels_and_what_kwok_selects_on() -> None:
    taint = {"key": "egress-placer.io/pool", "value": "overseas", "effect": "NoSchedule"}
    pool = karpenter.node_pool("egress", {"egress-placer.io/pool": "overseas"}, kwok_selector=KWOK_NODE_SELECTOR,
                               taints=[taint], cpu_limit="64")
    template = pool["spec"]["template"]
    assert template["metadata"]["labels"] == {"type": "kwok", "egress-placer.io/pool": "overseas"}
    assert template["spec"]["taints"] == [taint]
    assert template["spec"]["nodeClassRef"] == {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                                                "name": karpenter.NODE_CLASS}
    assert pool["spec"]["limits"] == {"cpu": "64"}
    assert karpenter.kwok_labels("a=b, c==d") == {"a": "b", "c": "d"}
    with pytest.raises(ValueError, match="only equality"):
        karpenter.kwok_labels("type!=kwok")


WEBHOOKS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mjob.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}}
  rules: [{apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}]
- name: mworkload.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-kueue-x-k8s-io-v1beta1-workload}}
  rules: [{apiGroups: [kueue.x-k8s.io], apiVersions: [v1beta1], operations: [CREATE], resources: [workloads]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: validating-webhook-configuration}
webhooks:
- name: vpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate--v1-pod}}
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
"""


def test_webhooks_are_registered_by_url_renamed_and_kueues_limited_to_its_own_group() -> None:
    kept = kueue.by_url(WEBHOOKS, 4443, "Q0E=", "kueue", keep=kueue.KUEUE_GROUP)
    assert [(c["kind"], c["metadata"]["name"]) for c in kept] == [
        ("MutatingWebhookConfiguration", "kueue-mutating-webhook-configuration")
    ]
    assert kept[0]["webhooks"] == [{
        "name": "mworkload.kb.io",
        "clientConfig": {"url": "https://127.0.0.1:4443/mutate-kueue-x-k8s-io-v1beta1-workload", "caBundle": "Q0E="},
        "rules": [{"apiGroups": ["kueue.x-k8s.io"], "apiVersions": ["v1beta1"], "operations": ["CREATE"],
                   "resources": ["workloads"]}],
    }]
    every = kueue.by_url(WEBHOOKS, 4443, "Q0E=", "tekton-kueue")
    assert [len(c["webhooks"]) for c in every] == [2, 1]
    assert all("service" not in w["clientConfig"] for c in every for w in c["webhooks"])


def test_kueue_is_configured_for_pipelineruns_on_loopback_without_its_own_certificates(tmp_path: Path) -> None:
    ports = {"kueue-webhook": 1, "kueue-metrics": 2, "kueue-probes": 3}
    config = kueue.configuration(ports, tmp_path)
    assert config["integrations"]["externalFrameworks"] == ["PipelineRun.v1.tekton.dev"]
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 1, "certDir": str(tmp_path)}
    assert config["metrics"]["bindAddress"] == "127.0.0.1:2" and config["health"]["healthProbeBindAddress"] == "127.0.0.1:3"
    assert "--feature-gates=VisibilityOnDemand=false" in kueue.kueue_argv(tmp_path, tmp_path / "c.yaml")
    configmap = kueue.tekton_kueue_config(cel=['resource("egress-placer.io/overseas", 1)'])
    assert yaml.safe_load(configmap["data"]["config.yaml"]) == {
        "queueName": "pipelines-queue", "cel": {"expressions": ['resource("egress-placer.io/overseas", 1)']}
    }
