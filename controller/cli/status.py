"""`egress-placer status`: each pool node, its taint, its load, and what is wrong there.

One read of the cluster (nodes, namespaces, pods, DaemonSets, the policy) through the kube adapter,
then the same core the controller uses: `plan_taints` says whether the taint is right, `find_intruders`
who should not be there, `plan_agents` which node agents a pool taint keeps off, `LoadView.loads`
the load the balancer would see (without admission-time assumptions, which live only in the running
controller's memory).

When the policy is invalid or missing, the table is that of the policy the controller keeps in
force (the last good copy the leader stored, controller/last_good_policy/reconcile.py; none: no
pools) and a line `policy: ...` (on stderr with --json) says what is wrong, in the controller's own
words (`PolicyTracker.problem`).

When a pools API CRD's `status.storedVersions` still lists a version besides v1beta1 (the leader's storage
migration has not succeeded yet), a line `storage: ...` (on stderr with -o json|yaml, so the rows stay
as they were) says so and where to look; the exit status does not change (the leader tries again).

Exit status (controller/cli/errors.py): 0 all well, 1 a taint is wrong, an intruder is there or a
node agent is missing, 2 the policy is invalid or missing or there is no usable kubeconfig, 3 the
cluster could not be reached or read (the message says which and why).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

import yaml

from controller.app import PolicyTracker
from controller.agents.core import AgentGap
from controller.cli.errors import ClusterUnreachable, CommandError, Exit
from controller.intruders.core import find_intruders
from controller.core.policy import PlacementPolicy, PolicyError, load_policy
from controller.queue.core import KUEUE_QUEUE_LABEL, KUEUE_WORKLOAD_WAIT_SECONDS, plan
from controller.taints.core import desired_taints
from controller.prometheus.egress_source import EgressPoller, PrometheusClient
from controller.kube.client import (
    ClusterConfigError,
    KubeApi,
    describe_error,
    describe_unreachable,
    make_api_client,
    status_of,
)
from controller.kube.policy_source import read_pools_policy
from controller.kube.storage_migration import CRDS, STORED
from controller.core.conversion import V1BETA1
from controller.core.pools import CONFIG_PLURAL, GROUP, POOL_PLURAL
from controller.agents.reconcile import find_gaps
from controller.last_good_policy.reconcile import POLICY_KEY, store_name
from controller.settings import Settings
from controller.state import ClusterState


@dataclass(frozen=True)
class PoolNodeRow:
    pool: str
    node: str
    ready: bool
    cordoned: bool
    taint: str  # "ok", "missing" or "wrong"
    placed: int
    capacity: int
    intruders: int
    egress: str = "-"  # measured outbound throughput and its age, when the pool has an egress load source
    # Node agents (DaemonSets of agent namespaces) that target this node but have no pod on it because
    # their pod template does not tolerate the pool taint ("namespace/name").
    agents_missing: tuple[str, ...] = ()
    # The pool's `history` rule (docs/suggest.md) and what the controller last wrote in its status.history.
    history: "PoolHistory | None" = None


@dataclass(frozen=True)
class PoolHistory:
    """A pool's `history` rule: on or off, and, from its EgressPool's `status.history` (written by the leader;
    none with a policy file or ConfigMap, or before the first write), the groups in force, when they were
    read and why the last read failed."""

    enabled: bool
    p90_bytes_at_least: int | None = None
    window: str | None = None
    groups: int | None = None
    read_at: str | None = None
    last_error: str | None = None


def _config_map_data(api: KubeApi, namespace: str, name: str) -> dict[str, str] | None:
    try:
        return dict(api.call("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}").get("data") or {})
    except Exception as e:
        if status_of(e) == 404:
            return None
        raise


def read_policy(settings: Settings, api: KubeApi) -> PlacementPolicy:
    """The policy from its source; PolicyError when it is invalid or missing."""
    if settings.policy_file:
        path = Path(settings.policy_file)
        if not path.exists():
            raise PolicyError(f"no policy found in file {settings.policy_file}")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise PolicyError(f"cannot read policy file {settings.policy_file}: {e}") from None
        return load_policy(text, source=settings.policy_file)
    if settings.policy_source == "pools":
        return read_pools_policy(api)
    source = f"configmap {settings.namespace}/{settings.policy_configmap}:{settings.policy_key}"
    data = _config_map_data(api, settings.namespace, settings.policy_configmap)
    if data is None or settings.policy_key not in data:
        raise PolicyError(f"no policy found in {source}")
    return load_policy(data[settings.policy_key], source=source)


def policy_in_force(settings: Settings, api: KubeApi, state: ClusterState) -> str | None:
    """Put the policy the controller keeps in force into `state`; None, or what is wrong with the policy."""
    tracker = PolicyTracker(state, on_policy=lambda policy: None)
    try:
        tracker.set_policy(read_policy(settings, api))
        return None
    except PolicyError as e:
        tracker.refused(str(e))
        refusal = str(e)
    name = store_name(settings.policy_configmap)
    where = f"configmap {settings.namespace}/{name}"
    try:
        stored = (_config_map_data(api, settings.namespace, name) or {}).get(POLICY_KEY)
    except Exception as e:  # the cluster cannot be read: say what is wrong with the policy too
        raise CommandError(f"invalid policy: {refusal} (and {where} cannot be read: {describe_error(e)})") from None
    if stored is not None:
        try:
            tracker.adopt_stored(load_policy(stored, source=f"{where}:{POLICY_KEY}"), where)
        except PolicyError:
            pass  # an invalid copy is no copy: the controller would not use it either
    return tracker.problem()


def _items(api: KubeApi, path: str) -> list[dict[str, Any]]:
    return list(api.call("GET", path).get("items") or [])


def pool_rows(state: ClusterState, gaps: Sequence[AgentGap] | None = None) -> list[PoolNodeRow]:
    policy = state.policy
    intruders = find_intruders(policy, state.nodes, state.pods.values(), state.namespace_map(), state.daemonset_map())
    gaps = find_gaps(state) if gaps is None else gaps
    rows = []
    for pool in policy.pools:
        loads = state.load.loads(pool)
        members = [n for n in state.node_list() if (owner := policy.pool_of(n)) is not None and owner.name == pool.name]
        for node in sorted(members, key=lambda n: n.name):
            want = set(desired_taints(node, policy))
            owned = {t for t in node.taints if t.key in policy.owned_taint_keys()}
            taint = "ok" if owned == want else ("missing" if not owned else "wrong")
            load = loads.get(node.name)
            placed = state.load.placed_counts([node.name])[node.name]
            rows.append(
                PoolNodeRow(
                    pool=pool.name,
                    node=node.name,
                    ready=node.ready,
                    cordoned=node.unschedulable,
                    taint=taint,
                    placed=placed,
                    capacity=load.capacity if load else (pool.capacity or node.allocatable_pods),
                    intruders=sum(1 for i in intruders if i.node == node.name),
                    agents_missing=tuple(g.key for g in gaps if node.name in g.missing),
                )
            )
    return rows


def egress_column(state: ClusterState, clock: Callable[[], float] = time.time) -> dict[tuple[str, str], str]:
    """One query per pool that has an egress source: each node's measured throughput and its age."""
    out: dict[tuple[str, str], str] = {}
    for pool in state.policy.pools:
        if pool.egress_load is None:
            continue
        poller = EgressPoller(
            pool.name,
            pool.egress_load,
            PrometheusClient.for_source(pool.egress_load.prometheus),
            clock,
            node_names=lambda pool=pool: [n.name for n in state.load.pool_nodes(pool)],
        )
        poller.poll_once(clock())
        status = poller.status()
        for node, figure in status["nodes"].items():
            if figure["bps"] is None:
                error = (status["last_error"] or "").splitlines()[0] if status["last_error"] else ""
                text = "no figure: run counts" + (f" (query failing: {error[-100:]})" if error else "")
            else:
                text = f"{figure['bps'] / 1e6:.2f} MB/s, {figure['age']:.0f}s old" + (
                    "" if figure["source"] == "measured" else " (stale: run counts)"
                )
            out[(pool.name, node)] = text
    return out


