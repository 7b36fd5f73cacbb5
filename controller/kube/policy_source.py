"""Keeps the placement policy current: from a ConfigMap key (watched), from a file (polled), or from
the EgressPool and EgressPlacerConfig objects of the pools API (watched; `policy_source: pools`,
docs/pools-api.md).

A valid new policy goes to `state.set_policy`. An invalid one is refused: its error goes to
`on_refused` (the app's `PolicyTracker` keeps it), to the log, and as a Warning Event
`PolicyRefused` on the ConfigMap (the error names the line); it is counted in
`policy_reloads{result="refused"}` with `policy_valid` 0; the last good policy stays in force.
A ConfigMap or file that disappears also leaves the last good policy in force (and says so, also
to `on_refused`). `loaded_text` is the text of the last policy loaded (the leader stores it:
controller/last_good_policy/reconcile.py).

Pools API: every change of the objects' specs rebuilds the policy from all of them
(`core.pools.policy_from_objects`, the loader's validation); no object is the empty policy, which
places nothing and removes the pool taints. Objects the validation refuses (only what the API server's
schema cannot check gets that far) are refused as a whole, with a PolicyRefused Event on the first
object named, the policy in force staying. A pools API that cannot be read before its first list (404:
the CRDs are not installed; 403: no RBAC) counts as no policy found; once listed, a failed watch keeps
the objects seen (the informer resumes). `loaded_text` is then the policy as a document (`dump_policy`).
"""

from __future__ import annotations

import json
import os
import threading
from functools import partial
from typing import Any, Callable, Protocol, Sequence

from loguru import logger

from controller.core.conversion import V1BETA1
from controller.core.policy import PlacementPolicy, PolicyError, dump_policy, load_policy
from controller.pool_status.core import PoolObject
from controller.core.pools import CONFIG_KIND, CONFIG_PLURAL, GROUP, KINDS, PLURALS, POOL_KIND, POOL_PLURAL, policy_from_objects
from controller.event_sink import EventSink
from controller.kube.client import KubeApi, describe_error, status_of
from controller.kube.informer import Informer, Obj, config_map, pools_api, start_informers
from controller.retry import WATCHES, RetryPolicy
from controller.metrics import Metrics
from controller.runner import Runner
from controller.settings import Settings


def read_pools_policy(api: KubeApi) -> PlacementPolicy:
    """The policy of the objects of the pools API, read once (`egress-placer status`); PolicyError
    when the pools API is not there (404: its CRDs are not installed) or the objects are refused; a
    cluster that does not answer, or refuses the read (403: the caller may not list them), raises as it
    is: the command says it cannot read the cluster."""
    objects: list[Obj] = []
    for kind in KINDS:
        try:
            items = api.call("GET", f"/apis/{V1BETA1}/{PLURALS[kind]}").get("items") or []
        except Exception as e:
            if status_of(e) != 404:
                raise
            raise PolicyError(_unreadable(e)) from None
        objects.extend({**o, "apiVersion": V1BETA1, "kind": kind} for o in items)
    return policy_from_objects(objects)


