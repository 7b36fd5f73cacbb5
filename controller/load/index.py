"""The load of one pool's nodes, kept current on events and ordered for node choice.

`PoolLoads` holds each eligible node's placed pods, assumed placements, capacity and measured
egress figure, and keeps the nodes sorted by `load.core.load_rank` (then name) in a plain list, kept
sorted with `bisect` (C). Whoever sees a change tells it (a pod on the node, an assumption, a node
joining or leaving, a new egress figure); a choice costs O(log n) comparisons in the pool's size, a
change as much plus a move of the list's tail (a memmove: about a microsecond at 5,000 nodes), and
nothing is rebuilt per decision. (An order-statistic tree, `sortedcontainers.SortedList`, did the same
in O(log n) Python steps: on admission's cold path its choice cost three times a list's, #24.)

The choice is the one `choose_node` of bench/oracles.py (the full scan) makes from the same loads: the
lowest rank, and among equal nodes the one at `spread_index(salt, count)` in name order. The
equal nodes come first in the sorted list and their count is one bisection, so a tie costs no more
than one node.

Measured egress figures go stale with time: `refresh(now)` re-ranks the nodes whose figure became
too old since the last refresh (a heap of expiry times), so only those are visited.

Pure: the time is passed in.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping


from controller.load.core import Rank, rank_of, spread_index
from controller.core.egress import EgressLoad, Measurement, is_fresh, measured_ratio
from controller.core.model import NodeLoad


class _Member:
    __slots__ = ("allocatable", "assumed", "key", "measurement", "placed")

    def __init__(self, allocatable: int, placed: int, assumed: int, measurement: Measurement | None) -> None:
        self.allocatable = allocatable
        self.placed = placed
        self.assumed = assumed
        self.measurement = measurement
        self.key: tuple[bool, float, object, int, str] | None = None


class PoolLoads:
    """One pool's eligible nodes and their load, ordered for node choice.

    `capacity`: the pool's setting, or None for each node's allocatable pods. `count_assumed`
    False ranks by seen pods only (Settings.balance "load-without-assumptions"); the loads it
    reports still show the assumed placements. `egress`: the pool's `egressLoad` (bandwidth per
    node, the figures' max age), or None to rank by run counts only.
    """

    def __init__(self, capacity: int | None, *, count_assumed: bool = True, egress: EgressLoad | None = None) -> None:
        self.capacity = capacity
        self.count_assumed = count_assumed
        self.egress = egress
        self._members: dict[str, _Member] = {}
        self._order: list[tuple[bool, float, object, int, str]] = []  # the members' keys, sorted
        self._figures: Mapping[str, Measurement] = {}
        self._now = -math.inf  # the time of the last refresh: what freshness is judged at
        # (expiry time, sequence, node, measurement): when a figure fresh at _now stops counting.
        self._expiry: list[tuple[float, int, str, Measurement]] = []
        self._sequence = itertools.count()

    # -- size and members -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def names(self) -> Iterator[str]:
        return iter(self._members)

    # -- updates --------------------------------------------------------------------------------
    def put(self, name: str, allocatable_pods: int, placed: int = 0, assumed: int = 0) -> None:
        """`name` is (still) an eligible node of the pool, with these counts and allocatable pods."""
        member = self._members.get(name)
        if member is None:
            member = self._members[name] = _Member(allocatable_pods, placed, assumed, None)
            self._set_measurement(name, member, self._figures.get(name))
        else:
            member.allocatable, member.placed, member.assumed = allocatable_pods, placed, assumed
        self._rerank(name, member)

    def remove(self, name: str) -> None:
        member = self._members.pop(name, None)
        if member is not None and member.key is not None:
            self._unorder(member.key)

    def set_placed(self, name: str, placed: int) -> None:
        """Pods that take a run's place on `name` (ignored when it is no member)."""
        member = self._members.get(name)
        if member is not None and member.placed != placed:
            member.placed = placed
            self._rerank(name, member)

    def set_assumed(self, name: str, assumed: int) -> None:
        """Placements assumed on `name` whose pods have not appeared (ignored when it is no member)."""
        member = self._members.get(name)
        if member is not None and member.assumed != assumed:
            member.assumed = assumed
            self._rerank(name, member)

    def set_figures(self, figures: Mapping[str, Measurement], names: Iterable[str] | None = None) -> None:
        """The egress figures now kept for the pool's nodes (a new mapping per poll, not changed after):
        each member whose figure changed is ranked again. `names`: only these members now (a caller
        that takes a poll in over several calls, each over some of the members; a member that joins
        meanwhile reads the new figures at once)."""
        self._figures = figures
        for name in self._members if names is None else names:
            member = self._members.get(name)
            if member is None:
                continue  # left the pool meanwhile
            measurement = figures.get(name)
            if measurement != member.measurement:
                self._set_measurement(name, member, measurement)
                self._rerank(name, member)

    def refresh(self, now: float) -> None:
        """Judge freshness at `now`: re-rank the nodes whose figure went stale since the last refresh.
        A clock that went back re-ranks every node with a figure."""
        if now < self._now:
            self._now = now
            self._expiry.clear()
            for name, member in self._members.items():
                if member.measurement is not None:
                    self._set_measurement(name, member, member.measurement)
                    self._rerank(name, member)
            return
        self._now = now
        # A little past `now`: `sampled_at + max_age` and `now - sampled_at` round differently; every
        # entry popped is judged by `is_fresh` itself, and pushed back when it still counts.
        horizon = now + (abs(now) + self.egress.prometheus.max_age) * 2**-40 if self.egress is not None else now
        still_fresh = []
        while self._expiry and self._expiry[0][0] <= horizon:
            entry = heapq.heappop(self._expiry)
            member = self._members.get(entry[2])
            if member is None or member.measurement is not entry[3]:
                continue  # gone, or a newer figure came
            self._rerank(entry[2], member)
            if self._fresh(entry[3]):  # the boundary, within a rounding: looked at again next time
                still_fresh.append(entry)
        for entry in still_fresh:
            heapq.heappush(self._expiry, entry)

    # -- choice ---------------------------------------------------------------------------------
    def choose(self, salt: str, allowed: frozenset[str] | None = None, prefer: str | None = None) -> str | None:
        """The least loaded node (None when the pool has none); among equals `prefer` when it is one of
        them (a run's pod keeps the node its run was given unless another is now less loaded), else the
        one at `spread_index(salt, count)` in name order. `allowed`: only among these (egress budgets: the
        nodes whose address has room; O(n) then)."""
        if allowed is not None:
            keys = [key for key in self._order if key[4] in allowed]
            if not keys:
                return None
            if prefer is not None and prefer in allowed and self.rank(prefer) == keys[0][:4]:
                return prefer
            tied = [key for key in keys if key[:4] == keys[0][:4]]
            return tied[0][4] if len(tied) == 1 else tied[spread_index(salt, len(tied))][4]
        if not self._order:
            return None
        first = self._order[0]
        if prefer is not None and self.rank(prefer) == first[:4]:
            return prefer
        tied = bisect_left(self._order, (first[0], first[1], first[2], first[3] + 1))
        return first[4] if tied == 1 else self._order[spread_index(salt, tied)][4]

    def load(self, name: str) -> NodeLoad | None:
        member = self._members.get(name)
        return None if member is None else self._load(name, member)

    def least_loaded(self, count: int, include: str | None = None) -> list[NodeLoad]:
        """The loads of the `count` least loaded nodes in choice order; `include` (the chosen node)
        takes the last place when it is not among them."""
        names = [key[4] for key in self._order[:count]]
        if include is not None and include in self._members and include not in names:
            names[-1:] = [include]
        # `_load` of each, inline, and the tuples made in C (a choice reports ten: one Python call, not twenty)
        members, capacity, new = self._members, self.capacity, tuple.__new__
        return [
            new(NodeLoad, (name, m.placed, m.assumed, capacity if capacity is not None else m.allocatable))
            for name, m in ((name, members[name]) for name in names)
        ]

    def loads(self) -> dict[str, NodeLoad]:
        """Every node's load (for `status` and tests: O(n))."""
        return {name: self._load(name, member) for name, member in self._members.items()}

    def rank(self, name: str) -> Rank | None:
        """What `name` is ranked by now (for tests and explanations)."""
        member = self._members.get(name)
        return None if member is None or member.key is None else member.key[:4]  # type: ignore[return-value]

    # -- inside ---------------------------------------------------------------------------------
    def _load(self, name: str, member: _Member) -> NodeLoad:
        capacity = self.capacity if self.capacity is not None else member.allocatable
        return NodeLoad(name, member.placed, member.assumed, capacity)

    def _fresh(self, measurement: Measurement) -> bool:
        return self.egress is not None and is_fresh(measurement, self._now, self.egress.prometheus.max_age)

    def _set_measurement(self, name: str, member: _Member, measurement: Measurement | None) -> None:
        member.measurement = measurement
        if measurement is not None and self._fresh(measurement):
            expires = measurement.sampled_at + self.egress.prometheus.max_age  # type: ignore[union-attr]
            heapq.heappush(self._expiry, (expires, next(self._sequence), name, measurement))

    def _rerank(self, name: str, member: _Member) -> None:
        capacity = self.capacity if self.capacity is not None else member.allocatable
        assumed = member.assumed if self.count_assumed else 0
        measured = None
        if self.egress is not None and member.measurement is not None:
            seen = NodeLoad(name, member.placed, assumed, capacity)
            measured = measured_ratio(
                seen, member.measurement, self.egress.bandwidth_of(name), self._now, self.egress.prometheus.max_age
            )
        key = (*rank_of(member.placed + assumed, capacity, measured), name)
        if key == member.key:
            return
        if member.key is not None:
            self._unorder(member.key)
        insort(self._order, key)
        member.key = key

    def _unorder(self, key: tuple[bool, float, object, int, str]) -> None:
        at = bisect_left(self._order, key)
        if at == len(self._order) or self._order[at] != key:
            raise KeyError(key)  # a member's key is always in the order: a bug if not
        del self._order[at]