def pool_statuses(settings: Settings, policy: PlacementPolicy) -> dict[str, dict[str, Any]]:
    """The EgressPools' `status.history` by pool name, read when the policy is the pools API's and a pool has
    the history rule; {} otherwise, or when they cannot be read (the rule is still shown, without its status)."""
    if settings.policy_file or settings.policy_source != "pools" or not any(p.history is not None for p in policy.pools):
        return {}
    api = connect(settings)
    try:
        items = _items(api, f"/apis/{V1BETA1}/{POOL_PLURAL}")
    except Exception as e:
        if status_of(e) in (403, 404):
            return {}
        raise unreachable(e, api) from None
    out: dict[str, dict[str, Any]] = {}
    for obj in items:
        name = (obj.get("metadata") or {}).get("name")
        history = (obj.get("status") or {}).get("history")
        if isinstance(name, str) and isinstance(history, dict):
            out[name] = history
    return out


def history_column(policy: PlacementPolicy, statuses: dict[str, dict[str, Any]]) -> dict[str, PoolHistory]:
    out = {}
    for pool in policy.pools:
        rule = pool.history
        if rule is None:
            out[pool.name] = PoolHistory(enabled=False)
            continue
        found = statuses.get(pool.name, {})
        groups = found.get("groups")
        out[pool.name] = PoolHistory(
            enabled=True,
            p90_bytes_at_least=rule.p90_bytes_at_least,
            window=rule.window,
            groups=groups if isinstance(groups, int) else None,
            read_at=found.get("readAt") if isinstance(found.get("readAt"), str) else None,
            last_error=found.get("lastError") if isinstance(found.get("lastError"), str) else None,
        )
    return out


