"""`egress-placer uninstall` removes everything `kubectl apply -k k8s/` installs (with either component):
each rendered object is one it deletes by name, or lives in the controller's namespace, which it
deletes; and it deletes nothing else. On the local cluster: tests/e2e/test_uninstall.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.cli import main
from controller.cli.errors import Exit
from controller.cli.uninstall import every_thing
from controller.settings import Settings
from devcluster.build import find_artifacts

ROOT = Path(__file__).resolve().parents[2]
# kind -> (API prefix, plural) of what k8s/ renders
PATHS = {
    "Namespace": ("/api/v1", "namespaces"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "MutatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations"),
    "ValidatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations"),
    "ValidatingAdmissionPolicy": ("/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicies"),
    "ValidatingAdmissionPolicyBinding": ("/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings"),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles"),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions"),
}


def path_of(obj: dict[str, Any]) -> str:
    prefix, plural = PATHS[obj["kind"]]
    namespace = obj["metadata"].get("namespace")
    return f"{prefix}/{'namespaces/' + namespace + '/' if namespace else ''}{plural}/{obj['metadata']['name']}"


def rendered(kubectl: Path, tmp: Path, components: tuple[str, ...]) -> list[dict[str, Any]]:
    base = os.path.relpath(ROOT / "k8s", tmp)
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [base], "components": [f"{base}/{c}" for c in components]}))
    out = subprocess.run([str(kubectl), "kustomize", str(tmp)], check=True, capture_output=True, text=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("components", [(), ("cert-manager",), ("report-only",), ("policy-configmap",)])
def test_uninstall_deletes_everything_the_install_makes_and_nothing_else(tmp_path: Path, components: tuple[str, ...]) -> None:
    artifacts = find_artifacts()
    if artifacts is None:
        pytest.skip("the local cluster's kubectl is not built yet (python -m devcluster build)")
    settings = Settings()
    deleted = {thing.path for thing in every_thing(settings)}
    installed = rendered(artifacts.binary("kubectl"), tmp_path, components)
    by_name = {path_of(o) for o in installed if o["metadata"].get("namespace") != settings.namespace}
    in_namespace = [o for o in installed if o["metadata"].get("namespace") == settings.namespace]
    assert by_name <= deleted
    assert f"/api/v1/namespaces/{settings.namespace}" in by_name  # its content goes with it
    assert in_namespace and {o["kind"] for o in in_namespace} >= {"Deployment", "Service", "Role"}
    # Deleted by name besides: the Deployment (first, so that no leader puts the taints back).
    assert deleted - by_name == {path_of({"kind": "Deployment", "metadata": {"name": "egress-placer", "namespace": settings.namespace}})}


def test_uninstall_wants_dry_run_or_yes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    assert main(["uninstall", "--kubeconfig", str(config)]) == Exit.USAGE
    assert "say --dry-run (show what would be removed) or --yes (remove it)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["uninstall", "--dry-run", "--yes"])
    assert exited.value.code == Exit.USAGE
