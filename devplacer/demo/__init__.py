"""`make demo` (`python -m devcluster demo`): egress-placer's main job on the local cluster.

Brings up the local cluster (3 ordinary nodes, 3 egress nodes), starts the controller under the
`k8s/` ServiceAccount with its webhook registered, reading the pool in `pools.yaml` (an EgressPool of the
pools API, as `k8s/` installs it by default) and shows it with `kubectl get egresspools`, submits the mix of runs in `runs.yaml` (uploads,
a Task reference, a param default, opt-out, opt-in, a namespace allowed by annotation, a namespace
that is not allowed, a copied toleration, a PipelineRun with a build and a publish task), waits for
them to finish, and prints where each run went and why. Exit status 0 only when every run finished
and every pod is where its decision says.

Before it stops the cluster it prints egress-placer's Events itself (why each run went where it went:
the hint to look them up would name a cluster that is gone); with `--keep` the cluster stays up, and the
last lines say how to look further and how to stop it (`python -m devcluster down --dir DIR`).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from devcluster.cluster import EGRESS_POOL_LABEL, Cluster, ClusterError
from devplacer.local_placer import kubectl, start_controller

HERE = Path(__file__).resolve().parent
POOLS = HERE / "pools.yaml"  # the demo's pool, an EgressPool
RUNS = HERE / "runs.yaml"
DONE_TIMEOUT = 180.0
EVENTS_SHOWN = 40  # egress-placer's Events printed at the end (the count says how many more)


@dataclass(frozen=True)
class Outcome:
    namespace: str
    run: str
    task: str
    reason: str
    pool: str
    node: str
    on_pool: bool
    result: str

    @property
    def honoured(self) -> bool:
        return (self.pool != "-") == self.on_pool


def _get(cluster: Cluster, *args: str) -> list[dict[str, Any]]:
    return json.loads(kubectl(cluster, "get", *args, "-o", "json")).get("items", [])


def _wait(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


def _pool_ready(cluster: Cluster) -> bool:
    """Every EgressPool's status says Ready True (its nodes carry its taint)."""
    pools = _get(cluster, "egresspools")
    return bool(pools) and all(
        any(c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or [])
        for p in pools
    )


def submit(cluster: Cluster, log: Callable[[str], None]) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(RUNS.read_text()) if d]
    context = [d for d in docs if d["kind"] in ("Namespace", "Task")]
    runs = [d for d in docs if d["kind"] in ("TaskRun", "PipelineRun")]
    kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump_all(context))
    for ns in {d["metadata"]["name"] for d in context if d["kind"] == "Namespace"}:
        _wait(f"ServiceAccount {ns}/default", lambda ns=ns: bool(_get(cluster, "serviceaccounts", "-n", ns)), 60)
    kubectl(cluster, "create", "-f", "-", stdin=yaml.safe_dump_all(runs))
    log(f"[demo] submitted {len(runs)} runs in {len({r['metadata']['namespace'] for r in runs})} namespaces")
    return runs


def _finished(run: dict[str, Any]) -> str | None:
    for c in (run.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Succeeded" and c.get("status") in ("True", "False"):
            return "Succeeded" if c["status"] == "True" else c.get("reason", "Failed")
    return None


def outcomes(cluster: Cluster) -> list[Outcome]:
    pools = {n["metadata"]["name"] for n in _get(cluster, "nodes", "-l", EGRESS_POOL_LABEL)}
    pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in _get(cluster, "pods", "-A")}
    rows = []
    for tr in _get(cluster, "taskruns", "-A"):
        meta = tr["metadata"]
        if meta["namespace"] == "devcluster-probe":
            continue
        labels = meta.get("labels") or {}
        decision = json.loads((meta.get("annotations") or {}).get("egress-placer.io/decision") or "{}")
        pod = pods.get((meta["namespace"], (tr.get("status") or {}).get("podName") or f"{meta['name']}-pod")) or {}
        node = (pod.get("spec") or {}).get("nodeName") or "-"
        rows.append(
            Outcome(
                namespace=meta["namespace"],
                run=labels.get("tekton.dev/pipelineRun") or meta["name"],
                task=labels.get("tekton.dev/pipelineTask") or "-",
                reason=decision.get("reason", "(no decision)"),
                pool=decision.get("pool") or "-",
                node=node,
                on_pool=node in pools,
                result=_finished(tr) or "running",
            )
        )
    return sorted(rows, key=lambda r: (r.namespace, r.run, r.task))


