"""The supported range (issue #29): the Kubernetes and Tekton minors the matrix's passing rows prove for the cells
of the plan, neither more nor less (devplacer/supported.py), and what `make generate` writes from it."""

from __future__ import annotations

import pytest

from devplacer import generate, matrix
from devplacer.matrix import Cell
from devplacer.supported import NothingProven, proven, runs

PLAN = matrix.cells_of(["v1.9.2", "v1.12.0"], "v1.15.0", ["v1.35.4", "v1.36.3", "v1.37.2", "v1.34.4"])


def row(cell: str, passed: int = 26, failed: int = 0) -> dict:
    tekton, kubernetes = cell.split("/")
    return {"tekton": tekton, "kubernetes": kubernetes, "passed": passed, "failed": failed, "date": "2026-12-06", "commit": "c"}


def test_the_plan_the_range_counts() -> None:
    assert [c.name for c in PLAN] == [
        "v1.9.2/v1.37.2", "v1.12.0/v1.37.2", "v1.15.0/v1.35.4", "v1.15.0/v1.36.3", "v1.15.0/v1.37.2"]
    # the checkout's: the Tekton modules it can build, the Kubernetes versions written down
    assert {c.kubernetes for c in matrix.checkout_plan()} <= set(matrix.KUBERNETES_VERSIONS)
    assert Cell("v1.15.0", "v1.37.2") in matrix.checkout_plan()  # CI's default pair


@pytest.mark.parametrize(
    ("rows", "kube_version", "kubernetes", "tekton"),
    [
        # today's file: one row
        ([row("v1.9.2/v1.37.2")], ">=1.37.0-0 <1.38.0-0", "1.37", "v1.9"),
        # every cell passes
        ([row(c.name) for c in PLAN], ">=1.35.0-0 <1.38.0-0", "1.35 to 1.37", "v1.9, v1.12 and v1.15"),
        # a failing row proves nothing: 1.36 failed between two that passed, it is not claimed
        ([row("v1.15.0/v1.35.4"), row("v1.15.0/v1.36.3", failed=1), row("v1.15.0/v1.37.2")],
         ">=1.35.0-0 <1.36.0-0 || >=1.37.0-0 <1.38.0-0", "1.35 and 1.37", "v1.15"),
        # a row that ran nothing (0 passed, 0 failed) proves nothing
        ([row("v1.12.0/v1.37.2", passed=0), row("v1.15.0/v1.36.3")], ">=1.36.0-0 <1.37.0-0", "1.36", "v1.15"),
        # rows of cells outside the plan (an LTS past its end, a Kubernetes minor dropped, a pair never planned)
        ([row("v1.6.1/v1.37.2"), row("v1.15.0/v1.34.4"), row("v1.9.2/v1.35.4"), row("v1.12.0/v1.37.2")],
         ">=1.37.0-0 <1.38.0-0", "1.37", "v1.12"),
    ],
    ids=["one-row", "every-cell", "failed-cell-in-the-middle", "nothing-ran", "outside-the-plan"],
)
def test_the_range_is_what_passing_rows_of_the_plan_prove(rows: list[dict], kube_version: str, kubernetes: str, tekton: str) -> None:
    supported = proven(rows, PLAN)
    assert supported.kube_version() == kube_version
    assert supported.kubernetes_text() == kubernetes
    assert supported.tekton_text() == tekton


@pytest.mark.parametrize(
    "rows",
    [[], [row("v1.9.2/v1.37.2", failed=2)], [row("v1.6.1/v1.37.2"), row("v1.15.0/v1.34.4")]],
    ids=["empty-file", "only-failures", "only-outside-the-plan"],
)
def test_nothing_proven_is_an_error_not_a_range(rows: list[dict]) -> None:
    with pytest.raises(NothingProven, match="no cell of the matrix's plan has a passing row.*python -m devplacer.matrix --only"):
        proven(rows, PLAN)


