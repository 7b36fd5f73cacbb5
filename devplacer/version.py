"""egress-placer's one version, and where a release publishes it (docs/releasing.md).

The version is `[project] version` in pyproject.toml, and nowhere else by hand: the wheel takes it from
there, `make generate` (devplacer/generate.py) writes it into the chart's Chart.yaml (`version` and
`appVersion`, in lockstep) and into k8s/deployment.yaml's image, and the release workflow
(.github/workflows/release.yaml) refuses a tag other than `v` + this version.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"

# Where the release workflow publishes: the image (multi-arch, signed, with an SBOM) and the chart, an OCI artifact.
IMAGE_REPOSITORY = "ghcr.io/egress-placer/egress-placer"
CHART_REPOSITORY = "oci://ghcr.io/egress-placer/charts"


def version(pyproject: Path = PYPROJECT) -> str:
    """The project's version, `[project] version` of pyproject.toml."""
    return tomllib.loads(pyproject.read_text())["project"]["version"]


VERSION = version()
PUBLISHED_IMAGE = f"{IMAGE_REPOSITORY}:{VERSION}"
