"""Files derived from code come from `make generate` (devplacer/generate.py) only: every committed one is
what it writes (the CRDs of k8s/ and of the chart, the pool guard's manifest and chart template), the
generated directories hold nothing else; `--check` writes nothing and names what differs; `--help`
writes nothing, also through the older `python -m devplacer.crds`."""

from __future__ import annotations

import runpy
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from devplacer import generate
from devplacer.generate import OWNED_DIRS, differences, main, outputs
from devplacer.version import IMAGE_REPOSITORY


def test_every_committed_generated_file_is_what_make_generate_writes() -> None:
    stale = differences()
    assert stale == [], "these files differ from what `make generate` writes, run make generate: " + ", ".join(stale)


def files(root: Path) -> dict[Path, str]:
    return {p.relative_to(root): p.read_text() for p in root.rglob("*") if p.is_file()}


def test_help_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"], root=tmp_path)
    assert exit_.value.code == 0 and files(tmp_path) == {}
    out = capsys.readouterr().out
    assert all(str(path) in out for path in outputs())  # it names what it writes


def test_the_older_command_is_the_same_and_its_help_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_write(*args: object) -> None:
        raise AssertionError("--help wrote")

    monkeypatch.setattr(generate, "write", no_write)
    monkeypatch.setattr(sys, "argv", ["python -m devplacer.crds", "--help"])
    monkeypatch.delitem(sys.modules, "devplacer.crds", raising=False)  # run as a program, as `python -m` does
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("devplacer.crds", run_name="__main__")
    assert exit_.value.code == 0


def test_check_writes_nothing_and_names_every_file_that_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check"], root=tmp_path) == 1
    assert files(tmp_path) == {}
    err = capsys.readouterr().err
    assert all(f"{path}: differs" in err for path in outputs()) and "run `make generate`" in err


def test_a_write_makes_the_check_pass_and_removes_what_the_render_does_not_make(tmp_path: Path) -> None:
    assert main([], root=tmp_path) == 0
    assert files(tmp_path) == outputs()
    assert main(["--check"], root=tmp_path) == 0
    leftover = tmp_path / OWNED_DIRS[0] / "egressoldthings.egress-placer.io.yaml"
    leftover.write_text("kind: CustomResourceDefinition\n")
    (tmp_path / next(iter(outputs()))).write_text("edited by hand\n")
    assert differences(tmp_path) == sorted([str(next(iter(outputs()))), f"{leftover.relative_to(tmp_path)} (not generated)"])
    assert main([], root=tmp_path) == 0
    assert files(tmp_path) == outputs() and differences(tmp_path) == []


def test_the_chart_readme_is_what_helm_docs_writes_from_the_values_comments() -> None:
    """charts/egress-placer/README.md comes from helm-docs (an optional build component): without it the
    check leaves that one file alone and says so; with it the committed file is its render, every
    top-level value in its table with a description."""
    if generate.helm_docs() is None:
        assert generate.skipped() == [generate.HELM_DOCS_MISSING]
        pytest.skip(generate.HELM_DOCS_MISSING)
    readme = outputs()[generate.CHART_README]
    assert (generate.REPO / generate.CHART_README).read_text() == readme, "run make generate"
    values = yaml.safe_load((generate.REPO / generate.CHART_DIR / "values.yaml").read_text())
    rows = {line.split(" | ")[0].lstrip("| "): line for line in readme.splitlines() if line.startswith("| ")}
    undocumented = [key for key in values if key not in rows or not rows[key].rsplit(" | ", 1)[-1].strip(" |")]
    assert undocumented == [], f"values without a `# --` comment: {undocumented}"


def test_without_helm_docs_generate_leaves_the_chart_readme_alone_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(generate, "helm_docs", lambda: None)
    assert main([], root=tmp_path) == 0
    assert generate.CHART_README not in files(tmp_path)
    assert main(["--check"], root=tmp_path) == 0
    assert capsys.readouterr().err.count(generate.HELM_DOCS_MISSING) == 2


def test_one_version_source_the_chart_and_k8s_carry_pyproject_s_version() -> None:
    """Issue 28: pyproject.toml's version is the one source; `make generate` writes it into Chart.yaml
    (version and appVersion in lockstep) and k8s/'s image, so a bump by hand anywhere else is drift."""
    version = tomllib.loads((generate.REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((generate.REPO / generate.CHART_YAML).read_text())
    assert (chart["version"], chart["appVersion"]) == (version, version)
    deployment = yaml.safe_load((generate.REPO / generate.DEPLOYMENT).read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{IMAGE_REPOSITORY}:{version}"


@pytest.mark.parametrize("bad", ["0.2", "0.2.0rc1", "0.2.0.dev0", "v0.2.0", "00.2.0"])
def test_a_version_helm_and_pip_would_read_differently_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    (tmp_path / "pyproject.toml").write_text(f'[project]\nversion = "{bad}"\n')
    monkeypatch.setattr(generate, "REPO", tmp_path)
    with pytest.raises(ValueError, match="MAJOR.MINOR.PATCH"):
        generate.release_version()


def test_a_version_bump_rewrites_only_the_version_lines() -> None:
    text = (generate.REPO / generate.CHART_YAML).read_text()
    bumped = generate.chart_yaml(text, "9.8.7", generate.supported_range())
    changed = [(a, b) for a, b in zip(text.splitlines(), bumped.splitlines()) if a != b]
    assert [b for _, b in changed] == ["version: 9.8.7", 'appVersion: "9.8.7"'] and len(bumped) - len(text) < 10
