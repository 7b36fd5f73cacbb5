"""The pools' measured sets as admission reads them: the last set each pool's history reader computed
(controller.suggest.reconcile), replaced whole; admission looks a run up with no lock and no I/O
(`matches`): the history is never fetched on the webhook's path."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from controller.core.model import MeasuredMatch
from controller.core.policy import PlacementPolicy
from controller.suggest.core import GroupKey, MeasuredSet, measured_matches


class MeasuredView:
    """Per pool, the measured set last computed (None: not read yet, or the pool's rule changed)."""

    def __init__(self) -> None:
        self._sets: Mapping[str, MeasuredSet] = {}  # replaced whole: readers take no lock
        self._lock = threading.Lock()  # orders the writers

    def publish(self, pool: str, measured: MeasuredSet | None) -> MeasuredSet | None:
        """Put `measured` in force for `pool` (None: forget it); the set it replaces."""
        with self._lock:
            sets = dict(self._sets)
            old = sets.pop(pool, None)
            if measured is not None:
                sets[pool] = measured
            self._sets = sets
        return old

    def get(self, pool: str) -> MeasuredSet | None:
        return self._sets.get(pool)

    def sets(self) -> Mapping[str, MeasuredSet]:
        return self._sets

    def matches(self, policy: PlacementPolicy, key: GroupKey | None) -> tuple[MeasuredMatch, ...]:
        """The run's matches (suggest.core.measured_matches) in the sets in force now."""
        if key is None or not self._sets:
            return ()
        return measured_matches(policy, key, self._sets)
