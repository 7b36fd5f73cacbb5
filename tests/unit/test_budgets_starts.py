"""The leader's record of the windows' starts (controller/budgets/reconcile.py BudgetStartsKeeper, the
pure part in controller/budgets/core.py): a ConfigMap in the controller's namespace, so that a start
outlives its run, its pod and every replica's memory; bounded to what the windows still count."""

from __future__ import annotations

import json
from typing import Any, Mapping

from hypothesis import given, strategies as st

from controller.budgets.core import (
    MAX_KEPT_STARTS,
    STARTS_CONFIGMAP,
    STARTS_KEY,
    Start,
    decode_starts,
    encode_starts,
    starts_to_keep,
    window_budgets,
)
from controller.budgets.reconcile import BudgetStartsKeeper
from controller.state import ClusterState
from tests.unit.test_budgets_view import NOW, POLICY, pod, rec, run, state

WINDOWS = {("overseas", "dockerhub-pulls"): (60, 5)}


class FakeConfigMaps:
    """The controller's namespace: one ConfigMap per name, resourceVersion bumped on each write."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes = 0

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get(name)
        return json.loads(json.dumps(found)) if found else None

    def create_configmap(self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str]) -> None:
        assert name not in self.objects
        self.objects[name] = {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "1", "labels": dict(labels)}, "data": dict(data)}
        self.writes += 1

    def replace_configmap(self, configmap: Mapping[str, Any]) -> None:
        name = configmap["metadata"]["name"]
        assert configmap["metadata"]["resourceVersion"] == self.objects[name]["metadata"]["resourceVersion"], "conflict"
        rv = str(int(self.objects[name]["metadata"]["resourceVersion"]) + 1)
        self.objects[name] = {**json.loads(json.dumps(dict(configmap))), "metadata": {**configmap["metadata"], "resourceVersion": rv}}
        self.writes += 1


def starts_of(s: ClusterState, now: float) -> list[tuple[str, float]]:
    budgets = s.budgets.pool_budgets(s.policy.pools[0], now)
    assert budgets is not None
    return sorted((x.address, x.time) for x in budgets.starts)


# -- the abuse case first -------------------------------------------------------------------------


def test_a_tenant_deleting_its_runs_while_no_replica_watched_frees_no_window() -> None:
    """Five runs start behind 203.0.113.7 (its window full), the leader records them; every replica goes,
    the tenant deletes its runs and pods meanwhile. A new replica sees no pod and no run, yet reads the
    record at start: the window is still full, and the next slot is where it was."""
    from controller.budgets.core import verdict

    s, cms = state(), FakeConfigMaps()
    for i in range(5):
        run(s, f"r{i}")
        pod(s, f"r{i}", "egress-1" if i % 2 else "egress-2", rec("egress-1", started=NOW - 50 + i))
    BudgetStartsKeeper(s, cms, "egress-placer", clock=lambda: NOW)()
    assert STARTS_CONFIGMAP in cms.objects
    fresh = state()  # no pod, no run: all deleted while no replica watched
    assert starts_of(fresh, NOW) == []
    BudgetStartsKeeper(fresh, cms, "egress-placer", clock=lambda: NOW).restore()
    assert starts_of(fresh, NOW) == [("203.0.113.7", NOW - 50 + i) for i in range(5)]
    budgets = fresh.budgets.pool_budgets(fresh.policy.pools[0], NOW)
    assert budgets is not None and verdict(budgets, ["dockerhub-pulls"], NOW).nodes == ("egress-3",)
    assert starts_of(fresh, NOW + 11) == [("203.0.113.7", NOW - 50 + i) for i in range(1, 5)]  # the first left the window


def test_the_record_holds_only_starts_the_view_trusts() -> None:
    """A forged record on a bare pod, or on a pod whose owner uid is made up, never reaches the record
    (the keeper writes only what the view counts); a destination not in the policy is dropped."""
    s, cms = state(), FakeConfigMaps()
    run(s, "forged")
    pod(s, "forged", "egress-1", rec("egress-1"), owner_uid="made-up")
    run(s, "real")
    pod(s, "real", "egress-3", rec("egress-3", names=("dockerhub-pulls", "made-up")))
    BudgetStartsKeeper(s, cms, "egress-placer", clock=lambda: NOW)()
    kept = decode_starts(cms.objects[STARTS_CONFIGMAP]["data"][STARTS_KEY])
    assert kept == {"pod-real": ("overseas", (Start("dockerhub-pulls", "egress-3", NOW - 10),))}


def test_a_run_both_live_and_recorded_counts_once() -> None:
    s, cms = state(), FakeConfigMaps()
    run(s, "a")
    pod(s, "a", "egress-3", rec("egress-3"))
    keeper = BudgetStartsKeeper(s, cms, "egress-placer", clock=lambda: NOW)
    keeper()
    keeper.restore()
    keeper()
    assert starts_of(s, NOW) == [("egress-3", NOW - 10)]
    assert cms.writes == 1  # nothing changed: no second write


def test_the_leader_writes_when_starts_come_and_leave_the_window_only() -> None:
    s, cms = state(), FakeConfigMaps()
    clock = [NOW]
    keeper = BudgetStartsKeeper(s, cms, "egress-placer", clock=lambda: clock[0])
    keeper()
    assert cms.writes == 1 and decode_starts(cms.objects[STARTS_CONFIGMAP]["data"][STARTS_KEY]) == {}
    run(s, "a")
    pod(s, "a", "egress-3", rec("egress-3"))
    keeper()
    keeper()
    assert cms.writes == 2
    clock[0] = NOW + 60
    keeper()
    assert cms.writes == 3 and decode_starts(cms.objects[STARTS_CONFIGMAP]["data"][STARTS_KEY]) == {}


def test_no_window_budget_no_record() -> None:
    from controller.core.policy import load_policy

    s, cms = ClusterState(load_policy(POLICY.replace("        maxStartsPerWindowPerAddress: 5\n        windowSeconds: 60\n", "")), clock=lambda: NOW), FakeConfigMaps()
    BudgetStartsKeeper(s, cms, "egress-placer", clock=lambda: NOW)()
    assert cms.objects == {}


def follower_informer(s: ClusterState) -> Any:
    """The informer every replica runs on the record (kube.informer.cluster_informers), fed by hand."""
    from controller.kube.informer import cluster_informers
    from controller.metrics import Metrics
    from controller.settings import Settings

    informers = {i.resource.name: i for i in cluster_informers(None, s, Settings(namespace="egress-placer"), Metrics())}  # type: ignore[arg-type]
    return informers[f"configmap egress-placer/{STARTS_CONFIGMAP}"]


def test_a_follower_follows_the_leaders_record_so_a_failover_keeps_the_window() -> None:
    """The leader (s) records 5 starts behind 203.0.113.7, then its runs and pods are deleted. A follower
    that started before any of it (an empty record at its first list) gets each write of the record by
    its watch: its window is full now, and stays full once it leads, though it never saw a pod."""
    from controller.budgets.core import verdict

    leader, cms = state(), FakeConfigMaps()
    follower = state()
    informer = follower_informer(follower)
    assert not informer.required  # readable or not, it does not hold readiness: rights of an older release during an upgrade
    informer.on_replace([])  # first list: no record yet
    assert starts_of(follower, NOW) == []
    keeper = BudgetStartsKeeper(leader, cms, "egress-placer", clock=lambda: NOW)
    for i in range(5):
        run(leader, f"r{i}")
        pod(leader, f"r{i}", "egress-1", rec("egress-1", started=NOW - 50 + i))
        keeper()
        informer.on_event("ADDED" if i == 0 else "MODIFIED", cms.objects[STARTS_CONFIGMAP])
    assert starts_of(follower, NOW) == [("203.0.113.7", NOW - 50 + i) for i in range(5)]
    budgets = follower.budgets.pool_budgets(follower.policy.pools[0], NOW)
    assert budgets is not None and verdict(budgets, ["dockerhub-pulls"], NOW).nodes == ("egress-3",)
    # the follower leads: its keeper reads the record again and writes nothing that drops a start
    new_keeper = BudgetStartsKeeper(follower, cms, "egress-placer", clock=lambda: NOW)
    new_keeper.leading()
    new_keeper()
    assert len(decode_starts(cms.objects[STARTS_CONFIGMAP]["data"][STARTS_KEY])) == 5
    informer.on_event("DELETED", cms.objects[STARTS_CONFIGMAP])  # a deleted record takes nothing away
    assert len(starts_of(follower, NOW)) == 5 and starts_of(follower, NOW + 11)[0] == ("203.0.113.7", NOW - 49)


def test_a_record_the_follower_reads_adds_nothing_it_already_counts_and_bad_text_is_ignored() -> None:
    """A pod the follower counts live and the record both name counts once; a record that is not ours to
    read (bad JSON, rows of unknown shape) takes nothing and does not stop the informer."""
    s = state()
    run(s, "a")
    pod(s, "a", "egress-3", rec("egress-3"))
    informer = follower_informer(s)
    row = encode_starts({"pod-a": ("overseas", (Start("dockerhub-pulls", "egress-3", NOW - 10),))})
    informer.on_replace([{"metadata": {"name": STARTS_CONFIGMAP}, "data": {STARTS_KEY: row}}])
    assert starts_of(s, NOW) == [("egress-3", NOW - 10)]
    for bad in ("{not json", "[[1, 2]]", json.dumps({"rows": "x"}), ""):
        informer.on_event("MODIFIED", {"metadata": {"name": STARTS_CONFIGMAP}, "data": {STARTS_KEY: bad}})
    informer.on_event("MODIFIED", {"metadata": {"name": STARTS_CONFIGMAP}})
    assert starts_of(s, NOW) == [("egress-3", NOW - 10)]


# -- the pure part --------------------------------------------------------------------------------


def test_kept_are_the_latest_the_budget_allows_per_destination_and_address_in_the_window() -> None:
    starts = {f"u{i}": ("overseas", (Start("dockerhub-pulls", "a1", NOW - 70 + 10 * i),)) for i in range(8)}
    starts["other"] = ("overseas", (Start("dockerhub-pulls", "a2", NOW - 1),))
    starts["no-window"] = ("overseas", (Start("cdn", "a1", NOW - 1),))
    starts["gone-pool"] = ("elsewhere", (Start("dockerhub-pulls", "a1", NOW - 1),))
    kept = starts_to_keep(starts, WINDOWS, NOW)
    assert sorted(kept) == ["other", "u3", "u4", "u5", "u6", "u7"]  # u0 out of the window; u1, u2 older than the latest 5


def test_the_record_round_trips_and_bad_rows_are_left_out() -> None:
    kept = {"u1": ("overseas", (Start("d1", "a", NOW), Start("d2", "a", NOW))), "u2": ("p2", (Start("d1", "b", NOW - 1.5),))}
    assert decode_starts(encode_starts(kept)) == kept
    bad = json.dumps({"starts": [["u", "p", "d", "a", "x"], ["u", "p", "d", "a", float("inf")], ["u", "p", "d", "a", True],
                                 ["", "p", "d", "a", 1], ["u", "p", "d"], "row", ["ok", "p", "d", "a", 1]]})
    assert decode_starts(bad) == {"ok": ("p", (Start("d", "a", 1.0),))}
    for text in (None, "", "not json", "[]", '{"starts": 7}', "[" * 100_000):
        assert decode_starts(text) == {}


def test_window_budgets_of_the_policy() -> None:
    assert window_budgets(state().policy.pools) == WINDOWS


@given(st.lists(st.tuples(st.sampled_from(["a1", "a2", "a3"]), st.floats(NOW - 120, NOW)), max_size=60))
def test_keeping_never_changes_whether_a_window_is_full_nor_its_next_slot(rows: list[tuple[str, float]]) -> None:
    """The record tells what the full set tells: per address, full or not, and when the next slot frees."""
    from controller.budgets.core import PoolBudgets, figures

    s = state()
    pool = s.policy.pools[0]
    starts = {f"u{i}": ("overseas", (Start("dockerhub-pulls", a, t),)) for i, (a, t) in enumerate(rows)}
    kept = starts_to_keep(starts, WINDOWS, NOW)
    assert len(kept) <= MAX_KEPT_STARTS
    where = {"n1": "a1", "n2": "a2", "n3": "a3"}

    def picture(d: Mapping[str, tuple[str, tuple[Start, ...]]]) -> list[tuple[bool, float | None]]:
        b = PoolBudgets("overseas", pool.destinations, where, (), tuple(x for _, mine in d.values() for x in mine))
        return [(f.full, f.next_slot) for a in ("a1", "a2", "a3") for f in figures(b, pool.destinations[0], a, NOW) if f.window]

    assert picture(kept) == picture(starts)
