"""Tekton's definitions as the image finder reads them (`core.images`): an index of Tasks, StepActions and
Pipelines, each trimmed to what decides images. Pure: no client; the Tekton view (view.py) feeds it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controller.core import cluster_resolver
from controller.core.images import PipelineSpec, StepActionSpec, TaskSpec, _dict, _str, pipeline_spec, step_action_spec, task_spec


class TektonObjects:
    """Tasks, StepActions and Pipelines by namespace and name, trimmed to what decides images.

    `put` and `remove` cost one object's parse; nothing else is kept of the objects.
    `generation` is a new object after every change (made once the change is done): what was found
    from these objects under one generation holds for as long as it stays the same."""

    KINDS = ("Task", "StepAction", "Pipeline")

    def __init__(self, resolver_config: cluster_resolver.ResolverConfig | None = None) -> None:
        self._tasks: dict[tuple[str, str], TaskSpec] = {}
        self._step_actions: dict[tuple[str, str], StepActionSpec] = {}
        self._pipelines: dict[tuple[str, str], PipelineSpec] = {}
        # Tekton's cluster resolver configuration (unknown until read: no cluster reference is followed)
        self.cluster_resolver = resolver_config or cluster_resolver.ResolverConfig()

    @property
    def cluster_resolver(self) -> cluster_resolver.ResolverConfig:
        return self._cluster_resolver

    @cluster_resolver.setter
    def cluster_resolver(self, config: cluster_resolver.ResolverConfig) -> None:
        self._cluster_resolver = config
        self.generation = object()

    def _table(self, kind: str) -> dict[tuple[str, str], Any] | None:
        return {"Task": self._tasks, "StepAction": self._step_actions, "Pipeline": self._pipelines}.get(kind)

    def put(self, obj: Mapping[str, Any], kind: str | None = None) -> bool:
        """Add or replace one object (kind from `obj`, or given when list items lack it). False if ignored."""
        kind = kind or _str(obj.get("kind"))
        table = self._table(kind)
        meta = _dict(obj.get("metadata"))
        name = _str(meta.get("name"))
        if table is None or not name:
            return False
        spec = obj.get("spec")
        parsed = {"Task": task_spec, "StepAction": step_action_spec, "Pipeline": pipeline_spec}[kind](spec)
        table[(_str(meta.get("namespace")) or "default", name)] = parsed
        self.generation = object()
        return True

    def remove(self, kind: str, namespace: str, name: str) -> None:
        table = self._table(kind)
        if table is not None:
            table.pop((namespace, name), None)
            self.generation = object()

    def replace_kind(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """All objects of `kind` become exactly `objs` (a relist)."""
        table = self._table(kind)
        if table is None:
            return
        table.clear()
        for obj in objs:
            self.put(obj, kind)
        self.generation = object()

    def task(self, namespace: str, name: str) -> TaskSpec | None:
        return self._tasks.get((namespace, name))

    def step_action(self, namespace: str, name: str) -> StepActionSpec | None:
        return self._step_actions.get((namespace, name))

    def pipeline(self, namespace: str, name: str) -> PipelineSpec | None:
        return self._pipelines.get((namespace, name))

    def __len__(self) -> int:
        return len(self._tasks) + len(self._step_actions) + len(self._pipelines)
