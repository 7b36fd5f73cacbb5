"""The runs no replica's webhook admitted: TaskRuns and PipelineRuns without a decision annotation."""

from __future__ import annotations

from typing import Any, Mapping

from controller.queue.view import RUN_KINDS, RunKey
from controller.store import Store


class MissedRuns:
    def __init__(self, stores: Mapping[str, Store[Any, Any]]) -> None:
        self._stores = stores

    def runs_without_decision(self) -> list[RunKey]:
        """TaskRuns and PipelineRuns with no decision annotation (created while the webhook was not
        called, or before egress-placer was installed), sorted."""
        return sorted(k for kind in RUN_KINDS for k, run in self._stores[kind].items.items() if not run.decided)

    def run_uid(self, key: RunKey) -> str:
        """The uid of a run seen by the informers ("" when unknown)."""
        run = self._stores[key[0]].items.get(key)
        return run.uid if run is not None else ""