def test_the_tekton_requirement_and_the_proven_pairs() -> None:
    supported = proven([row(c.name) for c in PLAN], PLAN)
    assert supported.tekton_minors == ("v1.9", "v1.12", "v1.15")  # by version, not by text
    assert supported.tekton_text("or") == "v1.9, v1.12 or v1.15"
    assert supported.tested() == ("v1.9.2 on Kubernetes 1.37.2; v1.12.0 on Kubernetes 1.37.2; "
                                  "v1.15.0 on Kubernetes 1.35.4, 1.36.3, 1.37.2")


@pytest.mark.parametrize(
    ("minors", "expected"),
    [
        ([], []),
        ([(1, 37)], [((1, 37), (1, 37))]),
        ([(1, 37), (1, 35), (1, 36), (1, 36)], [((1, 35), (1, 37))]),
        ([(1, 9), (1, 10), (1, 12)], [((1, 9), (1, 10)), ((1, 12), (1, 12))]),
        ([(1, 37), (2, 0)], [((1, 37), (1, 37)), ((2, 0), (2, 0))]),
    ],
)
def test_runs_of_consecutive_minors(minors: list[tuple[int, int]], expected: list) -> None:
    assert runs(minors) == expected


def test_generate_writes_the_range_everywhere_the_docs_state_it() -> None:
    supported = proven([row(c.name) for c in PLAN], PLAN)
    chart = generate.chart_yaml('version: 0.0.0\nappVersion: "0.0.0"\nkubeVersion: ">=1.30.0-0"\n', "0.2.0", supported)
    assert 'kubeVersion: ">=1.35.0-0 <1.38.0-0"' in chart.splitlines()
    doc = f"# x\n{generate.SUPPORTED_BEGIN}\nold\n{generate.SUPPORTED_END}\nrest\n"
    written = generate.compatibility_doc(doc, supported)
    assert "old" not in written and written.endswith(f"{generate.SUPPORTED_END}\nrest\n")
    assert "- Kubernetes **1.35 to 1.37**" in written and "- Tekton Pipelines **v1.9, v1.12 and v1.15**; on v1.9 no TaskRun is queued" in written
    assert generate.compatibility_doc(written, supported) == written
    helm = generate.helm_doc("a\n- Kubernetes 1.30 or newer;\n- Tekton Pipelines installed;\nb\n", supported)
    assert "- Tekton Pipelines v1.9, v1.12 or v1.15 installed;" in helm.splitlines()
    assert helm.splitlines()[1].startswith("- Kubernetes 1.35 to 1.37 (")
    with pytest.raises(ValueError, match="and one .* line were expected"):
        generate.compatibility_doc("no markers\n", supported)
    with pytest.raises(ValueError, match="0 lines match"):
        generate.helm_doc("nothing to set\n", supported)


def test_the_committed_files_state_the_committed_results_range() -> None:
    """What the repository says is what docs/compatibility.json proves (test_generated.py checks every byte)."""
    supported = generate.supported_range()
    assert f'kubeVersion: "{supported.kube_version()}"' in (generate.REPO / generate.CHART_YAML).read_text().splitlines()
    assert f"- Kubernetes **{supported.kubernetes_text()}**" in (generate.REPO / generate.COMPATIBILITY_DOC).read_text()


def test_the_plan_the_doc_shows_is_the_one_the_range_counts() -> None:
    """docs/compatibility.md's "The cells" table (the plan read from releases.md) and `matrix.checkout_plan` (what
    `make generate` counts rows of) name the same cells."""
    text = (generate.REPO / generate.COMPATIBILITY_DOC).read_text()
    section = text[text.index("## The cells"): text.index("## Results")]
    shown = {Cell(*(c.strip() for c in line.strip("|").split("|")[:2])) for line in section.splitlines() if line.startswith("| v")}
    assert shown == set(matrix.checkout_plan())
