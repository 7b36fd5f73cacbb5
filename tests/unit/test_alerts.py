"""The shipped alerts (charts/egress-placer/files/prometheus-rules.yaml, docs/alerts.md).

`promtool check rules` and `promtool test rules tests/data/alerts/rules.test.yaml` pass (promtool built
from the same Prometheus module and pin as the local cluster's Prometheus: `python -m devcluster build
--with prometheus`, part of `make cluster-build`; skipped, saying so, before that build). Every alert has a
case where it fires and one where it does not (every severity of it fires somewhere); every series an
alert reads is in the metrics contract; every alert has its section in docs/troubleshooting.md (its runbook_url).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.build import find_optional
from tests.promql import series_names, unknown_series
from tests.unit.test_metrics import CONTRACT

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "egress-placer" / "files" / "prometheus-rules.yaml"
RULE_TESTS = ROOT / "tests" / "data" / "alerts" / "rules.test.yaml"
ALERTS_DOC = ROOT / "docs" / "alerts.md"
RUNBOOK_DOC = ROOT / "docs" / "troubleshooting.md"  # a section per alert: the runbook_url anchors
RUNBOOK_BASE = "https://github.com/egress-placer/egress-placer/blob/main/docs/troubleshooting.md"  # the published docs/troubleshooting.md: prometheusRule.runbookBaseURL's default


def alerting_rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def rule_tests() -> list[dict[str, Any]]:
    return yaml.safe_load(RULE_TESTS.read_text())["tests"]


@pytest.fixture(scope="module")
def promtool() -> Path:
    bin_dir = find_optional("prometheus")
    if bin_dir is None:
        pytest.skip("promtool is not built yet (python -m devcluster build --with prometheus, part of make cluster-build)")
    return bin_dir / "promtool"


def run(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_the_rule_file(promtool: Path) -> None:
    done = run(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerting_rules())} rules found" in done.stdout


def test_promtool_test_rules_passes(promtool: Path) -> None:
    done = run(promtool, "test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_test_rules_fails_on_a_wrong_rule(promtool: Path, tmp_path: Path) -> None:
    """The cases bite: with one threshold changed (errors over 50% instead of 5%) the test fails."""
    (tmp_path / "rules.yaml").write_text(RULES.read_text().replace("> 0.05", "> 0.5"))
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tests["rule_files"] = ["rules.yaml"]
    (tmp_path / "rules.test.yaml").write_text(yaml.safe_dump(tests))
    done = run(promtool, "test", "rules", str(tmp_path / "rules.test.yaml"))
    assert done.returncode != 0 and "alertname: EgressPlacerWebhookErrors" in done.stdout + done.stderr


def test_every_alert_fires_in_one_case_and_stays_quiet_in_another() -> None:
    firing: dict[str, set[str]] = {}
    quiet: set[str] = set()
    for case in rule_tests():
        for check in case.get("alert_rule_test") or []:
            if check.get("exp_alerts"):
                firing.setdefault(check["alertname"], set()).update(a["exp_labels"]["severity"] for a in check["exp_alerts"])
            else:
                quiet.add(check["alertname"])
    severities: dict[str, set[str]] = {}
    for rule in alerting_rules():
        severities.setdefault(rule["alert"], set()).add(rule["labels"]["severity"])
    assert firing == severities  # every alert, at each of its severities, and no test of an alert that is not there
    assert quiet == set(severities)


def test_the_alerts_the_issue_asks_for_are_there() -> None:
    """No leader, webhook errors or latency, certificate expiring, pool node untainted, intruder not
    cleared, policy not ready; (issue 28) the queue: a run held past its pool's maximum wait, releases
    stalled; the egress source: scrape failing, fallback in use."""
    names = {r["alert"] for r in alerting_rules()}
    assert {
        "EgressPlacerNoLeader", "EgressPlacerWebhookErrors", "EgressPlacerWebhookSlow", "EgressPlacerCertificateExpiring",
        "EgressPlacerTaintDrift", "EgressPlacerIntruderNotCleared", "EgressPlacerPolicyNotReady",
        "EgressPlacerQueueWaitExceeded", "EgressPlacerQueueStalled", "EgressPlacerEgressScrapeFailing", "EgressPlacerEgressFallback",
    } <= names


def test_no_alert_names_the_policy_configmap_as_the_only_source() -> None:
    """The default source is the pools API (EGRESS_PLACER_POLICY_SOURCE=pools)."""
    for rule in alerting_rules():
        text = " ".join(rule["annotations"].values())
        assert "ConfigMap egress-placer-policy" not in text, rule["alert"]


def test_the_chart_default_runbook_base_is_the_one_in_the_rule_file() -> None:
    values = yaml.safe_load((ROOT / "charts" / "egress-placer" / "values.yaml").read_text())
    assert values["prometheusRule"]["runbookBaseURL"] == RUNBOOK_BASE
    assert RULES.read_text().count(RUNBOOK_BASE + "#") == len(alerting_rules())


@pytest.mark.parametrize("rule", alerting_rules(), ids=lambda r: f"{r['alert']}-{r['labels']['severity']}")
def test_every_alert_reads_series_of_the_contract(rule: dict[str, Any]) -> None:
    assert series_names(rule["expr"])  # it reads something
    assert unknown_series(rule["expr"], CONTRACT) == set()


@pytest.mark.parametrize("rule", alerting_rules(), ids=lambda r: f"{r['alert']}-{r['labels']['severity']}")
def test_every_alert_has_its_runbook_section_in_docs_troubleshooting_md(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
    assert "runbook" not in rule["annotations"]  # the annotation Alertmanager, Grafana and PagerDuty read is runbook_url
    base, anchor = rule["annotations"]["runbook_url"].split("#")
    assert base == RUNBOOK_BASE and anchor == rule["alert"].lower()
    headings = re.findall(r"^### (\w+)$", RUNBOOK_DOC.read_text(), re.M)
    assert anchor in {h.lower() for h in headings}, anchor  # GitHub's anchor of `### EgressPlacerNoLeader`
    assert rule["alert"] in headings
    assert f"[`{rule['alert']}`](troubleshooting.md#{anchor})" in ALERTS_DOC.read_text()  # the table links its runbook


def test_every_link_to_a_troubleshooting_section_names_one_that_exists() -> None:
    """The docs link troubleshooting.md's sections by GitHub's anchors (lower case, punctuation dropped, spaces as -)."""
    text = RUNBOOK_DOC.read_text()
    anchors = {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}
    linked = set(re.findall(r"\]\(#([^)]+)\)", text))
    for doc in sorted((ROOT / "docs").glob("*.md")):
        linked |= set(re.findall(r"\]\(troubleshooting\.md#([^)\s]+)\)", doc.read_text()))
    assert linked and linked <= anchors, sorted(linked - anchors)


# -- the series reader the alert and dashboard checks share ---------------------------------------------
@pytest.mark.parametrize(
    "expr, names",
    [
        ("sum(egress_placer_leader) < 1 or absent(egress_placer_leader)", {"egress_placer_leader"}),
        ('sum by (kind) (rate(egress_placer_admission_reviews_total{outcome="error"}[5m]))', {"egress_placer_admission_reviews_total"}),
        ("histogram_quantile(0.99, sum by (le, kind) (rate(egress_placer_admission_duration_seconds_bucket[$__rate_interval])))",
         {"egress_placer_admission_duration_seconds_bucket"}),
        ("0 < (egress_placer_webhook_certificate_expiration_timestamp_seconds - time()) / 86400 < 14",
         {"egress_placer_webhook_certificate_expiration_timestamp_seconds"}),
        ('max by (instance) (process_resident_memory_bytes and on (job, instance) egress_placer_build_info)',
         {"process_resident_memory_bytes", "egress_placer_build_info"}),
        ('a_total offset 5m * on (pod) group_left (node) b_info', {"a_total", "b_info"}),
        ('max without (pod) (x{pool=~"$pool", node!="by (y)"}) > bool 1', {"x"}),
        ("label_values(egress_placer_pool_ready_nodes, pool)", {"egress_placer_pool_ready_nodes"}),
        ("sum(rate(egress_placer_decisions_totl[5m]))", {"egress_placer_decisions_totl"}),  # misspelt: still a name
    ],
)
def test_series_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert series_names(expr) == names


@pytest.mark.parametrize(
    "expr, unknown",
    [
        ("rate(egress_placer_intruder_clear_seconds_bucket[5m])", set()),  # a histogram's bucket series
        ("rate(egress_placer_decisions_total_bucket[5m])", {"egress_placer_decisions_total_bucket"}),  # a counter has none
        ("sum(rate(egress_placer_decisions_totl[5m]))", {"egress_placer_decisions_totl"}),
        ("up", {"up"}),  # Prometheus' own series are not ours
    ],
)
def test_unknown_series_are_named(expr: str, unknown: set[str]) -> None:
    assert unknown_series(expr, CONTRACT) == unknown
