"""The pure parts of bench/under_relist.py: the list/watch API's pages and relist schedule, the row, and
its merge into latest.json (other keys kept)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from bench.report import _relist_margin
from bench.under_relist import ListWatchApi, QuietWatch, merge_into, summarize


def test_pages_cover_every_object_once_and_the_last_has_no_continue() -> None:
    objs = [{"metadata": {"name": f"p-{i}"}} for i in range(7)]
    api = ListWatchApi(objs, page_size=3)
    seen, token = [], None
    while True:
        page = api.call("GET", "/api/v1/pods", query={"limit": 3, "continue": token})
        seen += page["items"]
        token = page["metadata"].get("continue")
        if token is None:
            break
    assert seen == objs


def test_the_watch_answers_410_only_while_relisting_and_gap_seconds_after_the_last_list() -> None:
    now = [100.0]
    api = ListWatchApi([{"metadata": {"name": "p"}}], page_size=10, gap=2.0, clock=lambda: now[0])
    assert isinstance(api.stream("/api/v1/pods", query={}, timeout=None), QuietWatch)
    api.relisting.set()
    now[0] += 1.0
    assert isinstance(api.stream("/api/v1/pods", query={}, timeout=None), QuietWatch)
    now[0] += 1.0
    with pytest.raises(ApiException) as gone:
        api.stream("/api/v1/pods", query={}, timeout=None)
    assert gone.value.status == 410
    api.call("GET", "/api/v1/pods", query={"limit": 10})  # a list resets the gap
    assert not api.relist_due()


def test_the_row_takes_the_median_p99_of_each_phase_and_the_mean_relist() -> None:
    idle = [{"p99_ms": 4.0, "p50_ms": 1.0, "errors": 0}, {"p99_ms": 6.0, "p50_ms": 1.2, "errors": 0}]
    relist = [{"p99_ms": 9.0, "p50_ms": 2.0, "errors": 1}, {"p99_ms": 13.0, "p50_ms": 2.2, "errors": 0}]
    row = summarize(20000, 200, 10.0, idle, relist, [(3, 1.0), (1, 2.0)])
    assert (row["idle_p99_ms"], row["relist_p99_ms"]) == (5.0, 11.0)
    assert row["relist_p99_ms_each"] == [9.0, 13.0] and row["errors"] == 1
    assert (row["relists"], row["relist_s"]) == (4, 1.25)
    assert _relist_margin(row) == 1.1  # 11 ms against max(2 x 5, 5 + 5) = 10 ms


def test_merge_writes_only_its_key(tmp_path: Path) -> None:
    (tmp_path / "latest.json").write_text(json.dumps({"admission": {"headline": {"p99_ms": 2.5}}, "core": {"rows": []}}))
    merge_into(tmp_path, {"idle_p99_ms": 1.0, "relist_p99_ms": 2.0})
    assert json.loads((tmp_path / "latest.json").read_text()) == {
        "admission": {"headline": {"p99_ms": 2.5}, "under_relist": {"idle_p99_ms": 1.0, "relist_p99_ms": 2.0}},
        "core": {"rows": []},
    }
