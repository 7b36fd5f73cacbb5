"""The files of k8s/crds/ rendered from controller/core/pools.py (the CustomResourceDefinitions of
EgressPool and EgressPlacerConfig), and the Helm chart's crds/ with the label kustomize puts on every
object of k8s/ (Helm does not template crds/). `make generate` (devplacer/generate.py) writes them;
tests/unit/test_generated.py fails when a file and the render differ, tests/unit/test_chart.py when the
chart's render differs from k8s/. `python -m devplacer.crds` is `python -m devplacer.generate`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

# Where the files go, relative to the repository.
CRDS_DIR = Path("k8s", "crds")
CHART_CRDS_DIR = Path("charts", "egress-placer", "crds")
CHART_LABELS = {"app.kubernetes.io/part-of": "egress-placer"}  # what k8s/kustomization.yaml's `labels` adds
HEADER = (
    "# Generated from controller/core/pools.py by `make generate`: edit the models there, not this file.\n"
    "# docs/pools-api.md explains the resource; `kubectl explain {singular}.spec` describes every field.\n"
)


def file_name(crd: Mapping[str, Any]) -> str:
    return f"{crd['metadata']['name']}.yaml"


def render(crd: Mapping[str, Any]) -> str:
    body = yaml.safe_dump(dict(crd), sort_keys=False, width=120, allow_unicode=True)
    return HEADER.format(singular=crd["spec"]["names"]["singular"]) + body


def labelled(crd: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """`crd` with `labels` added to its metadata."""
    metadata = {**crd["metadata"], "labels": {**crd["metadata"].get("labels", {}), **labels}}
    return {**crd, "metadata": metadata}


if __name__ == "__main__":
    from devplacer.generate import main

    raise SystemExit(main())
