"""Egress budgets: caps per destination and per egress address (docs/budgets.md, issue #26).

A pool's `destinations` name the services its runs call, the runs that call each (image globs, Task
name globs, a run param whose value is a URL whose host matches), and budgets: runs at once per egress
address, runs at once per pool, starts per window per egress address. A node's egress address is the
value of a node label or annotation the pool names (`egressAddress`), or the node itself.

Pure: the policy's destinations, the pool's nodes and their addresses, the uses (active run pods and
what they touch, from controller-trusted records) and the clock are given; out come the destinations a
run touches, the nodes with room, and a verdict with its reason.

Trust (docs/budgets.md, "A tenant's moves"): what a run matches is the tenant's choice (Task names,
params); counts come only from `Use`s and `Start`s the view builds from facts the controller wrote or
the API server vouches for (a run's pod resolved by uid, the node it is bound to, the budget record
admission wrote and the run guard keeps). An address is always the node's, never a record's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from fnmatch import fnmatchcase, translate
from typing import Annotated, Any, Iterable, Literal, Mapping, Sequence
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, PositiveInt, model_validator

from controller.core.schema import NOT_BLANK, OpenAPI, PolicyModel, Rule

BUDGETS_ANNOTATION = "egress-placer.io/budgets"  # admission's budget record on a pod (JSON)
MAX_DESTINATIONS = 32
MAX_GLOBS = 64
MAX_WINDOW_SECONDS = 7 * 24 * 3600
MAX_RECORD_CHARS = 16 * 1024
ENFORCE, REPORT_ONLY = "Enforce", "ReportOnly"
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NOT_BLANK = re.compile(NOT_BLANK)


def _glob(pattern: str) -> str:
    if not _NOT_BLANK.search(pattern):
        raise ValueError("a glob must not be empty")
    return pattern


def _destination_name(name: str) -> str:
    if len(name) > 63 or not _DNS1123_LABEL.fullmatch(name):
        raise ValueError(f"{name!r} is not a DNS-1123 label (lower-case alphanumerics and '-', at most 63)")
    return name


Glob = Annotated[str, AfterValidator(_glob), OpenAPI(patterns=(NOT_BLANK,), max_length=512)]
Globs = Annotated[tuple[Glob, ...], Field(max_length=MAX_GLOBS)]
DestinationName = Annotated[
    str, AfterValidator(_destination_name), OpenAPI(patterns=(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)$",), max_length=63)
]
ParamName = Annotated[str, Field(min_length=1, max_length=253)]

# -- the policy's part -----------------------------------------------------------------------------


class UrlParam(PolicyModel):
    """A run param whose value is a URL (or a registry-style `host/path`): the run uses the destination
    when the URL's host matches one of `hosts`."""

    param: ParamName = Field(description="The param's name (the run's own params: spec.params).")
    hosts: Annotated[tuple[Glob, ...], Field(min_length=1, max_length=MAX_GLOBS)] = Field(
        description="Host globs (fnmatch: * ? [abc]; case-insensitive, as host names are). The host of "
        "`scheme://host:port/path`, or of `host/path` without a scheme, port left out."
    )


class DestinationMatch(PolicyModel):
    """The runs that use the destination: ANY of these matches."""

    images: Globs = Field(
        default=(),
        description="Globs on the run's images, as a pool's images (the whole reference as written, * also matches /).",
    )
    tasks: Globs = Field(default=(), description="Globs on the run's Task name (spec.taskRef.name).")
    url_params: Annotated[tuple[UrlParam, ...], Field(max_length=MAX_GLOBS)] = Field(
        default=(), description="Run params whose value is a URL whose host matches."
    )

    openapi = OpenAPI(
        rules=(
            Rule(
                "(has(self.images) && size(self.images) > 0) || (has(self.tasks) && size(self.tasks) > 0) || "
                "(has(self.urlParams) && size(self.urlParams) > 0)",
                "a destination's match needs images, tasks or urlParams (an empty one would match nothing)",
                reason="FieldValueRequired",
            ),
        )
    )

    @model_validator(mode="after")
    def _not_empty(self) -> "DestinationMatch":
        if not (self.images or self.tasks or self.url_params):
            raise ValueError("a destination's match needs images, tasks or urlParams (an empty one would match nothing)")
        return self