def print_table(rows: list[Outcome], out: Callable[[str], None]) -> None:
    header = ("NAMESPACE", "RUN", "TASK", "DECISION", "POOL", "NODE", "ON POOL", "RESULT")
    table = [header] + [
        (r.namespace, r.run, r.task, r.reason, r.pool, r.node, "yes" if r.on_pool else "no", r.result) for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        out("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def events_lines(cluster: Cluster, shown: int = EVENTS_SHOWN) -> list[str]:
    """egress-placer's Events (reportingController egress-placer.io/...), oldest first, as a table:
    namespace, object, type, reason, note."""
    events = [
        e for e in _get(cluster, "events.events.k8s.io", "-A") if str(e.get("reportingController") or "").startswith("egress-placer")
    ]
    events.sort(key=lambda e: str(e.get("eventTime") or (e.get("metadata") or {}).get("creationTimestamp") or ""))
    table = [("NAMESPACE", "OBJECT", "TYPE", "REASON", "NOTE")] + [
        (
            str((e.get("metadata") or {}).get("namespace") or "-"),
            f"{(e.get('regarding') or {}).get('kind', '?')}/{(e.get('regarding') or {}).get('name', '?')}",
            str(e.get("type") or ""),
            str(e.get("reason") or ""),
            " ".join(str(e.get("note") or "").split()),
        )
        for e in events[:shown]
    ]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(row[:4], widths)), row[4]]).rstrip() for row in table]
    if len(events) > shown:
        lines.append(f"... and {len(events) - shown} more")
    return lines if events else ["(no Event from egress-placer)"]


def finish(cluster: Cluster, cluster_dir: Path, keep: bool, log: Callable[[str], None]) -> None:
    """The demo's last lines: egress-placer's Events, then the cluster stopped, or kept and how to stop it."""
    try:
        lines = events_lines(cluster)
    except Exception as e:  # noqa: BLE001 - the cluster may be why the demo failed; say so and stop it
        lines = [f"(cannot read the Events: {' '.join(str(e).split())[:200]})"]
    log("[demo] why, from egress-placer's Events (kubectl get events.events.k8s.io -A):")
    for line in lines:
        log(f"  {line}")
    if keep:
        log(f"[demo] the cluster keeps running; look around: kubectl --kubeconfig {cluster.kubeconfig} get events.events.k8s.io -A")
        log(f"[demo] stop it: python -m devcluster down --dir {cluster_dir}")
    else:
        cluster.down()
        log("[demo] cluster stopped (python -m devcluster demo --keep leaves it running)")


def run_demo(directory: Path | None = None, keep: bool = False, log: Callable[[str], None] = print) -> int:
    cluster_dir = directory or Path(tempfile.mkdtemp(prefix="egress-placer-demo-"))
    cluster = Cluster(cluster_dir, nodes=3, egress_nodes=3, pod_seconds=2.0, log=log)
    started = time.monotonic()
    try:
        log(f"[demo] bringing up the local cluster in {cluster_dir}")
        cluster.up()
        log("[demo] starting egress-placer under system:serviceaccount:egress-placer:egress-placer")
        start_controller(cluster, POOLS, policy_source="pools")
        taints = {
            n["metadata"]["name"]: [f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in (n.get("spec") or {}).get("taints") or []]
            for n in _get(cluster, "nodes")
        }
        log("[demo] node taints: " + ", ".join(f"{k}: {v[0] if v else '-'}" for k, v in sorted(taints.items())))
        _wait("the pool's status: its nodes tainted", lambda: _pool_ready(cluster), 30)
        for line in kubectl(cluster, "get", "egresspools").splitlines():
            log(f"[demo] {line}")
        runs = submit(cluster, log)
        expected = sum(len((r["spec"].get("pipelineSpec") or {}).get("tasks") or [1]) for r in runs)

        def all_done() -> bool:
            rows = outcomes(cluster)
            return len(rows) >= expected and all(r.result != "running" for r in rows)

        _wait("every run to finish", all_done, DONE_TIMEOUT)
        rows = outcomes(cluster)
        log("")
        print_table(rows, log)
        log("")
        wrong = [r for r in rows if not r.honoured or r.result != "Succeeded"]
        placed = sum(1 for r in rows if r.on_pool)
        log(
            f"[demo] {len(rows)} task runs: {placed} on the pool, {len(rows) - placed} on ordinary nodes; "
            f"{'every decision honoured' if not wrong else f'{len(wrong)} not as decided'}; "
            f"{time.monotonic() - started:.0f} s in all"
        )
        return 0 if not wrong else 1
    finally:
        finish(cluster, cluster_dir, keep, log)
