"""The stored last good policy (controller/last_good_policy/reconcile.py) against a recording store:
written when the loaded text differs from the stored one (created, or replaced as read), never before
a policy loaded, and read again after each write."""

from __future__ import annotations

from typing import Any, Mapping

from controller.last_good_policy.reconcile import LABELS, POLICY_KEY, LastGoodPolicyKeeper, store_name

NAME = "egress-placer-policy-last-good"


class Store:
    def __init__(self, data: dict[str, str] | None = None) -> None:
        self.configmap: dict[str, Any] | None = (
            None if data is None else {"metadata": {"name": NAME, "namespace": "egress-placer", "resourceVersion": "1"}, "data": data}
        )
        self.reads = 0
        self.writes: list[tuple[str, dict[str, str]]] = []

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        assert (namespace, name) == ("egress-placer", NAME)
        self.reads += 1
        return self.configmap

    def create_configmap(self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str]) -> None:
        assert (namespace, name, dict(labels)) == ("egress-placer", NAME, LABELS) and self.configmap is None
        self.writes.append(("create", dict(data)))
        self.configmap = {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"}, "data": dict(data)}

    def replace_configmap(self, configmap: Mapping[str, Any]) -> None:
        assert self.configmap is not None and configmap["metadata"] == self.configmap["metadata"]  # as read: its version
        self.writes.append(("replace", dict(configmap["data"])))
        version = str(int(configmap["metadata"]["resourceVersion"]) + 1)
        self.configmap = {"metadata": {**configmap["metadata"], "resourceVersion": version}, "data": dict(configmap["data"])}


def keeper(store: Store, loaded: list[str | None]) -> LastGoodPolicyKeeper:
    return LastGoodPolicyKeeper(store, "egress-placer", store_name("egress-placer-policy"), lambda: loaded[-1])


def test_nothing_is_written_before_a_policy_loads_from_the_source():
    store = Store({POLICY_KEY: "old"})
    keep = keeper(store, [None])
    assert keep.reconcile() is False and store.writes == [] and store.reads == 0
    assert keep.read() == "old"


def test_each_new_loaded_text_is_written_once():
    store, loaded = Store(), ["a"]
    keep = keeper(store, loaded)
    assert keep.reconcile() is True and keep.reconcile() is False
    loaded.append("b")
    assert keep.reconcile() is True and keep.reconcile() is False
    assert store.writes == [("create", {POLICY_KEY: "a"}), ("replace", {POLICY_KEY: "b"})]


def test_a_stored_copy_equal_to_the_loaded_text_is_not_written_again():
    store = Store({POLICY_KEY: "a"})
    assert keeper(store, ["a"]).reconcile() is False and store.writes == []
