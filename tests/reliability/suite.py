"""What the reliability suite's modules share by import (the fixtures are in conftest.py and in the
shared harness, tests/e2e/harness.py): its tenant namespaces and policy, and `Figures`, each test's
measured outcome for `docs/reliability.md` (see report.py; the `figures` fixture hands one to a test).
A module's `CONTROLLER = ControllerSpec(...)` (the harness's) says how `egress_placer` runs egress-placer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIGURES_ENV = "EGRESS_PLACER_RELIABILITY_FIGURES"  # where the figures go (JSON); report.py sets it
POLICY_FILE = Path(__file__).with_name("policy.yaml")
# The suite's own tenants (not the e2e tests' team-cdn/team-other, so the two never wait on each other).
TEAM_CDN = "rel-team-cdn"  # may use pool `overseas`
TEAM_OTHER = "rel-team-other"  # may not
TEAM_CDN_EVIL = "rel-team-cdn-evil"  # a "renamed" rel-team-cdn: matches no namespace glob of the policy
TENANTS = (TEAM_CDN, TEAM_OTHER, TEAM_CDN_EVIL)


# -- figures for docs/reliability.md -----------------------------------------------------------------

FIGURES: dict[str, dict[str, Any]] = {}


class Figures:
    """One test's row(s) of the report. `fault(...)` for the main table, `attempt(...)` for the table
    of ways onto the pool, `attack(...)` for the hostile tenant's table; `set(key, value)` adds a measured figure as soon as it is known, so a
    failing test still shows what it measured."""

    def __init__(self, nodeid: str) -> None:
        self.row = FIGURES.setdefault(nodeid, {"nodeid": nodeid, "figures": {}, "attempts": [], "attacks": []})

    def fault(self, fault: str, load: str, expected: str) -> None:
        self.row.update(fault=fault, load=load, expected=expected)

    def set(self, key: str, value: Any) -> None:
        self.row["figures"][key] = value

    def measured(self, text: str, lost_or_misplaced: int) -> None:
        self.row.update(measured=text, lost=lost_or_misplaced)

    def attempt(self, attempt: str, outcome: str, seconds: float | None, stopped: bool) -> None:
        self.row["attempts"].append({"attempt": attempt, "outcome": outcome, "seconds": seconds, "stopped": stopped})

    def attack(self, attack: str, rbac: str, outcome: str, cleared_after: float, worst_window: float, held: bool) -> None:
        """One row of the hostile-tenant table: who may do it, what became of it, how long its longest-lived
        pod stayed Running on a pool node (0: never got there) and the most seconds in any 60 s."""
        self.row["attacks"].append(
            {"attack": attack, "rbac": rbac, "outcome": outcome, "cleared_after": round(cleared_after, 1),
             "worst_window": round(worst_window, 1), "held": held}
        )
