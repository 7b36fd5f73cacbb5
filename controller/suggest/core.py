"""`egress-placer suggest`'s rule: from what past runs sent, which images a pool should take, and which
of its globs took only quiet runs. Pure: history and policy in, a report with its evidence out.

One `PodHistory` per Tekton pod of the window (bytes it sent, how long it ran, the node it ran on and
the labels Tekton gave it). Pods are grouped (`group_key`):

- by Task (`tekton.dev/task`) when the run references one;
- else by Pipeline and PipelineTask (an inline `taskSpec` in a Pipeline);
- else by the set of its images (an inline TaskRun);

always within its namespace: a Task name means nothing across namespaces, and a tenant that names its
Task like another namespace's heavy one only ever lands in its own group.

A run is heavy when it sent at least `Thresholds.heavy_bytes`, quiet below `quiet_bytes`. A group of
at least `min_runs` runs is heavy when its median run is heavy, occasional when only its p90 is. For each
heavy group not placed yet, the proposal is its own images (`image_glob`: the repository, any tag or
digest) that no other non-heavy group of the window uses: an image shared with quiet runs (a base image)
is never proposed, the group is named for an opt-in instead. A glob of a pool whose matched runs (at
least `min_runs`) were all quiet is proposed for removal. Every proposal carries its evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any, Iterable, Mapping, Sequence

from controller.core.model import MeasuredMatch, NamespaceState
from controller.core.policy import PlacementPolicy, Pool

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class Thresholds:
    heavy_bytes: float = 1 * GIB  # a run that sent at least this is heavy
    quiet_bytes: float = 50 * MIB  # a run that sent less than this is quiet
    min_runs: int = 3  # fewer runs than this in a group (or under a glob) prove nothing
    # A heavy group is proposed only when runs on ordinary nodes do not beat runs on the pool by more
    # than this factor (where both exist): pool runs much slower say the pool does not help it.
    slower_on_pool_factor: float = 1.5

    def __post_init__(self) -> None:
        if not (0 <= self.quiet_bytes <= self.heavy_bytes) or not math.isfinite(self.heavy_bytes):
            raise ValueError("thresholds: need 0 <= quiet bytes <= heavy bytes (finite)")
        if self.min_runs < 1:
            raise ValueError("thresholds: min runs must be at least 1")


@dataclass(frozen=True)
class PodHistory:
    """One Tekton pod of the window, as Prometheus and the cluster remember it."""

    namespace: str
    pod: str
    task_run: str
    bytes_sent: float
    task: str | None = None  # tekton.dev/task: absent for an inline taskSpec
    pipeline: str | None = None
    pipeline_task: str | None = None
    pipeline_run: str | None = None
    images: tuple[str, ...] = ()
    node: str | None = None
    duration: float | None = None  # seconds the pod was seen, at the query's step


class GroupKind(StrEnum):
    TASK = "Task"
    PIPELINE_TASK = "PipelineTask"
    IMAGES = "Images"


@dataclass(frozen=True, order=True)
class GroupKey:
    namespace: str
    kind: GroupKind
    name: str  # the Task, "pipeline/pipelineTask", or the images joined with ","

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind.value}:{self.name}"


def group_key(pod: PodHistory) -> GroupKey:
    if pod.task:
        return GroupKey(pod.namespace, GroupKind.TASK, pod.task)
    if pod.pipeline and pod.pipeline_task:
        return GroupKey(pod.namespace, GroupKind.PIPELINE_TASK, f"{pod.pipeline}/{pod.pipeline_task}")
    return GroupKey(pod.namespace, GroupKind.IMAGES, ",".join(sorted(set(pod.images))) or "(no image known)")


class Verdict(StrEnum):
    HEAVY = "heavy"  # the median run is heavy
    OCCASIONAL = "occasional"  # only some runs are heavy (p90)
    QUIET = "quiet"  # every run is quiet
    BETWEEN = "between"  # neither
    FEW_RUNS = "few-runs"  # fewer than min_runs


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); `values` not empty."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _median(values: Sequence[float]) -> float | None:
    return quantile(values, 0.5) if values else None


@dataclass(frozen=True)
class GroupStats:
    key: GroupKey
    runs: int
    images: tuple[str, ...]
    bytes_median: float
    bytes_p90: float
    bytes_max: float
    heavy_runs: int
    quiet_runs: int
    pool_runs: int  # runs on pool nodes
    ordinary_runs: int  # runs on other known nodes
    pool_duration_median: float | None
    ordinary_duration_median: float | None
    pools: tuple[str, ...]  # the pools its runs ran on
    task_runs: tuple[str, ...]  # its TaskRuns, "namespace/name"
    verdict: Verdict

    @property
    def time_saved(self) -> float | None:
        """Seconds its ordinary-node runs would have saved on the pool (median against median), where
        both exist."""
        if self.pool_duration_median is None or self.ordinary_duration_median is None:
            return None
        return max(0.0, self.ordinary_duration_median - self.pool_duration_median) * self.ordinary_runs

    @property
    def speedup(self) -> float | None:
        if not self.pool_duration_median or self.ordinary_duration_median is None:
            return None
        return self.ordinary_duration_median / self.pool_duration_median


def group_stats(
    key: GroupKey, pods: Sequence[PodHistory], pool_of_node: Mapping[str, str], thresholds: Thresholds
) -> GroupStats:
    sent = [max(0.0, p.bytes_sent) for p in pods]
    on_pool = [p for p in pods if p.node is not None and p.node in pool_of_node]
    ordinary = [p for p in pods if p.node is not None and p.node not in pool_of_node]
    heavy = sum(1 for b in sent if b >= thresholds.heavy_bytes)
    quiet = sum(1 for b in sent if b < thresholds.quiet_bytes)
    median, p90 = quantile(sent, 0.5), quantile(sent, 0.9)
    if len(pods) < thresholds.min_runs:
        verdict = Verdict.FEW_RUNS
    elif median >= thresholds.heavy_bytes:
        verdict = Verdict.HEAVY
    elif heavy:  # some runs are heavy, not most
        verdict = Verdict.OCCASIONAL
    elif quiet == len(pods):
        verdict = Verdict.QUIET
    else:
        verdict = Verdict.BETWEEN
    return GroupStats(
        key=key,
        runs=len(pods),
        images=tuple(sorted({i for p in pods for i in p.images})),
        bytes_median=median,
        bytes_p90=p90,
        bytes_max=max(sent),
        heavy_runs=heavy,
        quiet_runs=quiet,
        pool_runs=len(on_pool),
        ordinary_runs=len(ordinary),
        pool_duration_median=_median([p.duration for p in on_pool if p.duration is not None]),
        ordinary_duration_median=_median([p.duration for p in ordinary if p.duration is not None]),
        pools=tuple(sorted({pool_of_node[p.node] for p in on_pool if p.node is not None})),
        task_runs=tuple(sorted({f"{p.namespace}/{p.task_run}" for p in pods})),
        verdict=verdict,
    )


def image_glob(image: str) -> str:
    """The glob proposed for an image: its repository with any tag or digest (`repo[:@]*`), so the next
    build's tag matches too; an image with neither is proposed as written."""
    name, at, _digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    if at or ":" in last:
        repository = name[: len(name) - len(last)] + last.split(":", 1)[0]
        return f"{_escape(repository)}[:@]*"
    return _escape(image)


