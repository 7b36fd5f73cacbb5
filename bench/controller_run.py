"""`python -m bench.controller_run`: `egress-placer run` whose state uses the `balance` setting.

The balance benchmark's case (c) runs the controller with EGRESS_PLACER_BALANCE=load-without-assumptions.
controller/app.py builds `ClusterState` without that setting (wiring it there is one line for the
lead: `ClusterState(..., balance=settings.balance)`); until then this launcher runs the very same
`controller.app.run`, with a Controller whose state gets `settings.balance` after it is built.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

from controller import app
from controller.settings import Settings


class BalancedController(app.Controller):
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        super().__init__(settings, clock)
        self.state.balance = settings.balance


def main() -> int:
    app.Controller = BalancedController  # type: ignore[misc]  # `app.run` builds `app.Controller`
    return app.run(Settings())


if __name__ == "__main__":
    sys.exit(main())
