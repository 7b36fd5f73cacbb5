"""Keeps the placement policy current: from a ConfigMap key (watched) or from a file (polled).

A valid new policy goes to `state.set_policy`. An invalid one is refused: its error goes to
`on_refused` (the app's `PolicyTracker` keeps it), to the log, and as a Warning Event
`PolicyRefused` on the ConfigMap (the error names the line); it is counted in
`policy_reloads{result="refused"}` with `policy_valid` 0; the last good policy stays in force.
A ConfigMap or file that disappears also leaves the last good policy in force (and says so, also
to `on_refused`). `loaded_text` is the text of the last policy loaded (the leader stores it:
controller/reconcile/last_good_policy.py).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Protocol

from loguru import logger

from controller.core.policy import PlacementPolicy, PolicyError, load_policy
from controller.event_sink import EventSink
from controller.kube.client import KubeApi
from controller.kube.informer import Informer, Obj, config_map
from controller.kube.retry import WATCHES, RetryPolicy
from controller.metrics import Metrics
from controller.settings import Settings


class PolicyTarget(Protocol):
    def set_policy(self, policy: PlacementPolicy) -> None: ...


class PolicySource:
    """Start it after the state exists; `synced` is set once the first answer is known (a policy
    loaded or refused, or no policy found)."""

    def __init__(
        self,
        settings: Settings,
        state: PolicyTarget,
        metrics: Metrics,
        events: EventSink | None = None,
        *,
        api: KubeApi | None = None,
        poll_seconds: float = 1.0,
        on_refused: Callable[[str], None] = lambda error: None,
        backoff: RetryPolicy = WATCHES,
    ) -> None:
        self.settings = settings
        self.state = state
        self.metrics = metrics
        self.events = events
        self.poll_seconds = poll_seconds
        self.synced = threading.Event()
        self.on_refused = on_refused
        self._last_text: str | None = None
        self.loaded_text: str | None = None  # the text of the last valid policy loaded
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._informer: Informer | None = None
        if settings.policy_file is None:
            if api is None:
                raise ValueError("ConfigMap mode (no policy_file) needs an API client")
            self._informer = Informer(
                api,
                config_map(settings.namespace, settings.policy_configmap),
                on_replace=self._configmaps_listed,
                on_event=self._configmap_changed,
                metrics=metrics,
                watch_timeout_seconds=settings.watch_timeout_seconds,
                backoff=backoff,
            )

    @property
    def source(self) -> str:
        s = self.settings
        if s.policy_file is not None:
            return f"file {s.policy_file}"
        return f"configmap {s.namespace}/{s.policy_configmap}:{s.policy_key}"

    def start(self) -> None:
        if self._informer is not None:
            self._informer.start()
        elif self._thread is None:
            self._thread = threading.Thread(target=self._poll_file, name="policy file", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._informer is not None:
            self._informer.stop()
        if self._thread is not None:
            self._thread.join(5.0)

    # -- the one place a policy text is judged ----------------------------------------------------
    def offer(self, text: str | None, regarding: dict[str, Any] | None = None) -> PlacementPolicy | None:
        """Load `text` (None: the source has no policy); the loaded policy, or None when refused or absent."""
        try:
            if text is None:
                logger.bind(source=self.source).warning("no policy found; the current policy stays in force")
                self._last_text = None  # the same text offered again loads again
                self.on_refused(f"no policy found in {self.source}")
                return None
            if text == self._last_text:
                return None
            self._last_text = text
            try:
                policy = load_policy(text, source=self.source)
            except PolicyError as e:
                self._refuse(str(e), regarding)
                return None
            self.loaded_text = text
            self.state.set_policy(policy)
            self.metrics.policy_valid.set(1)
            self.metrics.policy_reloads.labels(result="loaded").inc()  # last: the counter says "done"
            logger.bind(source=self.source, pools=[p.name for p in policy.pools]).info(
                "policy loaded: {} pool(s)", len(policy.pools)
            )
            return policy
        finally:
            self.synced.set()

    def _refuse(self, error: str, regarding: dict[str, Any] | None) -> None:
        self.on_refused(error)
        self.metrics.policy_valid.set(0)
        logger.bind(source=self.source, error=error).error("policy refused; the last good policy stays in force")
        if self.events is not None and regarding is not None:
            self.events.emit(regarding, "Warning", "PolicyRefused", error, action="LoadPolicy")
        self.metrics.policy_reloads.labels(result="refused").inc()  # last: the counter says "done"

    # -- ConfigMap mode ---------------------------------------------------------------------------
    def _text_of(self, cm: Obj) -> str | None:
        data = cm.get("data") or {}
        if self.settings.policy_key not in data:
            logger.bind(source=self.source).warning("the ConfigMap has no key {}", self.settings.policy_key)
            return None
        return str(data[self.settings.policy_key])

    def _configmaps_listed(self, objs: list[Obj]) -> None:
        if objs:
            self._configmap_changed("ADDED", objs[0])
        else:
            self.offer(None)

    def _configmap_changed(self, event: str, cm: Obj) -> None:
        if event == "DELETED":
            logger.bind(source=self.source).warning("policy ConfigMap deleted; the last good policy stays in force")
            self._last_text = None  # the same text offered again (re-created) loads again
            self.on_refused(f"no policy found in {self.source}: the ConfigMap was deleted")
            return
        meta = cm.get("metadata") or {}
        regarding = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        }
        self.offer(self._text_of(cm), regarding)

    # -- file mode --------------------------------------------------------------------------------
    def _poll_file(self) -> None:
        path = self.settings.policy_file
        assert path is not None
        seen: tuple[float, int] | None = None
        while not self._stop.is_set():
            try:
                st = os.stat(path)
                stamp = (st.st_mtime, st.st_size)
                if stamp != seen:
                    seen = stamp
                    with open(path, encoding="utf-8") as f:
                        self.offer(f.read())
            except FileNotFoundError:
                if seen is not None or not self.synced.is_set():
                    logger.bind(source=self.source).warning("policy file missing; the last good policy stays in force")
                    self.on_refused(f"no policy found in {self.source}: the file is missing")
                    self._last_text = None
                seen = None
                self.synced.set()
            except Exception:
                logger.bind(source=self.source).exception("policy file not read")
            self._stop.wait(self.poll_seconds)
