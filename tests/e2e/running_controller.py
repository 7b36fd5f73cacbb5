"""The egress-placer process the end-to-end tests run (through devplacer.local_placer): where its
replica listens, its JSON log, its metrics; how to remove its taints once it is stopped; and the
`egress-placer` command as an administrator runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from controller.core.guard import GUARD_NAME
from controller.core.model import TAINT_KEY
from devcluster.cluster import Cluster
from devplacer.local_placer import NAMESPACE, POOLS_WEBHOOK_CONFIG, WEBHOOK_CONFIG, ControllerReplica, replicas_of, stop_controller
from tests.kube import Api, namespaced, node

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "e2e"
POLICY_FILE = DATA / "policy.yaml"
INVALID_POLICY_FILE = DATA / "policy-invalid.yaml"  # `placment` (line 10) is not a field
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
WEBHOOK_CONFIGS = f"{ADMISSION}/mutatingwebhookconfigurations"
VALIDATING_WEBHOOK_CONFIGS = f"{ADMISSION}/validatingwebhookconfigurations"


@dataclass(frozen=True)
class EgressPlacer:
    """The running controller of this module (its replica is looked up again after a restart)."""

    cluster: Cluster

    @property
    def replica(self) -> ControllerReplica:
        return replicas_of(self.cluster)[0]

    @property
    def log(self) -> Path:
        return self.cluster.dir / "logs" / f"{self.replica.name}.log"

    def log_records(self, offset: int = 0) -> list[dict[str, object]]:
        """The JSON log lines written from byte `offset` on (other lines are skipped)."""
        with open(self.log, "rb") as f:
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def metric(self, name: str, labels: dict[str, str]) -> float:
        """One sample from /metrics (0 when the series does not exist yet)."""
        text = requests.get(self.replica.health_url + "/metrics", timeout=5).text
        wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series == wanted:
                return float(value)
        return 0.0


def pool_taints(api: Api, name: str) -> list[dict[str, Any]]:
    """The taints with egress-placer's key on node `name` (key, value, effect)."""
    taints = api.call("GET", node(name))["spec"].get("taints") or []
    return [{"key": t["key"], "value": t.get("value"), "effect": t["effect"]} for t in taints if t["key"] == TAINT_KEY]


def remove_pool_taints(api: Api) -> None:
    """Delete every taint with egress-placer's key from every node."""
    for listed in api.items(node()):
        taints = listed["spec"].get("taints") or []
        kept = [t for t in taints if t["key"] != TAINT_KEY]
        if len(kept) != len(taints):
            api.json_patch(node(listed["metadata"]["name"]), [
                {"op": "test", "path": "/metadata/resourceVersion", "value": listed["metadata"]["resourceVersion"]},
                {"op": "replace", "path": "/spec/taints", "value": kept},
            ])


def remove_pool_guard(api: Api) -> None:
    """Delete the pool guard's binding, policy and params (each may be missing)."""
    api.delete(f"{ADMISSION}/validatingadmissionpolicybindings/{GUARD_NAME}")
    api.delete(f"{ADMISSION}/validatingadmissionpolicies/{GUARD_NAME}")
    api.delete(namespaced(NAMESPACE, "configmaps", GUARD_NAME))


def make_plain(api: Api, cluster: Cluster) -> None:
    """No controller, no webhook configuration (the pools API's, fail-closed, neither), no pool guard, no
    pool taints: what later test modules expect."""
    stop_controller(cluster)
    api.delete(f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}")
    api.delete(f"{VALIDATING_WEBHOOK_CONFIGS}/{POOLS_WEBHOOK_CONFIG}")
    remove_pool_guard(api)
    remove_pool_taints(api)


def as_an_administrator(cluster: Cluster, *argv: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` with KUBECONFIG set as for kubectl (the cluster's admin, or `kubeconfig`) and no
    EGRESS_PLACER_* variable; this venv's scripts (egress-placer, kubectl-egress_placer) on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGRESS_PLACER_")}
    env.update(
        KUBECONFIG=str(kubeconfig or cluster.kubeconfig),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
    )
    return subprocess.run(list(argv), env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


def egress_placer_command(cluster: Cluster, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`egress-placer ARGS` (this checkout's) as an administrator runs it."""
    return as_an_administrator(cluster, sys.executable, "-m", "controller", *args, kubeconfig=kubeconfig)