def history_lines(history: dict[str, PoolHistory]) -> list[str]:
    """One line per pool when any pool has the history rule: on (threshold, window, groups in force, when read,
    the last error's first line) or off."""
    if not any(h.enabled for h in history.values()):
        return []
    lines = []
    for name, h in history.items():
        if not h.enabled:
            lines.append(f"  pool {name}: off")
            continue
        rule = f"p90 at least {h.p90_bytes_at_least} bytes over {h.window}"
        if h.groups is None and h.read_at is None and h.last_error is None:
            lines.append(f"  pool {name}: on ({rule}); no status.history yet (policy not from EgressPools, or not read yet)")
            continue
        read = f"read {h.read_at}" if h.read_at else "not read yet"
        error = f"; last read failed: {h.last_error.splitlines()[0][:200]}" if h.last_error else ""
        lines.append(f"  pool {name}: on ({rule}): {h.groups or 0} Task(s) in force, {read}{error}")
    return lines


STORAGE_CRDS = tuple(f"{plural}.{GROUP}" for plural in (POOL_PLURAL, CONFIG_PLURAL))


def stored_versions(settings: Settings) -> dict[str, list[str]]:
    """Each pools API CRD's `status.storedVersions`; a CRD that is not installed, or that this user may not
    read, is left out."""
    api = connect(settings)
    out: dict[str, list[str]] = {}
    for name in STORAGE_CRDS:
        try:
            crd = api.call("GET", f"{CRDS}/{name}")
        except Exception as e:
            if status_of(e) in (403, 404):
                continue
            raise unreachable(e, api) from None
        versions = (crd.get("status") or {}).get("storedVersions")
        if isinstance(versions, list):
            out[name] = [str(v) for v in versions]
    return out


def storage_line(stored: dict[str, list[str]]) -> str | None:
    """One line when a CRD's storedVersions lists a version besides the storage version (objects may still be
    stored in it: the leader's migration has not succeeded yet, docs/pools-api.md); None otherwise."""
    behind = {name: [v for v in versions if v != STORED] for name, versions in stored.items()}
    behind = {name: old for name, old in behind.items() if old}
    if not behind:
        return None
    listed = "; ".join(f"{name} [{', '.join(stored[name])}]" for name in behind)
    old = ", ".join(sorted({v for versions in behind.values() for v in versions}))
    return (
        f"storage: status.storedVersions still lists {old}: {listed}. The leader migrates the stored objects to {STORED} "
        f"after its election (a failure: Warning Event StorageMigrationFailed, kubectl describe crd {next(iter(behind))}); "
        "egress-placer migrate-storage does it now"
    )


