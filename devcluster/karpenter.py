"""Karpenter with its KWOK cloud provider as one of the cluster's processes (`up --with karpenter`).

Built by `build.ensure_optional("karpenter")` from `sigs.k8s.io/karpenter` (kwok/ of the module, Go 1.26.9
through GOTOOLCHAIN, metrics and probes bound to loopback by a patch), with the module's CRDs (NodePool,
NodeClaim, NodeOverlay, CapacityBuffer, KWOKNodeClass) copied beside the binary.

How it fits the local cluster: for a NodeClaim, Karpenter's KWOK provider creates a plain Node object
(provider id `kwok://NAME`, labels of the NodePool's template and of the instance type it picked, taint
`karpenter.sh/unregistered`), and the cluster's KWOK, which manages only nodes matching its label
selector (`type=kwok`), makes it Ready and keeps its Lease; Karpenter then registers it (the taint goes)
and the scheduler binds the pending pods. So a NodePool's template labels must carry the pool's own
labels and KWOK's selector: `node_pool` adds the latter. One KWOKNodeClass, `NODE_CLASS`, is created by
`up`; NodePools name it. Consolidation and disruption are Karpenter's own (`disruption` of the NodePool).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

NAME = "karpenter"  # the optional component, the `--with` value and the process name
PORTS = ("karpenter-metrics", "karpenter-probes")
NODE_CLASS = "devcluster"  # the KWOKNodeClass `up` creates
CRD_DIRS = ("kwok/charts/crds", "kwok/apis/crds")  # of the pinned module, copied by the build
NODE_CLASS_GROUP = "karpenter.kwok.sh"
NODEPOOL_LABEL = "karpenter.sh/nodepool"  # Karpenter's label on the nodes of a NodePool


def crd_files(bin_dir: Path) -> list[Path]:
    """Karpenter's CRDs and the KWOKNodeClass CRD, as the build copied them beside `bin_dir`."""
    files = bin_dir.parent / "files"
    return [path for directory in CRD_DIRS for path in sorted((files / directory).glob("*.yaml"))]


def node_class_manifest() -> dict[str, Any]:
    """The one KWOKNodeClass NodePools refer to (no registration delay: nodes come as fast as KWOK makes them Ready)."""
    return {
        "apiVersion": f"{NODE_CLASS_GROUP}/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_CLASS},
    }


def kwok_labels(kwok_selector: str) -> dict[str, str]:
    """The labels an equality selector like `type=kwok` (KWOK's `--manage-nodes-with-label-selector`) selects on."""
    labels = {}
    for term in filter(None, (part.strip() for part in kwok_selector.split(","))):
        key, sep, value = term.partition("=")
        if not sep or not key or "!" in key:
            raise ValueError(f"{kwok_selector!r}: only equality terms (key=value) can be put on a node")
        labels[key.strip()] = value.strip().lstrip("=")
    return labels


def node_pool(
    name: str,
    labels: Mapping[str, str],
    *,
    kwok_selector: str,
    taints: Sequence[Mapping[str, str]] = (),
    cpu_limit: str | None = None,
    consolidation: str = "WhenEmptyOrUnderutilized",
    consolidate_after: str = "30s",
    requirements: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A NodePool of fake nodes: its nodes carry `labels` (e.g. the egress pool's selector) plus the labels
    KWOK selects on (`kwok_selector`, e.g. the cluster's `type=kwok`), and `taints` from the start.

    The instance types are the KWOK provider's own (cpu 1-256, on-demand and spot, zones test-zone-a..d);
    `requirements` narrows them. `cpu_limit` caps the pool's total CPU (Karpenter's `limits.cpu`)."""
    template_spec: dict[str, Any] = {
        "nodeClassRef": {"group": NODE_CLASS_GROUP, "kind": "KWOKNodeClass", "name": NODE_CLASS},
        "requirements": [
            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            *requirements,
        ],
        "expireAfter": "Never",
    }
    if taints:
        template_spec["taints"] = [dict(t) for t in taints]
    spec: dict[str, Any] = {
        "template": {"metadata": {"labels": {**kwok_labels(kwok_selector), **labels}}, "spec": template_spec},
        "disruption": {"consolidationPolicy": consolidation, "consolidateAfter": consolidate_after},
    }
    if cpu_limit is not None:
        spec["limits"] = {"cpu": cpu_limit}
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": spec}


def command_env(kubeconfig: Path, ports: Mapping[str, int]) -> dict[str, str]:
    """Karpenter's options (pkg/operator/options) as environment, for one replica out of cluster."""
    return {
        "KUBECONFIG": str(kubeconfig),
        "DISABLE_LEADER_ELECTION": "true",
        "METRICS_PORT": str(ports["karpenter-metrics"]),
        "HEALTH_PROBE_PORT": str(ports["karpenter-probes"]),
        "LOG_LEVEL": "info",
        # Shorter batching than the defaults (1 s idle, 10 s max): tests see nodes sooner, still batched.
        "BATCH_IDLE_DURATION": "1s",
        "BATCH_MAX_DURATION": "3s",
    }


def command_argv(bin_dir: Path) -> list[str]:
    return [str(bin_dir / NAME)]


def health_url(ports: Mapping[str, int]) -> str:
    """Ready once its caches synced and the NodePool and NodeClaim CRDs are served."""
    return f"http://127.0.0.1:{ports['karpenter-probes']}/readyz"
