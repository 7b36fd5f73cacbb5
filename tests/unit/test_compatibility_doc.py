"""docs/compatibility.md's table and docs/compatibility.json (written together by `python -m devplacer.matrix`)
agree, row for row; and the matrix's planning, results and table code does what the doc says (issue #29)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from devplacer import matrix

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_and_the_result_file_agree() -> None:
    rows = json.loads((ROOT / "docs" / "compatibility.json").read_text())
    assert isinstance(rows, list)
    for row in rows:
        assert set(matrix.RESULT_KEYS) <= set(row), row
    shown = matrix.table_rows((ROOT / "docs" / "compatibility.md").read_text())
    assert [{k: r[k] for k in matrix.RESULT_KEYS} for r in shown] == [{k: r[k] for k in matrix.RESULT_KEYS} for r in rows]
    for r in shown:
        assert r["verdict"] == ("pass" if r["failed"] == 0 and r["passed"] > 0 else "fail")


RELEASES = """\
### v1.14
- **Initial Release**: [v1.14.0][v1.14-0] (2026-06-30)
- **End of Life**: 2026-07-30
- **Patch Releases**: [v1.14.0][v1.14-0]

### v1.12 (LTS)
- **End of Life**: 2027-05-04
- **Patch Releases**: [v1.12.0][v1.12-0]

### v1.9 (LTS)
- **End of Life**: 2027-01-30
- **Patch Releases**: [v1.9.0][v1.9-0], [v1.9.2][v1.9-2], [v1.9.3][v1.9-3]

### v1.6 (LTS)
- **End of Life**: 2026-10-31
- **Patch Releases**: [v1.6.0][v1.6-0]

## End of Life Releases
"""


def test_the_plan_takes_the_supported_lts_and_the_newest() -> None:
    releases = matrix.merged_releases([RELEASES])
    served = {"v1.9.2", "v1.12.0", "v1.15.0"}.__contains__  # v1.9.3 is not served: its newest served patch
    cells = matrix.plan(releases.values(), date(2026, 12, 5), "v1.15.0", ("v1.34.4", "v1.37.2", "v1.35.4", "v1.36.3"), served)
    assert [c.name for c in cells] == [
        "v1.9.2/v1.37.2", "v1.12.0/v1.37.2", "v1.15.0/v1.35.4", "v1.15.0/v1.36.3", "v1.15.0/v1.37.2"]
    later = matrix.plan(releases.values(), date(2027, 2, 1), "v1.15.0", ("v1.37.2",), served)
    assert [c.tekton for c in later] == ["v1.12.0", "v1.15.0"]  # v1.9 ended 2027-01-30


def test_results_are_kept_per_cell_and_the_table_follows(tmp_path: Path) -> None:
    results, doc = tmp_path / "c.json", tmp_path / "c.md"
    doc.write_text(f"# x\n{matrix.TABLE_BEGIN}\nold\n{matrix.TABLE_END}\nrest\n")
    row = {"tekton": "v1.9.2", "kubernetes": "v1.37.2", "passed": 10, "failed": 1, "date": "2026-12-05", "commit": "abc"}
    matrix.keep_result(row, results)
    rows = matrix.keep_result({**row, "failed": 0}, results)  # the same cell again: replaced
    assert rows == [{**row, "failed": 0}]
    matrix.write_table(rows, doc)
    assert matrix.table_rows(doc.read_text()) == [{**row, "failed": 0, "verdict": "pass"}]
    assert doc.read_text().endswith("rest\n")


@pytest.mark.parametrize(
    ("xml", "counts"),
    [
        ('<testsuites><testsuite tests="5" failures="1" errors="1" skipped="1"/></testsuites>', (2, 2)),
        ('<testsuite tests="3" failures="0" errors="0" skipped="0"/>', (3, 0)),
    ],
)
def test_junit_counts(tmp_path: Path, xml: str, counts: tuple[int, int]) -> None:
    report = tmp_path / "r.xml"
    report.write_text(xml)
    assert matrix.junit_counts(report) == counts
    assert matrix.junit_counts(tmp_path / "missing.xml") == (0, 0)
