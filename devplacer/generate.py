"""`make generate` (`python -m devplacer.generate`): write every file derived from code; `--check` writes
nothing and names the files that differ from what it would write (exit status 1). `--help` writes nothing.

| file | derived from |
|---|---|
| `k8s/crds/*.yaml` | `controller/core/pools.py` (`custom_resource_definitions`) serving v1alpha1 and v1beta1 (`controller/core/pools_v1beta1.py`, `served_crds`), rendered by `devplacer/crds.py` |
| `charts/egress-placer/templates/crds.yaml` | the same, as a Helm template (`crds.install`, `crds.keep`) |
| `k8s/pool-guard.yaml` | `controller/pool_guard/core.py`: the policy, and the binding for the default exempt and agent namespaces |
| `charts/egress-placer/templates/pool-guard-policy.yaml` | `controller/pool_guard/core.py`: the policy, as a Helm template |
| `k8s/controller-rights.yaml` | `controller/core/rights.py`: the policies bounding the controller's own writes, their bindings |
| `charts/egress-placer/templates/controller-rights.yaml` | the same, as a Helm template (`controllerRights` values) |
| `k8s/run-guard.yaml` | `controller/core/run_guard.py`: the run guard's policy and its binding (Deny) |
| `charts/egress-placer/templates/run-guard.yaml` | the same, as a Helm template (`runGuard.enabled`, `runGuard.warnOnly`) |
| `charts/egress-placer/README.md` | the chart's values.yaml (`# --` comments) and README.md.gotmpl, by helm-docs |
| `charts/egress-placer/Chart.yaml` | its `version` and `appVersion` lines: pyproject.toml's version (devplacer/version.py); its `kubeVersion`: the supported range (below); the rest as written |
| `docs/compatibility.md`, `docs/helm.md`, `docs/faq.md`, `k8s/README.md` | the supported versions they state (compatibility.md's "Supported versions" block, helm.md's `- Kubernetes` and `- Tekton Pipelines` lines, faq.md's Kubernetes and Tekton rows, k8s/README.md's `Prerequisites:` line): the range docs/compatibility.json proves (devplacer/supported.py); the rest as written |
| `k8s/deployment.yaml` | its `image:` line: the published image at that version (devplacer/version.py); the rest as written |

The chart's README needs helm-docs, an optional component of the local cluster's build
(`python -m devcluster build --with helm-docs`, part of `make cluster-build`). Without it (a bare
clone) a write and `--check` leave that file alone and say so. When no cell of the matrix's plan has a passing row
in docs/compatibility.json there is no supported range: a write and `--check` stop with that error.

The `crds/` directories (k8s/'s, and the chart's of the 0.1.0 chart, now empty) hold generated files only: a file there that the render does not make is
removed by a write and named by `--check`. tests/unit/test_generated.py fails when a committed file
differs from this render, and names it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import re

import yaml

from controller.pool_guard.core import GUARD_NAME, policy_binding, validating_admission_policy
from controller.core.rights import controller_rights
from controller.core.pools_v1beta1 import served_crds
from controller.core import run_guard
from devcluster.build import find_optional
from controller.compat.core import TASKRUN_PENDING_SINCE
from devplacer import crds, matrix, supported
from devplacer import version as versions

REPO = Path(__file__).resolve().parents[1]
COMMAND = "make generate"
CHART_DIR = Path("charts/egress-placer")
POOL_GUARD = Path("k8s/pool-guard.yaml")
CHART_POOL_GUARD = CHART_DIR / "templates" / "pool-guard-policy.yaml"
CONTROLLER_RIGHTS = Path("k8s/controller-rights.yaml")
CHART_CONTROLLER_RIGHTS = CHART_DIR / "templates" / "controller-rights.yaml"
RUN_GUARD = Path("k8s/run-guard.yaml")
CHART_RUN_GUARD = CHART_DIR / "templates" / "run-guard.yaml"
CHART_CRDS = CHART_DIR / "templates" / "crds.yaml"
CHART_README = CHART_DIR / "README.md"
CHART_YAML = CHART_DIR / "Chart.yaml"
DEPLOYMENT = Path("k8s/deployment.yaml")
COMPATIBILITY_DOC = Path("docs/compatibility.md")
HELM_DOC = Path("docs/helm.md")
FAQ_DOC = Path("docs/faq.md")
K8S_README = Path("k8s/README.md")
SUPPORTED_BEGIN = "<!-- supported versions: written by `make generate` (devplacer/supported.py) from docs/compatibility.json -->"
SUPPORTED_END = "<!-- end of the supported versions -->"
HELM_DOCS_MISSING = (
    f"{CHART_README}: not generated, helm-docs is not built "
    "(python -m devcluster build --with helm-docs, part of make cluster-build)"
)
# Directories of generated files only (relative to the repository).
OWNED_DIRS = (crds.CRDS_DIR, crds.CHART_CRDS_DIR)

POOL_GUARD_HEADER = f"""\
# The pool guard: a ValidatingAdmissionPolicy that refuses, inside the API server (so also while the
# webhook is down), pods of namespaces without pool rights that would reach a pool: a toleration of a
# pool's taint (by key, or a key-less Exists) unless pinned off the pool's nodes, or a nodeName of a pool
# node. See k8s/README.md, "The pool guard". The binding is static; the leader keeps the params
# (ConfigMap egress-placer-pool-guard: the namespaces left out, the pools, their nodes) current.
#
# GENERATED from controller/pool_guard/core.py by `{COMMAND}`; do not edit.
"""
CHART_POOL_GUARD_HEADER = f"""\
# The pool guard's ValidatingAdmissionPolicy (k8s/pool-guard.yaml; k8s/README.md, "The pool guard"), the
# same for every policy; its binding is pool-guard.yaml's.
#
# GENERATED from controller/pool_guard/core.py by `{COMMAND}`; do not edit.
"""
RUN_GUARD_HEADER = f"""\
# The run guard: a ValidatingAdmissionPolicy that refuses, inside the API server (fail-closed), a tenant's
# change that would move a run held in a pool's queue ahead: spec.status set to anything but a cancel
# value, admission's annotations (queue entry, decision, review) changed, or a queue entry added by UPDATE; or
# the schedulingGate egress-placer.io/pool-slot removed from a pod waiting for a pool slot. The controller's own
# ServiceAccount is not judged. See k8s/README.md, "The run guard"; the warn-only rollout: run-guard-warn/.
#
# GENERATED from controller/core/run_guard.py by `{COMMAND}`; do not edit.
"""
CHART_RUN_GUARD_HEADER = f"""\
# The run guard (k8s/run-guard.yaml; k8s/README.md, "The run guard"): runGuard.warnOnly answers with a
# warning and an audit annotation instead of refusing.
#
# GENERATED from controller/core/run_guard.py by `{COMMAND}`; do not edit.
"""


CONTROLLER_RIGHTS_HEADER = f"""\
# The controller's own rights, bounded in the API server: two ValidatingAdmissionPolicies that apply only
# to requests of the controller's ServiceAccount (system:serviceaccount:egress-placer:egress-placer).
# RBAC cannot say "only the caBundle"; these do: webhook configurations only caBundle, nodes only the
# pool taint, runs only removing spec.status and egress-placer.io/* annotations, pod deletes only on
# pool nodes. See k8s/README.md, "What bounds each right". Warn-only first: k8s/controller-rights-warn/.
#
# GENERATED from controller/core/rights.py by `{COMMAND}`; do not edit.
"""
CHART_CONTROLLER_RIGHTS_HEADER = f"""\
# The controller's own rights, bounded in the API server (k8s/controller-rights.yaml; k8s/README.md,
# "What bounds each right"); validationActions from .Values.controllerRights.
#
# GENERATED from controller/core/rights.py by `{COMMAND}`; do not edit.
"""
_ACTIONS = "__VALIDATION_ACTIONS__"
_NAMESPACE = "__NAMESPACE__"


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the CEL) as literal blocks."""


_BlockDumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None),
)


def _dump(docs: list[Any]) -> str:
    return yaml.dump_all(docs, Dumper=_BlockDumper, sort_keys=False, width=120, explicit_start=True)


def pool_guard_manifest() -> str:
    """k8s/pool-guard.yaml: the policy and its binding for the default policy-wide fields."""
    docs = [validating_admission_policy(), policy_binding("egress-placer")]
    return POOL_GUARD_HEADER + _dump(docs)


def controller_rights_manifest() -> str:
    """k8s/controller-rights.yaml: the two policies and their bindings, enforcing."""
    return CONTROLLER_RIGHTS_HEADER + _dump(controller_rights())


def chart_controller_rights_template() -> str:
    """The chart's template: the same objects, metadata through the chart's helper, the bindings'
    validationActions and params namespace from the chart."""
    parts = []
    for doc in controller_rights(namespace=_NAMESPACE, actions=(_ACTIONS,)):
        body = yaml.dump({"spec": doc["spec"]}, Dumper=_BlockDumper, sort_keys=False, width=120)
        if "{{" in body or "}}" in body:
            raise ValueError("a controller-rights spec holds '{{' or '}}', which Helm would read as a template action")
        body = body.replace(f"- {_ACTIONS}\n", "{{- toYaml .Values.controllerRights.validationActions | nindent 4 }}\n")
        body = body.replace(_NAMESPACE, '{{ include "egress-placer.namespace" . }}')
        parts.append(
            f"---\napiVersion: {doc['apiVersion']}\nkind: {doc['kind']}\n"
            + f'{{{{ include "egress-placer.metadata" (dict "root" . "name" "{doc["metadata"]["name"]}") }}}}\n'
            + body
        )
    return "{{- if .Values.controllerRights.enabled }}\n" + CHART_CONTROLLER_RIGHTS_HEADER + "".join(parts) + "{{- end }}\n"