def _unreadable(error: BaseException | None) -> str:
    """What is wrong, the same for both kinds (they fail together; one message, said once)."""
    why = " (its CRDs are not installed: k8s/crds/)" if error is not None and status_of(error) == 404 else ""
    return f"no policy found: the pools API ({GROUP}) cannot be read{why}: {describe_error(error)}"


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
        self._informers: list[Informer] = []
        # Pools API mode: the objects seen, by kind and name, and the kinds listed at least once.
        self._objects: dict[str, dict[str, Obj]] = {kind: {} for kind in KINDS}
        self._listed: set[str] = set()
        self._objects_lock = threading.Lock()
        self._refusal: str | None = None  # why the last policy offered was refused (None: it loaded)
        if settings.policy_file is None:
            if api is None:
                raise ValueError("ConfigMap and pools API modes (no policy_file) need an API client")
            watch = partial(Informer, api, metrics=metrics, watch_timeout_seconds=settings.watch_timeout_seconds, backoff=backoff)
            if settings.policy_source == "pools":
                self._informers = [
                    watch(
                        pools_api(kind, PLURALS[kind], V1BETA1),  # the storage version: read as stored (docs/pools-api.md)
                        on_replace=partial(self._objects_listed, kind),
                        on_event=partial(self._object_changed, kind),
                        on_error=partial(self._objects_unreadable, kind),
                    )
                    for kind in KINDS
                ]
            else:
                self._informers = [
                    watch(
                        config_map(settings.namespace, settings.policy_configmap),
                        on_replace=self._configmaps_listed,
                        on_event=self._configmap_changed,
                    )
                ]

    @property
    def source(self) -> str:
        s = self.settings
        if s.policy_file is not None:
            return f"file {s.policy_file}"
        if s.policy_source == "pools":
            return f"{POOL_PLURAL} and {CONFIG_PLURAL} ({GROUP})"
        return f"configmap {s.namespace}/{s.policy_configmap}:{s.policy_key}"

    def start(self, runner: Runner) -> None:
        """Its informers, or (file mode) the file's poll, as tasks of `runner`."""
        start_informers(runner, self._informers)
        if not self._informers:
            runner.start("policy file", self._poll_file)

    # -- the one place a policy text is judged ----------------------------------------------------
    def offer(self, text: str | None, regarding: dict[str, Any] | None = None) -> PlacementPolicy | None:
        """Load `text` (None: the source has no policy); the loaded policy, or None when refused or absent."""
        try:
            if text is None:
                logger.bind(source=self.source).warning("no policy found; the current policy stays in force")
                self._last_text = None  # the same text offered again loads again
                self.on_refused(f"no policy found in {self.source}")
                return None
            return self._judge(text, lambda: load_policy(text, source=self.source), lambda error: regarding, lambda p: text)
        finally:
            self.synced.set()

    def _judge(
        self,
        key: str,
        load: Callable[[], PlacementPolicy],
        regarding: Callable[[str], dict[str, Any] | None],
        text_of: Callable[[PlacementPolicy], str],
    ) -> PlacementPolicy | None:
        """`load()` unless `key` (what the policy is made of) was judged last; the policy, or None."""
        try:
            if key == self._last_text:
                return None
            self._last_text = key
            try:
                policy = load()
            except PolicyError as e:
                self._refusal = str(e)
                self._refuse(str(e), regarding(str(e)))
                return None
            self._refusal = None
            self.loaded_text = text_of(policy)
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

    # -- pools API mode ---------------------------------------------------------------------------
    def _objects_listed(self, kind: str, objs: list[Obj]) -> None:
        with self._objects_lock:
            self._objects[kind] = {str(o["metadata"]["name"]): o for o in objs}
            self._listed.add(kind)
            self._offer_objects()

    def _object_changed(self, kind: str, event: str, obj: Obj) -> None:
        with self._objects_lock:
            name = str(obj["metadata"]["name"])
            if event == "DELETED":
                self._objects[kind].pop(name, None)
            else:
                self._objects[kind][name] = obj
            self._offer_objects()

    def _objects_unreadable(self, kind: str, error: BaseException | None) -> None:
        """Before its first list, a kind that cannot be read means no policy (said once per cause)."""
        with self._objects_lock:
            if kind in self._listed:
                return  # the objects seen stay; the informer resumes the watch
            message = _unreadable(error)
            if self._last_text == f"unreadable: {message}":
                return
            logger.bind(source=self.source).warning(message + "; the current policy stays in force")
            self._last_text = f"unreadable: {message}"  # the objects, once listed, are judged again
            self.on_refused(message)
            self.synced.set()

    def cached_objects(self) -> list[Obj] | None:
        """Every object of the pools API as the informers hold it (apiVersion, kind, metadata, spec,
        status); None when they hold none: ConfigMap or file mode, or not every kind listed yet."""
        with self._objects_lock:
            if not self._informers or self._listed != set(KINDS):
                return None
            return [o for kind in KINDS for _, o in sorted(self._objects[kind].items())]

    def pool_objects(self) -> tuple[list[PoolObject], str | None]:
        """The EgressPools as stored (name, generation, status), and why the loader refused them as a
        whole (None: the policy in force is theirs). Nothing before every kind is listed."""
        with self._objects_lock:
            if self._listed != set(KINDS):
                return [], None
            pools = [
                PoolObject(name, (o["metadata"].get("generation")), o.get("status") or {})
                for name, o in sorted(self._objects[POOL_KIND].items())
            ]
            return pools, self._refusal

    def config_object(self) -> PoolObject | None:
        """The EgressPlacerConfig as stored (name, generation, status); None when there is none or before
        every kind is listed."""
        with self._objects_lock:
            if self._listed != set(KINDS):
                return None
            found = sorted(self._objects[CONFIG_KIND].items())
            if not found:
                return None
            name, o = found[0]
            return PoolObject(name, o["metadata"].get("generation"), o.get("status") or {})

    def _offer_objects(self) -> None:
        """Once every kind is listed: the policy of all the objects (under the lock)."""
        if self._listed != set(KINDS):
            return
        objects = [o for kind in KINDS for _, o in sorted(self._objects[kind].items())]
        key = json.dumps([[o["kind"], o["metadata"]["name"], o.get("spec")] for o in objects], sort_keys=True)
        self._judge(key, lambda: policy_from_objects(objects), partial(_named_first, objects), dump_policy)

    # -- file mode --------------------------------------------------------------------------------
    def _poll_file(self, stop: threading.Event) -> None:
        path = self.settings.policy_file
        assert path is not None
        seen: tuple[float, int] | None = None
        while not stop.is_set():
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
            stop.wait(self.poll_seconds)


def _named_first(objects: Sequence[Obj], error: str) -> dict[str, Any] | None:
    """The object the first line of `error` names (`EgressPool overseas: spec...`), for its Event."""
    for line in error.splitlines():
        for obj in objects:
            meta = obj["metadata"]
            if line.startswith(f"{obj['kind']} {meta['name']}:"):
                return {"apiVersion": V1BETA1, "kind": obj["kind"], "name": meta["name"], "uid": meta.get("uid")}
    return None
