"""The last good policy, stored so that a restart with a broken policy keeps it.

The leader copies the text of each valid policy it loads from its source into a ConfigMap it owns,
`<policy ConfigMap>-last-good` (key `policy.yaml`) in its own namespace. A replica whose policy
source answers at start with an invalid policy, or with none, reads that copy back, validates it
again and keeps it in force until the source offers a valid policy (controller/app.py).

Why a ConfigMap of its own: the policy ConfigMap is the administrator's (`kubectl apply -k` rewrites
it); the copy lives in the controller's namespace, where tenants cannot write, and only the leader
writes it. The copy proves nothing by itself: it is loaded with the same validation as the source.

Level-based, one of the leader's reconcilers: the stored copy is read, and replaced (with its
resourceVersion as precondition) or created whenever the policy loaded from the source differs from it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

from loguru import logger

POLICY_KEY = "policy.yaml"
LABELS = {"app.kubernetes.io/part-of": "egress-placer", "app.kubernetes.io/managed-by": "egress-placer"}


def store_name(policy_configmap: str) -> str:
    """The name of the ConfigMap that holds the last good copy of `policy_configmap`."""
    return f"{policy_configmap}-last-good"


class ConfigMapStore(Protocol):
    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_configmap(self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str]) -> None: ...

    def replace_configmap(self, configmap: Mapping[str, Any]) -> None: ...


class LastGoodPolicyKeeper:
    """Writes `loaded_text()` (the text of the policy last loaded from the source, None before one)
    into the store when it differs from what is stored."""

    def __init__(
        self, store: ConfigMapStore, namespace: str, name: str, loaded_text: Callable[[], str | None]
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.name = name
        self.loaded_text = loaded_text
        self._stored: dict[str, Any] | None = None  # the ConfigMap as last read or written
        self._read = False

    def __call__(self) -> None:
        self.reconcile()  # the loop's pass: no requeue-after (the resync is soon enough)

    def read(self) -> str | None:
        """The stored text (None: nothing stored); raises when it cannot be read."""
        self._stored = self.store.read_configmap(self.namespace, self.name)
        self._read = True
        return _text_of(self._stored)

    def reconcile(self) -> bool:
        """One pass; True when the copy was written. A failed write (a conflict: someone else wrote
        it meanwhile) raises; the next pass reads it again."""
        text = self.loaded_text()
        if text is None:
            return False  # nothing valid loaded from the source: what is stored stays
        if not self._read:
            self.read()
        if text == _text_of(self._stored):
            return False
        self._read = False  # read it again next pass, whatever happens now
        if self._stored is None:
            self.store.create_configmap(self.namespace, self.name, {POLICY_KEY: text}, LABELS)
        else:
            self.store.replace_configmap({**self._stored, "data": {POLICY_KEY: text}})
        logger.bind(kind="ConfigMap", namespace=self.namespace, name=self.name).info("last good policy stored")
        return True


def _text_of(configmap: Mapping[str, Any] | None) -> str | None:
    return None if configmap is None else (configmap.get("data") or {}).get(POLICY_KEY)
