"""The shipped Grafana dashboard (charts/egress-placer/files/grafana-dashboard.json, docs/dashboard.md).

It loads in a schema check: tests/data/grafana/dashboard.schema.json, a JSON Schema written from
Grafana's documented dashboard JSON model (the Classic model of
https://grafana.com/docs/grafana/latest/dashboards/build-dashboards/view-dashboard-json-model/; its
`$comment` says which fields, and where it is stricter). What a schema cannot say is checked here: panels
inside the 24-column grid without overlapping, unique ids, a reference to the data source variable,
every `$variable` defined. Every query (panel targets and template variables) names only series of
the metrics contract (tests/unit/test_metrics.py), and parses as PromQL (`promtool check rules` on the
queries as recording rules, Grafana's variables given values; skipped, saying so, before promtool is
built). The panels an on-call person needs are there.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from itertools import combinations
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

from devcluster.build import find_optional
from tests.promql import unknown_series
from tests.unit.test_metrics import CONTRACT

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_FILE = ROOT / "charts" / "egress-placer" / "files" / "grafana-dashboard.json"
SCHEMA = json.loads((ROOT / "tests" / "data" / "grafana" / "dashboard.schema.json").read_text())
DASHBOARD = json.loads(DASHBOARD_FILE.read_text())
# Values for Grafana's variables when the queries are checked as PromQL.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "6h", "$pool": ".*"}
# What an on-call person needs (issue 13), by panel title.
ON_CALL_PANELS = {
    "Decisions by reason", "Pool load per node", "Admission latency", "Intruders on pool nodes", "Taint drift and taint changes",
    "Leader", "Certificate days left",
    # issue 28: the queue and the egress source
    "Queue length and slots", "Releases and runs past maxQueueSeconds", "Egress queries by result", "Nodes on the run-count fallback",
}


def panels(dashboard: dict[str, Any] = DASHBOARD) -> Iterator[dict[str, Any]]:
    """Every panel, rows and the panels of collapsed rows included."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels") or []


def queries(dashboard: dict[str, Any] = DASHBOARD) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable."""
    found = [(f"panel {p['title']!r} {t['refId']}", t["expr"]) for p in panels(dashboard) for t in p.get("targets") or []]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found.append((f"variable ${variable['name']}", query["query"] if isinstance(query, dict) else query))
    return found


def schema_errors(dashboard: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(dashboard)]


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_the_dashboard_loads_in_the_schema_check() -> None:
    assert schema_errors(DASHBOARD) == []


def broken(change: str) -> dict[str, Any]:
    dashboard = copy.deepcopy(DASHBOARD)
    first_chart = next(p for p in dashboard["panels"] if p["type"] != "row")
    if change == "too wide":
        first_chart["gridPos"]["w"] = 25
    elif change == "no type":
        del first_chart["type"]
    elif change == "a target without a query":
        first_chart["targets"][0].pop("expr")
    elif change == "a short uid":
        dashboard["uid"] = "ep"
    elif change == "an unknown field":
        dashboard["rowz"] = []
    elif change == "a graph tooltip of 3":
        dashboard["graphTooltip"] = 3
    return dashboard


@pytest.mark.parametrize("change", ["too wide", "no type", "a target without a query", "a short uid", "an unknown field", "a graph tooltip of 3"])
def test_the_schema_check_refuses_a_broken_dashboard(change: str) -> None:
    assert schema_errors(broken(change)) != []


def test_panels_stay_inside_the_grid_and_do_not_overlap() -> None:
    boxes = [(p["title"], p["gridPos"]) for p in panels()]
    for title, g in boxes:
        assert g["x"] + g["w"] <= 24, title
    for (a, g), (b, h) in combinations(boxes, 2):
        apart = g["x"] + g["w"] <= h["x"] or h["x"] + h["w"] <= g["x"] or g["y"] + g["h"] <= h["y"] or h["y"] + h["h"] <= g["y"]
        assert apart, f"{a!r} overlaps {b!r}"


def test_ids_and_ref_ids_are_unique() -> None:
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    for panel in panels():
        refs = [t["refId"] for t in panel.get("targets") or []]
        assert len(refs) == len(set(refs)), panel["title"]


def test_every_query_uses_the_data_source_variable_and_only_defined_variables() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    reference = {"type": "prometheus", "uid": "${datasource}"}
    for panel in panels():
        if panel["type"] != "row":
            assert panel["datasource"] == reference, panel["title"]
            assert all(t["datasource"] == reference for t in panel["targets"]), panel["title"]
    used = {name for _, expr in queries() for name in re.findall(r"\$(\w+)", expr) if not name.startswith("__")}
    assert used <= set(variables)


@pytest.mark.parametrize("where, expr", queries(), ids=[w for w, _ in queries()])
def test_every_query_names_only_series_of_the_metrics_contract(where: str, expr: str) -> None:
    assert unknown_series(expr, CONTRACT) == set()


def test_the_series_check_catches_a_misspelt_series() -> None:
    dashboard = copy.deepcopy(DASHBOARD)
    next(p for p in panels(dashboard) if p["type"] != "row")["targets"][0]["expr"] = "sum(egress_placer_leaders)"
    assert {n for _, e in queries(dashboard) for n in unknown_series(e, CONTRACT)} == {"egress_placer_leaders"}


def test_the_panels_on_call_needs_are_there() -> None:
    assert ON_CALL_PANELS <= {p["title"] for p in panels()}


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    bin_dir = find_optional("prometheus")
    if bin_dir is None:
        pytest.skip("promtool is not built yet (python -m devcluster build --with prometheus, part of make cluster-build)")

    def promql(expr: str) -> str:
        expr = re.sub(r"\blabel_values\s*\(\s*([^,]+),\s*\w+\s*\)", r"\1", expr)  # Grafana's, not PromQL
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        return expr

    rules = [{"record": f"dashboard:query_{i}", "expr": promql(expr)} for i, (_, expr) in enumerate(queries())]
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([str(bin_dir / "promtool"), "check", "rules", str(tmp_path / "queries.yaml")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout
