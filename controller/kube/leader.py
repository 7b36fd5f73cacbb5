"""Lease-based leader election (coordination.k8s.io/v1), as client-go's leaderelection does it.

Why not `kubernetes.leaderelection` (shipped with the pinned client): its LeaseLock talks through
the process-wide default client (no ApiClient can be given), its Config calls `sys.exit` on bad
timings and refuses a retry period under 1 s, its loop sleeps with `time.sleep` and cannot be
stopped, it never releases the lease on shutdown, and it judges expiry on the wall clock.

Rules (client-go): a follower takes the lease when it has no holder, or when its record has not
changed for `lease_duration` seconds of this process's monotonic clock; the leader renews every
`retry_period` and steps down when no renewal succeeded for `renew_deadline`. It is a task of the
runner (controller.runner): when stopped, the leader steps down and releases the lease (empty holder,
unless `release_on_stop` is off), so a follower takes over at its next try.

Lease requests go through the adapter's `KubeClient`: its one error classification (a 404 is "no
lease yet", a 409 "another candidate wrote first") and its retry policy (`retry.lease_policy`: one
quick second try of a throttled or failed request, well within the renew deadline).
"""

from __future__ import annotations

import random
import threading
import time
from functools import partial
from typing import Any, Callable

from loguru import logger

from controller.kube.client import KubeApi
from controller.retry import lease_policy
from controller.kube.writer import ApiError, KubeClient, Outcome, micro_time
from controller.metrics import Metrics


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        metrics: Metrics,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started_leading: Callable[[], None] = lambda: None,
        on_stopped_leading: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("leader election needs lease_duration > renew_deadline > retry_period > 0")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.metrics = metrics
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.clock = clock
        self.wall_clock = wall_clock
        # One lease attempt (two requests at most) must not outlast the renew deadline (client-go
        # bounds it the same way).
        self._timeout = min(api.timeout, max(1.0, renew_deadline / 4))
        self._client = KubeClient(api, metrics, retry=lease_policy(retry_period))
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self._leader = threading.Event()
        self.release_on_stop = True  # off: stop as a crash would (tests)
        self._observed: tuple[Any, ...] | None = None  # (holder, renewTime, transitions) last seen
        self._observed_at = 0.0
        self._lease: dict[str, Any] | None = None  # the lease as last read or written
        self._log = logger.bind(lease=f"{namespace}/{name}", identity=identity)
        metrics.is_leader.set(0)

    @property
    def is_leader(self) -> bool:
        return self._leader.is_set()

    def run(self, stop: threading.Event) -> None:
        """Campaign until `stop`; then a leader steps down and frees the lease for the others."""
        last_renewal = self.clock()
        while not stop.is_set():
            try:
                ok = self.try_acquire_or_renew()
            except Exception as e:  # any API trouble counts as a failed attempt
                self._log.warning("lease attempt failed: {}", e)
                ok = False
            now = self.clock()
            if ok:
                last_renewal = now
                if not self.is_leader:
                    self._step_up()
            elif self.is_leader and now - last_renewal >= self.renew_deadline:
                self._log.warning("lease not renewed for {:.1f}s: stepping down", now - last_renewal)
                self._step_down()
            wait = self.retry_period if self.is_leader else self.retry_period * (1 + 0.2 * random.random())
            stop.wait(wait)
        if self.is_leader:
            self._step_down()
            if self.release_on_stop:
                self._release()

    # -- one attempt ---------------------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        now_wall = micro_time(self.wall_clock())
        try:
            lease = self._request("read-lease", "GET", self._path)
        except ApiError as e:
            if e.outcome is not Outcome.NOT_FOUND:
                raise
            return self._create(now_wall)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed = record
            self._observed_at = self.clock()
        if holder and holder != self.identity and self.clock() - self._observed_at < self.lease_duration:
            return False  # someone else holds a lease that has not expired
        if holder != self.identity:
            spec["acquireTime"] = now_wall
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.lease_duration)),
            renewTime=now_wall,
        )
        lease["spec"] = spec
        return self._write(lease)

    def _create(self, now_wall: str) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self.lease_duration)),
                "acquireTime": now_wall,
                "renewTime": now_wall,
                "leaseTransitions": 0,
            },
        }
        try:
            self._lease = self._request("create-lease", "POST", self._path.rsplit("/", 1)[0], body)
        except ApiError as e:
            if e.outcome is Outcome.CONFLICT:  # someone created it first
                return False
            raise
        return True

    def _write(self, lease: dict[str, Any]) -> bool:
        try:  # PUT with metadata.resourceVersion: a conflict means another candidate wrote first
            self._lease = self._request("renew-lease", "PUT", self._path, lease)
        except ApiError as e:
            if e.outcome is Outcome.CONFLICT:
                return False
            raise
        spec = self._lease.get("spec") or {}
        self._observed = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        self._observed_at = self.clock()
        return True

    def _request(self, operation: str, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One Lease request through the client (its classification and retries); raises ApiError."""
        return self._client.call(operation, partial(self.api.call, method, path, body=body, timeout=self._timeout))

    # -- transitions ---------------------------------------------------------------------------------
    def _step_up(self) -> None:
        self._leader.set()
        self.metrics.is_leader.set(1)
        self._log.info("became leader")
        self._callback(self.on_started_leading)

    def _step_down(self) -> None:
        self._leader.clear()
        self.metrics.is_leader.set(0)
        self._log.info("stopped leading")
        self._callback(self.on_stopped_leading)

    def _callback(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            self._log.exception("leader callback failed")

    def _release(self) -> None:
        """Empty the holder so a follower takes over at once (only if we still hold it)."""
        lease = self._lease
        if not lease or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        now_wall = micro_time(self.wall_clock())
        lease["spec"].update(holderIdentity=None, leaseDurationSeconds=1, acquireTime=now_wall, renewTime=now_wall)
        try:
            self._request("release-lease", "PUT", self._path, lease)
            self._log.info("lease released")
        except Exception as e:
            self._log.warning("lease not released: {}", e)
