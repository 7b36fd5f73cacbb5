"""End to end, installation: the `k8s/` kustomize base is accepted by the real API server
(`kubectl apply --dry-run=server -k k8s/`, admin credentials).

It runs without the controller fixture, on a cluster where the devcluster's local form of the
webhook configuration (a `url` instead of the Service) is not installed: applying the Service form
over it client-side would set both and be refused, which says nothing about the manifests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from devcluster.cluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

K8S = Path(__file__).resolve().parents[2] / "k8s"


def test_the_k8s_base_passes_a_server_side_dry_run(devcluster: Cluster) -> None:
    result = subprocess.run(
        [str(devcluster.binary("kubectl")), "--kubeconfig", str(devcluster.kubeconfig), "apply", "--dry-run=server", "-k", str(K8S)],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    applied = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    kinds = {line.split("/", 1)[0] for line in applied}
    assert {"deployment.apps", "mutatingwebhookconfiguration.admissionregistration.k8s.io", "configmap"} <= kinds, result.stdout
