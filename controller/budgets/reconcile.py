"""Egress budgets, the leader's figures (docs/budgets.md): each budget's use per pool, destination and
address into metrics after each change. Nothing is written to the cluster: the hold and the release
are the queue's (admission, `queue.reconcile`), the node choice admission's."""

from __future__ import annotations

import time
from typing import Callable, Protocol

from controller.budgets.core import PER_ADDRESS, PER_WINDOW, addresses, figures
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
