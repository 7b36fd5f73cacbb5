"""Tekton's objects as admission reads them: the definitions a run refers to and Tekton's settings.

The informers feed it: Tasks, StepActions and Pipelines through `apply` / `replace` (ClusterState hands
them on), Tekton's feature-flags and config-defaults ConfigMaps through `set_coschedule` /
`set_default_pod_template`, the cluster resolver's ConfigMaps by replacing `cluster_resolver` whole.
Admission reads it with no lock: the image finder reads the definitions (`generation` scopes what was
found from them), the settings are replaced whole, never changed in place. Writers take the view's lock.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Mapping

from controller.compat.core import UNREAD, Limitation, Support, assess
from controller.tekton.core import TektonObjects

TEKTON_FLAGS = "TektonFeatureFlags"  # the kind passed to subscribers when Tekton's coschedule flag changes


class TektonView(TektonObjects):
    """The definitions index (what `core.images.taskrun_images` reads), with Tekton's settings beside it.
    `notify(TEKTON_FLAGS)` is called, outside the lock, when the coschedule flag changes."""

    def __init__(self, notify: Callable[[str], None] = lambda kind: None) -> None:
        super().__init__()
        self._notify = notify
        self._write = threading.Lock()
        self.coschedule: str | None = None  # Tekton's feature-flags `coschedule` (None: unknown)
        # The placement fields of Tekton's config-defaults `default-pod-template` (None: none, or unreadable).
        self.default_pod_template: dict[str, Any] | None = None
        # What this Tekton and API server support (controller.compat): replaced whole, read with no lock.
        self.support: Support = UNREAD
        self._pipelines_info: tuple[str | None, str | None] | None = None  # (version, why unreadable) once read
        self._kubernetes: tuple[Limitation, ...] = ()
        self.version_read = threading.Event()  # set once pipelines-info was read (or found unreadable)

    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """One watch event of a Task, StepAction or Pipeline."""
        with self._write:
            if event == "DELETED":
                meta = obj["metadata"]
                self.remove(kind, meta.get("namespace") or "default", meta["name"])
            else:
                self.put(dict(obj), kind)

    def replace(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list of one kind (first sync or relist)."""
        with self._write:
            self.replace_kind(kind, [dict(o) for o in objs])

    def set_coschedule(self, value: str | None) -> None:
        with self._write:
            changed = value != self.coschedule
            self.coschedule = value
        if changed:
            self._notify(TEKTON_FLAGS)

    def set_tekton_version(self, version: str | None, unreadable: str | None = None) -> None:
        """Tekton's version from its pipelines-info ConfigMap (None: absent; `unreadable`: why it cannot be read)."""
        with self._write:
            self._pipelines_info = (version, unreadable)
            self._assess()
        self.version_read.set()

    def set_kubernetes_limitations(self, limitations: Iterable[Limitation]) -> None:
        """What the API server's discovery showed missing (controller.compat.core.kubernetes_limitations)."""
        with self._write:
            self._kubernetes = tuple(limitations)
            self._assess()

    def _assess(self) -> None:
        if self._pipelines_info is None:  # not read yet: nothing of Tekton's turned off
            self.support = Support(self._kubernetes)
        else:
            self.support = assess(*self._pipelines_info, kubernetes=self._kubernetes)

    def set_default_pod_template(self, template: dict[str, Any] | None) -> None:
        """Admission reads it whole (it is replaced, never changed in place)."""
        self.default_pod_template = template
