"""Builds the cluster's binaries from the Go tool modules into a cache outside the repository.

Each tool module under `devcluster/tools/` pins one upstream project (separate modules so Go's
minimal version selection never unifies their k8s.io versions). The cache directory is keyed by
the pinned versions, a hash of the modules' go.mod/go.sum and the Go version; it is filled in a
temporary directory and renamed into place, so it is either complete or absent.

Optional components (`OPTIONAL_COMPONENTS`, e.g. Prometheus for the egress-load tests) are not part
of that set: `ensure_optional(name)` builds one on demand into a cache key of its own, so `up` and
the default build neither wait for them nor change when they change.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

TOOLS_DIR = Path(__file__).resolve().parent / "tools"
RECIPE_VERSION = "1"  # bump when the build commands below change in a way the key does not see
TEKTON_MODULE = "github.com/tektoncd/pipeline"

# Version choices (`--tekton-version`, `--kubernetes-version` of every command, or these variables): a tool module
# that follows one is built from `tools/_versions/<module>/<version>/` laid over `tools/<module>/` (`module_dir`) when
# the chosen version is not the one `tools/<module>/go.mod` pins; the pins name the cache key, so pairs stay apart.
TEKTON_VERSION_ENV = "EGRESS_PLACER_TEKTON_VERSION"
KUBERNETES_VERSION_ENV = "EGRESS_PLACER_KUBERNETES_VERSION"
VERSIONS_DIR = TOOLS_DIR / "_versions"
VERSIONED_MODULES: dict[str, str] = {
    "kubernetes": KUBERNETES_VERSION_ENV,
    "tekton": TEKTON_VERSION_ENV,
    "tekton-webhook": TEKTON_VERSION_ENV,
    "tekton-resolvers": TEKTON_VERSION_ENV,
}

Log = Callable[[str], None]


class BuildError(RuntimeError):
    """A component failed to build; the message carries the tail of Go's output."""


@dataclass(frozen=True)
class Component:
    """One tool module and the binaries built from it."""

    module: str  # directory under tools/
    pin: str  # the upstream module whose version names the component
    binaries: dict[str, str]  # output binary name -> Go package
    why: str  # why a cold build takes long (printed with progress)
    stamp_kubernetes_version: bool = False
    tags: tuple[str, ...] = ()  # Go build tags
    version_variable: str | None = None  # a Go string variable stamped (-X) with the pinned version
    # Go packages whose `k8sVersionMajor`/`k8sVersionMinor` are stamped with the Kubernetes version of the
    # k8s.io/client-go the tool module requires (v0.37.x: 1.37), as Helm's own Makefile stamps them: the
    # version `helm template` and `helm lint` assume when no cluster is asked.
    client_go_version_packages: tuple[str, ...] = ()
    # Fixes the pinned upstream release lacks: a directory under tools/<module>/ of patched .go files
    # -> the Go package whose files of the same names they replace (see `_patched_modfile`).
    patches: dict[str, str] = field(default_factory=dict)
    # Optional components only: files of the pinned module's tree copied beside bin/ (`optional_file`).
    module_files: tuple[str, ...] = ()
    # A component of the project's own source (no upstream module to pin): the version that names it.
    own_version: str | None = None
    # The Go toolchain this build needs when it is newer than the local one (`GOTOOLCHAIN` for this build only,
    # downloaded by `go` from the module proxy); it also names the cache key instead of the local Go version.
    toolchain: str | None = None
    # The version of a variant (`tools/_versions/<module>/<variant>/` over `tools/<module>/`), None: the module as pinned.
    variant: str | None = None


