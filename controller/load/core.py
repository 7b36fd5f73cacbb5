"""Node choice inside a pool: the rank of a node's load, the tie rule among equally loaded nodes
(`load.index.PoolLoads` keeps the order; bench/oracles.py's `choose_node` is the full scan it is
held to), and the bookkeeping of placements chosen at admission whose pods do not exist yet.

Pure: the clock is passed in, nothing here reads the cluster.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from controller.core.model import NodeLoad, NodeState


class Ratio:
    """An exact fraction num/den (den > 0), compared by cross-multiplication of integers: no
    Fraction objects, and no float that could tie two unequal loads or order them wrongly."""

    __slots__ = ("num", "den")

    def __init__(self, num: int, den: int) -> None:
        self.num = num
        self.den = den

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ratio):
            return NotImplemented
        return self.num * other.den == other.num * self.den

    def __lt__(self, other: "Ratio") -> bool:
        return self.num * other.den < other.num * self.den

    def __le__(self, other: "Ratio") -> bool:
        return self.num * other.den <= other.num * self.den

    def __gt__(self, other: "Ratio") -> bool:
        return self.num * other.den > other.num * self.den

    def __ge__(self, other: "Ratio") -> bool:
        return self.num * other.den >= other.num * self.den

    __hash__ = None  # type: ignore[assignment]  # equal ratios have different (num, den)

    def __repr__(self) -> str:
        return f"Ratio({self.num}, {self.den})"


# (no capacity, the ratio rounded to a float, the exact ratio, absolute count): lower is better.
# The float is the correctly rounded value of the exact ratio, so it never orders two loads
# against their exact order; it only lets most comparisons end in C. Equal floats fall through to
# the exact ratio.
Rank = tuple[bool, float, Ratio, int]
_NO_RATIO = Ratio(0, 1)


def load_rank(load: NodeLoad, measured: tuple[int, int] | None = None) -> Rank:
    """The rank node choice orders by: the ratio (placed+assumed)/capacity, or `measured` (an exact
    fraction (numerator, denominator > 0), the measured egress ratio of `core.egress.measured_ratio`)
    when given; then the absolute count. A node with capacity 0 or less sorts after every node that
    has some, whatever its ratio."""
    return rank_of(load.total, load.capacity, measured)


def rank_of(total: int, capacity: int, measured: tuple[int, int] | None = None) -> Rank:
    """`load_rank` of a node with `total` runs (placed + assumed, as ranked) and `capacity`."""
    if capacity <= 0:
        return (True, 0.0, _NO_RATIO, total)
    num, den = measured if measured is not None else (total, capacity)
    try:
        approx = num / den  # int / int is correctly rounded: monotone in the exact value
    except OverflowError:
        approx = math.inf
    return (False, approx, Ratio(num, den), total)


def spread_index(salt: str, count: int) -> int:
    """Which of `count` equally loaded nodes (in name order) takes the run: a stable,
    process-independent hash of `salt` modulo `count`, so equal nodes take runs in turn."""
    if count <= 1:
        return 0
    return int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "big") % count


def ledger_key(kind: str, namespace: str, name: str) -> str:
    """The key convention of `LoadLedger`: "<kind>/<namespace>/<name>", kind "taskrun" or "pod"."""
    return f"{kind}/{namespace}/{name}"


@dataclass(frozen=True)
class Assumption:
    """A placement chosen at admission whose pod the informer has not seen yet."""

    pool: str
    node: str
    since: float


class LoadLedger:
    """Placements assumed at admission, counted on their node until their pod appears.

    Keys are opaque strings; by convention `ledger_key(kind, namespace, name)`: "taskrun/ns/name"
    when a TaskRun is admitted (settled when a pod labelled `tekton.dev/taskRun=name` appears in
    ns) and "pod/ns/name" when a Pod is admitted (settled when the informer sees that pod). The
    caller that assumes a key must settle it with the same key; whatever is never settled is
    dropped by `expire`. Assuming a key again moves it (never counted twice).

    `on_change(node)`, when given, is called each time the count assumed on `node` changes (the
    load index follows it). `expire` only looks at what has become old: a heap ordered by the time
    of each assumption, so its cost does not grow with what is still fresh.

    Not thread-safe: one event loop (or one lock) owns a ledger.
    """

    def __init__(self, on_change: Callable[[str], None] | None = None) -> None:
        self._assumed: dict[str, Assumption] = {}
        self._per_node: Counter[str] = Counter()
        self._on_change = on_change
        # (since, sequence, key, assumption): settled or moved entries stay until they come first.
        self._by_age: list[tuple[float, int, str, Assumption]] = []
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._assumed)

    def __contains__(self, key: object) -> bool:
        return key in self._assumed

    def get(self, key: str) -> Assumption | None:
        return self._assumed.get(key)

    def assume(self, key: str, pool: str, node: str, now: float) -> None:
        """Count one placement on `node` until `key` is settled or expires."""
        self.settle(key)
        assumption = Assumption(pool=pool, node=node, since=now)
        self._assumed[key] = assumption
        self._per_node[node] += 1
        heapq.heappush(self._by_age, (now, next(self._sequence), key, assumption))
        if len(self._by_age) > 2 * len(self._assumed) + 64:  # mostly settled entries: drop them
            self._by_age = [entry for entry in self._by_age if self._assumed.get(entry[2]) is entry[3]]
            heapq.heapify(self._by_age)
        if self._on_change is not None:
            self._on_change(node)

    def settle(self, key: str) -> None:
        """The pod of `key` appeared (the informer counts it now) or will never come. Unknown keys are ignored."""
        old = self._assumed.pop(key, None)
        if old is not None:
            self._per_node[old.node] -= 1
            if self._per_node[old.node] <= 0:
                del self._per_node[old.node]
            if self._on_change is not None:
                self._on_change(old.node)

    def expire(self, now: float, ttl: float) -> list[str]:
        """Drop and return (sorted) the keys assumed more than `ttl` seconds before `now`."""
        stale = []
        while self._by_age and now - self._by_age[0][0] > ttl:
            _, _, key, assumption = heapq.heappop(self._by_age)
            if self._assumed.get(key) is assumption:
                stale.append(key)
        stale.sort()
        for key in stale:
            self.settle(key)
        return stale

    def assumed_on(self, node: str) -> int:
        return self._per_node.get(node, 0)

    def loads(self, nodes: Sequence[NodeState], placed: Mapping[str, int], capacity: int | None) -> dict[str, NodeLoad]:
        """The load of each node: `placed` pods (from the informer), assumed placements, and
        `capacity` (the pool's setting) or, when None, the node's allocatable pods."""
        return {
            n.name: NodeLoad(
                name=n.name,
                placed=placed.get(n.name, 0),
                assumed=self.assumed_on(n.name),
                capacity=capacity if capacity is not None else n.allocatable_pods,
            )
            for n in nodes
        }


# -- placements every replica counts ------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One version of a stored run or pod, as the claim book reads it (the view builds it from the object).

    `claim` (pool, node): what admission's decision record on the object names, already checked against
    the pool's members and the namespace's rights (None: none, or none to trust). `active`: may it take
    a place now (a run not finished, not pending; a pod not bound, not finished, not being deleted).
    `created`: the API server's creationTimestamp. `runs`: a pod's runs, (run ledger key, run uid or "" for
    any), whose own placement the pod replaces from now on."""

    key: str
    uid: str
    created: float
    claim: tuple[str, str] | None
    active: bool
    runs: tuple[tuple[str, str], ...] = ()
    also: tuple[str, ...] = ()  # keys this replica may have assumed it under before it had a name


class ClaimBook:
    """What the ledger counts for each key, from two sources: the placements this replica assumed at
    admission (`assume`, `forget`), and the decision records on the runs and pods the API server stores
    (`seen`, `removed`), which every replica's informers see, whichever replica admitted them. One key is
    one entry (`ledger_key`: the same key for the replica's own assumption and the stored object):

    - a stored object replaces the replica's own assumption for its key, for good;
    - a pod of a run replaces the run's entry (own, and stored for that run's uid) for good: the pod counts;
    - a bound pod counts as placed (the view's count), not here: its `Seen` is not active;
    - an object's claim is read from the first active version seen and kept while it stays active (a
      later edit of the annotation by its owner moves nothing); it counts for `ttl` seconds after the
      object's creationTimestamp (own assumptions: after they were made), like an assumption.

    The ledger's counts are a function of what was seen, not of the order (across objects) or of
    repeats. Pure: `now` is passed in. Memory: what was created or assumed in the last `ttl` seconds.
    """

    def __init__(self, ledger: LoadLedger, ttl: float) -> None:
        self.ledger, self.ttl = ledger, ttl
        self._own: dict[str, Assumption] = {}
        # key -> (uid, since, claim) of the active objects created in the last `ttl` seconds: the claim is the
        # first version's, kept while the object stays active
        self._stored: dict[str, tuple[str, float, Assumption | None]] = {}
        self._replaced: dict[tuple[str, str], float] = {}  # (run key, uid or "") -> when a pod of it was first seen
        self._by_age: list[tuple[float, int, str, Any, Any]] = []  # (time, sequence, table, key, token)
        self._sequence = itertools.count()

    # -- the replica's own admissions ---------------------------------------------------------------
    def assume(self, key: str, pool: str, node: str, now: float) -> None:
        if key in self._stored:  # its object is stored already (admitted again): what is stored counts
            return
        assumption = Assumption(pool, node, now)
        self._own[key] = assumption
        self._aged(now, "own", key, assumption)
        self._resolve(key, now)

    def withdraw(self, key: str, now: float) -> None:
        """This replica's own assumption for `key` counts no more (what is stored of it still does): the
        API server calls the pod webhook again (reinvocation) and the placement is chosen anew."""
        if self._own.pop(key, None) is not None:
            self._resolve(key, now)

    def forget(self, key: str, now: float) -> None:
        """A run's pod is being made (admitted here): from now on the pod counts, the run (its own
        assumption, and what is stored of it) does not."""
        self._own.pop(key, None)
        if (key, "") not in self._replaced:
            self._replaced[(key, "")] = now
            self._aged(now, "replaced", (key, ""), now)
        self._resolve(key, now)

    # -- what the API server stores -------------------------------------------------------------------
    def seen(self, version: Seen, now: float) -> None:
        """One version of a run or pod (an informer event or a relist's item)."""
        for key in (version.key, *version.also):
            if self._own.pop(key, None) is not None and key != version.key:
                self._resolve(key, now)
        for run in version.runs:
            self._own.pop(run[0], None)
            if run not in self._replaced:
                self._replaced[run] = now
                self._aged(now, "replaced", run, now)
            self._resolve(run[0], now)
        kept = self._stored.get(version.key)
        if not version.active:  # it counts no more (bound, finished, held): nothing is kept
            self._stored.pop(version.key, None)
        elif kept is None or kept[0] != version.uid or now - kept[1] > self.ttl:
            if now - version.created <= self.ttl:
                since = min(version.created, now)  # an API server clock ahead of ours: counted from now
                claim = Assumption(version.claim[0], version.claim[1], since) if version.claim else None
                self._stored[version.key] = entry = (version.uid, since, claim)
                self._aged(since, "stored", version.key, entry)
            else:  # too old to count
                self._stored.pop(version.key, None)
        self._resolve(version.key, now)

    def removed(self, key: str, now: float) -> None:
        """The object under `key` is gone (deleted; or finished, for a pod the cache drops)."""
        self._own.pop(key, None)
        if self._stored.pop(key, None) is not None or key in self.ledger:
            self._resolve(key, now)

    def stored_keys(self) -> list[str]:
        return list(self._stored)

    def knows(self, key: str, uid: str, now: float) -> bool:
        """Is a version of this object (`uid`) kept, still fresh: its claim is read already (the view need not parse it)."""
        kept = self._stored.get(key)
        return kept is not None and kept[0] == uid and now - kept[1] <= self.ttl

    # -- time -------------------------------------------------------------------------------------------
    def expire(self, now: float) -> list[str]:
        """Drop what is more than `ttl` old; returns the keys the ledger stopped counting (sorted)."""
        while self._by_age and now - self._by_age[0][0] > self.ttl:
            _, _, table, key, token = heapq.heappop(self._by_age)
            if table == "own" and self._own.get(key) is token:
                del self._own[key]
            elif table == "stored" and self._stored.get(key) is token:
                del self._stored[key]
            elif table == "replaced" and self._replaced.get(key) == token:
                del self._replaced[key]
        return self.ledger.expire(now, self.ttl)

    # -- inside -----------------------------------------------------------------------------------------
    def _aged(self, when: float, table: str, key: Any, token: Any) -> None:
        heapq.heappush(self._by_age, (when, next(self._sequence), table, key, token))

    def counted(self, key: str, now: float) -> Assumption | None:
        """What `key` counts for now (None: nothing)."""
        stored = self._stored.get(key)
        if stored is not None:
            uid, _, claim = stored
            if claim is None or (key, uid) in self._replaced or (key, "") in self._replaced:
                return None
        else:
            claim = self._own.get(key)
            if claim is None:
                return None
        return claim if now - claim.since <= self.ttl else None

    def _resolve(self, key: str, now: float) -> None:
        want = self.counted(key, now)
        have = self.ledger.get(key)
        if want == have:
            return
        if want is None:
            self.ledger.settle(key)
        else:
            self.ledger.assume(key, want.pool, want.node, want.since)
