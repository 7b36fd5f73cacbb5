"""Pool guard reconciler (leader): the params of the pool guard's ValidatingAdmissionPolicy (the
namespaces it leaves out, the pools, their nodes) follow the policy in force and the cached nodes.

Level-based: desired params from the policy and the nodes (`guard_params`); each pass compares them
with what it last wrote and writes when they differ; every `verify_seconds` (and after any failure) it
reads the ConfigMap back and repairs it (a deleted one is created again, an edited one is put back).
It never writes the binding or the policy: the installation does (`k8s/pool-guard.yaml`), and the
binding is static (what depends on the policy lives in the params); without them the params are kept
anyway and the guard simply is not in force. With no valid policy in force (controller/app.py) it
leaves the params as they are.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Protocol

from loguru import logger

from controller.pool_guard.core import GUARD_NAME, GuardError, guard_params
from controller.core.model import NodeState
from controller.core.policy import PlacementPolicy

PARAMS_LABELS = {"app.kubernetes.io/part-of": "egress-placer", "app.kubernetes.io/managed-by": "egress-placer"}


class GuardWriter(Protocol):
    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_configmap(self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str]) -> None: ...

    def replace_configmap(self, configmap: Mapping[str, Any]) -> None: ...


class NodeSource(Protocol):
    @property
    def policy(self) -> PlacementPolicy: ...

    @property
    def policy_in_force(self) -> bool: ...

    def node_list(self) -> list[NodeState]: ...


class PoolGuardReconciler:
    def __init__(
        self,
        state: NodeSource,
        writer: GuardWriter,
        namespace: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        verify_seconds: float = 30.0,
    ) -> None:
        self.state, self.writer, self.namespace = state, writer, namespace
        self.clock = clock
        self.verify_seconds = verify_seconds  # read the guard back at least this often, even when nothing changed
        # The params data the last pass left in place; None: read back next pass.
        self._kept: dict[str, str] | None = None
        self._verified_at = float("-inf")

    def __call__(self) -> None:
        self.reconcile()  # the loop's pass: no requeue-after (the resync is soon enough)

    def reconcile(self) -> list[str]:
        """One pass; what was written ("params"). A failure is logged and retried next pass.
        With no valid policy in force (the empty stand-in) it writes nothing: the guard stays as it was."""
        if not self.state.policy_in_force:
            return []
        policy = self.state.policy
        try:
            data = guard_params(policy, self.state.node_list())
        except GuardError as e:
            logger.bind(kind="ConfigMap", name=GUARD_NAME).error("pool guard params not written: {}", e)
            return []
        now = self.clock()
        if self._kept == data and now - self._verified_at < self.verify_seconds:
            return []
        self._kept = None
        written = []
        try:
            if self._keep_params(data):
                written.append("params")
        except Exception as e:
            logger.bind(kind="ConfigMap", name=GUARD_NAME).warning("pool guard not reconciled: {}", e)
            return written
        self._kept = data
        self._verified_at = now
        return written

    def _keep_params(self, data: dict[str, str]) -> bool:
        log = logger.bind(kind="ConfigMap", namespace=self.namespace, name=GUARD_NAME)
        current = self.writer.read_configmap(self.namespace, GUARD_NAME)
        if current is None:
            self.writer.create_configmap(self.namespace, GUARD_NAME, data, PARAMS_LABELS)
            log.bind(pools=data.get("Pools", "")).info("pool guard params created")
            return True
        if (current.get("data") or {}) == data:
            return False
        self.writer.replace_configmap({**current, "data": data})
        log.bind(pools=data.get("Pools", "")).info("pool guard params updated")
        return True
