"""Kyverno's admission controller as one of the cluster's processes (`up --with kyverno`).

Built by `build.ensure_optional("kyverno")` from github.com/kyverno/kyverno v1.19.1 (`cmd/kyverno`), with its
CRDs copied from the module (`build.KYVERNO.module_files`). It runs out of cluster with the cluster admin's
kubeconfig: `--serverIP 127.0.0.1:PORT` makes it register its webhooks by URL (`https://127.0.0.1:PORT/...`)
with a CA it makes itself and keeps in Secrets of namespace `kyverno`; `--webhookServerHost 127.0.0.1` and
`--metricsHost 127.0.0.1` keep it on loopback. Its own ServiceAccount and RBAC are the Helm chart's, not
rebuilt here. Its mutating webhook configuration is `kyverno-resource-mutating-webhook-cfg`, written once a
ClusterPolicy with a mutate rule exists (rules and namespaces from the policies). The benchmarks
(`bench/kyverno.py`) start it with the same command line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

NAME = "kyverno"  # the optional component, the `--with` value and the process name
NAMESPACE = "kyverno"
PORTS = ("kyverno-webhook", "kyverno-metrics")
CA_SECRET = "kyverno-svc.kyverno.svc.kyverno-tls-ca"
TLS_SECRET = "kyverno-svc.kyverno.svc.kyverno-tls-pair"
POLICY_PATH = "/apis/kyverno.io/v1/clusterpolicies"
MUTATING_CONFIG = "kyverno-resource-mutating-webhook-cfg"
ESTABLISHED = ("clusterpolicies.kyverno.io", "policies.kyverno.io", "updaterequests.kyverno.io", "policyexceptions.kyverno.io")


def command_argv(bin_dir: Path, kubeconfig: Path, port: int, metrics_port: int) -> list[str]:
    return [
        str(bin_dir / NAME), f"--kubeconfig={kubeconfig}", f"--serverIP=127.0.0.1:{port}",
        "--webhookServerHost=127.0.0.1", f"--webhookServerPort={port}", f"--caSecretName={CA_SECRET}",
        f"--tlsSecretName={TLS_SECRET}", "--admissionReports=false", "--metricsHost=127.0.0.1",
        f"--metricsPort={metrics_port}", "--controllerRuntimeMetricsAddress=0", "--loggingFormat=json",
        "--autoMemLimitEnabled=false", "--webhookTimeout=3",
    ]


def command_env(pod_name: str = "kyverno-0") -> dict[str, str]:
    return {"KYVERNO_NAMESPACE": NAMESPACE, "KYVERNO_POD_NAME": pod_name, "KYVERNO_SERVICEACCOUNT_NAME": "kyverno",
            "KYVERNO_DEPLOYMENT": "kyverno", "KYVERNO_SVC": "kyverno-svc", "INIT_CONFIG": "kyverno",
            "METRICS_CONFIG": "kyverno-metrics"}


def namespace_manifest() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def config_map(namespace_selector: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Kyverno's ConfigMap (`INIT_CONFIG`); `namespace_selector`: every Kyverno webhook only for those namespaces."""
    data = {"webhooks": json.dumps({"namespaceSelector": dict(namespace_selector)})} if namespace_selector else {}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, "namespace": NAMESPACE}, "data": data}