WINDOW_NEEDS_BOTH = "maxStartsPerWindowPerAddress and windowSeconds go together: give both or neither"
NEEDS_A_BUDGET = (
    "a destination needs a budget: maxConcurrentPerAddress, maxConcurrentPerPool or "
    "maxStartsPerWindowPerAddress (with windowSeconds)"
)


class Destination(PolicyModel):
    """A service the pool's runs call, the runs that call it, and its budgets."""

    name: DestinationName = Field(description="The destination's name (a DNS-1123 label, unique in the pool): in Events, status and metrics.")
    match: DestinationMatch = Field(description="The runs that use it (any of images, tasks, urlParams).")
    max_concurrent_per_address: PositiveInt | None = Field(
        default=None, description="At most this many runs at once on the pool's nodes behind one egress address."
    )
    max_concurrent_per_pool: PositiveInt | None = Field(default=None, description="At most this many runs at once on the whole pool.")
    max_starts_per_window_per_address: PositiveInt | None = Field(
        default=None, description="At most this many runs started in any windowSeconds behind one egress address."
    )
    window_seconds: Annotated[int, Field(ge=1, le=MAX_WINDOW_SECONDS)] | None = Field(
        default=None, description="The window of maxStartsPerWindowPerAddress, in seconds (1 to 604800)."
    )
    mode: Literal["Enforce", "ReportOnly"] = Field(
        default=ENFORCE,
        description="Enforce (the default): runs wait for room. ReportOnly: counted and reported (what would "
        "have waited), never held: to find the right numbers first.",
    )

    openapi = OpenAPI(
        rules=(
            Rule("has(self.maxStartsPerWindowPerAddress) == has(self.windowSeconds)", WINDOW_NEEDS_BOTH, reason="FieldValueRequired"),
            Rule(
                "has(self.maxConcurrentPerAddress) || has(self.maxConcurrentPerPool) || has(self.maxStartsPerWindowPerAddress)",
                NEEDS_A_BUDGET,
                reason="FieldValueRequired",
            ),
        )
    )

    @model_validator(mode="after")
    def _budgets(self) -> "Destination":
        if (self.max_starts_per_window_per_address is None) != (self.window_seconds is None):
            raise ValueError(WINDOW_NEEDS_BOTH)
        if self.max_concurrent_per_address is None and self.max_concurrent_per_pool is None and self.max_starts_per_window_per_address is None:
            raise ValueError(NEEDS_A_BUDGET)
        return self

    @property
    def enforced(self) -> bool:
        return self.mode == ENFORCE


ADDRESS_NEEDS_ONE = "egressAddress needs exactly one of label and annotation"


class EgressAddress(PolicyModel):
    """Where a node's egress address is read. A node without it is its own address (its name)."""

    label: Annotated[str, Field(min_length=1, max_length=317)] | None = Field(
        default=None, description="A node label whose value is the node's egress address (e.g. the NAT's public IP)."
    )
    annotation: Annotated[str, Field(min_length=1, max_length=317)] | None = Field(
        default=None, description="A node annotation whose value is the node's egress address."
    )

    openapi = OpenAPI(rules=(Rule("has(self.label) != has(self.annotation)", ADDRESS_NEEDS_ONE),))

    @model_validator(mode="after")
    def _one(self) -> "EgressAddress":
        if (self.label is None) == (self.annotation is None):
            raise ValueError(ADDRESS_NEEDS_ONE)
        return self


def unique_destinations(destinations: tuple[Destination, ...]) -> tuple[Destination, ...]:
    """The pool validator's check: names unique in the pool (the error names the first user)."""
    first: dict[str, int] = {}
    for i, d in enumerate(destinations):
        if d.name in first:
            raise ValueError(f"destination name {d.name!r} is already used by destinations[{first[d.name]}]")
        first[d.name] = i
    return destinations


def address_of(node: str, labels: Mapping[str, str], annotations: Mapping[str, str], setting: EgressAddress | None) -> str:
    """A node's egress address: the value of the label or annotation the pool names, else the node's name.
    Nodes are cluster-scoped: a tenant writes neither."""
    if setting is not None:
        value = labels.get(setting.label) if setting.label else annotations.get(setting.annotation or "")
        if isinstance(value, str) and value.strip():
            return value.strip()
    return node