COMPONENTS: tuple[Component, ...] = (
    Component(
        module="kubernetes",
        pin="k8s.io/kubernetes",
        binaries={
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        },
        why="compiles ~2,500 packages of k8s.io/kubernetes: ~5.5 min cold on 2 cores",
        stamp_kubernetes_version=True,
    ),
    Component(
        module="etcd",
        pin="go.etcd.io/etcd/server/v3",
        binaries={"etcd": "go.etcd.io/etcd/server/v3"},
        why="etcd server with gRPC and bbolt: ~20 s cold",
    ),
    Component(
        module="kwok",
        pin="sigs.k8s.io/kwok",
        binaries={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
        why="KWOK with client-go and its stage engine: ~1 min cold",
        # KWOK's stage workers share CEL caches and Stage objects without locks: it died at start
        # with "fatal error: concurrent map writes" (seen in CI). The patches guard them.
        patches={
            "_patches/easycel": "github.com/wzshiming/easycel",
            "_patches/kwok-lifecycle": "sigs.k8s.io/kwok/pkg/utils/lifecycle",
        },
    ),
    Component(
        module="tekton",
        pin=TEKTON_MODULE,
        # Tekton's cmd/controller with loopback-only probes (see tools/tekton/controller/main.go).
        binaries={"tekton-controller": "egress-placer/devcluster/tools/tekton/controller"},
        why="Tekton controller with knative, cloud SDKs and sigstore: ~1.5 min cold on 2 cores",
    ),
)


PROMETHEUS = Component(
    module="prometheus",
    pin="github.com/prometheus/prometheus",
    # promtool: `promtool test rules` tests the shipped alerts (charts/egress-placer/files/prometheus-rules.yaml).
    binaries={
        "prometheus": "github.com/prometheus/prometheus/cmd/prometheus",
        "promtool": "github.com/prometheus/prometheus/cmd/promtool",
    },
    why="Prometheus server and promtool with its TSDB, PromQL and remote-write stack: ~3 min cold on 2 cores",
    # remove_all_sd: static scrape configs only (no cloud SDKs). Without `builtinassets` the web UI
    # assets (built with npm upstream) are not embedded: the HTTP API works, the UI pages do not.
    tags=("remove_all_sd",),
    version_variable="github.com/prometheus/common/version.Version",
)

HELM = Component(
    module="helm",
    pin="helm.sh/helm/v3",
    # Helm 3 (what most users run), to lint, render and install charts/egress-placer.
    binaries={"helm": "helm.sh/helm/v3/cmd/helm"},
    why="Helm with client-go, kustomize's kyaml and the OCI registry client: ~2.5 min cold on 2 cores",
    version_variable="helm.sh/helm/v3/internal/version.version",
    client_go_version_packages=("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"),
)

HELM_DOCS = Component(
    module="helm-docs",
    pin="github.com/norwoodj/helm-docs",
    # helm-docs: `make generate` writes charts/egress-placer/README.md with it from values.yaml's `# --` comments.
    binaries={"helm-docs": "github.com/norwoodj/helm-docs/cmd/helm-docs"},
    why="helm-docs with Helm's chart loader and sprig: ~1 min cold on 2 cores",
    version_variable="main.version",
)

PROMETHEUS_OPERATOR_CRDS = Component(
    module="prometheus-operator",
    pin="github.com/prometheus-operator/prometheus-operator",
    # Files only: the CRDs of the objects the chart ships for prometheus-operator, so that the API server
    # checks them against their schemas (tests/e2e/test_helm_install.py). Nothing is compiled.
    binaries={},
    why="the prometheus-operator module's CRDs, downloaded: seconds",
    module_files=(
        "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
        "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
    ),
)

TEKTON_WEBHOOK = Component(
    module="tekton-webhook",
    pin=TEKTON_MODULE,
    # Tekton's cmd/webhook bound to loopback (see tools/tekton-webhook/webhook/main.go), same Tekton pin
    # as the controller but its own module, so the core cache key stays as it is.
    binaries={"tekton-webhook": "egress-placer/devcluster/tools/tekton-webhook/webhook"},
    why="Tekton webhook with knative's admission and conversion webhooks: ~3 min cold on 2 cores",
    # knative serves admission on ":PORT" (every interface) with no option to change it.
    patches={"_patches/knative-webhook": "knative.dev/pkg/webhook"},
    module_files=("config/500-webhooks.yaml",),
)

TEKTON_RESOLVERS = Component(
    module="tekton-resolvers",
    pin=TEKTON_MODULE,
    # Tekton's cmd/resolvers (git, hub, bundles, cluster, http) with loopback-only probes
    # (see tools/tekton-resolvers/resolvers/main.go).
    binaries={"tekton-resolvers": "egress-placer/devcluster/tools/tekton-resolvers/resolvers"},
    why="Tekton resolvers with go-git, OCI bundles and the hub client: ~3 min cold on 2 cores",
    module_files=tuple(
        f"config/resolvers/{name}.yaml"
        for name in (
            "100-namespace", "bundleresolver-config", "cluster-resolver-config", "config-feature-flags",
            "config-leader-election", "config-logging", "config-observability", "git-resolver-config",
            "http-resolver-config", "hubresolver-config", "resolver-cache-config",
        )
    ),
)

FLOOR_WEBHOOK = Component(
    module="floor-webhook",
    pin="egress-placer/devcluster/tools/floor-webhook",
    # The benchmarks' end-to-end floor: a no-op mutating webhook on Go's standard library alone
    # (tools/floor-webhook/main.go), registered on exactly egress-placer's hooks (bench/e2e.py); on
    # /mutate/patch it answers with a patch that changes nothing.
    binaries={"floor-webhook": "egress-placer/devcluster/tools/floor-webhook"},
    why="a no-op webhook on Go's standard library: seconds",
    own_version="v2",
)

KYVERNO = Component(
    module="kyverno",
    pin="github.com/kyverno/kyverno",
    # Kyverno's admission controller, the peer a user would install instead of egress-placer; the
    # benchmarks run it out of cluster (`--serverIP`) with a ClusterPolicy doing the same placement
    # (bench/peers.py). Its CRDs come from the module.
    binaries={"kyverno": "github.com/kyverno/kyverno/cmd/kyverno"},
    why="Kyverno with client-go, controller-runtime, CEL, sigstore/cosign, notation and wasmtime: ~13 min cold on 2 shared cores (relinked from a warm Go cache: ~40 s)",
    version_variable="github.com/kyverno/kyverno/pkg/version.BuildVersion",
    module_files=(
        "config/crds/kyverno/kyverno.io_cleanuppolicies.yaml",
        "config/crds/kyverno/kyverno.io_clustercleanuppolicies.yaml",
        "config/crds/kyverno/kyverno.io_clusterpolicies.yaml",
        "config/crds/kyverno/kyverno.io_globalcontextentries.yaml",
        "config/crds/kyverno/kyverno.io_policies.yaml",
        "config/crds/kyverno/kyverno.io_policyexceptions.yaml",
        "config/crds/kyverno/kyverno.io_updaterequests.yaml",
        *(f"config/crds/policies.kyverno.io/policies.kyverno.io_{name}.yaml" for name in (
            "deletingpolicies", "generatingpolicies", "imagevalidatingpolicies", "mutatingpolicies",
            "namespaceddeletingpolicies", "namespacedgeneratingpolicies", "namespacedimagevalidatingpolicies",
            "namespacedmutatingpolicies", "namespacedvalidatingpolicies", "policyexceptions", "validatingpolicies")),
        "config/crds/policyreport/wgpolicyk8s.io_clusterpolicyreports.yaml",
        "config/crds/policyreport/wgpolicyk8s.io_policyreports.yaml",
        "config/crds/reports/reports.kyverno.io_clusterephemeralreports.yaml",
        "config/crds/reports/reports.kyverno.io_ephemeralreports.yaml",
    ),
)

KARPENTER = Component(
    module="karpenter",
    pin="sigs.k8s.io/karpenter",
    # Karpenter's controllers with its KWOK cloud provider (kwok/ of the module): NodeClaims become plain Node
    # objects, which the cluster's KWOK keeps Ready when the NodePool's labels carry its selector (devcluster/karpenter.py).
    binaries={"karpenter": "sigs.k8s.io/karpenter/kwok"},
    why="Karpenter with its KWOK provider, controller-runtime and the scheduler's simulation: ~12 min cold on 2 shared cores",
    version_variable="sigs.k8s.io/karpenter/pkg/operator.Version",
    # Its metrics and health-probe servers bind ":PORT" (every interface), with no option to change it.
    patches={"_patches/karpenter-operator": "sigs.k8s.io/karpenter/pkg/operator"},
    module_files=(
        "kwok/charts/crds/karpenter.sh_nodepools.yaml",
        "kwok/charts/crds/karpenter.sh_nodeclaims.yaml",
        "kwok/charts/crds/karpenter.sh_nodeoverlays.yaml",
        "kwok/charts/crds/autoscaling.x-k8s.io_capacitybuffers.yaml",
        "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
    ),
    toolchain="go1.26.9",  # Karpenter's go.mod asks for it; the local Go is 1.26.8
)

KUEUE = Component(
    module="kueue",
    pin="sigs.k8s.io/kueue",
    # Kueue's manager, the version tekton-kueue v0.3.0 pins; configured by devcluster/kueue.py (external
    # framework PipelineRun.v1.tekton.dev, loopback servers, certificates minted, webhooks registered by URL).
    binaries={"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
    why="Kueue with controller-runtime, its job integrations and the visibility API server: ~10 min cold on 2 shared cores",
    version_variable="sigs.k8s.io/kueue/pkg/version.GitVersion",
    # With its internal certificate management off, upstream reads the metrics certificate from a fixed path
    # (/etc/kueue/metrics/certs, a mounted Secret in a pod): the patch takes $KUEUE_METRICS_CERT_DIR instead.
    patches={"_patches/kueue-cmd": "sigs.k8s.io/kueue/cmd/kueue"},
    module_files=(
        *(f"config/components/crd/bases/kueue.x-k8s.io_{name}.yaml" for name in (
            "admissionchecks", "clusterqueues", "cohorts", "localqueues", "multikueueclusters", "multikueueconfigs",
            "provisioningrequestconfigs", "resourceflavors", "topologies", "workloadpriorityclasses", "workloads")),
        "config/components/webhook/manifests.yaml",
    ),
)

TEKTON_KUEUE = Component(
    module="tekton-kueue",
    pin="github.com/konflux-ci/tekton-kueue",
    # tekton-kueue's `controller` (PipelineRun workloads for Kueue) and `webhook` (every new PipelineRun created
    # PipelineRunPending with its LocalQueue label) subcommands, in one binary.
    binaries={"tekton-kueue": "github.com/konflux-ci/tekton-kueue/cmd"},
    why="tekton-kueue with Tekton's API, Kueue's API and CEL: ~4 min cold on 2 shared cores after Kueue (shared dependencies)",
    # Its webhook server binds ":9443" (every interface), and it reads its namespace from the in-cluster
    # ServiceAccount file: the patches bind loopback and take POD_NAMESPACE.
    patches={
        "_patches/tekton-kueue-cmd": "github.com/konflux-ci/tekton-kueue/cmd",
        "_patches/tekton-kueue-common": "github.com/konflux-ci/tekton-kueue/pkg/common",
    },
    module_files=("config/webhook/manifests.yaml",),
)

# The release pipeline's tools (docs/releasing.md): actionlint checks .github/workflows/; the registry and cosign
# serve `make release-dry-run` and the OCI install test (tests/e2e/test_release_oci.py).
ACTIONLINT = Component(
    module="actionlint",
    pin="github.com/rhysd/actionlint",
    binaries={"actionlint": "github.com/rhysd/actionlint/cmd/actionlint"},
    why="actionlint with its expression checker: seconds",
    version_variable="github.com/rhysd/actionlint.version",
)

OCI_REGISTRY = Component(
    module="oci-registry",
    pin="github.com/distribution/distribution/v3",
    # The CNCF distribution registry (cmd/registry), run on 127.0.0.1 only with filesystem storage (devplacer/release.py).
    binaries={"registry": "github.com/distribution/distribution/v3/cmd/registry"},
    why="the distribution registry with its storage drivers and OpenTelemetry: ~1.5 min cold on 2 cores",
    version_variable="github.com/distribution/distribution/v3/version.version",
)

COSIGN = Component(
    module="cosign",
    pin="github.com/sigstore/cosign/v2",
    # cosign: `make release-dry-run` signs the image with a generated key pair and verifies it (keyless needs Fulcio/Rekor).
    binaries={"cosign": "github.com/sigstore/cosign/v2/cmd/cosign"},
    why="cosign with sigstore-go, go-containerregistry, cloud KMS clients and TUF: ~13 min cold on 2 shared cores (relinked from a warm Go cache: ~70 s)",
    version_variable="sigs.k8s.io/release-utils/version.gitVersion",
)

# The upstream module each versioned tool module pins (for `available_versions`).
_DEFAULT_PINS = {c.module: c.pin for c in (*COMPONENTS, TEKTON_WEBHOOK, TEKTON_RESOLVERS)}

# Built only when a test or benchmark asks for them (`ensure_optional`), each into its own cache key.
OPTIONAL_COMPONENTS: dict[str, Component] = {
    "prometheus": PROMETHEUS,
    "helm": HELM,
    "helm-docs": HELM_DOCS,
    "prometheus-operator-crds": PROMETHEUS_OPERATOR_CRDS,
    "tekton-webhook": TEKTON_WEBHOOK,
    "tekton-resolvers": TEKTON_RESOLVERS,
    "floor-webhook": FLOOR_WEBHOOK,
    "kyverno": KYVERNO,
    "karpenter": KARPENTER,
    "kueue": KUEUE,
    "tekton-kueue": TEKTON_KUEUE,
    "actionlint": ACTIONLINT,
    "oci-registry": OCI_REGISTRY,
    "cosign": COSIGN,
}

# An optional component that needs another: `build --with NAME` and `up --with NAME` take those too.
IMPLIED: dict[str, tuple[str, ...]] = {"tekton-kueue": ("kueue",)}


def with_implied(names: Iterable[str]) -> tuple[str, ...]:
    """`names` with what each implies (`IMPLIED`) before it, each once, in order."""
    out: list[str] = []
    for name in names:
        out += [*IMPLIED.get(name, ()), name]
    return tuple(dict.fromkeys(out))


VERSION_PATTERN = re.compile(r"v\d+\.\d+\.\d+")


def chosen_version(variable: str) -> str | None:
    """The version `variable` (`TEKTON_VERSION_ENV` or `KUBERNETES_VERSION_ENV`) chooses, None when unset or empty."""
    value = os.environ.get(variable, "").strip()
    if not value:
        return None
    if not VERSION_PATTERN.fullmatch(value):
        raise BuildError(f"{variable}={value!r} is not a version like v1.15.0")
    return value


def available_versions(module: str) -> list[str]:
    """The versions `module` can be built at: its pin and every variant under `tools/_versions/<module>/`."""
    variants = [d.name for d in (VERSIONS_DIR / module).glob("v*") if (d / "go.mod").is_file()]
    pinned = required_version(Component(module, "", {}, ""), _DEFAULT_PINS.get(module, ""))
    return sorted({pinned, *variants}, key=lambda v: tuple(int(part) for part in v[1:].split(".")))


def with_version(component: Component) -> Component:
    """`component` at the version chosen for its module (`VERSIONED_MODULES`): itself when nothing is chosen or the
    choice is its pin, else its variant; a version without a variant is a `BuildError` naming those there are."""
    variable = VERSIONED_MODULES.get(component.module)
    version = chosen_version(variable) if variable else None
    if version is None or version == pinned_version(component):
        return component
    if not (VERSIONS_DIR / component.module / version / "go.mod").is_file():
        raise BuildError(
            f"{component.module} cannot be built at {version} ({variable}): no tools/_versions/{component.module}/"
            f"{version}/go.mod; available: {', '.join(available_versions(component.module))}"
        )
    return replace(component, variant=version)


def core_components() -> tuple[Component, ...]:
    """`COMPONENTS` at the chosen versions."""
    return tuple(with_version(c) for c in COMPONENTS)


def module_files(component: Component) -> dict[str, Path]:
    """The tool module's go.mod, go.sum and Go files by path inside it, its variant's files (any kind) over them."""
    module = TOOLS_DIR / component.module
    files = {str(p.relative_to(module)): p for p in [module / "go.mod", module / "go.sum", *module.rglob("*.go")]}
    if component.variant is not None:
        variant = VERSIONS_DIR / component.module / component.variant
        files.update({str(p.relative_to(variant)): p for p in variant.rglob("*") if p.is_file()})
    return files


def source_dir(component: Component) -> Path:
    """Where Go builds the component: `tools/<module>/`, or for a variant a copy of its `module_files` under the
    cache (`sources/<module>-<version>_<digest>/`, written once, renamed into place)."""
    if component.variant is None:
        return TOOLS_DIR / component.module
    final = cache_root() / "sources" / f"{component.module}-{component.variant}_{tools_digest((component,))}"
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".copying-", dir=final.parent))
    for relative, path in module_files(component).items():
        (staging / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, staging / relative)
    try:
        os.rename(staging, final)
    except OSError:  # another process copied it first
        shutil.rmtree(staging, ignore_errors=True)
    return final


