"""egress-placer's Helm chart (`charts/egress-placer`) rendered and installed on the local cluster.

helm is built from its Go module as an optional devcluster component (`python -m devcluster build --with
helm`, a cache key of its own). `template` renders the chart into objects. `Release.install` runs `helm
install` against the cluster's admin kubeconfig through a post-renderer (this module run as a program,
`python -m devplacer.chart --webhook-url URL`) that points the webhooks at the loopback URL of a
controller running as a local process, as `devplacer.local_placer` does for `k8s/`: the API server here
reaches no Service. Every other object is the chart's, the Deployment too (its pods "run" on KWOK's
nodes without a container, as in tests/e2e/test_install.py). `settings_env` is what the chart's
Deployment sets, for that local process (`start_controller(..., env=settings_env(docs), install=release.install)`).

Helm's own state (cache, config, data) goes to a temporary directory per command, never to ~/.config/helm.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

from devcluster.build import ensure_optional
from devcluster.cluster import Cluster, ClusterError
from devplacer.local_placer import REPO, WEBHOOK_KINDS, kubectl, webhooks_calling

CHART_DIR = REPO / "charts" / "egress-placer"
RELEASE = "egress-placer"
# The release's namespace, where the chart puts its objects: k8s/'s. Rendered (`helm template`) the chart
# makes it (createNamespace); installed, Helm needs it before it installs anything (it keeps the release
# there), so `Release.install` has Helm make it (--create-namespace) and labels it as docs/helm.md says.
RELEASE_NAMESPACE = "egress-placer"
# The labels the chart's Namespace carries, for a namespace made by `helm install --create-namespace`.
NAMESPACE_LABELS = {
    "egress-placer.io/webhook": "skip",
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
# Settings of the chart's Deployment that a local process sets itself: loopback ports, its own certificate.
LOCAL_SETTINGS = frozenset(
    {"EGRESS_PLACER_WEBHOOK_PORT", "EGRESS_PLACER_HEALTH_PORT", "EGRESS_PLACER_TLS_CERT_FILE", "EGRESS_PLACER_TLS_KEY_FILE"}
)
TIMEOUT = 300.0


def helm_binary(log: Callable[[str], None] = print) -> Path:
    """The helm built from its Go module (built first when it is not cached)."""
    return ensure_optional("helm", log) / "helm"


def run_helm(helm: Path, *args: str, kubeconfig: Path | None = None) -> str:
    """`helm ARGS` (with `--kubeconfig` when given) in the repository; its stdout, or ClusterError with its stderr."""
    with tempfile.TemporaryDirectory(prefix="egress-placer-helm-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBECONFIG"))}
        env.update(HELM_CACHE_HOME=f"{home}/cache", HELM_CONFIG_HOME=f"{home}/config", HELM_DATA_HOME=f"{home}/data")
        argv = [str(helm), *args, *(["--kubeconfig", str(kubeconfig)] if kubeconfig else [])]
        out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    if out.returncode != 0:
        raise ClusterError(f"helm {' '.join(args)} failed (exit {out.returncode}): {out.stderr.strip()}")
    return out.stdout


def _values_args(values: Mapping[str, Any] | None, directory: str) -> list[str]:
    if not values:
        return []
    path = Path(directory) / "values.json"  # JSON is YAML
    path.write_text(json.dumps(values))
    return ["--values", str(path)]


def template(helm: Path, values: Mapping[str, Any] | None = None, *args: str, namespace: str = RELEASE_NAMESPACE) -> list[dict[str, Any]]:
    """The chart's objects for `values` in `namespace` (`helm template -n`, CRDs of the chart's crds/ included)."""
    with tempfile.TemporaryDirectory(prefix="egress-placer-values-") as tmp:
        out = run_helm(
            helm, "template", RELEASE, str(CHART_DIR), "--namespace", namespace, "--include-crds",
            *_values_args(values, tmp), *args,
        )
    return [d for d in yaml.safe_load_all(out) if d]


def policy_values(policy_file: Path) -> dict[str, Any]:
    """The chart's `policy` value for a PlacementPolicy file: the document without apiVersion and kind."""
    document = yaml.safe_load(Path(policy_file).read_text())
    return {k: v for k, v in document.items() if k not in ("apiVersion", "kind")}