def print_rows(rows: list[PoolNodeRow], out: TextIO, gaps: Sequence[AgentGap] = ()) -> None:
    header = (
        f"{'POOL':<14}{'NODE':<22}{'READY':<7}{'CORDONED':<10}{'TAINT':<9}{'LOAD':>10}  {'INTRUDERS':>9}  "
        f"{'AGENTS MISSING':>14}  EGRESS"
    )
    print(header, file=out)
    for r in rows:
        load = f"{r.placed}/{r.capacity}"
        print(
            f"{r.pool:<14}{r.node:<22}{str(r.ready).lower():<7}{str(r.cordoned).lower():<10}{r.taint:<9}"
            f"{load:>10}  {r.intruders:>9}  {len(r.agents_missing):>14}  {r.egress}",
            file=out,
        )
    if not rows:
        print("(no pool has a node)", file=out)
    if gaps:
        print("\nNode agents whose pod template does not tolerate a pool taint:", file=out)
        for g in gaps:
            action = f"patched by the leader ({g.why})" if g.patch else f"reported only ({g.why})"
            print(
                f"  {g.key}: pools {', '.join(g.pools)}; no pod on {len(g.missing)} of {len(g.nodes)} pool nodes "
                f"it targets; {action}",
                file=out,
            )


QUEUE_LINES_SHOWN = 20  # waiting runs listed per pool (the count says how many more)


def _read_runs(api: KubeApi, state: ClusterState) -> None:
    """TaskRuns and PipelineRuns, for the queues (a user who may not list them sees no queue)."""
    for kind, plural in (("TaskRun", "taskruns"), ("PipelineRun", "pipelineruns")):
        try:
            state.replace(kind, _items(api, f"/apis/tekton.dev/v1/{plural}"))
        except Exception as e:
            if status_of(e) not in (403, 404):
                raise


def queue_lines(state: ClusterState, now: float, shown: int = QUEUE_LINES_SHOWN, kueue_wait: float = KUEUE_WORKLOAD_WAIT_SECONDS) -> list[str]:
    """Each queued pool's slots and its waiting runs in release order (the leader's own plan)."""
    lines: list[str] = []
    for pool in state.policy.pools:
        picture = state.queue.pool_queue(pool)
        if picture is None:
            continue
        result = plan(picture, state.queue.queue_entries(pool.name), now)
        about_to_go = [r.entry for r in result.releases]
        waiting = [*about_to_go, *result.line]
        lines.append(
            f"pool {pool.name}: {result.occupied}/{result.slots} slots taken, {len(waiting)} waiting "
            f"(runsPerNode {picture.setting.runs_per_node}, maxQueueSeconds {picture.setting.max_queue_seconds})"
        )
        for i, entry in enumerate(waiting[:shown]):
            late = " (past maxQueueSeconds)" if entry in result.overdue else ""
            lines.append(f"  {i + 1:>3}. {entry.kind} {entry.namespace}/{entry.name}, waiting {now - entry.queued_at:.0f}s{late}")
        if len(waiting) > shown:
            lines.append(f"  ... and {len(waiting) - shown} more")
        lines += _kueue_lines(state.queue.queue_entries(pool.name), now, shown, kueue_wait)
    return lines


def _kueue_lines(entries: Sequence[Any], now: float, shown: int, wait: float) -> list[str]:
    """The pool's runs Kueue holds by tekton-kueue's label (no line of ours; the leader reads their Workloads,
    which this command does not): how long each has been held, and where to look when it is long."""
    held = sorted((e for e in entries if e.kueue_held), key=lambda e: (e.queued_at, e.key))
    lines = [f"  held for Kueue ({KUEUE_QUEUE_LABEL}), not released by egress-placer: {len(held)}"] if held else []
    for entry in held[:shown]:
        waited = now - entry.queued_at
        late = (f" (over {wait:.0f}s: see its Workload, kubectl get workloads -n {entry.namespace}; "
                "a KueueWorkloadMissing Event means it has none)") if waited >= wait else ""
        lines.append(f"      {entry.kind} {entry.namespace}/{entry.name}, held {waited:.0f}s{late}")
    if len(held) > shown:
        lines.append(f"      ... and {len(held) - shown} more")
    return lines