def chart_pool_guard_template() -> str:
    """The chart's template of the policy: its metadata through the chart's helper, its spec the render's."""
    policy = validating_admission_policy()
    if policy["metadata"] != {"name": GUARD_NAME}:
        raise ValueError(f"the chart's template sets only the name: the policy's metadata is {policy['metadata']}")
    spec = yaml.dump({"spec": policy["spec"]}, Dumper=_BlockDumper, sort_keys=False, width=120)
    if "{{" in spec or "}}" in spec:
        raise ValueError("the policy's spec holds '{{' or '}}', which Helm would read as a template action")
    return (
        "{{- if .Values.poolGuard.enabled }}\n"
        + CHART_POOL_GUARD_HEADER
        + f"---\napiVersion: {policy['apiVersion']}\nkind: {policy['kind']}\n"
        + f'{{{{ include "egress-placer.metadata" (dict "root" . "name" "{GUARD_NAME}") }}}}\n'
        + spec
        + "{{- end }}\n"
    )


def run_guard_manifest() -> str:
    """k8s/run-guard.yaml: the run guard's policy and its binding (Deny)."""
    return RUN_GUARD_HEADER + _dump([run_guard.validating_admission_policy(), run_guard.policy_binding()])


def chart_run_guard_template() -> str:
    """The chart's run guard: the policy and its binding, metadata through the chart's helper, the binding's
    actions from runGuard.warnOnly."""
    out = "{{- if .Values.runGuard.enabled }}\n" + CHART_RUN_GUARD_HEADER
    for doc in (run_guard.validating_admission_policy(namespace=_NAMESPACE), run_guard.policy_binding()):
        spec = dict(doc["spec"])
        actions = "validationActions" in spec
        spec.pop("validationActions", None)
        text = yaml.dump({"spec": spec}, Dumper=_BlockDumper, sort_keys=False, width=120)
        if "{{" in text or "}}" in text:
            raise ValueError("the run guard's spec holds '{{' or '}}', which Helm would read as a template action")
        text = text.replace(_NAMESPACE, '{{ include "egress-placer.namespace" . }}')
        if actions:
            text = text.replace(
                "spec:\n",
                "spec:\n  validationActions: {{ ternary (list \"Warn\" \"Audit\") (list \"Deny\") "
                ".Values.runGuard.warnOnly | toJson }}\n",
                1,
            )
        out += (
            f"---\napiVersion: {doc['apiVersion']}\nkind: {doc['kind']}\n"
            + f'{{{{ include "egress-placer.metadata" (dict "root" . "name" "{doc["metadata"]["name"]}") }}}}\n'
            + text
        )
    return out + "{{- end }}\n"


CHART_CRDS_HEADER = f"""\
# The pools API's CRDs (k8s/crds/; docs/pools-api.md) as templates, so that `helm upgrade` updates them
# (docs/helm.md, "The pools API's CRDs"). crds.install: false leaves them out (installed another way);
# crds.keep (default true): `helm uninstall` leaves them, and with them every EgressPool. Both versions are
# served, v1beta1 stored, converted by the controller's /convert (Service egress-placer-conversion), whose
# caBundle the leader keeps (with cert-manager, its CA injector). Before each CRD, the pre-upgrade check:
# an installed CRD whose status.storedVersions lists a version this chart does not serve fails the upgrade
# (docs/pools-api.md, "Deprecation policy"; `egress-placer migrate-storage` migrates the objects).
#
# GENERATED from controller/core/pools.py by `{COMMAND}`; do not edit.
"""


