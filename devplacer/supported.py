"""The supported range: the Kubernetes and Tekton versions the compatibility matrix proves (issue #29), neither more
nor less. The one source of the chart's `kubeVersion` and of the versions the docs state: `make generate`
(devplacer/generate.py) writes them from docs/compatibility.json through `proven`.

- A cell proves its pair when its row says `failed == 0` and `passed > 0` (the table's `pass`) and the cell is in
  the plan (`matrix.checkout_plan`): the row of a cell the plan no longer has (a Tekton LTS past its end of life, a
  Kubernetes minor dropped) proves nothing now, and a cell of the plan without a row proves nothing yet.
- Kubernetes: the minors of the proven cells, each from its `.0` to the next minor, as a Helm (Masterminds semver)
  constraint whose bounds carry the pre-release suffix `-0`: without it no version with a pre-release part matches,
  and providers' versions have one (`v1.35.4-eks-...`, `v1.37.9-gke.100`); `1.38.0-alpha.1` is above `<1.38.0-0`.
  Minors with a gap between them are separate ranges joined by `||` (a minor that did not pass is not claimed).
- Tekton: the minors of the proven cells (`v1.9`, `v1.12`, `v1.15`), not the minors between them.
- Nothing proven (no rows, or no passing row of the plan): `NothingProven`, and `make generate` stops saying so.
  A chart that claims no Kubernetes cannot be installed, one that claims any would claim more than is proven.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from devplacer.matrix import Cell, version_key

Minor = tuple[int, int]


class NothingProven(ValueError):
    """No cell of the plan has a passing row: there is no supported range to write."""


@dataclass(frozen=True)
class SupportedRange:
    cells: tuple[Cell, ...]  # the proven cells, sorted by versions

    @property
    def kubernetes_minors(self) -> tuple[Minor, ...]:
        return tuple(sorted({_minor(c.kubernetes) for c in self.cells}))

    @property
    def tekton_minors(self) -> tuple[str, ...]:
        return tuple(f"v{a}.{b}" for a, b in sorted({_minor(c.tekton) for c in self.cells}))

    def kube_version(self) -> str:
        """The chart's `kubeVersion` constraint."""
        return " || ".join(f">={lo[0]}.{lo[1]}.0-0 <{hi[0]}.{hi[1] + 1}.0-0" for lo, hi in runs(self.kubernetes_minors))

    def kubernetes_text(self) -> str:
        """`1.37`, `1.35 to 1.37`, `1.35 and 1.37`."""
        return _join([_name(lo) if lo == hi else f"{_name(lo)} to {_name(hi)}" for lo, hi in runs(self.kubernetes_minors)], "and")

    def tekton_text(self, word: str = "and") -> str:
        """`v1.9`, `v1.9, v1.12 and v1.15` (`word`: `or` in a requirement)."""
        return _join(list(self.tekton_minors), word)

    def tested(self) -> str:
        """The proven pairs, by Tekton: `v1.9.2 on Kubernetes 1.37.2; v1.15.0 on Kubernetes 1.35.4, 1.37.2`."""
        tektons = sorted({c.tekton for c in self.cells}, key=version_key)
        return "; ".join(
            f"{t} on Kubernetes " + ", ".join(c.kubernetes.lstrip("v") for c in self.cells if c.tekton == t) for t in tektons)


def proven(rows: Iterable[dict], plan: Iterable[Cell]) -> SupportedRange:
    """The range the passing rows of `plan`'s cells prove; `NothingProven` when none passes."""
    cells = set(plan)
    passing = {Cell(r["tekton"], r["kubernetes"]) for r in rows if r["failed"] == 0 and r["passed"] > 0} & cells
    if not passing:
        raise NothingProven(
            "no cell of the matrix's plan has a passing row in docs/compatibility.json "
            f"(the plan: {', '.join(sorted(c.name for c in cells)) or 'none'}): there is no supported range to write; "
            "run a cell (python -m devplacer.matrix --only TEKTON/KUBERNETES), then `make generate`")
    return SupportedRange(tuple(sorted(passing, key=lambda c: (version_key(c.tekton), version_key(c.kubernetes)))))


def runs(minors: Sequence[Minor]) -> list[tuple[Minor, Minor]]:
    """Sorted minors as (lowest, highest) of each run of consecutive minors."""
    out: list[tuple[Minor, Minor]] = []
    for minor in sorted(set(minors)):
        if out and out[-1][1] == (minor[0], minor[1] - 1):
            out[-1] = (out[-1][0], minor)
        else:
            out.append((minor, minor))
    return out


def _minor(version: str) -> Minor:
    major, minor = version_key(version)[:2]
    return major, minor


def _name(minor: Minor) -> str:
    return f"{minor[0]}.{minor[1]}"


def _join(parts: list[str], word: str) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + f" {word} {parts[-1]}"
