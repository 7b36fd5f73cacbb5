"""Pool guard reconciler (leader): the params of the pool guard's ValidatingAdmissionPolicy, and the
namespaces its binding leaves out, follow the policy in force and the cached nodes.

Level-based: desired params from the policy and the nodes (`guard_params`), desired binding from the
policy (`policy_binding`); each pass compares them with what it last wrote and writes when they
differ; every `verify_seconds` (and after any failure) it reads both objects back and repairs them
(a deleted params ConfigMap is created again; an edited one or a binding reset by `kubectl apply -k`
is put back). It never creates the binding or the policy: the installation does (`k8s/pool-guard.yaml`);
without them the params are kept anyway and the guard simply is not in force. With no valid policy
in force (controller/app.py) it leaves both as they are.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Protocol, Sequence

from loguru import logger

from controller.core.guard import GUARD_NAME, GuardError, guard_params, policy_binding
from controller.core.model import NodeState
from controller.core.policy import PlacementPolicy

PARAMS_LABELS = {"app.kubernetes.io/part-of": "egress-placer", "app.kubernetes.io/managed-by": "egress-placer"}


class GuardWriter(Protocol):
    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_configmap(self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str]) -> None: ...

    def replace_configmap(self, configmap: Mapping[str, Any]) -> None: ...

    def read_policy_binding(self, name: str) -> dict[str, Any] | None: ...

    def replace_policy_binding(self, binding: Mapping[str, Any]) -> None: ...


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
        # What the last pass left in place: (params data, binding spec); None: read back next pass.
        self._kept: tuple[dict[str, str], dict[str, Any]] | None = None
        self._verified_at = float("-inf")

    def __call__(self) -> None:
        self.reconcile()  # the loop's pass: no requeue-after (the resync is soon enough)

    def reconcile(self) -> list[str]:
        """One pass; what was written ("params", "binding"). A failure is logged and retried next pass.
        With no valid policy in force (the empty stand-in) it writes nothing: the guard stays as it was."""
        if not self.state.policy_in_force:
            return []
        policy = self.state.policy
        try:
            data = guard_params(policy, self.state.node_list())
        except GuardError as e:
            logger.bind(kind="ConfigMap", name=GUARD_NAME).error("pool guard params not written: {}", e)
            return []
        binding_spec = policy_binding(policy, self.namespace)["spec"]
        now = self.clock()
        if self._kept == (data, binding_spec) and now - self._verified_at < self.verify_seconds:
            return []
        self._kept = None
        written = []
        try:
            if self._keep_params(data):
                written.append("params")
            if self._keep_binding(binding_spec):
                written.append("binding")
        except Exception as e:
            logger.bind(kind="ConfigMap", name=GUARD_NAME).warning("pool guard not reconciled: {}", e)
            return written
        self._kept = (data, binding_spec)
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

    def _keep_binding(self, spec: dict[str, Any]) -> bool:
        log = logger.bind(kind="ValidatingAdmissionPolicyBinding", name=GUARD_NAME)
        current = self.writer.read_policy_binding(GUARD_NAME)
        if current is None:
            log.debug("the pool guard's binding is not installed (k8s/pool-guard.yaml); only its params are kept")
            return False
        have = current.get("spec") or {}
        match = dict(have.get("matchResources") or {})
        wanted_selector = spec["matchResources"].get("namespaceSelector") or {}
        if (
            (match.get("namespaceSelector") or {}) == wanted_selector
            and have.get("paramRef") == spec["paramRef"]
            and have.get("policyName") == spec["policyName"]
            and have.get("validationActions") == spec["validationActions"]
        ):
            return False
        match["namespaceSelector"] = wanted_selector
        new_spec = {**have, **{k: spec[k] for k in ("policyName", "paramRef", "validationActions")}, "matchResources": match}
        self.writer.replace_policy_binding({**current, "spec": new_spec})
        log.bind(left_out=_names(wanted_selector)).info("pool guard binding updated")
        return True


def _names(selector: Mapping[str, Any]) -> Sequence[str]:
    return [v for e in selector.get("matchExpressions") or [] for v in e.get("values") or []]
