"""Checks of the devcluster's parts that need no cluster: certificates and the identities they
carry, the build cache key, KWOK stage rendering, fake node manifests, and stopping or reaping
processes by pid (with pid-reuse protection)."""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from devcluster import build, certs, tekton_webhook
from devcluster.cluster import (
    EGRESS_POOL,
    EGRESS_POOL_LABEL,
    Cluster,
    node_manifest,
    reap_stale_clusters,
    render_stages,
    served_storage_version_only,
)
from devcluster.process import ProcessRecord, free_port, is_alive, listens, spawn, start_time_of, stop
from tests.waiting import wait_for


@pytest.mark.parametrize(
    ("user", "groups"),
    [
        (
            "system:serviceaccount:ns:sa",
            ("system:serviceaccounts", "system:serviceaccounts:ns", "system:authenticated"),
        ),
        (
            "system:serviceaccount:egress-placer:controller",
            ("system:serviceaccounts", "system:serviceaccounts:egress-placer", "system:authenticated"),
        ),
        ("system:serviceaccount:ns", ("system:authenticated",)),
        ("system:serviceaccount::sa", ("system:authenticated",)),
        ("alice", ("system:authenticated",)),
    ],
)
def test_service_account_groups(user: str, groups: tuple[str, ...]) -> None:
    assert certs.service_account_groups(user) == groups


@pytest.mark.parametrize(
    ("user", "groups"),
    [
        ("system:serviceaccount:ns:sa", ("system:serviceaccounts", "system:serviceaccounts:ns")),
        ("admin", ("system:masters",)),
    ],
)
def test_client_cert_names_the_user_and_groups_and_is_signed_by_the_ca(
    tmp_path: Path, user: str, groups: tuple[str, ...]
) -> None:
    pki = certs.create_pki(tmp_path / "pki")
    issued = certs.issue_client_cert(pki, user, groups)

    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == [user]
    assert tuple(a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)) == groups