def required_version(component: Component, module: str) -> str:
    """The version of `module` required in the tool module's go.mod."""
    text = (module_files(component)["go.mod"]).read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
    if match is None:
        raise BuildError(f"{module} is not required in tools/{component.module}/go.mod")
    return match.group(1)


def pinned_version(component: Component) -> str:
    """The version of `component.pin` required in the tool module's go.mod (or the project's own version)."""
    if component.own_version is not None:
        return component.own_version
    return required_version(component, component.pin)


def kubernetes_ldflags(version: str) -> str:
    """Link flags that stamp the Kubernetes version (Tekton refuses to start on v0.0.0-master)."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.gitVersion={version}", f"-X {pkg}.gitMajor={major}", f"-X {pkg}.gitMinor={minor}"]
    return " ".join(flags)


def ldflags(component: Component) -> str:
    if component.stamp_kubernetes_version:
        return kubernetes_ldflags(pinned_version(component))
    flags = ["-s", "-w"]
    if component.version_variable:
        flags.append(f"-X {component.version_variable}={pinned_version(component)}")
    if component.client_go_version_packages:
        minor = required_version(component, "k8s.io/client-go").lstrip("v").split(".")[1]
        for package in component.client_go_version_packages:
            flags += [f"-X {package}.k8sVersionMajor=1", f"-X {package}.k8sVersionMinor={minor}"]
    return " ".join(flags)


def cache_root() -> Path:
    """`${EGRESS_PLACER_CACHE:-~/.cache/egress-placer}/devcluster`."""
    base = os.environ.get("EGRESS_PLACER_CACHE") or "~/.cache/egress-placer"
    return Path(base).expanduser() / "devcluster"


def go_version() -> str | None:
    """`go env GOVERSION`, or None when Go is not installed."""
    if shutil.which("go") is None:
        return None
    return subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()


def tools_digest(components: tuple[Component, ...] | None = None) -> str:
    """Hash of the recipe, the link flags, the build tags and the tool modules' go.mod, go.sum and Go files
    (a variant's files laid over its module's: the default pair's key is the same as before versions were choices)."""
    digest = hashlib.sha256(RECIPE_VERSION.encode())
    for component in core_components() if components is None else components:
        files = module_files(component)
        for relative in sorted(files, key=lambda name: Path(component.module) / name):
            digest.update(f"{Path(component.module) / relative}\0".encode())
            digest.update(files[relative].read_bytes())
        digest.update(ldflags(component).encode())
        if component.tags:  # only optional components have tags: the default key stays as it was
            digest.update(f"\0tags={','.join(component.tags)}".encode())
    return digest.hexdigest()[:12]


def key_prefix() -> str:
    """The part of the cache key that does not depend on the Go toolchain."""
    k8s, etcd, kwok, tekton = (pinned_version(c) for c in core_components())
    return f"k8s-{k8s}_etcd-{etcd}_kwok-{kwok}_tekton-{tekton}_{tools_digest()}"


@dataclass(frozen=True)
class Artifacts:
    """A cache directory holding `bin/` and Tekton's `tekton-config/`."""

    root: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def tekton_config(self) -> Path:
        return self.root / "tekton-config"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def versions(self) -> dict[str, str]:
        """The pair the key names: {"kubernetes": "v1.37.2", "tekton": "v1.15.0"}."""
        match = re.match(r"k8s-(v[^_]+)_.*_tekton-(v[^_]+)_", self.root.name)
        return {"kubernetes": match.group(1), "tekton": match.group(2)} if match else {}

    def complete(self) -> bool:
        names = [name for c in COMPONENTS for name in c.binaries]
        return all(os.access(self.binary(n), os.X_OK) for n in names) and (self.tekton_config / "300-crds").is_dir()


def find_artifacts() -> Artifacts | None:
    """The complete cache for the current pins, or None. Without Go, any Go version's cache fits."""
    prefix, version = key_prefix(), go_version()
    if version is not None:
        candidates = [cache_root() / f"{prefix}_{version}"]
    else:
        candidates = sorted(cache_root().glob(f"{prefix}_go*"), reverse=True)
    return next((Artifacts(c) for c in candidates if Artifacts(c).complete()), None)


def ensure_built(log: Log = print) -> Artifacts:
    """Return the complete cache, building it first when it is missing."""
    found = find_artifacts()
    if found is not None:
        log(f"[build] cache complete, nothing to build: {found.root}")
        return found
    version = go_version()
    if version is None:
        raise BuildError("the binaries are not cached and `go` is not on PATH")
    final = cache_root() / f"{key_prefix()}_{version}"
    final.parent.mkdir(parents=True, exist_ok=True)
    log(f"[build] building into {final} (Go build cache: later builds take seconds)")
    started = time.monotonic()
    staging = Artifacts(Path(tempfile.mkdtemp(prefix=".building-", dir=final.parent)))
    try:
        staging.bin_dir.mkdir()
        for component in core_components():
            _build_component(component, staging.bin_dir, log)
        _copy_tekton_config(staging.tekton_config)
        os.rename(staging.root, final)
    except BaseException:
        shutil.rmtree(staging.root, ignore_errors=True)
        if not Artifacts(final).complete():  # unless another build finished first
            raise
    log(f"[build] all components built in {time.monotonic() - started:.0f} s")
    return Artifacts(final)


def optional_key(component: Component) -> str:
    """The cache key of an optional component, without the Go version: its pin and its own digest."""
    return f"{component.module}-{pinned_version(component)}_{tools_digest((component,))}"


def _optional_component(name: str) -> Component:
    try:
        return with_version(OPTIONAL_COMPONENTS[name])
    except KeyError:
        raise BuildError(f"no optional component {name!r}; known: {', '.join(OPTIONAL_COMPONENTS)}") from None


def _optional_complete(root: Path, component: Component) -> bool:
    return all(os.access(root / "bin" / binary, os.X_OK) for binary in component.binaries) and all(
        (root / "files" / name).is_file() for name in component.module_files
    )


def optional_file(bin_dir: Path, name: str) -> Path:
    """One of `module_files` of the optional component whose `bin/` is `bin_dir`."""
    return bin_dir.parent / "files" / name


def find_optional(name: str) -> Path | None:
    """The `bin/` directory of the complete cache of optional component `name`, or None.
    Without Go, any Go version's cache fits."""
    component = _optional_component(name)
    base, version = cache_root() / "optional", component.toolchain or go_version()
    key = optional_key(component)
    candidates = [base / f"{key}_{version}"] if version is not None else sorted(base.glob(f"{key}_go*"), reverse=True)
    return next((c / "bin" for c in candidates if _optional_complete(c, component)), None)


def ensure_optional(name: str, log: Log = print) -> Path:
    """The `bin/` directory holding optional component `name`'s binaries, built first when missing.

    Same recipe as `ensure_built` (staging directory renamed into place), its own key:
    `<cache>/optional/<module>-<pin>_<digest>_<go version>/bin/`."""
    component = _optional_component(name)
    found = find_optional(name)
    if found is not None:
        return found
    if go_version() is None:
        raise BuildError(f"{name} is not cached and `go` is not on PATH")
    version = component.toolchain or go_version()
    final = cache_root() / "optional" / f"{optional_key(component)}_{version}"
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=final.parent))
    try:
        (staging / "bin").mkdir()
        if component.binaries:  # else files only
            _build_component(component, staging / "bin", log)
        _copy_module_files(component, staging / "files")
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if not _optional_complete(final, component):  # unless another build finished first
            raise
    return final / "bin"


