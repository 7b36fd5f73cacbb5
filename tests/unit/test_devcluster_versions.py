"""The devcluster's version choices (issue #29): `--tekton-version`/`--kubernetes-version` and their variables pick
a tool module's variant, the cache key names the pair, and the default pair's key stays as it was."""

from __future__ import annotations

import pytest

from devcluster import __main__ as cli
from devcluster import build, versions

DEFAULT_TEKTON = build.pinned_version(build.COMPONENTS[3])
DEFAULT_KUBERNETES = build.pinned_version(build.COMPONENTS[0])


@pytest.fixture(autouse=True)
def _no_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """No choice (empty), and whatever a test sets (also `apply_version_options`, straight into os.environ) undone."""
    monkeypatch.setenv(build.TEKTON_VERSION_ENV, "")
    monkeypatch.setenv(build.KUBERNETES_VERSION_ENV, "")


@pytest.mark.parametrize(
    ("tekton", "kubernetes", "key_part"),
    [
        (None, None, f"k8s-{DEFAULT_KUBERNETES}_"),
        ("", "", f"_tekton-{DEFAULT_TEKTON}_"),
        (DEFAULT_TEKTON, DEFAULT_KUBERNETES, f"_tekton-{DEFAULT_TEKTON}_"),  # the pin itself: no variant
        ("v1.9.2", None, "_tekton-v1.9.2_"),
    ],
)
def test_the_cache_key_names_the_chosen_pair(monkeypatch, tekton, kubernetes, key_part) -> None:
    for variable, value in ((build.TEKTON_VERSION_ENV, tekton), (build.KUBERNETES_VERSION_ENV, kubernetes)):
        if value is not None:
            monkeypatch.setenv(variable, value)
    assert key_part in build.key_prefix()


def test_the_default_pair_keeps_its_key(monkeypatch) -> None:
    default = build.key_prefix()
    monkeypatch.setenv(build.TEKTON_VERSION_ENV, DEFAULT_TEKTON)
    assert build.key_prefix() == default
    monkeypatch.setenv(build.TEKTON_VERSION_ENV, "v1.9.2")
    other = build.key_prefix()
    assert other != default and other.split("_")[-1] != default.split("_")[-1]


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (build.TEKTON_VERSION_ENV, "1.9.2", "is not a version like v1.15.0"),
        (build.TEKTON_VERSION_ENV, "v1.10.0", "no tools/_versions/tekton/v1.10.0/go.mod; available: v1.9.2"),
        (build.KUBERNETES_VERSION_ENV, "v1.20.0", "kubernetes cannot be built at v1.20.0"),
    ],
)
def test_a_version_that_cannot_be_built_is_a_clear_error(monkeypatch, variable, value, message) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(build.BuildError, match=message.replace(".", r"\.")):
        build.key_prefix()


def test_optional_tekton_components_follow_the_tekton_choice(monkeypatch) -> None:
    monkeypatch.setenv(build.TEKTON_VERSION_ENV, "v1.9.2")
    for name in ("tekton-webhook", "tekton-resolvers"):
        assert build.optional_key(build._optional_component(name)).startswith(f"{name}-v1.9.2_")
    assert build.optional_key(build._optional_component("helm")) == build.optional_key(build.HELM)


def test_a_variant_lays_its_files_over_the_module(monkeypatch) -> None:
    monkeypatch.setenv(build.TEKTON_VERSION_ENV, "v1.9.2")
    webhook = build._optional_component("tekton-webhook")
    files = build.module_files(webhook)
    assert files["go.mod"].parent == build.VERSIONS_DIR / "tekton-webhook" / "v1.9.2"
    assert files["_patches/knative-webhook/webhook.go"].is_relative_to(build.VERSIONS_DIR)
    controller = build.module_files(build.core_components()[3])
    assert controller["controller/main.go"] == build.TOOLS_DIR / "tekton" / "controller" / "main.go"  # same upstream file


@pytest.mark.parametrize("command", ["build", "up", "down", "status", "kubeconfig", "controller", "demo"])
def test_every_command_takes_the_version_options(monkeypatch, command) -> None:
    sub = next(a for a in cli.parser()._actions if a.dest == "command")
    options = {o for a in sub.choices[command]._actions for o in a.option_strings}
    assert {"--tekton-version", "--kubernetes-version"} <= options


def test_the_options_set_the_variables(monkeypatch) -> None:
    args = cli.parser().parse_args(["down", "--dir", "/tmp/x", "--tekton-version", "v1.9.2"])
    cli.apply_version_options(args)
    assert build.chosen_version(build.TEKTON_VERSION_ENV) == "v1.9.2"
    assert build.chosen_version(build.KUBERNETES_VERSION_ENV) is None


def test_a_kubernetes_variant_replaces_the_staging_modules_at_its_version() -> None:
    upstream = "replace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\tk8s.io/kms => ./staging/src/k8s.io/kms\n)\n"
    assert versions.staging_replaces(upstream, "v1.36.3") == [
        "\tk8s.io/api => k8s.io/api v0.36.3", "\tk8s.io/kms => k8s.io/kms v0.36.3"]
    pinned = "// comment\nmodule m\n\ngo 1.26.0\n\nrequire (\n\ta v1\n)\n\ntool (\n\tk8s.io/kubernetes/cmd/kubectl\n)\n"
    written = versions.variant_go_mod(pinned, "k8s.io/kubernetes", "v1.36.3", ["\tx => x v0"])
    assert written == ("// comment\nmodule m\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v1.36.3\n\n"
                       "replace (\n\tx => x v0\n)\n\ntool (\n\tk8s.io/kubernetes/cmd/kubectl\n)\n")
