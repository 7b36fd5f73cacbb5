"""`egress-placer suggest`: which runs need a pool, learned from what they sent (docs/suggest.md).

Reads the Tekton pods of a window from Prometheus (controller/prometheus/history.py), the policy, nodes
and namespaces from the cluster, and prints per Task (Pipeline task, image set) the runs, bytes sent
(median, p90) and durations on pool and ordinary nodes, then the proposals with their evidence
(controller/suggest/core.py). `-o yaml`: the complete EgressPool objects the proposals change, for
`kubectl apply --server-side`. `--explain` replays the window's runs still in the cluster with the
policy as it is and as proposed, and counts the runs that would move.

Nothing is changed in the cluster. Exit status: 0 a report (also "not enough history"), 2 usage or no
usable kubeconfig or no policy, 3 the cluster or Prometheus cannot be reached or read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence, TextIO

from controller.cli.errors import ClusterUnreachable, CommandError, Exit
from controller.cli.explain import Document, explain_documents
from controller.cli.status import connect, reach, unreachable
from controller.core.model import NamespaceState, NodeState
from controller.core.policy import PlacementPolicy, PolicyError
from controller.core.conversion import V1BETA1
from controller.core.pools import PLURALS, POOL_KIND, dump_objects, policy_from_objects
from controller.kube.client import KubeApi, status_of
from controller.prometheus.egress_source import InstantQuery, PrometheusError
from controller.prometheus.history import History, read_history
from controller.settings import Settings
from controller.suggest.core import MIB, Action, Report, Thresholds, proposed_objects, proposed_policy, suggest

NOT_ENOUGH = "not enough history"
ALL_BYTES = "all-transmit: every byte the pods sent (cAdvisor), in-cluster traffic included: an upper bound of internet egress"
INTERNET_BYTES = "internet: the bytes --bytes-query gives (sent to destinations outside the cluster)"


@dataclass(frozen=True)
class Cluster:
    policy: PlacementPolicy
    pool_objects: tuple[dict[str, Any], ...]
    pool_of_node: dict[str, str]
    namespaces: dict[str, NamespaceState]


def read_cluster(api: KubeApi) -> Cluster:
    """The pools API's objects, nodes and namespaces. CommandError when the policy cannot be had."""
    objects: list[dict[str, Any]] = []
    for kind in ("EgressPlacerConfig", POOL_KIND):
        try:
            items = api.call("GET", f"/apis/{V1BETA1}/{PLURALS[kind]}").get("items") or []  # the storage version
        except Exception as e:
            if status_of(e) == 404:
                raise CommandError("no policy found: the pools API is not installed (k8s/crds/)") from None
            raise
        objects.extend({**o, "apiVersion": V1BETA1, "kind": kind} for o in items)
    try:
        policy = policy_from_objects(objects)
    except PolicyError as e:
        raise CommandError(f"invalid policy: {e}") from None
    nodes = [NodeState.from_node(n) for n in api.call("GET", "/api/v1/nodes").get("items") or []]
    pool_of_node = {n.name: pool.name for n in nodes if (pool := policy.pool_of(n)) is not None}
    namespaces = {
        str(ns["metadata"]["name"]): NamespaceState.from_namespace(ns)
        for ns in api.call("GET", "/api/v1/namespaces").get("items") or []
    }
    return Cluster(policy, tuple(o for o in objects if o["kind"] == POOL_KIND), pool_of_node, namespaces)


@dataclass(frozen=True)
class Replay:
    runs: int  # TaskRuns of the window
    replayed: int  # still in the cluster
    pruned: int  # gone: not replayed
    moved: int  # replayed runs whose pool would change
    onto_pool: int
    off_pool: int
    moved_runs: tuple[str, ...]