def stored_versions_check(crd: dict[str, Any]) -> str:
    """The chart's pre-upgrade check of a CRD (docs/pools-api.md, "Deprecation policy", point 3): the CRD
    installed (Helm's `lookup`, empty under `helm template` and a client-side --dry-run) still lists in
    `status.storedVersions` a version this chart does not serve: `fail`, before anything is applied, naming
    the command that migrates the objects (the API server would refuse the CRD's update anyway, halfway
    through the upgrade, with "must appear in spec.versions")."""
    name = crd["metadata"]["name"]
    versions = " ".join(f'"{v["name"]}"' for v in crd["spec"]["versions"])
    message = (
        f"{name} still stores objects as %s (status.storedVersions: %v), a version this chart no longer serves: "
        "migrate them first with `egress-placer migrate-storage` (or let the controller of the chart installed now "
        "do it: its leader migrates them once it is elected), then upgrade again (docs/pools-api.md, 'Deprecation policy')"
    )
    return (
        f'{{{{- $installed := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "{name}" }}}}\n'
        + '{{- $stored := dig "status" "storedVersions" (list) $installed }}\n'
        + "{{- range $stored }}\n"
        + f"{{{{- if not (has . (list {versions})) }}}}\n"
        + f'{{{{- fail (printf "{message}" . $stored) }}}}\n'
        + "{{- end }}\n{{- end }}\n"
    )


def chart_crds_template() -> str:
    """The chart's CRDs: metadata through the chart's helper (its labels, the keep policy), specs the render's."""
    out = (
        "{{- if .Values.crds.install }}\n" + CHART_CRDS_HEADER
        + '{{- $annotations := ternary (dict "helm.sh/resource-policy" "keep") (dict) .Values.crds.keep }}\n'
        + '{{- if include "egress-placer.certManager" . }}\n'
        + '{{- $_ := set $annotations "cert-manager.io/inject-ca-from" (printf "%s/egress-placer-webhook" (include "egress-placer.namespace" .)) }}\n'
        + "{{- end }}\n"
    )
    for crd in served_crds(_NAMESPACE):
        if set(crd["metadata"]) != {"name"}:
            raise ValueError(f"the chart's template sets only the name: the CRD's metadata is {crd['metadata']}")
        out += stored_versions_check(crd)
        spec = yaml.dump({"spec": crd["spec"]}, Dumper=_BlockDumper, sort_keys=False, width=120, allow_unicode=True)
        if "{{" in spec or "}}" in spec:
            raise ValueError("a CRD's spec holds '{{' or '}}', which Helm would read as a template action")
        spec = spec.replace(_NAMESPACE, '{{ include "egress-placer.namespace" . }}')
        out += (
            f"---\napiVersion: {crd['apiVersion']}\nkind: {crd['kind']}\n"
            + f'{{{{ include "egress-placer.metadata" (dict "root" . "name" "{crd["metadata"]["name"]}" "annotations" $annotations) }}}}\n'
            + spec
        )
    return out + "{{- end }}\n"


def _set_line(text: str, pattern: str, line: str, where: Path) -> str:
    """`text` with the one line matching `pattern` (a full-line regex) replaced by `line`."""
    new, count = re.subn(pattern, line.replace("\\", "\\\\"), text, flags=re.MULTILINE)
    if count != 1:
        raise ValueError(f"{where}: {count} lines match {pattern!r}, one was expected")
    return new


def release_version() -> str:
    """pyproject.toml's version, checked to be one Helm (SemVer 2) and pip (PEP 440) both read the same way."""
    version = versions.version(REPO / "pyproject.toml")
    if not re.fullmatch(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)", version):
        raise ValueError(f"pyproject.toml: version {version!r} is not MAJOR.MINOR.PATCH (docs/releasing.md)")
    return version


def chart_yaml(text: str, version: str, supported_range: supported.SupportedRange) -> str:
    """Chart.yaml with `version` and `appVersion` set to the project's version (lockstep, docs/releasing.md), and
    `kubeVersion` to the Kubernetes minors the matrix proves."""
    text = _set_line(text, r"^version: .*$", f"version: {version}", CHART_YAML)
    text = _set_line(text, r"^kubeVersion: .*$", f'kubeVersion: "{supported_range.kube_version()}"', CHART_YAML)
    return _set_line(text, r"^appVersion: .*$", f'appVersion: "{version}"', CHART_YAML)