def _go_env(component: Component | None = None) -> dict[str, str]:
    toolchain = (component.toolchain if component is not None else None) or "local"
    return {**os.environ, "GOTOOLCHAIN": toolchain, "GOWORK": "off", "GOFLAGS": "-buildvcs=false"}


def _go_output_name(package: str) -> str:
    """The file name `go build -o DIR/` gives a main package (major-version suffixes skipped)."""
    parts = package.split("/")
    return parts[-2] if re.fullmatch(r"v\d+", parts[-1]) else parts[-1]


def _patched_modfile(component: Component, work_dir: Path) -> list[str]:
    """`go build -modfile FILE` arguments that build against patched copies of some dependencies.

    Go refuses `-overlay` for files in the module cache, so each module a patch touches is copied
    into `work_dir`, the patched files are laid over the copy, and a copy of the tool module's
    go.mod (with its go.sum) replaces the module with that directory. The tool module itself and
    the module cache stay untouched.
    """
    if not component.patches:
        return []
    module_dir = source_dir(component)
    modfile = work_dir / "go.mod"
    shutil.copyfile(module_dir / "go.mod", modfile)
    shutil.copyfile(module_dir / "go.sum", work_dir / "go.sum")
    copies: dict[str, Path] = {}
    for directory, package in component.patches.items():
        listed = subprocess.run(
            ["go", "list", "-f", "{{.Module.Path}}\t{{.Module.Dir}}\t{{.Dir}}", package],
            cwd=module_dir,
            env=_go_env(component),
            capture_output=True,
            text=True,
        )
        if listed.returncode != 0:
            raise BuildError(f"cannot find {package} for the patches in {directory}: {listed.stderr.strip()}")
        module, original_root, package_dir = listed.stdout.strip().split("\t")
        if module not in copies:
            copies[module] = work_dir / f"module-{len(copies)}"
            shutil.copytree(original_root, copies[module], copy_function=shutil.copyfile)
            for sub, _, _ in os.walk(copies[module]):
                os.chmod(sub, 0o755)  # the module cache is read-only; the copy must be writable and removable
        target = copies[module] / Path(package_dir).relative_to(original_root)
        for patched in sorted((module_dir / directory).glob("*.go")):
            if not (target / patched.name).is_file():
                raise BuildError(f"{directory}/{patched.name} replaces no file of {package}")
            shutil.copyfile(patched, target / patched.name)
    for module, copy in copies.items():
        subprocess.run(["go", "mod", "edit", f"-replace={module}={copy}", str(modfile)], env=_go_env(component), check=True)
    return [f"-modfile={modfile}"]


