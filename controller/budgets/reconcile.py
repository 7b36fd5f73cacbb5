"""Egress budgets, the leader's part (docs/budgets.md): each budget's use per pool, destination and
address into metrics after each change (`BudgetMetrics`), and the record of the windows' starts
(`BudgetStartsKeeper`). The hold and the release are the queue's (admission, `queue.reconcile`), the
node choice admission's.

The record of starts: a ConfigMap `egress-placer-budget-starts` in the controller's namespace (tenants
can neither read nor write it), written by the leader only: the starts every window budget still counts
(`budgets.core.starts_to_keep`: in the window, the latest as many as the budget allows per destination
and address). Read back at every replica's start and when a replica starts leading
(`BudgetsView.restore`), so a run and its pod deleted while no replica watched still fill their window.
It proves nothing new: it holds only starts the view counted from trusted records."""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Protocol

from loguru import logger

from controller.budgets.core import (
    PER_ADDRESS,
    PER_WINDOW,
    STARTS_CONFIGMAP,
    STARTS_KEY,
    addresses,
    decode_starts,
    encode_starts,
    figures,
    starts_to_keep,
    window_budgets,
)
from controller.budgets.view import BudgetsView
from controller.core.policy import PlacementPolicy
from controller.metrics import GaugeSnapshot, Metrics


class BudgetState(Protocol):
    @property
    def policy(self) -> PlacementPolicy: ...

    budgets: BudgetsView


class BudgetMetrics:
    def __init__(self, state: BudgetState, metrics: Metrics, clock: Callable[[], float] = time.time) -> None:
        self.state, self.clock = state, clock
        self._in_use = GaugeSnapshot(metrics.budget_in_use)
        self._starts = GaugeSnapshot(metrics.budget_window_starts)

    def __call__(self) -> float | None:
        now = self.clock()
        in_use: dict[tuple[str, ...], float] = {}
        starts: dict[tuple[str, ...], float] = {}
        for pool in self.state.policy.pools:
            budgets = self.state.budgets.pool_budgets(pool, now)
            if budgets is None:
                continue
            for d in pool.destinations:
                for address in addresses(budgets):
                    in_use[(pool.name, d.name, address)] = sum(1 for u in budgets.uses if d.name in u.destinations
                                                               and budgets.addresses.get(u.node) == address)
                    for f in figures(budgets, d, address, now):
                        if f.budget == PER_WINDOW:
                            starts[(pool.name, d.name, address)] = f.used
                        elif f.budget == PER_ADDRESS:
                            in_use[(pool.name, d.name, address)] = f.used
        self._in_use.set(in_use)
        self._starts.set(starts)
        return None


LABELS = {"app.kubernetes.io/part-of": "egress-placer", "app.kubernetes.io/managed-by": "egress-placer"}


class ConfigMapStore(Protocol):
    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_configmap(self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str]) -> None: ...

    def replace_configmap(self, configmap: Mapping[str, Any]) -> None: ...


class BudgetStartsKeeper:
    """The leader's record of the windows' starts (above). Level-based: each pass, the starts the view
    counts, bounded, written when they differ from the record (replace with its resourceVersion as
    precondition; a conflict raises and the next pass reads again)."""

    def __init__(self, state: BudgetState, store: ConfigMapStore, namespace: str, clock: Callable[[], float] = time.time) -> None:
        self.state, self.store, self.namespace, self.clock = state, store, namespace, clock
        self._stored: dict[str, Any] | None = None
        self._read = False  # the record as stored is known (False after a write: read it again)
        self._restored = False  # its starts given to the view since this replica started leading

    def _load(self) -> dict[str, Any] | None:
        self._stored = self.store.read_configmap(self.namespace, STARTS_CONFIGMAP)
        self._read = True
        return self._stored

    def restore(self) -> int:
        """Read the record and give its starts to the view (every replica at start; a new leader on its
        first pass). The number of runs' starts taken."""
        kept = decode_starts(((self._load() or {}).get("data") or {}).get(STARTS_KEY))
        self._restored = True
        taken = self.state.budgets.restore(kept)
        if taken:
            logger.bind(kind="ConfigMap", namespace=self.namespace, name=STARTS_CONFIGMAP, runs=taken).info("budget window starts restored")
        return taken

    def leading(self) -> None:
        """A replica starts leading: take the record's starts again before writing it."""
        self._read = self._restored = False

    def __call__(self) -> float | None:
        windows = window_budgets(self.state.policy.pools)
        if not windows and self._stored is None:
            return None  # no window budget and no record: nothing to keep
        if not self._restored:
            self.restore()
        elif not self._read:
            self._load()
        now = self.clock()
        text = encode_starts(starts_to_keep(self.state.budgets.window_starts(now), windows, now))
        if text == ((self._stored or {}).get("data") or {}).get(STARTS_KEY):
            return None
        self._read = False  # read it again next pass, whatever happens now
        if self._stored is None:
            self.store.create_configmap(self.namespace, STARTS_CONFIGMAP, {STARTS_KEY: text}, LABELS)
        else:
            self.store.replace_configmap({**self._stored, "data": {STARTS_KEY: text}})
        return None
