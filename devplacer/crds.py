"""`python -m devplacer.crds`: write k8s/crds/ from the render in controller/core/pools.py (the
CustomResourceDefinitions of EgressPool and EgressPlacerConfig), and the same into the Helm chart's
crds/ with the label kustomize puts on every object of k8s/ (Helm does not template crds/).
tests/unit/test_pools_schema.py fails when k8s/crds/ and the render differ, and names this command;
tests/unit/test_chart.py when the chart's differ from k8s/."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping

import yaml

from controller.core.pools import custom_resource_definitions

CRDS_DIR = Path(__file__).resolve().parents[1] / "k8s" / "crds"
CHART_CRDS_DIR = Path(__file__).resolve().parents[1] / "charts" / "egress-placer" / "crds"
CHART_LABELS = {"app.kubernetes.io/part-of": "egress-placer"}  # what k8s/kustomization.yaml's `labels` adds
HEADER = (
    "# Generated from controller/core/pools.py by `python -m devplacer.crds`: edit the models there, not this file.\n"
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


def write(directory: Path = CRDS_DIR, labels: Mapping[str, str] | None = None) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for crd in custom_resource_definitions():
        path = directory / file_name(crd)
        path.write_text(render(labelled(crd, labels) if labels else crd))
        written.append(path)
    return written


if __name__ == "__main__":
    for path in [*write(), *write(CHART_CRDS_DIR, CHART_LABELS)]:
        print(path, file=sys.stdout)