def _build_component(component: Component, bin_dir: Path, log: Log) -> None:
    names = ", ".join(component.binaries)
    log(f"[build] {component.module} {pinned_version(component)} ({names}): {component.why}")
    started = time.monotonic()
    out_dir = Path(tempfile.mkdtemp(prefix=f".{component.module}-", dir=bin_dir))
    packages = list(component.binaries.values())
    tags = ["-tags", ",".join(component.tags)] if component.tags else []
    patch_dir = Path(tempfile.mkdtemp(prefix=".patched-", dir=bin_dir))
    modfile = _patched_modfile(component, patch_dir)
    argv = ["go", "build", "-trimpath", *tags, *modfile, "-ldflags", ldflags(component), "-o", f"{out_dir}/", *packages]
    with tempfile.TemporaryFile(mode="w+") as output:
        proc = subprocess.Popen(argv, cwd=source_dir(component), env=_go_env(component), stdout=output, stderr=output)
        while True:
            try:
                proc.wait(timeout=60)
                break
            except subprocess.TimeoutExpired:
                log(f"[build]   still building {component.module}: {time.monotonic() - started:.0f} s")
            except BaseException:
                proc.kill()
                proc.wait()
                raise
        if proc.returncode != 0:
            output.seek(0)
            tail = "\n".join(output.read().splitlines()[-40:])
            raise BuildError(f"building {component.module} failed (exit {proc.returncode}):\n{tail}")
    for name, package in component.binaries.items():
        os.rename(out_dir / _go_output_name(package), bin_dir / name)
    out_dir.rmdir()
    shutil.rmtree(patch_dir)
    log(f"[build] {component.module} done in {time.monotonic() - started:.0f} s")


