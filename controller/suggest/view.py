"""The pools' measured sets as admission reads them: the last set each pool's history reader computed
(controller.suggest.reconcile), replaced whole; admission looks a run up with no lock and no I/O
(`matches`): the history is never fetched on the webhook's path."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from controller.core.model import MeasuredMatch
from controller.core.policy import PlacementPolicy
from controller.core.pools import MEASURED_SHOWN, HistoryStatus, MeasuredGroupStatus
from controller.placement_log.core import rfc3339
from controller.suggest.core import GroupKey, MeasuredSet, measured_matches


class MeasuredView:
    """Per pool, the measured set last computed (None: not read yet, or the pool's rule changed)."""

    def __init__(self) -> None:
        self._sets: Mapping[str, MeasuredSet] = {}  # replaced whole: readers take no lock
        self._lock = threading.Lock()  # orders the writers
        self._errors: dict[str, str] = {}  # why a pool's last read failed

    def publish(self, pool: str, measured: MeasuredSet | None) -> MeasuredSet | None:
        """Put `measured` in force for `pool` (None: forget it); the set it replaces."""
        with self._lock:
            sets = dict(self._sets)
            old = sets.pop(pool, None)
            if measured is not None:
                sets[pool] = measured
            self._sets = sets
            self._errors.pop(pool, None)
        return old

    def failed(self, pool: str, error: str) -> None:
        """A read of `pool`'s history failed: the set in force stays, the error is shown in its status ("": forget it)."""
        with self._lock:
            if error:
                self._errors[pool] = error
            else:
                self._errors.pop(pool, None)

    def error(self, pool: str) -> str | None:
        return self._errors.get(pool)

    @property
    def active(self) -> bool:
        """Some pool has a set in force (admission looks nothing up otherwise)."""
        return bool(self._sets)

    def get(self, pool: str) -> MeasuredSet | None:
        return self._sets.get(pool)

    def sets(self) -> Mapping[str, MeasuredSet]:
        return self._sets

    def matches(self, policy: PlacementPolicy, key: GroupKey | None) -> tuple[MeasuredMatch, ...]:
        """The run's matches (suggest.core.measured_matches) in the sets in force now."""
        if key is None or not self._sets:
            return ()
        return measured_matches(policy, key, self._sets)

    def status(self, pool: str) -> HistoryStatus:
        """The pool's `status.history`: the set in force (largest p90 first, `MEASURED_SHOWN` at most), when it
        was read, and why the last read failed."""
        found = self._sets.get(pool)
        groups = sorted(found.groups.values(), key=lambda m: (-m.bytes_p90, m.key)) if found is not None else []
        return HistoryStatus(
            groups=len(groups),
            read_at=rfc3339(found.read_at) if found is not None and found.read_at is not None else None,
            last_error=self._errors.get(pool),
            measured=tuple(
                MeasuredGroupStatus(namespace=m.key.namespace, kind=m.key.kind.value, name=m.key.name, runs=m.runs,
                                    p90_bytes=int(m.bytes_p90), median_bytes=int(m.bytes_median))
                for m in groups[:MEASURED_SHOWN]
            ),
        )