def settings_env(docs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The EGRESS_PLACER_* values the chart's Deployment sets literally, less `LOCAL_SETTINGS`."""
    (deployment,) = [d for d in docs if d.get("kind") == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e and e["name"] not in LOCAL_SETTINGS}


def post_render(stream: str, webhook_url: str) -> str:
    """Helm's rendered objects with the webhooks calling `webhook_url` instead of the Service."""
    docs = [d for d in yaml.safe_load_all(stream) if d]
    docs = [webhooks_calling(d, webhook_url) if d.get("kind") in WEBHOOK_KINDS else d for d in docs]
    return yaml.safe_dump_all(docs, sort_keys=False)


@dataclass
class Release:
    """The chart installed on `cluster` as release `RELEASE` with `values`, by the cluster's admin."""

    cluster: Cluster
    helm: Path
    values: Mapping[str, Any] = field(default_factory=dict)
    namespace: str = RELEASE_NAMESPACE
    chart: Path = CHART_DIR  # another, e.g. the 0.1.0 chart, which makes namespace egress-placer itself
    webhook_url: str | None = None  # set by `install`

    def _helm(self, *args: str) -> str:
        return run_helm(self.helm, *args, kubeconfig=self.cluster.kubeconfig)

    def _post_renderer(self) -> list[str]:
        args = ("-m", "devplacer.chart", f"--webhook-url={self.webhook_url}")
        return [f"--post-renderer={sys.executable}", *(f"--post-renderer-args={a}" for a in args)]

    def install(self, webhook_url: str) -> None:
        """`helm install`, the webhooks pointed at `webhook_url` by the post-renderer; this chart into its
        namespace made by Helm and labelled (docs/helm.md), another chart as it is."""
        self.install_from(webhook_url, (str(self.chart),))

    def install_from(self, webhook_url: str, source: Sequence[str]) -> None:
        """`install`, the chart named by `source` (helm's arguments: a directory, or `oci://… --version V
        --plain-http`, devplacer/release.py), this chart's namespace handling unless `chart` is another."""
        self.webhook_url = webhook_url
        ours = self.chart == CHART_DIR
        values = {**self.values, "createNamespace": False} if ours else self.values
        with tempfile.TemporaryDirectory(prefix="egress-placer-values-") as tmp:
            self._helm(
                "install", RELEASE, *source, "--namespace", self.namespace, *(["--create-namespace"] if ours else []),
                *_values_args(values, tmp), *self._post_renderer(),
            )
        if ours:
            kubectl(self.cluster, "label", "--overwrite", "namespace", self.namespace, *(f"{k}={v}" for k, v in NAMESPACE_LABELS.items()))

    def upgrade(self, values: Mapping[str, Any]) -> None:
        """`helm upgrade --reset-then-reuse-values` to this chart (its new values get their defaults) with `values`
        on top, through the same post-renderer."""
        self.chart = CHART_DIR
        with tempfile.TemporaryDirectory(prefix="egress-placer-values-") as tmp:
            self._helm(
                "upgrade", RELEASE, str(CHART_DIR), "--namespace", self.namespace, "--reset-then-reuse-values",
                *_values_args(values, tmp), *self._post_renderer(),
            )

    def status(self) -> dict[str, Any]:
        """`helm status` as JSON (`info.status` is "deployed" once installed)."""
        return json.loads(self._helm("status", RELEASE, "--namespace", self.namespace, "--output", "json"))

    def manifest(self) -> list[dict[str, Any]]:
        """The objects Helm installed (`helm get manifest`, after the post-renderer)."""
        return [d for d in yaml.safe_load_all(self._helm("get", "manifest", RELEASE, "--namespace", self.namespace)) if d]

    def uninstall(self) -> None:
        """`helm uninstall`, waiting until its objects are gone; nothing when it is not installed."""
        self._helm("uninstall", RELEASE, "--namespace", self.namespace, "--ignore-not-found", "--wait", "--timeout=120s")


def main(argv: Sequence[str] | None = None) -> int:
    """The post-renderer: Helm's rendered objects on stdin, the local form on stdout."""
    parser = argparse.ArgumentParser(prog="python -m devplacer.chart", description=main.__doc__)
    parser.add_argument("--webhook-url", required=True, help="where the webhooks call the controller, e.g. https://127.0.0.1:PORT/mutate")
    args = parser.parse_args(argv)
    sys.stdout.write(post_render(sys.stdin.read(), args.webhook_url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