# -- what a run touches ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunFacts:
    """What a run shows for matching: its images, its Task name(s), its params (string values). All of it
    is the tenant's to write: it chooses which budgets its own run touches, nothing more."""

    images: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    params: Mapping[str, str] = field(default_factory=dict)


def url_host(value: str) -> str | None:
    """The host of `scheme://host:port/path`, or of `host[:port]/path` without a scheme; lower-case."""
    text = value.strip()
    if not text or len(text) > 2048:
        return None
    try:
        parts = urlsplit(text if "://" in text else f"//{text}")
        host = parts.hostname
    except ValueError:
        return None
    return host.lower() if host else None


@dataclass(frozen=True)
class Touch:
    """A destination a run touches, and what matched (for explain and Events)."""

    destination: str
    why: str


def match(destinations: Sequence[Destination], facts: RunFacts) -> tuple[Touch, ...]:
    """The destinations the run touches, in policy order, each with the first thing that matched."""
    out = []
    for d in destinations:
        why = _why(d.match, facts)
        if why:
            out.append(Touch(d.name, why))
    return tuple(out)


def _why(m: DestinationMatch, facts: RunFacts) -> str:
    if m.images:
        regex = _regex(m.images)
        image = next((i for i in facts.images if regex.fullmatch(i)), None)
        if image is not None:
            return f"image {image}"
    task = next((t for t in facts.tasks for g in m.tasks if fnmatchcase(t, g)), None)
    if task is not None:
        return f"task {task}"
    for p in m.url_params:
        value = facts.params.get(p.param)
        host = url_host(value) if isinstance(value, str) else None
        if host is not None and any(fnmatchcase(host, g.lower()) for g in p.hosts):
            return f"param {p.param} (host {host})"
    return ""


@lru_cache(maxsize=256)
def _regex(globs: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{translate(g)})" for g in globs))


def taskrun_facts(run: Mapping[str, Any], images: Iterable[str]) -> RunFacts:
    """A TaskRun's facts: its images (as found by core.images), spec.taskRef.name, spec.params' strings."""
    spec = run.get("spec") if isinstance(run.get("spec"), Mapping) else {}
    ref = spec.get("taskRef") if isinstance(spec.get("taskRef"), Mapping) else {}
    tasks = (ref["name"],) if isinstance(ref.get("name"), str) and ref["name"] else ()
    return RunFacts(tuple(images), tasks, string_params(spec.get("params")))


def string_params(raw: Any) -> dict[str, str]:
    """name -> value of the params whose value is a string (arrays and objects match nothing)."""
    out: dict[str, str] = {}
    for p in raw if isinstance(raw, list) else []:
        if isinstance(p, Mapping) and isinstance(p.get("name"), str) and isinstance(p.get("value"), str):
            out[p["name"]] = p["value"]
    return out


# -- the budget record admission writes on a pod --------------------------------------------------


def record_annotation(pool: str, destinations: Iterable[str], node: str, started: float) -> str:
    return json.dumps({"pool": pool, "destinations": sorted(set(destinations)), "node": node, "time": round(started, 3)},
                      separators=(",", ":"))


@dataclass(frozen=True)
class Record:
    pool: str
    destinations: tuple[str, ...]
    node: str
    started: float


def read_record(value: Any) -> Record | None:
    """The record in an annotation value; None for anything else. Read only on a run's pod (the view's
    `is_run_pod`); its node is a claim until the pod is bound (then the bound node counts)."""
    if not isinstance(value, str) or not value or len(value) > MAX_RECORD_CHARS:
        return None
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    pool, names, node, when = data.get("pool"), data.get("destinations"), data.get("node"), data.get("time")
    if not isinstance(pool, str) or not isinstance(node, str) or not isinstance(names, list):
        return None
    if not all(isinstance(n, str) for n in names) or isinstance(when, bool) or not isinstance(when, (int, float)):
        return None
    if not math.isfinite(when):
        return None
    return Record(pool, tuple(names), node, float(when))


# -- counting ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Use:
    """An active run pod on the pool: the node it is bound to (or, not bound yet, the node admission
    chose), the destinations recorded when its node was chosen."""

    key: str  # the pod's uid (one use per pod)
    node: str
    destinations: frozenset[str]