def supported_range() -> supported.SupportedRange:
    """What docs/compatibility.json proves for the plan this checkout builds (`supported.NothingProven` when nothing)."""
    return supported.proven(matrix.read_results(), matrix.checkout_plan())


def _queue_note(supported_range: supported.SupportedRange) -> str:
    """What the oldest Tekton minors lack (controller/compat/: no TaskRunPending), when the range has them."""
    since = "v" + ".".join(map(str, TASKRUN_PENDING_SINCE[:2]))
    older = ", ".join(t for t in supported_range.tekton_minors if matrix.version_key(t) < TASKRUN_PENDING_SINCE[:2])
    return f"; on {older} no TaskRun is queued (no TaskRunPending before {since})" if older else ""


def supported_block(supported_range: supported.SupportedRange) -> str:
    """docs/compatibility.md's "Supported versions" block."""
    return (
        f"- Kubernetes **{supported_range.kubernetes_text()}**: the chart's `kubeVersion: \"{supported_range.kube_version()}\"`\n"
        f"- Tekton Pipelines **{supported_range.tekton_text()}**{_queue_note(supported_range)}\n"
        f"- proven by the passing cells: {supported_range.tested()}\n"
    )


def compatibility_doc(text: str, supported_range: supported.SupportedRange) -> str:
    if text.count(SUPPORTED_BEGIN) != 1 or text.count(SUPPORTED_END) != 1:
        raise ValueError(f"{COMPATIBILITY_DOC}: one {SUPPORTED_BEGIN!r} and one {SUPPORTED_END!r} line were expected")
    begin, end = text.index(SUPPORTED_BEGIN) + len(SUPPORTED_BEGIN), text.index(SUPPORTED_END)
    return text[:begin] + "\n" + supported_block(supported_range) + text[end:]


def helm_doc(text: str, supported_range: supported.SupportedRange) -> str:
    k8s, tekton = supported_range.kubernetes_text(), supported_range.tekton_text("or")
    text = _set_line(text, r"^- Kubernetes .*;$", f"- Kubernetes {k8s} (what the compatibility matrix proves: "
                     "[compatibility.md](compatibility.md#supported-versions));", HELM_DOC)
    return _set_line(text, r"^- Tekton Pipelines .*;$", f"- Tekton Pipelines {tekton} installed;", HELM_DOC)


def faq_doc(text: str, supported_range: supported.SupportedRange) -> str:
    k8s, tekton = supported_range.kubernetes_text(), supported_range.tekton_text()
    patches = sorted({c.kubernetes for c in supported_range.cells}, key=matrix.version_key)
    text = _set_line(text, r"^\| Kubernetes \| .*\|$", f"| Kubernetes | {k8s} (what the compatibility matrix proves: "
                     f"[compatibility.md](compatibility.md#supported-versions)) | {', '.join(p.lstrip('v') for p in patches)} |", FAQ_DOC)
    return _set_line(text, r"^\| Tekton Pipelines \| .*\|$", f"| Tekton Pipelines | {tekton} (the `tekton.dev/v1` API: TaskRun, "
                     f"PipelineRun){_queue_note(supported_range)} | {supported_range.tested()} |", FAQ_DOC)


def k8s_readme(text: str, supported_range: supported.SupportedRange) -> str:
    line = (f"Prerequisites: Kubernetes {supported_range.kubernetes_text()} and Tekton Pipelines {supported_range.tekton_text('or')} "
            "(what the compatibility matrix proves: [docs/compatibility.md](../docs/compatibility.md#supported-versions)),")
    return _set_line(text, r"^Prerequisites: Kubernetes .*,$", line, K8S_README)


def deployment_yaml(text: str, version: str) -> str:
    """k8s/deployment.yaml with the controller's image the one the release publishes at `version`."""
    return _set_line(text, r"^          image: .*$", f"          image: {versions.IMAGE_REPOSITORY}:{version}", DEPLOYMENT)