def connect(settings: Settings) -> KubeApi:
    """The API client for a command; CommandError (status 2) when there is no usable kubeconfig."""
    try:
        return KubeApi(make_api_client(settings), timeout=settings.request_timeout_seconds)
    except ClusterConfigError as e:
        raise CommandError(str(e)) from None


def unreachable(error: BaseException, api: KubeApi) -> ClusterUnreachable:
    """The one-line error of a request that failed: refused by the API server (its status), or no answer."""
    if status_of(error) is not None:
        return ClusterUnreachable(f"cannot read the cluster: {describe_error(error)}")
    return ClusterUnreachable(describe_unreachable(error, api.api_client.configuration.host))


def reach(api: KubeApi) -> None:
    """One request (the API server's version), no retry: ClusterUnreachable at once when no API server
    answers, before a command starts work that would retry. An HTTP answer, whatever its status, is an
    API server: the command's own requests say what it refuses."""
    try:
        api.call("GET", "/version")
    except Exception as e:  # no API server, TLS, a name that does not resolve
        if status_of(e) is None:
            raise unreachable(e, api) from None


def read_cluster(settings: Settings) -> tuple[ClusterState, str | None]:
    """The policy in force, nodes, namespaces, pods and DaemonSets, read once, and what is wrong with
    the policy (None: nothing); CommandError when there is no usable kubeconfig, ClusterUnreachable
    when the cluster cannot be reached or read."""
    api = connect(settings)
    try:
        state = ClusterState(None, clock=time.time)
        problem = policy_in_force(settings, api, state)
        state.replace("Node", _items(api, "/api/v1/nodes"))
        state.replace("Namespace", _items(api, "/api/v1/namespaces"))
        state.replace("Pod", _items(api, "/api/v1/pods"))
        state.replace("DaemonSet", _items(api, "/apis/apps/v1/daemonsets"))
        if any(pool.queue is not None or pool.destinations for pool in state.policy.pools):
            _read_runs(api, state)  # a budget counts a run's pods only: their TaskRuns say which they are
    except CommandError:
        raise
    except Exception as e:  # no API server, a refused request
        raise unreachable(e, api) from None
    return state, problem


def run_status(
    settings: Settings, out: TextIO, as_json: bool = False, err: TextIO | None = None, output: str | None = None
) -> int:
    """`output` "json" (as --json) or "yaml": the rows as one list; None or "table": the table. `err`: sys.stderr
    as it is at the call (not at import)."""
    err = err or sys.stderr
    output = "json" if as_json and output in (None, "table") else output
    as_json = output in ("json", "yaml")
    state, problem = read_cluster(settings)
    egress = egress_column(state)
    gaps = find_gaps(state)
    history = history_column(state.policy, pool_statuses(settings, state.policy))
    rows = [replace(r, egress=egress.get((r.pool, r.node), "-"), history=history.get(r.pool)) for r in pool_rows(state, gaps)]
    if problem is not None:
        print(f"policy: {problem}", file=err if as_json else out)
    storage = storage_line(stored_versions(settings))
    if storage is not None:
        print(storage, file=err if as_json else out)
    if output == "yaml":
        out.write(yaml.safe_dump([{**asdict(r), "agents_missing": list(r.agents_missing)} for r in rows], sort_keys=False))
    elif as_json:
        print(json.dumps([asdict(r) for r in rows]), file=out)
    else:
        print_rows(rows, out, gaps)
        queues = queue_lines(state, time.time(), kueue_wait=settings.kueue_workload_wait_seconds)
        if queues:
            print("\nQueues (release order):", file=out)
            for line in queues:
                print(line, file=out)
        measured = history_lines(history)
        if measured:
            print("\nMeasured history (a pool's history rule, docs/suggest.md):", file=out)
            for line in measured:
                print(line, file=out)
        budgets = state.budgets.status_lines(time.time())
        if budgets:
            print("\nEgress budgets (docs/budgets.md):", file=out)
            for line in budgets:
                print(line, file=out)
    if problem is not None:
        return Exit.USAGE
    return Exit.OK if all(r.taint == "ok" and r.intruders == 0 and not r.agents_missing for r in rows) else Exit.FINDINGS
