"""Tekton's resolvers controller (git, hub, bundles, cluster, http) as one of the cluster's processes.

An optional part of `up` (`python -m devcluster up --with tekton-resolvers`), built by
`build.ensure_optional("tekton-resolvers")` into a cache key of its own, with the namespace and
ConfigMaps of Tekton's `config/resolvers/` (copied by the build). Only the http resolver and the
cluster resolver can work here (no internet); the tests serve Tasks from a loopback HTTP server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

NAME = "tekton-resolvers"  # the optional component, the `--with` value and the process name
NAMESPACE = "tekton-pipelines-resolvers"
PORTS = ("tekton-resolvers-probes", "tekton-resolvers-metrics")
CONFIG_DIR = "config/resolvers"  # of the pinned Tekton module, copied by the build


def config_files(bin_dir: Path) -> list[Path]:
    """The namespace first, then the ConfigMaps, as the build copied them beside `bin_dir`."""
    directory = bin_dir.parent / "files" / CONFIG_DIR
    files = sorted(directory.glob("*.yaml"))
    return sorted(files, key=lambda f: not f.name.startswith("100-namespace"))


def namespace_manifest() -> dict[str, object]:
    """The resolvers' namespace alone, for a cluster that does not run them: a Tekton release always
    makes it, and egress-placer reads the cluster resolver's rules there (with no ConfigMaps, it
    follows no `resolver: cluster` reference, as Tekton resolves none)."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def command_env(ports: Mapping[str, int]) -> dict[str, str]:
    """The environment of upstream's config/resolvers/resolvers-deployment.yaml, with loopback ports."""
    return {
        "SYSTEM_NAMESPACE": NAMESPACE,
        "KUBERNETES_MIN_VERSION": "v1.28.0",
        "CONFIG_LOGGING_NAME": "config-logging",
        "CONFIG_OBSERVABILITY_NAME": "config-observability",
        "CONFIG_FEATURE_FLAGS_NAME": "feature-flags",
        "CONFIG_LEADERELECTION_NAME": "config-leader-election-resolvers",
        "METRICS_DOMAIN": "tekton.dev/resolution",
        "PROBES_ADDRESS": f"127.0.0.1:{ports['tekton-resolvers-probes']}",
        "TEKTON_HUB_API": "",
        "ARTIFACT_HUB_API": "https://artifacthub.io/",
        # As for the controller: knative binds the profiling server to ":PORT"; 0 = an ephemeral port.
        "PROFILING_PORT": "0",
        "METRICS_PROMETHEUS_HOST": "127.0.0.1",
        "METRICS_PROMETHEUS_PORT": str(ports["tekton-resolvers-metrics"]),
    }


def command_argv(bin_dir: Path, kubeconfig: Path) -> list[str]:
    return [str(bin_dir / NAME), f"-kubeconfig={kubeconfig}", "-disable-ha", "-kube-api-qps=50", "-kube-api-burst=100"]
