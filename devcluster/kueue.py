"""Kueue and tekton-kueue as the cluster's processes (`up --with kueue`, `up --with tekton-kueue`).

Built by `build.ensure_optional("kueue")` (sigs.k8s.io/kueue v0.14.5, the version tekton-kueue v0.3.0
pins) and `build.ensure_optional("tekton-kueue")`, with Kueue's CRDs and both projects' webhook manifests
copied beside the binaries. `tekton-kueue` implies `kueue` (`build.IMPLIED`).

There is no kube-proxy and no cert-manager here, so, as for egress-placer's own webhook:
- Kueue runs with its internal certificate management off and `VisibilityOnDemand` off (the visibility
  API server would need an APIService reached through a Service); its webhook and metrics servers
  serve a certificate minted by the cluster CA (`Cluster.serving_cert`), on 127.0.0.1 only.
- Both projects' webhook configurations (their `config/.../manifests.yaml`) are registered by URL
  (`https://127.0.0.1:PORT/PATH`, `caBundle` = the cluster CA), renamed so the two do not collide.
  Of Kueue's, only the webhooks of its own API group (ClusterQueue, Workload, ...) are registered: the
  job integrations' webhooks (Job, Pod, Deployment, ...) would stand between every such object and
  the API server for integrations nobody uses here.
- Kueue is configured with `integrations.externalFrameworks: [PipelineRun.v1.tekton.dev]`, so it
  manages the Workloads tekton-kueue's controller makes for PipelineRuns.
- tekton-kueue reads its ConfigMap `tekton-kueue-config` (`config.yaml`: the default LocalQueue name
  and CEL expressions) in namespace `TEKTON_KUEUE_NAMESPACE` (POD_NAMESPACE, by a patch: upstream
  reads the in-cluster ServiceAccount file). Its webhook makes every new PipelineRun
  `PipelineRunPending` with label `kueue.x-k8s.io/queue-name` (default `DEFAULT_QUEUE`); its controller
  clears `spec.status` when Kueue admits the Workload.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

NAME = "kueue"  # the optional component, the `--with` value and the process name
TEKTON_KUEUE = "tekton-kueue"  # the optional component and `--with` value
TEKTON_KUEUE_CONTROLLER = "tekton-kueue-controller"  # process names
TEKTON_KUEUE_WEBHOOK = "tekton-kueue-webhook"
PORTS = ("kueue-webhook", "kueue-metrics", "kueue-probes")
TEKTON_KUEUE_PORTS = ("tekton-kueue-webhook", "tekton-kueue-webhook-probes", "tekton-kueue-controller-probes")
NAMESPACE = "kueue-system"
TEKTON_KUEUE_NAMESPACE = "tekton-kueue"
TEKTON_KUEUE_CONFIGMAP = "tekton-kueue-config"
DEFAULT_QUEUE = "pipelines-queue"  # tekton-kueue's default LocalQueue name (its sample config's)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PIPELINERUN_FRAMEWORK = "PipelineRun.v1.tekton.dev"
PIPELINERUN_RESOURCE = "tekton.dev/pipelineruns"  # what tekton-kueue requests for each PipelineRun (1)
CRD_DIR = "config/components/crd/bases"  # of the pinned Kueue module, copied by the build
KUEUE_WEBHOOKS_FILE = "config/components/webhook/manifests.yaml"
TEKTON_KUEUE_WEBHOOKS_FILE = "config/webhook/manifests.yaml"  # of the pinned tekton-kueue module
KUEUE_GROUP = "kueue.x-k8s.io"


def crd_files(bin_dir: Path) -> list[Path]:
    """Kueue's CRDs as the build copied them beside `bin_dir`."""
    return sorted((bin_dir.parent / "files" / CRD_DIR).glob("*.yaml"))


def configuration(ports: Mapping[str, int], cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta1) for one replica out of cluster."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue-probes']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['kueue-metrics']}"},
        "webhook": {"host": "127.0.0.1", "port": ports["kueue-webhook"], "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [PIPELINERUN_FRAMEWORK]},
    }


def kueue_env(kubeconfig: Path, cert_dir: Path) -> dict[str, str]:
    # KUEUE_METRICS_CERT_DIR: a patch (tools/kueue/_patches/kueue-cmd); upstream reads /etc/kueue/metrics/certs.
    return {"KUBECONFIG": str(kubeconfig), "KUEUE_METRICS_CERT_DIR": str(cert_dir)}