@dataclass(frozen=True)
class Start:
    """A start of a run pod touching `destination` behind `address` at `time` (the leader's record and the
    pods' records)."""

    destination: str
    address: str
    time: float


@dataclass(frozen=True)
class PoolBudgets:
    """One pool's budgets at one moment."""

    pool: str
    destinations: tuple[Destination, ...]
    addresses: Mapping[str, str]  # node -> egress address (the pool's nodes that may take runs)
    uses: tuple[Use, ...] = ()
    starts: tuple[Start, ...] = ()

    def destination(self, name: str) -> Destination | None:
        return next((d for d in self.destinations if d.name == name), None)


@dataclass(frozen=True)
class Figure:
    """One budget's use: `used` of `limit`, behind `address` ("" for the pool); `next_slot`: seconds until
    a window slot frees (None: when a run ends)."""

    destination: str
    budget: str  # "at once per address" | "at once per pool" | "starts per window per address"
    address: str
    used: int
    limit: int
    mode: str
    window: int | None = None
    next_slot: float | None = None

    @property
    def full(self) -> bool:
        return self.used >= self.limit


PER_ADDRESS, PER_POOL, PER_WINDOW = "at once per address", "at once per pool", "starts per window per address"


def in_window(start: Start, window: int, now: float) -> bool:
    return now - window < start.time <= now + 1.0  # a second of clock skew between replicas


def figures(budgets: PoolBudgets, destination: Destination, address: str | None, now: float) -> list[Figure]:
    """The budgets of one destination behind one address (None: only the pool-wide one)."""
    d = destination
    out = []
    using = [u for u in budgets.uses if d.name in u.destinations]
    if d.max_concurrent_per_pool is not None:
        out.append(Figure(d.name, PER_POOL, "", len(using), d.max_concurrent_per_pool, d.mode))
    if address is None:
        return out
    if d.max_concurrent_per_address is not None:
        here = sum(1 for u in using if budgets.addresses.get(u.node) == address)
        out.append(Figure(d.name, PER_ADDRESS, address, here, d.max_concurrent_per_address, d.mode))
    if d.max_starts_per_window_per_address is not None and d.window_seconds is not None:
        limit, window = d.max_starts_per_window_per_address, d.window_seconds
        times = sorted(s.time for s in budgets.starts if s.destination == d.name and s.address == address and in_window(s, window, now))
        nxt = None
        if len(times) >= limit:
            nxt = max(0.0, times[len(times) - limit] + window - now)
        out.append(Figure(d.name, PER_WINDOW, address, len(times), limit, d.mode, window, nxt))
    return out


def addresses(budgets: PoolBudgets) -> list[str]:
    return sorted(set(budgets.addresses.values()))


def blocking(budgets: PoolBudgets, touched: Iterable[str], address: str, now: float, mode: str = ENFORCE) -> list[Figure]:
    """The full budgets (of destinations in `mode`) a new run touching `touched` meets behind `address`."""
    out = []
    for name in touched:
        d = budgets.destination(name)
        if d is not None and d.mode == mode:
            out += [f for f in figures(budgets, d, address, now) if f.full]
    return out


def nodes_with_room(budgets: PoolBudgets, touched: Iterable[str], now: float) -> tuple[str, ...]:
    """The pool's nodes where a new run touching `touched` fits every Enforce budget (sorted). A
    destination no longer in the policy is no budget; ReportOnly destinations never narrow."""
    touched = tuple(touched)
    room = {a for a in addresses(budgets) if not blocking(budgets, touched, a, now)}
    return tuple(sorted(n for n, a in budgets.addresses.items() if a in room))


@dataclass(frozen=True)
class Verdict:
    """For a run touching some destinations: hold it or not, the nodes with room, why (the Event's text),
    and what ReportOnly destinations would have held (their texts)."""

    hold: bool
    nodes: tuple[str, ...]
    reason: str = ""
    reported: tuple[str, ...] = ()


