"""Bursts of TaskRuns created while something breaks, and the count of what became of them.

`Burst` creates `count` runs from a thread pool, one every `interval` seconds, so a fault can be
injected mid-burst; `pool_outcome()` counts, for runs that must go to the pool, what was lost or misplaced.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping

from controller.core.model import TAINT_KEY
from tests.e2e.tekton_runs import (
    MATCHING_IMAGE,
    POOL,
    POOL_NODES,
    Runs,
    decision_of,
    node_of,
    succeeded,
    taskrun,
)
from tests.waiting import wait_for


@dataclass
class Burst:
    """`count` TaskRuns of `image` in `namespace`, one started every `interval` s, creations retried
    (`Runs.create_retrying`)."""

    runs: Runs
    namespace: str
    count: int
    prefix: str = "burst"
    image: str = MATCHING_IMAGE
    interval: float = 0.05
    workers: int = 8
    names: list[str] = field(init=False)
    attempts: dict[str, int] = field(default_factory=dict, init=False)
    errors: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.names = [self.runs.name(f"{self.prefix}-{i}") for i in range(self.count)]
        self._futures: list[Future[None]] = []
        self._pool = ThreadPoolExecutor(max_workers=self.workers)
        self._submitter = threading.Thread(target=self._submit, name="burst", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> "Burst":
        self._submitter.start()
        return self

    def _submit(self) -> None:
        for name in self.names:
            self._futures.append(self._pool.submit(self._create, name))
            # Part of the scenario: the burst's pace, one creation every `interval` s.
            time.sleep(self.interval)

    def _create(self, name: str) -> None:
        try:
            attempts = self.runs.create_retrying(self.namespace, "taskruns", taskrun(name, self.image))
        except Exception as e:  # noqa: BLE001 - counted as lost; the test reports it
            with self._lock:
                self.errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
            return
        with self._lock:
            self.attempts[name] = attempts

    @property
    def submitted(self) -> int:
        """Creations handed to the pool so far."""
        return len(self._futures)

    @property
    def retried(self) -> int:
        """Runs whose creation needed more than one attempt (the API server was away)."""
        with self._lock:
            return sum(1 for a in self.attempts.values() if a > 1)

    def wait_started(self, count: int, timeout: float = 60.0) -> None:
        """Wait until `count` creations were handed to the pool (the burst is under way)."""
        wait_for(f"{count} creations of the burst under way", lambda: self.submitted >= count, timeout=timeout, interval=0.01)

    def join(self, timeout: float = 180.0) -> None:
        """Wait until every creation succeeded or gave up."""
        self._submitter.join(timeout)
        for future in list(self._futures):
            future.result(timeout)
        self._pool.shutdown(wait=True)


@dataclass(frozen=True)
class PoolOutcome:
    """What became of runs that must all run on the pool.

    A run Tekton failed before it made any pod (`no_pod`: its pod creation hit the outage, and Tekton
    treats that as final, tektoncd/pipeline#3902 and #10724) is not egress-placer's to place; it is
    counted apart, and only checked to carry the pool placement egress-placer wrote into its podTemplate.
    """

    total: int
    lost: tuple[str, ...]  # never created, or gone
    unfinished: tuple[str, ...]  # not finished (yet); where its pod is bound still counts
    no_pod: tuple[str, ...]  # Succeeded=False and no pod: Tekton gave up creating it
    unplaced_template: tuple[str, ...]  # ... and its podTemplate lacks the pool toleration
    failed: tuple[str, ...]  # Succeeded=False after its pod existed
    off_pool: tuple[str, ...]  # its pod ran elsewhere (or has no node)
    without_run_decision: tuple[str, ...]  # the TaskRun has no decision annotation (its admission was missed)
    pod_without_decision: tuple[str, ...]  # neither has the pod

    @property
    def misplaced(self) -> tuple[str, ...]:
        return tuple(sorted({*self.failed, *self.off_pool, *self.pod_without_decision, *self.unplaced_template}))

    def summary(self) -> str:
        tekton = f", {len(self.no_pod)} failed by Tekton before any pod (placement written)" if self.no_pod else ""
        tekton += f", {len(self.unfinished)} not finished (bound where they belong)" if self.unfinished else ""
        on_pool = self.total - len(self.lost) - len(self.misplaced) - len(self.no_pod)
        return (
            f"{on_pool}/{self.total} on the pool, {len(self.lost)} lost, {len(self.misplaced)} misplaced{tekton}, "
            f"{len(self.without_run_decision)} TaskRun(s) without decision"
        )


def _tolerates_pool(run: Mapping[str, Any]) -> bool:
    tolerations = ((run.get("spec") or {}).get("podTemplate") or {}).get("tolerations") or []
    return any(t.get("key") == TAINT_KEY and t.get("value") == POOL for t in tolerations)


def pool_outcome(runs: Runs, namespace: str, names: list[str]) -> PoolOutcome:
    listed = runs.listed(namespace, "taskruns")
    pods = runs.pods_by_taskrun(namespace)
    present = [n for n in names if n in listed]
    no_pod = [n for n in present if n not in pods and succeeded(listed[n]) == "False"]
    with_pod = [n for n in present if n not in no_pod]
    pod_decision = {n: decision_of(pods[n]) if n in pods else {} for n in with_pod}
    return PoolOutcome(
        total=len(names),
        lost=tuple(n for n in names if n not in listed),
        unfinished=tuple(n for n in present if succeeded(listed[n]) is None),
        no_pod=tuple(no_pod),
        unplaced_template=tuple(n for n in no_pod if not _tolerates_pool(listed[n])),
        failed=tuple(n for n in with_pod if succeeded(listed[n]) == "False"),
        off_pool=tuple(n for n in with_pod if node_of(pods.get(n)) not in POOL_NODES),
        without_run_decision=tuple(n for n in present if decision_of(listed[n]).get("pool") != POOL),
        pod_without_decision=tuple(n for n in with_pod if pod_decision[n].get("pool") != POOL),
    )


def all_finished(runs: Runs, namespace: str, names: list[str]) -> bool:
    """Every named run exists and has a final Succeeded condition (True or False)."""
    listed = runs.listed(namespace, "taskruns")
    return all(n in listed and succeeded(listed[n]) is not None for n in names)


def all_settled(runs: Runs, namespace: str, names: list[str]) -> bool:
    """Every named run exists and has finished or has its pod bound to a node: where it runs is decided.
    (A fake node can miss a status update while etcd is away, leaving its pod unfinished for good.)"""
    listed = runs.listed(namespace, "taskruns")
    pods = runs.pods_by_taskrun(namespace)
    return all(n in listed and (succeeded(listed[n]) is not None or node_of(pods.get(n))) for n in names)