def replay(api: KubeApi, report: Report, cluster: Cluster, task_runs: Sequence[str]) -> Replay:
    """The window's TaskRuns still in the cluster through explain's core, with the policy as it is and
    as proposed (Tasks, StepActions, Pipelines and Namespaces as context)."""
    documents: list[Document] = []
    for plural, kind in (("tasks", "Task"), ("stepactions", "StepAction"), ("pipelines", "Pipeline")):
        version = "v1beta1" if kind == "StepAction" else "v1"
        try:
            items = api.call("GET", f"/apis/tekton.dev/{version}/{plural}").get("items") or []
        except Exception as e:
            if status_of(e) not in (403, 404):
                raise
            items = []
        documents.extend(Document("cluster", 0, 0, {**o, "kind": kind}) for o in items)
    documents.extend(
        Document("cluster", 0, 0, {"kind": "Namespace", "metadata": {"name": n, "labels": dict(ns.labels), "annotations": dict(ns.annotations)}})
        for n, ns in cluster.namespaces.items()
    )
    wanted = set(task_runs)
    runs = [
        {**o, "kind": "TaskRun"}
        for o in api.call("GET", "/apis/tekton.dev/v1/taskruns").get("items") or []
        if f"{o['metadata'].get('namespace')}/{o['metadata'].get('name')}" in wanted
    ]
    documents.extend(Document("cluster", 0, 0, r) for r in runs)
    before = explain_documents(cluster.policy, documents)
    after = explain_documents(proposed_policy(cluster.policy, report.proposals), documents)
    moved = [(b, a) for b, a in zip(before, after) if b["pool"] != a["pool"]]
    return Replay(
        runs=len(wanted),
        replayed=len(runs),
        pruned=len(wanted) - len(runs),
        moved=len(moved),
        onto_pool=sum(1 for b, a in moved if b["pool"] is None),
        off_pool=sum(1 for b, a in moved if a["pool"] is None),
        moved_runs=tuple(sorted(f"{b['namespace']}/{b['name']}: {b['pool'] or '-'} -> {a['pool'] or '-'}" for b, a in moved)),
    )


def run_suggest(
    settings: Settings,
    prometheus: InstantQuery,
    url: str,
    window: str,
    step: str,
    thresholds: Thresholds,
    out: TextIO,
    err: TextIO,
    output: str | None = None,
    explain: bool = False,
    bytes_query: str | None = None,
) -> int:
    api = connect(settings)
    reach(api)
    try:
        cluster = read_cluster(api)
    except CommandError:
        raise
    except Exception as e:
        raise unreachable(e, api) from None
    try:
        history = read_history(prometheus, window, step, bytes_query)
    except PrometheusError as e:
        raise ClusterUnreachable(f"cannot read Prometheus at {url}: {' '.join(str(e).split())}") from None
    report = suggest(
        history.pods, cluster.policy, cluster.pool_of_node, cluster.namespaces, thresholds, history.queries, history.missing
    )
    if not report.enough_history:
        line = f"{NOT_ENOUGH} in the last {window} at {url}: {'; '.join(report.missing)}"
        if output == "json":
            print(json.dumps({"enough_history": False, "missing": list(report.missing), "window": window, "queries": list(history.queries)}), file=out)
        elif output == "yaml":
            print(line, file=err)  # no objects: nothing to apply
        else:
            print(line, file=out)
        return Exit.OK
    try:
        replayed = replay(api, report, cluster, sorted({f"{p.namespace}/{p.task_run}" for p in history.pods})) if explain else None
    except Exception as e:
        raise unreachable(e, api) from None
    source = INTERNET_BYTES if bytes_query else ALL_BYTES
    if output == "yaml":
        objects = proposed_objects(cluster.pool_objects, report.proposals)
        if objects:
            out.write(dump_objects(objects))
        else:
            print("no change to propose: no EgressPool object to apply", file=err)
        if replayed is not None:
            print(_replay_line(replayed), file=err)
    elif output == "json":
        print(json.dumps({**as_json(report, history, window, step, replayed), "bytes": source}, indent=2), file=out)
    else:
        print(f"Bytes: {source}\n", file=out)
        print_table(report, history, window, out, replayed)
    return Exit.OK