def chart_readme(helm_docs: Path, chart_yaml_text: str) -> str:
    """charts/egress-placer/README.md: helm-docs over the chart (its README.md.gotmpl), values in file order, with
    `chart_yaml_text` as its Chart.yaml (the one this render writes: one `make generate` makes both agree)."""
    with tempfile.TemporaryDirectory() as scratch:
        chart = Path(scratch) / CHART_DIR.name
        shutil.copytree(REPO / CHART_DIR, chart)
        (chart / "Chart.yaml").write_text(chart_yaml_text)
        result = subprocess.run(
            [str(helm_docs), "--dry-run", "--sort-values-order", "file", "--log-level", "warning"],
            cwd=chart,
            capture_output=True,
            text=True,
        )
    if result.returncode != 0:
        raise RuntimeError(f"helm-docs failed (exit status {result.returncode}): {result.stderr.strip()}")
    return result.stdout


def helm_docs() -> Path | None:
    """The helm-docs binary of the local cluster's build, or None when it is not built."""
    bin_dir = find_optional("helm-docs")
    return None if bin_dir is None else bin_dir / "helm-docs"


def outputs() -> dict[Path, str]:
    """Every generated file (relative to the repository) and its text; the chart's README only when
    helm-docs is built (`skipped` says otherwise)."""
    out: dict[Path, str] = {}
    for crd in served_crds():
        out[crds.CRDS_DIR / crds.file_name(crd)] = crds.render(crd)
    out[CHART_CRDS] = chart_crds_template()
    out[POOL_GUARD] = pool_guard_manifest()
    out[CHART_POOL_GUARD] = chart_pool_guard_template()
    out[CONTROLLER_RIGHTS] = controller_rights_manifest()
    out[CHART_CONTROLLER_RIGHTS] = chart_controller_rights_template()
    out[RUN_GUARD] = run_guard_manifest()
    out[CHART_RUN_GUARD] = chart_run_guard_template()
    version = release_version()
    proven = supported_range()
    out[CHART_YAML] = chart_yaml((REPO / CHART_YAML).read_text(), version, proven)
    out[COMPATIBILITY_DOC] = compatibility_doc((REPO / COMPATIBILITY_DOC).read_text(), proven)
    out[HELM_DOC] = helm_doc((REPO / HELM_DOC).read_text(), proven)
    out[FAQ_DOC] = faq_doc((REPO / FAQ_DOC).read_text(), proven)
    out[K8S_README] = k8s_readme((REPO / K8S_README).read_text(), proven)
    out[DEPLOYMENT] = deployment_yaml((REPO / DEPLOYMENT).read_text(), version)
    binary = helm_docs()
    if binary is not None:
        out[CHART_README] = chart_readme(binary, out[CHART_YAML])
    return out


def skipped() -> list[str]:
    """Why a generated file is left alone: the chart's README without helm-docs."""
    return [] if helm_docs() is not None else [HELM_DOCS_MISSING]


def differences(root: Path = REPO) -> list[str]:
    """The generated files under `root` that are missing, differ, or should not be there (sorted)."""
    wanted = outputs()
    found = {p.relative_to(root) for d in OWNED_DIRS for p in (root / d).glob("*") if p.is_file()}
    stale = [str(path) for path, text in wanted.items() if not (root / path).is_file() or (root / path).read_text() != text]
    return sorted(stale + [f"{path} (not generated)" for path in found - set(wanted)])


def write(root: Path = REPO) -> list[Path]:
    """Write every generated file that differs under `root`, remove the others of `OWNED_DIRS`; what changed."""
    wanted = outputs()
    changed = []
    for path, text in wanted.items():
        target = root / path
        if not target.is_file() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            changed.append(path)
    for directory in OWNED_DIRS:
        for extra in sorted(p for p in (root / directory).glob("*") if p.is_file() and p.relative_to(root) not in wanted):
            extra.unlink()
            changed.append(extra.relative_to(root))
    return changed


def main(argv: Sequence[str] | None = None, root: Path = REPO) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devplacer.generate",
        description="Write every file derived from code (CRDs, the pool and run guards' manifests and chart templates).",
        epilog="Files:\n" + "".join(f"  {p}\n" for p in sorted({*outputs(), CHART_README})),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="write nothing; name the files that differ, exit 1 when any does")
    args = parser.parse_args(argv)
    for reason in skipped():
        print(reason, file=sys.stderr)
    if args.check:
        stale = differences(root)
        for path in stale:
            print(f"{path}: differs from what `{COMMAND}` writes", file=sys.stderr)
        if stale:
            print(f"run `{COMMAND}`", file=sys.stderr)
        return 1 if stale else 0
    for path in write(root):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