def test_serving_cert_covers_loopback(tmp_path: Path) -> None:
    pki = certs.create_pki(tmp_path / "pki")
    cert = x509.load_pem_x509_certificate(pki.serving_cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert oct(pki.ca_key.stat().st_mode & 0o777) == "0o600"


def test_kubeconfig_embeds_server_and_credentials(tmp_path: Path) -> None:
    pki = certs.create_pki(tmp_path / "pki")
    issued = certs.issue_client_cert(pki, "bob", ())
    path = certs.write_kubeconfig(tmp_path / "kc", "https://127.0.0.1:6443", pki, "bob", issued)

    config = yaml.safe_load(path.read_text())
    assert config["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert config["users"][0]["user"]["client-certificate-data"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_kubernetes_ldflags_stamp_the_version() -> None:
    flags = build.kubernetes_ldflags("v1.37.2")
    for expected in ("version.gitVersion=v1.37.2", "version.gitMajor=1", "version.gitMinor=37"):
        assert f"k8s.io/component-base/{expected}" in flags
        assert f"k8s.io/client-go/pkg/{expected}" in flags


@pytest.mark.parametrize(
    ("package", "name"),
    [
        ("k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
        ("go.etcd.io/etcd/server/v3", "server"),
        ("egress-placer/devcluster/tools/tekton/controller", "controller"),
    ],
)
def test_go_output_name(package: str, name: str) -> None:
    assert build._go_output_name(package) == name


def test_cache_key_changes_with_any_tool_module_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "tools"
    shutil.copytree(build.TOOLS_DIR, tools)
    monkeypatch.setattr(build, "TOOLS_DIR", tools)
    before = build.key_prefix()
    assert build.key_prefix() == before
    with open(tools / "kwok" / "go.sum", "a") as go_sum:
        go_sum.write("example.com/x v1.0.0 h1:AAAA\n")
    assert build.key_prefix() != before


def test_patched_modules_replace_their_originals_in_a_copy_of_go_mod(tmp_path: Path) -> None:
    """KWOK is built against copies of the modules its patches touch; tools/kwok and the cache stay as they were."""
    kwok = next(c for c in build.COMPONENTS if c.module == "kwok")
    go_mod_before = (build.TOOLS_DIR / "kwok" / "go.mod").read_text()
    assert build._patched_modfile(kwok, tmp_path) == [f"-modfile={tmp_path / 'go.mod'}"]
    replaced = subprocess.run(
        ["go", "mod", "edit", "-json", str(tmp_path / "go.mod")], capture_output=True, text=True, check=True
    )
    replacements = {r["Old"]["Path"]: Path(r["New"]["Path"]) for r in json.loads(replaced.stdout)["Replace"]}
    assert set(replacements) == {"github.com/wzshiming/easycel", "sigs.k8s.io/kwok"}
    for directory, package in kwok.patches.items():
        module = next(m for m in replacements if package.startswith(m))
        copy_dir = replacements[module] / package.removeprefix(module).lstrip("/")
        for patched in (build.TOOLS_DIR / "kwok" / directory).glob("*.go"):
            assert (copy_dir / patched.name).read_text() == patched.read_text()
    assert (build.TOOLS_DIR / "kwok" / "go.mod").read_text() == go_mod_before
    assert (tmp_path / "go.sum").read_text() == (build.TOOLS_DIR / "kwok" / "go.sum").read_text()


def test_cache_root_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGRESS_PLACER_CACHE", str(tmp_path))
    assert build.cache_root() == tmp_path / "devcluster"


@pytest.mark.parametrize("seconds", [0.0, 1.5, 30.0])
def test_rendered_stages_set_the_run_time_of_tekton_pods(seconds: float) -> None:
    stages = {s["metadata"]["name"]: s for s in yaml.safe_load_all(render_stages(seconds))}
    tekton = stages["tekton-pod-complete"]
    assert tekton["spec"]["delay"]["durationMilliseconds"] == int(seconds * 1000)
    expressions = {e["key"]: e.get("values") for e in tekton["spec"]["selector"]["matchExpressions"]}
    assert '.metadata.labels["tekton.dev/taskRun"]' in expressions  # Tekton's pods, whoever manages them
    assert '.metadata.labels["app.kubernetes.io/managed-by"]' not in expressions
    assert "exitCode: 0" in tekton["spec"]["next"]["statusTemplate"]
    assert "phase: Succeeded" in tekton["spec"]["next"]["statusTemplate"]
    assert {"node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-delete"} <= set(stages)


HONOUR_GRACE = '.metadata.labels["devcluster.egress-placer.io/honour-grace"]'  # the tests' label


def test_a_pod_labelled_to_honour_its_grace_is_removed_only_when_the_grace_is_over() -> None:
    stages = {s["metadata"]["name"]: s for s in yaml.safe_load_all(render_stages(1.5))}
    at_once, after_grace = stages["pod-delete"]["spec"], stages["pod-delete-after-grace"]["spec"]
    operators = {
        name: [(e["key"], e["operator"], e.get("values")) for e in spec["selector"]["matchExpressions"]]
        for name, spec in (("at-once", at_once), ("after-grace", after_grace))
    }
    # Every pod being deleted matches exactly one of the two by the label, except the value "never"
    # (a node that never confirms): no stage removes it, only a delete with grace 0 does.
    assert operators["at-once"] == [(".metadata.deletionTimestamp", "Exists", None), (HONOUR_GRACE, "DoesNotExist", None)]
    assert operators["after-grace"] == [
        (".metadata.deletionTimestamp", "Exists", None),
        (HONOUR_GRACE, "Exists", None),
        (HONOUR_GRACE, "NotIn", ["never"]),
    ]
    assert not [s for s in stages.values() if s["spec"]["resourceRef"]["kind"] == "Pod" and s["spec"]["next"].get("delete")
                and s["metadata"]["name"] not in ("pod-delete", "pod-delete-after-grace")]
    assert "delay" not in at_once and at_once["next"] == {"delete": True}
    # KWOK reads a timestamp from durationFrom as "until then": the deletion's grace, whatever it is.
    assert after_grace["delay"]["durationFrom"] == {"expressionFrom": ".metadata.deletionTimestamp"}
    assert after_grace["next"] == {"delete": True}


@pytest.mark.parametrize(
    ("name", "labels", "egress"),
    [("node-1", {}, False), ("egress-1", {EGRESS_POOL_LABEL: EGRESS_POOL}, True)],
)
def test_node_manifest(name: str, labels: dict[str, str], egress: bool) -> None:
    node = node_manifest(name, labels)
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == name
    assert node["metadata"]["labels"]["type"] == "kwok"
    assert (node["metadata"]["labels"].get(EGRESS_POOL_LABEL) == EGRESS_POOL) is egress
    assert node["status"]["allocatable"]["pods"] == "110"
    assert "taints" not in node["spec"]


def _sleeper(tmp_path: Path, ignore_sigterm: bool = False) -> ProcessRecord:
    code = "import signal, time\n"
    if ignore_sigterm:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    # Part of the scenario: the sleeper is a process that runs until it is stopped.
    code += "print('ready', flush=True)\ntime.sleep(600)\n"
    record = spawn("sleeper", [sys.executable, "-c", code], tmp_path / "sleeper.log")
    # "ready": its signal handler is in place
    wait_for("the sleeper to start", lambda: "ready" in (tmp_path / "sleeper.log").read_text(), timeout=30, interval=0.02)
    return record


@pytest.mark.parametrize("ignore_sigterm", [False, True], ids=["sigterm", "needs-sigkill"])
def test_stop_ends_the_process(tmp_path: Path, ignore_sigterm: bool) -> None:
    record = _sleeper(tmp_path, ignore_sigterm)
    assert record.alive()

    assert stop([record], timeout=0.5) == []
    assert not record.alive()


def test_a_reused_pid_is_not_the_recorded_process(tmp_path: Path) -> None:
    record = _sleeper(tmp_path)
    try:
        assert is_alive(record.pid, record.start_time)
        assert not is_alive(record.pid, record.start_time + 1)
        assert stop([ProcessRecord("other", record.pid, record.start_time + 1, [], "")]) == []
        assert record.alive()  # the mismatching record was never signalled
    finally:
        stop([record])


def test_reaping_downs_clusters_whose_owner_died(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGRESS_PLACER_CACHE", str(tmp_path / "cache"))
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    clusters = {}
    for label, owner_pid in (("orphaned", dead_owner.pid), ("owned", None)):
        cluster = Cluster(tmp_path / label, log=lambda _: None)
        with cluster._locked_state() as state:
            state["processes"] = []
        record = cluster.start_process("sleeper", ["sleep", "600"])
        owner = {"pid": owner_pid, "start_time": 0} if owner_pid else {"pid": 1, "start_time": start_time_of(1)}
        entry = build.cache_root() / "clusters" / f"{label}.json"
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(json.dumps({"dir": str(cluster.dir), "owner": owner}))
        clusters[label] = (record, entry)

    try:
        assert reap_stale_clusters(log=lambda _: None) == [(tmp_path / "orphaned").resolve()]
        assert not clusters["orphaned"][0].alive()
        assert not clusters["orphaned"][1].exists()
        assert clusters["owned"][0].alive()  # its owner (pid 1) is alive
    finally:
        stop([record for record, _ in clusters.values()])


def _crd(*versions: tuple[str, bool]) -> dict[str, Any]:
    return {
        "kind": "CustomResourceDefinition",
        "spec": {
            "versions": [{"name": name, "served": True, "storage": storage} for name, storage in versions],
            "conversion": {"strategy": "Webhook", "webhook": {"clientConfig": {"service": {"name": "tekton"}}}},
        },
    }


@pytest.mark.parametrize(
    ("versions", "served"),
    [
        ((("v1beta1", False), ("v1", True)), {"v1"}),
        ((("v1alpha1", False), ("v1beta1", True)), {"v1beta1"}),
    ],
)
def test_multi_version_crds_serve_only_their_storage_version(
    versions: tuple[tuple[str, bool], ...], served: set[str]
) -> None:
    crd = served_storage_version_only(_crd(*versions))
    assert {v["name"] for v in crd["spec"]["versions"] if v["served"]} == served
    assert crd["spec"]["conversion"] == {"strategy": "None"}


def test_single_version_crds_are_unchanged() -> None:
    crd = {"kind": "CustomResourceDefinition", "spec": {"versions": [{"name": "v1", "served": True, "storage": True}]}}
    assert served_storage_version_only(crd) == crd


def test_optional_components_leave_the_core_cache_key_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tekton's webhook has a tool module of its own: changing it changes its key, never the core's
    (so a warm core cache stays valid), and the core key never reads it."""
    tools = tmp_path / "tools"
    shutil.copytree(build.TOOLS_DIR, tools)
    monkeypatch.setattr(build, "TOOLS_DIR", tools)
    core, webhook = build.key_prefix(), build.optional_key(build.TEKTON_WEBHOOK)
    assert build.OPTIONAL_COMPONENTS["tekton-webhook"] is build.TEKTON_WEBHOOK
    assert build.TEKTON_WEBHOOK.module not in {c.module for c in build.COMPONENTS}
    with open(tools / "tekton-webhook" / "webhook" / "main.go", "a") as main_go:
        main_go.write("\n// changed\n")
    assert build.key_prefix() == core
    assert build.optional_key(build.TEKTON_WEBHOOK) != webhook
    assert build.optional_key(build.TEKTON_WEBHOOK).startswith("tekton-webhook-v1.15.0_")


def test_helm_is_stamped_as_its_makefile_stamps_it() -> None:
    """Its version, and the Kubernetes version `helm template` and `helm lint` assume: that of the client-go
    it requires (v0.37.x: 1.37), not Helm's built-in fallback 1.20."""
    flags = build.ldflags(build.HELM).split(" -X ")
    client_go = build.required_version(build.HELM, "k8s.io/client-go")
    minor = client_go.split(".")[1]
    assert f"helm.sh/helm/v3/internal/version.version={build.pinned_version(build.HELM)}" in flags
    for package in ("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"):
        assert {f"{package}.k8sVersionMajor=1", f"{package}.k8sVersionMinor={minor}"} <= set(flags)
    assert build.pinned_version(build.HELM).startswith("v3.")


def test_helm_has_a_cache_key_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A change of Helm's tool module changes Helm's key only: not the core's, not Prometheus'."""
    tools = tmp_path / "tools"
    shutil.copytree(build.TOOLS_DIR, tools)
    monkeypatch.setattr(build, "TOOLS_DIR", tools)
    core, helm, prometheus = build.key_prefix(), build.optional_key(build.HELM), build.optional_key(build.PROMETHEUS)
    assert build.OPTIONAL_COMPONENTS["helm"] is build.HELM
    with open(tools / "helm" / "go.mod", "a") as go_mod:
        go_mod.write("\n// changed\n")
    assert (build.key_prefix(), build.optional_key(build.PROMETHEUS)) == (core, prometheus)
    assert build.optional_key(build.HELM) != helm and build.optional_key(build.HELM).startswith("helm-v3.22.0_")


def test_the_prometheus_operator_crds_are_files_of_a_module_nothing_is_built_from() -> None:
    component = build.OPTIONAL_COMPONENTS["prometheus-operator-crds"]
    assert component.binaries == {} and len(component.module_files) == 2
    assert build.pinned_version(component) == "v0.85.0"  # a one-line `require` in its go.mod


def test_promtool_is_built_with_prometheus_from_the_same_pin() -> None:
    assert build.PROMETHEUS.binaries["promtool"] == "github.com/prometheus/prometheus/cmd/promtool"
    assert "github.com/prometheus/prometheus/cmd/promtool" in (build.TOOLS_DIR / "prometheus" / "go.mod").read_text()


def test_tekton_webhook_pins_the_same_tekton_as_the_controller() -> None:
    controller = next(c for c in build.COMPONENTS if c.module == "tekton")
    assert build.pinned_version(build.TEKTON_WEBHOOK) == build.pinned_version(controller)


WEBHOOKS_YAML = """
apiVersion: v1
kind: Secret
metadata: {name: webhook-certs, namespace: tekton-pipelines}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: webhook.pipeline.tekton.dev}
webhooks:
- name: webhook.pipeline.tekton.dev
  clientConfig: {service: {name: tekton-pipelines-webhook, namespace: tekton-pipelines}}
"""


def test_tekton_webhook_registration_names_the_loopback_port_on_an_external_name_service() -> None:
    docs = tekton_webhook.registration(WEBHOOKS_YAML, "tekton-pipelines", 40123)
    service, secret, mutating = docs
    assert service["spec"] == {"type": "ExternalName", "externalName": "localhost"}
    assert (service["metadata"]["name"], service["metadata"]["namespace"]) == (
        "tekton-pipelines-webhook", "tekton-pipelines",
    )
    assert secret["kind"] == "Secret" and "data" not in secret  # knative fills it
    assert mutating["webhooks"][0]["clientConfig"]["service"] == {
        "name": "tekton-pipelines-webhook", "namespace": "tekton-pipelines", "port": 40123,
    }


def test_tekton_webhook_registration_refuses_a_service_it_does_not_run() -> None:
    with pytest.raises(ValueError, match="unexpected service"):
        tekton_webhook.registration(WEBHOOKS_YAML.replace("tekton-pipelines-webhook", "other"), "tekton-pipelines", 1)


def test_crds_with_tekton_webhook_serve_every_version_and_convert_on_loopback() -> None:
    original = _crd(("v1beta1", False), ("v1", True))
    crd = tekton_webhook.with_conversion_webhook(original, "tekton-pipelines", 40123)
    assert [v["served"] for v in crd["spec"]["versions"]] == [True, True]
    assert crd["spec"]["conversion"]["strategy"] == "Webhook"
    assert crd["spec"]["conversion"]["webhook"]["clientConfig"] == {
        "service": {
            "name": "tekton-pipelines-webhook", "namespace": "tekton-pipelines", "path": "/resource-conversion",
            "port": 40123,
        }
    }
    assert original["spec"]["conversion"]["webhook"]["clientConfig"] == {"service": {"name": "tekton"}}
    single = {"kind": "CustomResourceDefinition", "spec": {"versions": [{"name": "v1", "served": True, "storage": True}]}}
    assert tekton_webhook.with_conversion_webhook(single, "tekton-pipelines", 1) == single


def _webhook(rules: bool, ca: bool, path: bool) -> dict[str, Any]:
    service: dict[str, Any] = {"name": "tekton-pipelines-webhook", **({"path": "/defaulting"} if path else {})}
    return {
        "clientConfig": {"service": service, **({"caBundle": "Q0E="} if ca else {})},
        **({"rules": [{"operations": ["CREATE"]}]} if rules else {}),
    }


@pytest.mark.parametrize(
    ("configuration", "ready"),
    [
        (None, False),
        ({"webhooks": []}, False),
        ({"webhooks": [_webhook(rules=False, ca=False, path=False)]}, False),  # as applied, before knative
        ({"webhooks": [_webhook(rules=True, ca=False, path=True)]}, False),
        ({"webhooks": [_webhook(rules=False, ca=True, path=True)]}, False),
        ({"webhooks": [_webhook(rules=True, ca=True, path=False)]}, False),
        ({"webhooks": [_webhook(rules=True, ca=True, path=True)]}, True),
    ],
)
def test_tekton_webhook_configuration_is_ready_once_knative_filled_it(
    configuration: dict[str, Any] | None, ready: bool
) -> None:
    assert tekton_webhook.configuration_ready(configuration) is ready


@pytest.mark.parametrize(
    ("crd", "ready"),
    [
        (None, False),
        ({"spec": {"conversion": {"strategy": "None"}}}, True),
        ({"spec": {}}, True),
        ({"spec": {"conversion": {"strategy": "Webhook", "webhook": {"clientConfig": {"service": {}}}}}}, False),
        ({"spec": {"conversion": {"strategy": "Webhook", "webhook": {"clientConfig": {"caBundle": "Q0E="}}}}}, True),
    ],
)
def test_crd_conversion_is_ready_once_it_has_the_webhooks_ca(crd: dict[str, Any] | None, ready: bool) -> None:
    assert tekton_webhook.conversion_ready(crd) is ready


def test_the_floor_webhook_is_the_projects_own_source_on_the_standard_library_alone() -> None:
    """No upstream module to pin: its version is the project's own, and its go.mod requires nothing."""
    assert build.OPTIONAL_COMPONENTS["floor-webhook"] is build.FLOOR_WEBHOOK
    assert build.pinned_version(build.FLOOR_WEBHOOK) == build.FLOOR_WEBHOOK.own_version == "v2"
    module = build.TOOLS_DIR / "floor-webhook"
    assert "require" not in (module / "go.mod").read_text() and (module / "go.sum").read_text() == ""
    assert build.optional_key(build.FLOOR_WEBHOOK).startswith("floor-webhook-v2_")


@pytest.mark.cluster
def test_the_floor_answers_with_no_patch_and_on_mutate_patch_with_one_that_changes_nothing(tmp_path: Path) -> None:
    """The built floor (bench/floor.py) over TLS: /mutate allows with no patch; /mutate/patch allows with a
    JSON Patch whose one operation tests the object's kind (the API server applies it, and nothing changes)."""
    binary = build.ensure_optional("floor-webhook", lambda line: None) / "floor-webhook"
    pki = certs.create_pki(tmp_path / "pki")
    issued = certs.issue_serving_cert(pki, "floor-webhook")
    cert, key = tmp_path / "floor.crt", tmp_path / "floor.key"
    cert.write_bytes(issued.cert_pem)
    key.write_bytes(issued.key_pem)
    port = free_port()
    process = subprocess.Popen([str(binary), "--listen", f"127.0.0.1:{port}", "--cert", str(cert), "--key", str(key)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    context = ssl.create_default_context(cafile=str(pki.ca_cert))

    def review(path: str) -> dict[str, Any]:
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": {"kind": "Pod"}}}
        request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, context=context, timeout=5) as answer:
            return json.loads(answer.read())["response"]

    try:
        wait_for("the floor listening", lambda: listens(port), timeout=20)
        assert review("/mutate") == {"uid": "u-1", "allowed": True}
        patched = review("/mutate/patch")
        assert patched["allowed"] is True and patched["patchType"] == "JSONPatch"
        assert json.loads(base64.b64decode(patched["patch"])) == [{"op": "test", "path": "/kind", "value": "Pod"}]
    finally:
        process.terminate()
        process.wait(10)


def test_kyverno_is_built_from_its_module_with_its_own_replace_and_crds() -> None:
    go_mod = (build.TOOLS_DIR / "kyverno" / "go.mod").read_text()
    assert build.pinned_version(build.KYVERNO) == "v1.19.1"
    assert "replace k8s.io/pod-security-admission => github.com/kyverno/pod-security-admission" in go_mod
    assert "github.com/kyverno/kyverno/pkg/version.BuildVersion=v1.19.1" in build.ldflags(build.KYVERNO)
    assert "config/crds/kyverno/kyverno.io_clusterpolicies.yaml" in build.KYVERNO.module_files
