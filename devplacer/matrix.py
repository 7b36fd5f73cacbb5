"""The compatibility matrix (issue #29): `make matrix` / `python -m devplacer.matrix [--plan] [--only T/K] [--again]`.

Cells, as Tekton Chains tests Pipelines:
- every supported Tekton LTS (its `End of Life` date, in Tekton's `releases.md`, after today), at the newest patch
  the module proxy serves, plus the newest release (the default pin), on the newest Kubernetes;
- the newest Tekton on the three newest Kubernetes minors (`KUBERNETES_VERSIONS`: the module proxy here refuses
  `@v/list`, so the versions it serves are written down).

Each cell builds its pair (`python -m devcluster build --tekton-version T --kubernetes-version K`, cached per pair;
a missing `tools/_versions/` module is written by `devcluster.versions` first) and runs `CELL_TESTS` with pytest on a
session cluster of that pair. Its row {tekton, kubernetes, passed, failed, date, commit} goes into
docs/compatibility.json at once, and the table of docs/compatibility.md is written again from that file. Resumable: a
cell that already has a row for this commit is skipped (`--again` runs it anyway). Outside CI: CI runs the default
cell only (`make test`). Long: a cold pair builds in minutes, the tests take ~15-25 min per cell on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Sequence

from devcluster import build, versions

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "compatibility.json"
TABLE_DOC = REPO / "docs" / "compatibility.md"
TABLE_BEGIN = "<!-- matrix table: written by `python -m devplacer.matrix` from docs/compatibility.json -->"
TABLE_END = "<!-- end of the matrix table -->"
RESULT_KEYS = ("tekton", "kubernetes", "passed", "failed", "date", "commit")
# The Kubernetes releases the module proxy here serves (it refuses `@v/list`; one patch per minor, newest first).
KUBERNETES_VERSIONS = ("v1.37.2", "v1.36.3", "v1.35.4", "v1.34.4")
KUBERNETES_MINORS = 3
# What each cell runs: placement, the guards, the queue, Tekton's defaulting, and Tekton's own examples with and
# without placement (the differential).
CELL_TESTS = (
    "tests/e2e/test_placement.py",
    "tests/e2e/test_pool_guard.py",
    "tests/e2e/test_pool_guard_vap.py",
    "tests/e2e/test_queue.py",
    "tests/e2e/test_tekton_webhook.py",
    "tests/e2e/test_compat_on_the_cluster.py",
    "tests/e2e/test_examples_differential.py",
)

_SECTION = re.compile(r"^### (v\d+\.\d+)( \(LTS\))?\s*$", re.MULTILINE)
_EOL = re.compile(r"\*\*End of Life\*\*:\s*(\d{4}-\d{2}-\d{2})")
_PATCHES = re.compile(r"\*\*Patch Releases\*\*:(.*)$", re.MULTILINE)
_LINKED_VERSION = re.compile(r"\[(v\d+\.\d+\.\d+)\]")


@dataclass(frozen=True)
class Release:
    """One minor release line of Tekton's releases.md."""

    minor: str  # "v1.9"
    lts: bool
    end_of_life: date
    patches: tuple[str, ...]  # oldest first


@dataclass(frozen=True, order=True)
class Cell:
    tekton: str
    kubernetes: str

    @property
    def name(self) -> str:
        return f"{self.tekton}/{self.kubernetes}"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def parse_releases(text: str) -> list[Release]:
    """The release lines of a releases.md (supported and end-of-life sections alike)."""
    out = []
    heads = list(_SECTION.finditer(text))
    for head, following in zip(heads, [*heads[1:], None]):
        body = text[head.end(): following.start() if following else len(text)]
        eol, patches = _EOL.search(body), _PATCHES.search(body)
        if eol is None:
            continue
        versions = tuple(_LINKED_VERSION.findall(patches.group(1))) if patches else ()
        out.append(Release(head.group(1), bool(head.group(2)), date.fromisoformat(eol.group(1)), versions))
    return out


def merged_releases(texts: Iterable[str]) -> dict[str, Release]:
    """Release lines by minor over several releases.md (each module's; a later text's line wins, with the patches of all)."""
    out: dict[str, Release] = {}
    for text in texts:
        for release in parse_releases(text):
            known = out.get(release.minor)
            patches = tuple(sorted({*release.patches, *(known.patches if known else ())}, key=version_key))
            out[release.minor] = Release(release.minor, release.lts, release.end_of_life, patches)
    return out


def supported_lts(releases: Iterable[Release], today: date) -> list[Release]:
    """LTS lines whose end of life is after `today`, oldest first."""
    return sorted((r for r in releases if r.lts and r.end_of_life > today), key=lambda r: version_key(r.minor))


