"""`explain` over Tekton's own examples: a real-world corpus every machine has once the local cluster
is built (`examples/` of the pinned Tekton module in the Go module cache).

Each example file is explained on its own, as a user would pass it (its Tasks, StepActions and
Pipelines are its context). No file may give an error. Every image reported is either written in the
file as it is, or an image field of the file with `$(params.X)` references whose values all appear in
the file (a param value or default). A run is reported unresolved only where the file fetches
something the file does not hold: a remote resolver, or a Pipeline inside a Pipeline.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import yaml

from bench.corpus import tekton_examples_dir
from controller.cli.explain import run_explain

EXAMPLES = tekton_examples_dir()
if EXAMPLES is None:
    pytest.skip("Tekton's examples/ are not in the Go module cache yet: `make cluster-build` downloads the "
                "pinned Tekton module", allow_module_level=True)

POLICY = """\
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: everything
    nodes: [egress-1]
    images: ["*"]
    namespaces: ["*"]
"""
PARAM = re.compile(r"\$\((?:inputs\.)?params(?:\.([A-Za-z0-9_.-]+)|\[['\"]([A-Za-z0-9_.-]+)['\"]\])(?:\[\*\])?\)")
UNRESOLVABLE_HERE = re.compile(r"resolver:|pipelineSpec:\s*$|pipelineRef:", re.MULTILINE)


def run_files() -> list[Path]:
    assert EXAMPLES is not None
    return sorted(
        p for p in EXAMPLES.rglob("*.yaml")
        if any(isinstance(d, dict) and d.get("kind") in ("TaskRun", "PipelineRun") for d in yaml.safe_load_all(p.read_text()))
    )


FILES = run_files()


def explain(policy: Path, path: Path) -> list[dict]:
    out, err = io.StringIO(), io.StringIO()
    assert run_explain(str(policy), [str(path)], out=out, err=err) == 0, err.getvalue()
    assert err.getvalue() == ""
    return [json.loads(line) for line in out.getvalue().splitlines()]


def image_fields(text: str) -> list[str]:
    return [m.group(1).strip().strip("\"'") for m in re.finditer(r"^\s*-?\s*image:\s*(\S.*?)\s*$", text, re.MULTILINE)]


def explained_by_the_file(image: str, text: str) -> bool:
    """The image is written in the file, or is an image field whose params take values written in the file."""
    if image in text:
        return True
    for field in image_fields(text):
        if not PARAM.search(field):
            continue
        pattern = "".join(
            "(.+)" if i % 3 == 1 else re.escape(part) for i, part in enumerate(PARAM.split(field)) if i % 3 != 2
        )
        match = re.fullmatch(pattern, image)
        if match and all(value in text for value in match.groups()):
            return True
    return False


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(POLICY)
    return path


def test_the_examples_hold_runs_of_both_kinds() -> None:
    kinds = {d.get("kind") for p in FILES for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict)}
    assert {"TaskRun", "PipelineRun", "Task", "Pipeline"} <= kinds
    assert len(FILES) >= 100, len(FILES)  # v1.15.0 has 152; fewer means the corpus was not found whole


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_example_is_explained(policy: Path, path: Path) -> None:
    text = path.read_text()
    results = explain(policy, path)
    assert results, "a file with runs gives at least one line"
    for result in results:
        assert result["reason"] in ("image-match", "unresolved"), result
        if result["reason"] == "unresolved":
            assert UNRESOLVABLE_HERE.search(text), f"unresolved without a remote reference: {result}"
            continue
        assert result["images"], result
        for image in result["images"]:
            assert "$(" not in image, f"an unsubstituted image: {result}"
            assert explained_by_the_file(image, text), f"{image} is neither in the file nor made from its params"


def test_the_oracle_refuses_an_image_the_file_does_not_give() -> None:
    text = "steps:\n  - image: $(params.base):$(params.tag)\nparams:\n  - {name: base, default: ubuntu}\n"
    assert explained_by_the_file("ubuntu:22.04", text + "  - {name: tag, default: '22.04'}\n")
    assert not explained_by_the_file("ubuntu:24.04", text + "  - {name: tag, default: '22.04'}\n")
    assert not explained_by_the_file("alpine", text)