def tekton_module_dir() -> Path:
    """Where the chosen Tekton module lives in the Go module cache (downloaded when missing)."""
    tekton = source_dir(core_components()[3])
    out = subprocess.run(
        ["go", "list", "-m", "-json", TEKTON_MODULE],
        cwd=tekton,
        env=_go_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module_dir = json.loads(out).get("Dir")
    if not module_dir:
        subprocess.run(["go", "mod", "download", TEKTON_MODULE], cwd=tekton, env=_go_env(), check=True)
        return tekton_module_dir()
    return Path(module_dir)


def _copy_module_files(component: Component, dest: Path) -> None:
    """Copy `component.module_files` from the pinned module (as writable files) into `dest`."""
    if not component.module_files:
        return
    listed = subprocess.run(
        ["go", "mod", "download", "-json", component.pin],
        cwd=source_dir(component),
        env=_go_env(component),
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        raise BuildError(f"cannot find {component.pin}: {listed.stderr.strip()}")
    source = Path(json.loads(listed.stdout)["Dir"])
    for name in component.module_files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((source / name).read_bytes())


TEKTON_AGGREGATE_ROLES = "clusterrole-aggregate-*.yaml"  # tekton-aggregate-edit and -view, of the module's config/


def tekton_aggregate_roles(config: Path) -> list[Path]:
    """Tekton's aggregated ClusterRoles (`tekton-aggregate-edit`, `tekton-aggregate-view`: every release
    installs them, so `edit` and `view` users may write and read runs) in `config`; from the pinned
    module's own config/ when a cache built before they were copied lacks them."""
    found = sorted(config.glob(TEKTON_AGGREGATE_ROLES))
    return found or sorted((tekton_module_dir() / "config").glob(TEKTON_AGGREGATE_ROLES))


def _copy_tekton_config(dest: Path) -> None:
    """Copy the v1 CRDs, the namespace, the ConfigMaps the controller needs and the aggregated
    ClusterRoles (as writable files)."""
    config = tekton_module_dir() / "config"
    files = [*sorted((config / "300-crds").glob("*.yaml")), *sorted((config / "100-namespace").glob("*.yaml"))]
    files += sorted(config.glob("config-*.yaml")) + sorted(config.glob(TEKTON_AGGREGATE_ROLES))
    for src in files:
        target = dest / src.relative_to(config)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(src.read_bytes())