def plan(
    releases: Iterable[Release],
    today: date,
    newest_tekton: str,
    kubernetes_versions: Sequence[str],
    served: Callable[[str], bool],
) -> list[Cell]:
    """The matrix's cells: each supported LTS (its newest patch `served` says the proxy serves) and `newest_tekton`
    on the newest Kubernetes; `newest_tekton` on the `KUBERNETES_MINORS` newest Kubernetes minors."""
    kubernetes = sorted(kubernetes_versions, key=version_key, reverse=True)
    tektons = []
    for release in supported_lts(releases, today):
        patch = next((v for v in sorted(release.patches, key=version_key, reverse=True) if served(v)), None)
        if patch is not None:
            tektons.append(patch)
    return cells_of(tektons, newest_tekton, kubernetes)


def cells_of(tektons: Iterable[str], newest_tekton: str, kubernetes_versions: Sequence[str]) -> list[Cell]:
    """The cells of `tektons` (older than `newest_tekton`) and `newest_tekton` on the newest Kubernetes, and
    `newest_tekton` on the `KUBERNETES_MINORS` newest Kubernetes minors."""
    kubernetes = sorted(kubernetes_versions, key=version_key, reverse=True)
    older = [t for t in tektons if version_key(t) < version_key(newest_tekton)]
    cells = [Cell(t, kubernetes[0]) for t in (*older, newest_tekton)]
    cells += [Cell(newest_tekton, k) for k in kubernetes[:KUBERNETES_MINORS]]
    return sorted(set(cells), key=lambda c: (version_key(c.tekton), version_key(c.kubernetes)))


def checkout_plan() -> list[Cell]:
    """The plan as this checkout can build it, offline (what `make generate` counts rows of): every Tekton it has a
    module for (the pin, the newest, and each variant under `devcluster/tools/_versions/tekton/`, which are the
    supported LTS: a variant goes when its LTS ends) and `KUBERNETES_VERSIONS`, cell for cell as `plan` makes them.
    `main` says when the plan read from releases.md differs."""
    return cells_of(build.available_versions("tekton"), build.pinned_version(build.COMPONENTS[3]), KUBERNETES_VERSIONS)


# -- results -------------------------------------------------------------------------------------------------------


def read_results(path: Path = RESULTS) -> list[dict]:
    return json.loads(path.read_text()) if path.is_file() else []


def keep_result(row: dict, path: Path = RESULTS) -> list[dict]:
    """`row` in place of the cell's earlier one; the list sorted by versions."""
    rows = [r for r in read_results(path) if (r["tekton"], r["kubernetes"]) != (row["tekton"], row["kubernetes"])]
    rows.append({key: row[key] for key in RESULT_KEYS})
    rows.sort(key=lambda r: (version_key(r["tekton"]), version_key(r["kubernetes"])))
    path.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def table(rows: Sequence[dict]) -> str:
    """The markdown table of docs/compatibility.md, one row per cell."""
    lines = ["| Tekton | Kubernetes | result | passed | failed | date | commit |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        verdict = "pass" if r["failed"] == 0 and r["passed"] > 0 else "fail"
        lines.append(f"| {r['tekton']} | {r['kubernetes']} | {verdict} | {r['passed']} | {r['failed']} | {r['date']} | {r['commit']} |")
    return "\n".join(lines)


def write_table(rows: Sequence[dict], doc: Path = TABLE_DOC) -> None:
    text = doc.read_text()
    begin, end = text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)
    doc.write_text(text[:begin] + "\n" + table(rows) + "\n" + text[end:])


def table_rows(doc_text: str) -> list[dict]:
    """The rows of the table in docs/compatibility.md, read back (what the unit test compares with the JSON)."""
    body = doc_text[doc_text.index(TABLE_BEGIN) + len(TABLE_BEGIN): doc_text.index(TABLE_END)]
    rows = []
    for line in body.strip().splitlines()[2:]:
        tekton, kubernetes, verdict, passed, failed, day, commit = (c.strip() for c in line.strip().strip("|").split("|"))
        rows.append({"tekton": tekton, "kubernetes": kubernetes, "verdict": verdict, "passed": int(passed),
                     "failed": int(failed), "date": day, "commit": commit})
    return rows


def junit_counts(report: Path) -> tuple[int, int]:
    """(passed, failed) of a pytest junit XML report: failures and errors count as failed, skips as neither."""
    if not report.is_file():
        return 0, 0
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return tests - failed - skipped, failed


# -- running -------------------------------------------------------------------------------------------------------


def _python() -> str:
    return sys.executable


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def releases_texts() -> list[str]:
    """Tekton's releases.md of every module this checkout can build (the pin and each variant), oldest first."""
    texts = []
    for version in build.available_versions("tekton"):
        os.environ[build.TEKTON_VERSION_ENV] = version
        try:
            texts.append((build.tekton_module_dir() / "releases.md").read_text())
        except (OSError, subprocess.CalledProcessError, build.BuildError):
            continue
        finally:
            os.environ.pop(build.TEKTON_VERSION_ENV, None)
    return texts