def _escape(text: str) -> str:
    """`text` as a glob that matches only itself (fnmatch has no escape character but brackets)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


class Action(StrEnum):
    ADD_IMAGE = "add-image"  # add the glob to the pool's images
    REMOVE_IMAGE = "remove-image"  # remove the glob from the pool's images
    OPT_IN = "opt-in"  # heavy, but no image of its own: its runs should opt in
    FLAG = "flag"  # heavy only sometimes: nothing changes, a person looks


@dataclass(frozen=True)
class Evidence:
    runs: int
    bytes_median: float
    bytes_p90: float
    bytes_max: float
    heavy_runs: int
    pool_runs: int
    ordinary_runs: int
    pool_duration_median: float | None
    ordinary_duration_median: float | None
    time_saved_seconds: float | None
    groups: tuple[str, ...]
    namespaces: tuple[str, ...]
    queries: tuple[str, ...]


@dataclass(frozen=True)
class Proposal:
    action: Action
    pool: str | None
    glob: str | None
    reason: str
    evidence: Evidence


@dataclass(frozen=True)
class Report:
    enough_history: bool
    missing: tuple[str, ...]  # what history is missing, when not enough
    groups: tuple[GroupStats, ...]
    proposals: tuple[Proposal, ...]
    thresholds: Thresholds
    queries: tuple[str, ...] = field(default=())


def _evidence(stats: Sequence[GroupStats], pods: Sequence[PodHistory], pool_of_node: Mapping[str, str], queries: tuple[str, ...]) -> Evidence:
    sent = [max(0.0, p.bytes_sent) for p in pods] or [0.0]
    saved = [s.time_saved for s in stats if s.time_saved is not None]
    durations_pool = [p.duration for p in pods if p.duration is not None and p.node in pool_of_node]
    durations_ordinary = [p.duration for p in pods if p.duration is not None and p.node is not None and p.node not in pool_of_node]
    return Evidence(
        runs=len(pods),
        bytes_median=quantile(sent, 0.5),
        bytes_p90=quantile(sent, 0.9),
        bytes_max=max(sent),
        heavy_runs=sum(s.heavy_runs for s in stats),
        pool_runs=sum(s.pool_runs for s in stats),
        ordinary_runs=sum(s.ordinary_runs for s in stats),
        pool_duration_median=_median(durations_pool),
        ordinary_duration_median=_median(durations_ordinary),
        time_saved_seconds=sum(saved) if saved else None,
        groups=tuple(str(s.key) for s in stats),
        namespaces=tuple(sorted({p.namespace for p in pods})),
        queries=queries,
    )


def _first_pool(policy: PlacementPolicy, namespace: str, namespaces: Mapping[str, NamespaceState]) -> Pool | None:
    """The pool a run of `namespace` would go to by image: the first of the policy it may use."""
    ns = namespaces.get(namespace) or NamespaceState(name=namespace)
    return next((p for p in policy.pools if p.allows(ns)), None)


def suggest(
    history: Iterable[PodHistory],
    policy: PlacementPolicy,
    pool_of_node: Mapping[str, str],
    namespaces: Mapping[str, NamespaceState] | None = None,
    thresholds: Thresholds = Thresholds(),
    queries: Sequence[str] = (),
    missing: Sequence[str] = (),
) -> Report:
    """The report for the window. `pool_of_node`: the pool of each pool node (a node not in it is an
    ordinary one); `missing`: what the history source lacks (the adapter says); `queries`: those it ran."""
    pods = list(history)
    namespaces = namespaces or {}
    queries = tuple(queries)
    by_group: dict[GroupKey, list[PodHistory]] = {}
    for pod in pods:
        by_group.setdefault(group_key(pod), []).append(pod)
    stats = {key: group_stats(key, members, pool_of_node, thresholds) for key, members in sorted(by_group.items())}
    gaps = list(missing)
    if not pods and not gaps:
        gaps.append("no Tekton pod sent anything in the window")
    elif pods and all(s.verdict is Verdict.FEW_RUNS for s in stats.values()):
        gaps.append(f"no Task, Pipeline task or image set has {thresholds.min_runs} runs in the window")
    if gaps:
        return Report(False, tuple(gaps), tuple(stats.values()), (), thresholds, queries)

    proposals = [
        *_additions(stats, by_group, policy, pool_of_node, namespaces, thresholds, queries),
        *_flags(stats, by_group, pool_of_node, queries),
        *_removals(pods, policy, pool_of_node, thresholds, queries),
    ]
    return Report(True, (), tuple(stats.values()), tuple(proposals), thresholds, queries)


def _placed_by_policy(policy: PlacementPolicy, images: Iterable[str]) -> Pool | None:
    return next((p for p in policy.pools for i in images if p.matches_image(i)), None)


def _additions(
    stats: Mapping[GroupKey, GroupStats],
    by_group: Mapping[GroupKey, Sequence[PodHistory]],
    policy: PlacementPolicy,
    pool_of_node: Mapping[str, str],
    namespaces: Mapping[str, NamespaceState],
    thresholds: Thresholds,
    queries: tuple[str, ...],
) -> list[Proposal]:
    heavy = [s for s in stats.values() if s.verdict is Verdict.HEAVY]
    others = {i for s in stats.values() if s.verdict is not Verdict.HEAVY for i in s.images}
    wanted: dict[tuple[str, str], list[GroupStats]] = {}
    opt_ins: list[Proposal] = []
    for s in heavy:
        if _placed_by_policy(policy, s.images) is not None:
            continue  # its images already send it to a pool
        if s.speedup is not None and s.speedup * thresholds.slower_on_pool_factor < 1:
            continue  # its runs were much slower on the pool: the pool does not help it
        pool = _first_pool(policy, s.key.namespace, namespaces)
        own = [g for g in sorted({image_glob(i) for i in s.images}) if not any(fnmatchcase(o, g) for o in others)]
        if pool is not None and own:
            for glob in own:
                wanted.setdefault((pool.name, glob), []).append(s)
            continue
        why = (
            f"namespace {s.key.namespace} may use no pool"
            if pool is None
            else f"every image of it is used by runs that are not heavy too ({', '.join(s.images) or 'none known'})"
        )
        opt_ins.append(
            Proposal(
                Action.OPT_IN, pool.name if pool else None, None,
                f"{s.key} sent {_size(s.bytes_median)} per run (median) but {why}: annotate its runs "
                "egress-placer.io/placement: <pool> instead",
                _evidence([s], by_group[s.key], pool_of_node, queries),
            )
        )
    additions = []
    for (pool_name, glob), groups in sorted(wanted.items()):
        members = [p for s in groups for p in by_group[s.key]]
        names = ", ".join(str(s.key) for s in groups)
        additions.append(
            Proposal(
                Action.ADD_IMAGE, pool_name, glob,
                f"{names}: median run sent {_size(quantile([p.bytes_sent for p in members], 0.5))}; "
                f"no run that is not heavy uses an image {glob} matches",
                _evidence(groups, members, pool_of_node, queries),
            ),
        )
    return additions + opt_ins


def _flags(
    stats: Mapping[GroupKey, GroupStats],
    by_group: Mapping[GroupKey, Sequence[PodHistory]],
    pool_of_node: Mapping[str, str],
    queries: tuple[str, ...],
) -> list[Proposal]:
    return [
        Proposal(
            Action.FLAG, None, None,
            f"{s.key}: {s.heavy_runs} of {s.runs} runs sent at least the heavy threshold (p90 {_size(s.bytes_p90)}, "
            f"median {_size(s.bytes_median)}); too few to send every run to a pool",
            _evidence([s], by_group[s.key], pool_of_node, queries),
        )
        for s in stats.values()
        if s.verdict is Verdict.OCCASIONAL
    ]


def _removals(
    pods: Sequence[PodHistory],
    policy: PlacementPolicy,
    pool_of_node: Mapping[str, str],
    thresholds: Thresholds,
    queries: tuple[str, ...],
) -> list[Proposal]:
    out = []
    for pool in policy.pools:
        for glob in pool.images:
            matched = [p for p in pods if any(fnmatchcase(i, glob) for i in p.images)]
            if len(matched) < thresholds.min_runs or any(p.bytes_sent >= thresholds.quiet_bytes for p in matched):
                continue
            keys = sorted({group_key(p) for p in matched})
            stats = [group_stats(k, [p for p in matched if group_key(p) == k], pool_of_node, thresholds) for k in keys]
            out.append(
                Proposal(
                    Action.REMOVE_IMAGE, pool.name, glob,
                    f"all {len(matched)} runs it matched sent less than {_size(thresholds.quiet_bytes)} "
                    f"(most: {_size(max(p.bytes_sent for p in matched))})",
                    _evidence(stats, matched, pool_of_node, queries),
                )
            )
    return out


def _size(n: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def proposed_policy(policy: PlacementPolicy, proposals: Iterable[Proposal]) -> PlacementPolicy:
    """The policy with the image proposals applied (additions after the pool's own globs)."""
    images = {pool.name: list(pool.images) for pool in policy.pools}
    for p in proposals:
        if p.pool is None or p.glob is None or p.pool not in images:
            continue
        if p.action is Action.ADD_IMAGE and p.glob not in images[p.pool]:
            images[p.pool].append(p.glob)
        elif p.action is Action.REMOVE_IMAGE and p.glob in images[p.pool]:
            images[p.pool].remove(p.glob)
    pools = [Pool.model_validate({**pool.model_dump(), "images": tuple(images[pool.name])}) for pool in policy.pools]
    return PlacementPolicy.model_validate({**policy.model_dump(), "pools": pools})


def proposed_objects(objects: Sequence[Mapping[str, Any]], proposals: Iterable[Proposal]) -> list[dict[str, Any]]:
    """Complete EgressPool objects, changed by the proposals, for `kubectl apply --server-side`: apply
    replaces a custom resource's list whole, so each object carries its full spec with the whole new
    `images` list. Only the pools a proposal changes; status and server-set metadata left out."""
    changes: dict[str, list[Proposal]] = {}
    for p in proposals:
        if p.pool is not None and p.glob is not None and p.action in (Action.ADD_IMAGE, Action.REMOVE_IMAGE):
            changes.setdefault(p.pool, []).append(p)
    out = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        if obj.get("kind") != "EgressPool" or name not in changes:
            continue
        spec = dict(obj.get("spec") or {})
        images = list(spec.get("images") or [])
        for p in changes[name]:
            if p.action is Action.ADD_IMAGE and p.glob not in images:
                images.append(p.glob)
            elif p.action is Action.REMOVE_IMAGE and p.glob in images:
                images.remove(p.glob)
        spec["images"] = images
        kept = {k: meta[k] for k in ("name", "labels", "annotations") if meta.get(k)}
        annotations = {
            k: v for k, v in (kept.get("annotations") or {}).items() if k != "kubectl.kubernetes.io/last-applied-configuration"
        }
        kept.pop("annotations", None)
        if annotations:
            kept["annotations"] = annotations
        out.append({"apiVersion": obj.get("apiVersion"), "kind": "EgressPool", "metadata": kept, "spec": spec})
    return out


# -- the controller's rule: a pool takes runs by measured history (its opt-in `history` setting) ----------

MAX_MEASURED = 10_000  # Tasks kept in one pool's measured set (largest p90 first): a bound on what tenants can grow
MEASURED_KINDS = (GroupKind.TASK, GroupKind.PIPELINE_TASK)  # an image set is what the globs are for


@dataclass(frozen=True)
class Measured:
    """Why a group is in a pool's measured set: its runs and what they sent over the window."""

    key: GroupKey
    runs: int
    bytes_p90: float
    bytes_median: float
    heavy_runs: int  # runs that sent at least the rule's bytes

    def why(self, window: str, threshold: float) -> str:
        return (
            f"{self.key} sent {_size(self.bytes_p90)} at p90 over its {self.runs} runs of the last {window} "
            f"(at least {_size(threshold)}; median {_size(self.bytes_median)})"
        )


@dataclass(frozen=True)
class MeasuredSet:
    """A pool's measured set, as its history was last read: the groups it takes, and how many qualified
    groups the cap left out (`dropped`)."""

    groups: Mapping[GroupKey, Measured]
    runs_read: int  # Tekton pods of the window the history had
    dropped: int = 0
    read_at: float | None = None  # when it was read (the reader's clock)


def measured_set(pods: Iterable[PodHistory], p90_bytes_at_least: float, min_runs: int, cap: int = MAX_MEASURED) -> MeasuredSet:
    """The groups (Task, or Pipeline task: never an image set) of at least `min_runs` runs whose p90 of
    bytes sent reaches `p90_bytes_at_least`, each within its own namespace; at most `cap`, largest p90 first
    (ties by key)."""
    by_group: dict[GroupKey, list[float]] = {}
    count = 0
    for pod in pods:
        count += 1
        key = group_key(pod)
        if key.kind in MEASURED_KINDS:
            by_group.setdefault(key, []).append(max(0.0, pod.bytes_sent) if math.isfinite(pod.bytes_sent) else 0.0)
    chosen = []
    for key, sent in by_group.items():
        if len(sent) < min_runs:
            continue
        p90 = quantile(sent, 0.9)
        if p90 >= p90_bytes_at_least:
            heavy = sum(1 for b in sent if b >= p90_bytes_at_least)
            chosen.append(Measured(key, len(sent), p90, quantile(sent, 0.5), heavy))
    chosen.sort(key=lambda m: (-m.bytes_p90, m.key))
    kept = chosen[: max(0, cap)]
    return MeasuredSet({m.key: m for m in kept}, count, len(chosen) - len(kept))


def run_key(namespace: str, task: str | None, pipeline: str | None, pipeline_task: str | None) -> GroupKey | None:
    """The group a run being admitted belongs to, as `group_key` groups its pod in the history: by Task,
    else by Pipeline and PipelineTask; None for a run of neither (an image set: not matched)."""
    key = group_key(PodHistory(namespace, "", "", 0.0, task=task or None, pipeline=pipeline or None, pipeline_task=pipeline_task or None))
    return key if key.kind in MEASURED_KINDS else None


TASK_LABEL, PIPELINE_LABEL, PIPELINE_TASK_LABEL = "tekton.dev/task", "tekton.dev/pipeline", "tekton.dev/pipelineTask"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def taskrun_group(namespace: str, run: Mapping[str, Any]) -> GroupKey | None:
    """The history group of a TaskRun being created (`run_key`): its `spec.taskRef.name` (a Task of its
    namespace, no resolver), else the Task, Pipeline and PipelineTask labels Tekton (or its creator) wrote.
    All are the creator's to choose; `namespace` must be the admission request's (or the manifest's), so a
    run only ever matches its own namespace's history."""
    meta = run.get("metadata") if isinstance(run.get("metadata"), Mapping) else {}
    spec = run.get("spec") if isinstance(run.get("spec"), Mapping) else {}
    ref = spec.get("taskRef") if isinstance(spec.get("taskRef"), Mapping) else {}
    task = _text(ref.get("name")) if not ref.get("resolver") and ref.get("kind") in (None, "Task") else None
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    return run_key(namespace, task or _text(labels.get(TASK_LABEL)), _text(labels.get(PIPELINE_LABEL)), _text(labels.get(PIPELINE_TASK_LABEL)))


def pod_group(namespace: str, labels: Mapping[str, Any]) -> GroupKey | None:
    """The history group of a run's pod: Tekton's labels on it (what the history grouped it by)."""
    return run_key(namespace, _text(labels.get(TASK_LABEL)), _text(labels.get(PIPELINE_LABEL)), _text(labels.get(PIPELINE_TASK_LABEL)))


def measured_matches(
    policy: PlacementPolicy, key: GroupKey | None, sets: Mapping[str, MeasuredSet]
) -> tuple[MeasuredMatch, ...]:
    """The run's matches in the measured sets of the pools that have a `history` rule, in policy order. The
    sets are keyed by namespace: `key` is built from the run's own namespace (the admission request's), so a
    run only ever matches its own namespace's history. Whether the pool allows that namespace is `decide`'s."""
    if key is None:
        return ()
    out = []
    for pool in policy.pools:
        rule = pool.history
        found = sets.get(pool.name) if rule is not None else None
        measured = found.groups.get(key) if found is not None else None
        if measured is not None and rule is not None:
            out.append(MeasuredMatch(pool.name, key.namespace, str(key), measured.why(rule.window, rule.p90_bytes_at_least)))
    return tuple(out)


def set_change(old: MeasuredSet | None, new: MeasuredSet) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The groups a new set adds and removes (sorted), for the pool's Event."""
    before = set(old.groups) if old is not None else set()
    after = set(new.groups)
    return tuple(str(k) for k in sorted(after - before)), tuple(str(k) for k in sorted(before - after))


def sets_from_status(objects: Iterable[Any]) -> dict[str, MeasuredSet]:
    """The measured sets EgressPool objects carry in `status.history.measured` (what the controller wrote;
    `kubectl get egresspools -o yaml` gives them), for `explain`. Entries it cannot read are skipped."""
    out: dict[str, MeasuredSet] = {}
    for obj in objects:
        if not isinstance(obj, Mapping) or obj.get("kind") != "EgressPool":
            continue
        name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), Mapping) else None
        status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
        history = status.get("history") if isinstance(status.get("history"), Mapping) else None
        if not isinstance(name, str) or history is None:
            continue
        groups = {}
        for entry in history.get("measured") or ():
            try:
                key = GroupKey(str(entry["namespace"]), GroupKind(entry["kind"]), str(entry["name"]))
                groups[key] = Measured(key, int(entry["runs"]), float(entry["p90Bytes"]), float(entry.get("medianBytes", 0)), 0)
            except (KeyError, TypeError, ValueError):
                continue
        out[name] = MeasuredSet(groups, 0)
    return out