def verdict(budgets: PoolBudgets, touched: Iterable[str], now: float) -> Verdict:
    touched = tuple(t for t in touched if budgets.destination(t) is not None)
    nodes = nodes_with_room(budgets, touched, now)
    reported = _report(budgets, touched, now)
    if not touched or nodes:
        return Verdict(False, nodes, "", reported)
    if not budgets.addresses:
        return Verdict(True, (), f"waiting for budgets of pool {budgets.pool}: the pool has no node", reported)
    return Verdict(True, (), "waiting for " + _soonest(budgets, touched, now, ENFORCE), reported)


def _report(budgets: PoolBudgets, touched: tuple[str, ...], now: float) -> tuple[str, ...]:
    """ReportOnly: what would have held the run (no address with room for them)."""
    if not any((d := budgets.destination(t)) is not None and not d.enforced for t in touched) or not budgets.addresses:
        return ()
    if any(not blocking(budgets, touched, a, now, REPORT_ONLY) for a in addresses(budgets)):
        return ()
    return ("would have waited for " + _soonest(budgets, touched, now, REPORT_ONLY),)


def _soonest(budgets: PoolBudgets, touched: tuple[str, ...], now: float, mode: str) -> str:
    """The budget to name: at each address the one that frees last; of those, the address freeing first."""
    best: tuple[float, str, Figure] | None = None
    for a in addresses(budgets):
        full = blocking(budgets, touched, a, now, mode)
        worst = max(full, key=lambda f: math.inf if f.next_slot is None else f.next_slot)
        wait = math.inf if worst.next_slot is None else worst.next_slot
        if best is None or (wait, a) < (best[0], best[1]):
            best = (wait, a, worst)
    assert best is not None
    return describe(best[2], budgets.pool)


def describe(f: Figure, pool: str) -> str:
    """'budget dockerhub-pulls on 203.0.113.7: 10 of 10 in the last hour, next slot in 7 min'."""
    where = f"pool {pool}" if f.budget == PER_POOL else f.address
    if f.budget == PER_WINDOW and f.window is not None:
        slot = "" if f.next_slot is None else f", next slot in {span(f.next_slot)}"
        return f"budget {f.destination} on {where}: {f.used} of {f.limit} in the last {period(f.window)}{slot}"
    return f"budget {f.destination} on {where}: {f.used} of {f.limit} at once"


def period(seconds: int) -> str:
    if seconds == 3600:
        return "hour"
    if seconds == 86400:
        return "day"
    return span(seconds)