def served(module: str) -> Callable[[str], bool]:
    """Does the module proxy serve `module` at a version (its source, not only its go.mod)?"""

    def check(version: str) -> bool:
        out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True,
                             check=False, cwd=REPO, env={**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=mod"})
        return out.returncode == 0 and '"Error"' not in out.stdout

    return check


def run_cell(cell: Cell, log: Callable[[str], None] = print, extra: Sequence[str] = ()) -> dict:
    """Build the pair, run `CELL_TESTS` on it, and return its row (the commit checked out when the cell started)."""
    at = commit()
    env = {**os.environ, build.TEKTON_VERSION_ENV: cell.tekton, build.KUBERNETES_VERSION_ENV: cell.kubernetes, "PYTHONPATH": str(REPO),
           "EGRESS_PLACER_MATRIX": "1"}
    env.pop("EGRESS_PLACER_DEVCLUSTER", None)  # a cluster of this pair, not a running one
    started = time.monotonic()
    log(f"[matrix] {cell.name}: build")
    built = subprocess.run([_python(), "-m", "devcluster", "build", "--with", "tekton-webhook", "--with", "tekton-resolvers"],
                           cwd=REPO, env=env, check=False)
    report = REPO / ".matrix" / f"{cell.tekton}_{cell.kubernetes}.xml"
    report.parent.mkdir(exist_ok=True)
    report.unlink(missing_ok=True)
    if built.returncode == 0:
        log(f"[matrix] {cell.name}: tests ({time.monotonic() - started:.0f} s)")
        subprocess.run([_python(), "-m", "pytest", "-m", "cluster", "-p", "no:cacheprovider", f"--junitxml={report}", *extra,
                        *CELL_TESTS], cwd=REPO, env=env, check=False)
    passed, failed = junit_counts(report)
    if built.returncode != 0:
        failed += 1  # the pair does not build: the cell fails
    log(f"[matrix] {cell.name}: {passed} passed, {failed} failed in {time.monotonic() - started:.0f} s")
    return {"tekton": cell.tekton, "kubernetes": cell.kubernetes, "passed": passed, "failed": failed,
            "date": datetime.now(timezone.utc).date().isoformat(), "commit": at}


def ensure_variants(cell: Cell, log: Callable[[str], None]) -> None:
    """Write the tool modules a cell needs and does not have (go.mod and go.sum only: see devcluster.versions)."""
    for module, version in (("kubernetes", cell.kubernetes), *((m, cell.tekton) for m in ("tekton", "tekton-webhook", "tekton-resolvers"))):
        if version not in build.available_versions(module):
            versions.add_variant(module, version, log)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devplacer.matrix", description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", action="store_true", help="print the cells and stop")
    p.add_argument("--only", action="append", default=[], metavar="TEKTON/KUBERNETES", help="run this cell only (repeatable)")
    p.add_argument("--again", action="store_true", help="run cells that already have a row for this commit")
    p.add_argument("--today", type=date.fromisoformat, default=datetime.now(timezone.utc).date())
    args = p.parse_args(argv)
    newest = build.pinned_version(build.COMPONENTS[3])
    cells = plan(merged_releases(releases_texts()).values(), args.today, newest, KUBERNETES_VERSIONS, served(build.TEKTON_MODULE))
    if set(cells) != set(checkout_plan()):
        print(f"[matrix] note: `make generate` counts the rows of the cells this checkout can build "
              f"({', '.join(c.name for c in checkout_plan())}), not of this plan: add or remove the Tekton variants "
              "(devcluster/tools/_versions/) to match it", file=sys.stderr)
    if args.only:
        cells = [Cell(*name.split("/")) for name in args.only]
    for cell in cells:
        print(f"[matrix] cell {cell.name}")
    if args.plan:
        return 0
    here = commit()
    done = {(r["tekton"], r["kubernetes"]) for r in read_results() if r["commit"] == here}
    for cell in cells:
        if (cell.tekton, cell.kubernetes) in done and not args.again:
            print(f"[matrix] {cell.name}: done for {here}, skipped (--again runs it)")
            continue
        ensure_variants(cell, print)
        write_table(keep_result(run_cell(cell)))
    rows = read_results()
    print("[matrix] the supported range is written from docs/compatibility.json by `python -m devplacer.generate`")
    return 0 if all(r["failed"] == 0 and r["passed"] > 0 for r in rows if (r["tekton"], r["kubernetes"]) in {(c.tekton, c.kubernetes) for c in cells}) else 1


if __name__ == "__main__":
    sys.exit(main())
