"""The release pipeline's static parts (docs/releasing.md): `actionlint` (built from its Go module, an optional
devcluster component, cached by version) finds nothing in .github/workflows/; the workflow publishes what the
chart installs by default; the dry run's registry listens on loopback only. Skipped, saying so, when actionlint
is not built (`python -m devcluster build --with actionlint`, or `make actionlint`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from devcluster.build import find_optional
from devplacer import release
from devplacer.chart import template
from devplacer.version import CHART_REPOSITORY, IMAGE_REPOSITORY, PUBLISHED_IMAGE, VERSION

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
RELEASE_WORKFLOW = WORKFLOWS / "release.yaml"


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    bin_dir = find_optional("actionlint")
    if bin_dir is None:
        pytest.skip("actionlint is not built (python -m devcluster build --with actionlint, or make actionlint)")
    assert sorted(WORKFLOWS.glob("*.yaml")), "no workflow to check"
    # The files named, not found by walking up to a Git repository: a bare copy (`git archive`, as .ci/run makes) has none.
    workflows = [str(path.relative_to(ROOT)) for path in sorted(WORKFLOWS.glob("*.yaml"))]
    out = subprocess.run([str(bin_dir / "actionlint"), "-no-color", *workflows], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_workflow_publishes_what_the_chart_installs_by_default() -> None:
    workflow = yaml.safe_load(RELEASE_WORKFLOW.read_text())
    assert workflow["env"] == {"IMAGE": IMAGE_REPOSITORY, "CHARTS": CHART_REPOSITORY}
    values = yaml.safe_load((ROOT / "charts" / "egress-placer" / "values.yaml").read_text())
    assert values["image"]["repository"] == IMAGE_REPOSITORY and values["image"]["tag"] == ""  # tag: the appVersion
    assert PUBLISHED_IMAGE == f"{IMAGE_REPOSITORY}:{VERSION}"
    build = next(s for s in workflow["jobs"]["image"]["steps"] if str(s.get("uses", "")).startswith("docker/build-push-action"))
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64" and build["with"]["sbom"] is True
    steps = "\n".join(str(s.get("run", "")) for job in workflow["jobs"].values() for s in job["steps"])
    assert 'cosign sign --yes "${IMAGE}@${DIGEST}"' in steps and "helm push" in steps and "cosign attest" in steps


def test_only_a_tag_of_the_version_releases() -> None:
    workflow = yaml.safe_load(RELEASE_WORKFLOW.read_text())
    assert workflow[True] == {"push": {"tags": ["v[0-9]+.[0-9]+.[0-9]+"]}}  # YAML 1.1 reads `on` as true
    assert workflow["permissions"] == {}  # each job asks for what it needs
    assert '"v${version}" != "${TAG}"' in workflow["jobs"]["check"]["steps"][2]["run"]


def test_the_dry_run_registry_listens_on_loopback_only() -> None:
    config = yaml.safe_load(release.REGISTRY_CONFIG.format(root="/x", port=5000))
    assert config["http"]["addr"] == "127.0.0.1:5000" and "debug" not in config["http"]


def test_arm64_is_built_only_with_an_aarch64_binfmt_handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handler = tmp_path / "qemu-aarch64"
    monkeypatch.setattr(release, "BINFMT_AARCH64", handler)
    assert "binfmt_misc has no aarch64 handler" in (release.arm64_note() or "")
    handler.write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n")
    assert release.arm64_note() is None


def test_the_dry_run_checks_it_runs_the_image_as_the_chart_s_deployment() -> None:
    """make release-dry-run runs the pulled image with devplacer.image.ControllerContainer; the chart's default
    Deployment container must be what that runs, and a difference is named."""
    bin_dir = find_optional("helm")
    if bin_dir is None:
        pytest.skip("helm is not built yet (python -m devcluster build --with helm, part of make cluster-build)")
    (deployment,) = [d for d in template(bin_dir / "helm") if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert release.runs_as_the_container(container) == []
    container["securityContext"]["readOnlyRootFilesystem"] = False
    assert release.runs_as_the_container(container) == ["readOnlyRootFilesystem: the Deployment's False, the container's True"]