def span(seconds: float) -> str:
    s = max(0, math.ceil(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{math.ceil(s / 60)} min"
    if s < 86400:
        h, m = divmod(math.ceil(s / 60), 60)
        return f"{h} h" if m == 0 else f"{h} h {m} min"
    d, h = divmod(math.ceil(s / 3600), 24)
    return f"{d} d" if h == 0 else f"{d} d {h} h"


def admit(budgets: PoolBudgets, key: str, node: str, touched: Iterable[str], now: float) -> PoolBudgets:
    """The picture after a run pod touching `touched` is placed on `node` now: one use, and a start per
    destination behind the node's address (also ReportOnly ones: they are counted)."""
    names = frozenset(t for t in touched if budgets.destination(t) is not None)
    address = budgets.addresses[node]
    starts = tuple(Start(n, address, now) for n in sorted(names))
    return PoolBudgets(budgets.pool, budgets.destinations, budgets.addresses, budgets.uses + (Use(key, node, names),), budgets.starts + starts)


def release(budgets: PoolBudgets, key: str) -> PoolBudgets:
    """The picture after the run pod `key` ended (its starts stay in their window)."""
    return PoolBudgets(budgets.pool, budgets.destinations, budgets.addresses, tuple(u for u in budgets.uses if u.key != key), budgets.starts)


def trusted_use(key: str, record: Record | None, run_pod: bool, pool: str, bound_node: str | None, known: Iterable[str]) -> Use | None:
    """A pod's use from its budget record: only a run's pod (`queue.core.is_run_pod`) whose record names
    this pool; the node it is bound to counts over the node the record names; destinations not in the
    policy are dropped (no made-up names reach a count or a metric)."""
    if record is None or not run_pod or record.pool != pool:
        return None
    names = frozenset(record.destinations) & frozenset(known)
    return Use(key, bound_node or record.node, names) if names else None


BUDGET_FIELDS = ("max_concurrent_per_address", "max_concurrent_per_pool", "max_starts_per_window_per_address", "window_seconds")


def explained(destinations: Sequence[Destination], facts: RunFacts) -> list[dict[str, Any]]:
    """What `explain` shows of the budgets a run would touch: each destination, what matched, its mode
    and budgets (as the policy spells them)."""
    by_name = {d.name: d for d in destinations}
    out = []
    for touch in match(destinations, facts):
        d = by_name[touch.destination]
        limits = {Destination.model_fields[f].alias or f: getattr(d, f) for f in BUDGET_FIELDS if getattr(d, f) is not None}
        out.append({"destination": d.name, "matched": touch.why, "mode": d.mode, **limits})
    return out


REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
MAX_NARROWED_NODES = 256  # nodes named in a pod's required affinity; past it, the node choice alone keeps to the budget


def full_nodes(budgets: PoolBudgets, touched: Iterable[str], now: float) -> tuple[str, ...]:
    """The pool's nodes whose address has no room for a new run touching `touched` (Enforce budgets)."""
    room = set(nodes_with_room(budgets, touched, now))
    return tuple(sorted(n for n in budgets.addresses if n not in room))


def narrow(template: Mapping[str, Any], full: Sequence[str]) -> dict[str, Any]:
    """`template` whose REQUIRED node affinity keeps off `full` (each term ANDed with `metadata.name NotIn
    [node]` per node: the API server allows one value per field requirement). A preferred node alone
    would let the scheduler put the pod on a full address. Idempotent; unchanged past MAX_NARROWED_NODES."""
    out = json.loads(json.dumps(dict(template)))
    if not full or len(full) > MAX_NARROWED_NODES:
        return out
    affinity = out.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    selector = node_affinity.setdefault(REQUIRED, {})
    terms = selector.get("nodeSelectorTerms") or [{}]
    wanted = [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in full]
    for term in terms:
        fields = term.setdefault("matchFields", [])
        fields += [w for w in wanted if w not in fields]
    selector["nodeSelectorTerms"] = terms
    return out


def release_within(budgets: PoolBudgets, waiting: Sequence[tuple[Any, Sequence[str]]], in_flight: Iterable[Sequence[str]],
                   now: float) -> list[Any]:
    """The keys `release_to` releases (runs in flight with no address given)."""
    return list(release_to(budgets, waiting, [(touched, "") for touched in in_flight], now))


def release_to(budgets: PoolBudgets, waiting: Sequence[tuple[Any, Sequence[str]]], in_flight: Iterable[tuple[Sequence[str], str]],
               now: float) -> dict[Any, str]:
    """The keys of the waiting runs (in release order, each with the destinations it touches) that fit
    the budgets now, each counted as a use (and a start) on a node with room as it is taken; the runs
    released whose pod has not come yet (`in_flight`) are counted first, so that passes made before
    their pods appear never release twice into one room. A run that does not fit stays waiting; later
    runs touching other destinations may still go.

    Each key released -> the egress address it was counted behind (the release writes it on the run, and
    the pod goes behind it while it has room there: replicas admitting pods at once then do not all take
    one address's last room). A run in flight is counted behind the address it was released to, when it
    has one and it is still a pool address.

    A run touching no destination of the pool (none, or only names no longer in the policy) takes no room
    and is released to no address (""): nothing is written on it beyond the release, and its pod is placed
    as on a pool without budgets (issue #26: such runs are not slowed by the pool's budgets)."""
    picture = budgets
    for i, (touched, address) in enumerate(in_flight):
        if not _known(budgets, touched):
            continue  # takes no room: nothing to count
        behind = tuple(sorted(n for n, a in picture.addresses.items() if a == address)) if address else ()
        nodes = [n for n in nodes_with_room(picture, touched, now) if not behind or n in behind]
        nodes = nodes or list(behind) or list(nodes_with_room(picture, touched, now)) or sorted(picture.addresses)
        if nodes:
            picture = admit(picture, f"in-flight-{i}", nodes[0], touched, now)
    out: dict[Any, str] = {}
    for key, touched in waiting:
        if not _known(budgets, touched):
            out[key] = ""
            continue
        nodes = nodes_with_room(picture, touched, now)
        if not nodes:
            continue
        picture = admit(picture, f"waiting-{len(out)}", nodes[0], touched, now)
        out[key] = picture.addresses.get(nodes[0], nodes[0])
    return out


def _known(budgets: PoolBudgets, touched: Iterable[str]) -> bool:
    """Does `touched` name a destination of the pool (one whose budgets count)?"""
    return any(budgets.destination(t) is not None for t in touched)


def holding(budgets: PoolBudgets, touched: Iterable[str], now: float, mode: str = ENFORCE) -> list[str]:
    """The destinations among `touched` (of `mode`) with no room behind any address now (for the count of
    runs each held, or would have held)."""
    return [t for t in dict.fromkeys(touched) if budgets.addresses
            and all(blocking(budgets, [t], a, now, mode) for a in addresses(budgets))]


# -- the start record the leader keeps (a ConfigMap in the controller's namespace) ------------------

STARTS_CONFIGMAP = "egress-placer-budget-starts"
STARTS_KEY = "starts.json"
MAX_KEPT_STARTS = 5000  # rows in the record (~100 bytes each: far under a ConfigMap's 1 MiB)

Kept = Mapping[str, tuple[str, tuple[Start, ...]]]  # pod uid -> (pool, its starts)


def window_budgets(pools: Iterable[Any]) -> dict[tuple[str, str], tuple[int, int]]:
    """(pool, destination) -> (window seconds, starts allowed) of the window budgets in the policy."""
    return {(p.name, d.name): (d.window_seconds, d.max_starts_per_window_per_address)
            for p in pools for d in p.destinations
            if d.window_seconds is not None and d.max_starts_per_window_per_address is not None}


def starts_to_keep(starts: Kept, windows: Mapping[tuple[str, str], tuple[int, int]], now: float) -> dict[str, tuple[str, tuple[Start, ...]]]:
    """What the record keeps of `starts` (the trusted starts the view counts, by pod uid): only starts of a
    window budget still in its window, and per (pool, destination, address) only the latest as many as
    the budget allows (enough to tell full, and when the next slot frees); at most MAX_KEPT_STARTS."""
    rows = sorted(((s.time, uid, pool, s) for uid, (pool, mine) in starts.items() for s in mine
                   if (pool, s.destination) in windows and in_window(s, windows[(pool, s.destination)][0], now)),
                  key=lambda r: (-r[0], r[1], r[3].destination))
    per: dict[tuple[str, str, str], int] = {}
    out: dict[str, tuple[str, tuple[Start, ...]]] = {}
    kept = 0
    for _, uid, pool, s in rows:
        group = (pool, s.destination, s.address)
        if per.get(group, 0) >= windows[(pool, s.destination)][1] or kept >= MAX_KEPT_STARTS:
            continue
        per[group] = per.get(group, 0) + 1
        kept += 1
        out[uid] = (pool, out.get(uid, (pool, ()))[1] + (s,))
    return {uid: (pool, tuple(sorted(mine, key=lambda s: s.destination))) for uid, (pool, mine) in sorted(out.items())}


def encode_starts(kept: Kept) -> str:
    """The record's text: one row [uid, pool, destination, address, time] per start, in a stable order."""
    rows = [[uid, pool, s.destination, s.address, round(s.time, 3)] for uid, (pool, mine) in sorted(kept.items()) for s in mine]
    return json.dumps({"starts": rows}, separators=(",", ":"))


def decode_starts(text: Any) -> dict[str, tuple[str, tuple[Start, ...]]]:
    """The record's starts; a row that is not [uid, pool, destination, address, finite time] is left out,
    a text that is no record gives nothing (never raises)."""
    if not isinstance(text, str) or len(text) > 2 * 1024 * 1024:
        return {}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    rows = data.get("starts") if isinstance(data, dict) else None
    out: dict[str, tuple[str, tuple[Start, ...]]] = {}
    for row in rows if isinstance(rows, list) else []:
        if not (isinstance(row, list) and len(row) == 5 and all(isinstance(v, str) and v for v in row[:4])):
            continue
        when = row[4]
        if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
            continue
        uid, pool, destination, address = row[:4]
        if uid in out and out[uid][0] != pool:
            continue
        out[uid] = (pool, out.get(uid, (pool, ()))[1] + (Start(destination, address, float(when)),))
        if len(out) > MAX_KEPT_STARTS:
            break
    return out