def kueue_argv(bin_dir: Path, config_file: Path) -> list[str]:
    return [str(bin_dir / NAME), f"--config={config_file}", "--feature-gates=VisibilityOnDemand=false"]


def kueue_health_url(ports: Mapping[str, int]) -> str:
    """Ready once its webhook server listens (Kueue's own readiness check)."""
    return f"http://127.0.0.1:{ports['kueue-probes']}/readyz"


def tekton_kueue_env(kubeconfig: Path) -> dict[str, str]:
    return {"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": TEKTON_KUEUE_NAMESPACE}


def tekton_kueue_controller_argv(bin_dir: Path, ports: Mapping[str, int]) -> list[str]:
    return [
        str(bin_dir / TEKTON_KUEUE), "controller", "--leader-elect=false", "--metrics-bind-address=0",
        f"--health-probe-bind-address=127.0.0.1:{ports['tekton-kueue-controller-probes']}",
    ]


def tekton_kueue_webhook_argv(bin_dir: Path, ports: Mapping[str, int], cert: Path, key: Path) -> list[str]:
    if cert.parent != key.parent:
        raise ValueError("tekton-kueue reads its certificate and key from one directory")
    return [
        str(bin_dir / TEKTON_KUEUE), "webhook", "--metrics-bind-address=0",
        f"--health-probe-bind-address=127.0.0.1:{ports['tekton-kueue-webhook-probes']}",
        f"--webhook-cert-path={cert.parent}", f"--webhook-cert-name={cert.name}", f"--webhook-cert-key={key.name}",
        "--webhook-host=127.0.0.1", f"--webhook-port={ports['tekton-kueue-webhook']}",
    ]


def probe_url(ports: Mapping[str, int], component: str) -> str:
    return f"http://127.0.0.1:{ports[component + '-probes']}/readyz"


def tekton_kueue_config(queue_name: str = DEFAULT_QUEUE, cel: Sequence[str] = ()) -> dict[str, Any]:
    """tekton-kueue's ConfigMap: the LocalQueue a PipelineRun without the queue label goes to, and CEL
    expressions (e.g. `resource("egress-slots", 1)`) applied to every new PipelineRun."""
    config: dict[str, Any] = {"queueName": queue_name}
    if cel:
        config["cel"] = {"expressions": list(cel)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": TEKTON_KUEUE_CONFIGMAP, "namespace": TEKTON_KUEUE_NAMESPACE},
        "data": {"config.yaml": yaml.safe_dump(config, sort_keys=False)},
    }


def namespace_manifest(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def by_url(
    webhooks_yaml: str, port: int, ca_bundle: str, prefix: str, keep: str | None = None
) -> list[dict[str, Any]]:
    """The webhook configurations of `webhooks_yaml`, each webhook called at `https://127.0.0.1:PORT/PATH`
    with `ca_bundle` (base64) instead of its Service, configurations renamed `PREFIX-NAME`. With `keep`, only
    the webhooks whose rules are all of API group `keep` stay."""
    out = []
    for doc in (d for d in yaml.safe_load_all(webhooks_yaml) if d):
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": f"{prefix}-{doc['metadata']['name']}"}
        webhooks = []
        for webhook in doc.get("webhooks", []):
            if keep is not None and any(set(r.get("apiGroups", [])) != {keep} for r in webhook.get("rules", [])):
                continue
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
            webhooks.append(webhook)
        if webhooks:
            out.append({**doc, "webhooks": webhooks})
    return out


def queue_manifests(
    cluster_queue: str,
    namespace: str,
    *,
    quota: Mapping[str, int | str],
    local_queue: str = DEFAULT_QUEUE,
    flavor: str = "default-flavor",
) -> list[dict[str, Any]]:
    """A ResourceFlavor, a ClusterQueue with `quota` (resource -> nominal quota, e.g.
    {"tekton.dev/pipelineruns": 2}) for every namespace, and a LocalQueue in `namespace` pointing at it."""
    return [
        {"apiVersion": f"{KUEUE_GROUP}/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {
            "apiVersion": f"{KUEUE_GROUP}/v1beta1",
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "queueingStrategy": "BestEffortFIFO",
                "resourceGroups": [{
                    "coveredResources": list(quota),
                    "flavors": [{
                        "name": flavor,
                        "resources": [{"name": name, "nominalQuota": value} for name, value in quota.items()],
                    }],
                }],
            },
        },
        {
            "apiVersion": f"{KUEUE_GROUP}/v1beta1",
            "kind": "LocalQueue",
            "metadata": {"name": local_queue, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]