def as_json(report: Report, history: History, window: str, step: str, replayed: Replay | None) -> dict[str, Any]:
    return {
        "enough_history": True,
        "window": window,
        "step": step,
        "thresholds": asdict(report.thresholds),
        "groups": [
            {**asdict(s), "key": str(s.key), "time_saved_seconds": s.time_saved, "speedup": s.speedup}
            for s in report.groups
        ],
        "proposals": [asdict(p) for p in report.proposals],
        "queries": list(history.queries),
        "explain": asdict(replayed) if replayed is not None else None,
    }


def _bytes(n: float) -> str:
    for unit, scale in (("G", 1024**3), ("M", MIB), ("K", 1024)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}B"


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.0f}s"


def print_table(report: Report, history: History, window: str, out: TextIO, replayed: Replay | None) -> None:
    print(
        f"{'GROUP':<44}{'RUNS':>5}{'MEDIAN':>9}{'P90':>9}  {'POOL':>11}  {'ORDINARY':>11}  VERDICT", file=out
    )
    for s in report.groups:
        pool = f"{s.pool_runs}x{_seconds(s.pool_duration_median)}"
        ordinary = f"{s.ordinary_runs}x{_seconds(s.ordinary_duration_median)}"
        print(
            f"{str(s.key):<44}{s.runs:>5}{_bytes(s.bytes_median):>9}{_bytes(s.bytes_p90):>9}  {pool:>11}  {ordinary:>11}  {s.verdict.value}",
            file=out,
        )
    print(f"\nProposals ({len(report.proposals)}), from {len(history.pods)} Tekton pods of the last {window}:", file=out)
    for p in report.proposals:
        e = p.evidence
        target = f" {p.glob!r} {'to' if p.action is Action.ADD_IMAGE else 'from'} pool {p.pool}" if p.glob else (f" pool {p.pool}" if p.pool else "")
        saved = f", {e.time_saved_seconds:.0f}s saved" if e.time_saved_seconds else ""
        print(f"  {p.action.value}{target}: {p.reason}", file=out)
        print(
            f"    evidence: {e.runs} runs ({e.heavy_runs} heavy), median {_bytes(e.bytes_median)}, p90 {_bytes(e.bytes_p90)}, "
            f"{e.pool_runs} on the pool ({_seconds(e.pool_duration_median)}) / {e.ordinary_runs} off ({_seconds(e.ordinary_duration_median)}){saved}",
            file=out,
        )
    if not report.proposals:
        print("  (none)", file=out)
    print("\nQueries:", file=out)
    for q in history.queries:
        print(f"  {q}", file=out)
    if replayed is not None:
        print(f"\n{_replay_line(replayed)}", file=out)
        for line in replayed.moved_runs:
            print(f"  {line}", file=out)


def _replay_line(r: Replay) -> str:
    return (
        f"explain: {r.moved} of {r.replayed} runs still in the cluster would move ({r.onto_pool} onto a pool, "
        f"{r.off_pool} off); {r.pruned} of the window's {r.runs} runs were pruned and not replayed"
    )


def parse_bytes(text: str) -> float:
    """"1Gi", "500M", "1e9", "2GiB" -> bytes; ValueError otherwise."""
    units: Mapping[str, float] = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 1024, "mi": MIB, "gi": 1024**3, "ti": 1024**4}
    number = text.strip().rstrip("bB")
    head = number.rstrip("iIkKmMgGtT")
    unit = number[len(head):].lower()
    if unit not in units:
        raise ValueError(f"not a size: {text!r} (e.g. 1Gi, 500M)")
    try:
        value = float(head) * units[unit]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 1Gi, 500M)") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"not a size: {text!r}")
    return value

