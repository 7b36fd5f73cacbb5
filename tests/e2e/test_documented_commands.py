"""The shell commands the documentation shows (fenced `sh` blocks of README.md, config/, k8s/README.md and
docs/) work as written: each one is run here, on the local cluster where it needs one, or listed in
SKIPPED with the reason. A command added to the docs fails `test_every_documented_command_is_run_or_skipped`
until it is one or the other.

The run is one install-and-uninstall story, in the order a reader follows it: install with
`kubectl apply -k k8s/` (the local cluster's nodes are KWOK's, so the Deployment's pods "run" without
an image), wait for the rollout, delete the pools API's fail-closed webhook configuration (no
controller answers it), apply the example policy as objects of the pools API, uninstall with
`egress-placer uninstall`; install again and uninstall with kubectl alone (docs/uninstall.md); then
with Helm (docs/helm.md; the helm the local cluster's build makes) into its namespace made by
`--create-namespace`, uninstalled with `helm uninstall` and `egress-placer uninstall`. Before each uninstall a pool node gets the pool taint, as the
controller would have left it; after it, nothing of egress-placer is left. Placeholders (`NODES PODS
TASKRUNS`) get small values. Inline commands in prose (`egress-placer status`, ...) are not collected:
most are fragments or syntax summaries; the CLI's own tests run them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from controller.core.model import TAINT_KEY
from controller.core.pools import custom_resource_definitions
from devcluster.cluster import Cluster
from devplacer.chart import helm_binary
from devplacer.local_placer import NAMESPACE, POOLS_WEBHOOK_CONFIG, WEBHOOK_CONFIG, adopt_conversion_form, render_manifests
from tests.e2e.harness import REPO, VALIDATING_WEBHOOK_CONFIGS, WEBHOOK_CONFIGS, remove_pool_taints
from tests.e2e.tekton_runs import POOL, POOL_NODES
from tests.kube import Api, namespace, namespaces_left, node
from tests.waiting import wait_for, wait_gone

DOCS = [REPO / "README.md", *sorted((REPO / "config").glob("*.md")), REPO / "k8s" / "README.md", *sorted((REPO / "docs").glob("*.md"))]

RELEASED = "needs the published release on ghcr.io, out of reach here (tests/e2e/test_release_oci.py and make release-dry-run: the same from a registry on 127.0.0.1)"
SKIPPED = {
    "kubectl label crd egresspools.egress-placer.io egressplacerconfigs.egress-placer.io app.kubernetes.io/managed-by=Helm": (
        "needs a release of the 0.1.0 chart: tests/e2e/test_helm_upgrade.py installs one and runs this command"
    ),
    "kubectl annotate crd egresspools.egress-placer.io egressplacerconfigs.egress-placer.io meta.helm.sh/release-name=egress-placer"
    " meta.helm.sh/release-namespace=default": "needs a release of the 0.1.0 chart: tests/e2e/test_helm_upgrade.py runs it",
    "helm upgrade egress-placer charts/egress-placer --namespace default --reset-then-reuse-values --set namespaceOverride=egress-placer": (
        "needs a release of the 0.1.0 chart: tests/e2e/test_helm_upgrade.py installs one and runs this upgrade"
    ),
    "make demo": "the whole demo on a cluster of its own (minutes); its parts are the e2e tests",
    "make test": "the whole suite, this test among it",
    "docker build -t registry.example.com/egress-placer:0.1.0 .": (
        "needs a Docker daemon; `make image` builds the same Dockerfile without one (tests/e2e/test_image.py)"
    ),
    "docker push registry.example.com/egress-placer:0.1.0": "needs a registry",
    "kubectl -n NAMESPACE edit daemonset NAME": "interactive (opens an editor)",
    'egress-placer suggest --prometheus "$PROM" -o yaml | kubectl apply --server-side --force-conflicts -f -': (
        "needs a Prometheus holding Tekton pods' history: tests/e2e/test_suggest.py applies suggest's -o yaml so"
    ),
    # docs/releasing.md: the published release; make release-dry-run runs the same against a registry on 127.0.0.1
    "helm install egress-placer oci://ghcr.io/egress-placer/charts/egress-placer --version X.Y.Z --namespace egress-placer"
    " --create-namespace --set createNamespace=false": RELEASED,
    "cosign verify ghcr.io/egress-placer/egress-placer:X.Y.Z --certificate-identity https://github.com/egress-placer/egress-placer/.github/workflows/release.yaml@refs/tags/vX.Y.Z --certificate-oidc-issuer https://token.actions.githubusercontent.com": RELEASED,
    "cosign verify-attestation --type spdxjson ghcr.io/egress-placer/egress-placer:X.Y.Z --certificate-identity https://github.com/egress-placer/egress-placer/.github/workflows/release.yaml@refs/tags/vX.Y.Z --certificate-oidc-issuer https://token.actions.githubusercontent.com": RELEASED,
    "helm pull oci://ghcr.io/egress-placer/charts/egress-placer --version X.Y.Z": RELEASED,
    "cosign verify ghcr.io/egress-placer/charts/egress-placer@DIGEST --certificate-identity https://github.com/egress-placer/egress-placer/.github/workflows/release.yaml@refs/tags/vX.Y.Z --certificate-oidc-issuer https://token.actions.githubusercontent.com": RELEASED,
}
PLACEHOLDERS = {"NODES PODS TASKRUNS": "10 40 40"}
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

INSTALL = ["kubectl apply -k k8s/", "kubectl -n egress-placer rollout status deploy/egress-placer"]
# The Deployment's pods here are KWOK's: no controller answers the pools API's fail-closed webhook, the
# case k8s/README.md ("The pools API's webhook: fail-closed") says to delete its configuration for.
NO_CONTROLLER_ANSWERS = ["kubectl delete validatingwebhookconfiguration egress-placer-pools"]
# k8s/README.md and docs/pools-api.md, right after the install (the uninstall removes the CRDs and the objects with them).
POOLS_API = [
    "kubectl apply -f config/pools.example.yaml",
    "egress-placer migrate-policy config/policy.example.yaml | kubectl apply -f -",
    "kubectl get egresspools",
    "kubectl explain egresspool.spec.images",
]
UNINSTALL_WITH_THE_COMMAND = ["egress-placer uninstall --dry-run", "egress-placer uninstall --yes"]
UNINSTALL_WITH_KUBECTL = [
    "kubectl -n egress-placer delete deployment egress-placer --ignore-not-found --wait",
    "kubectl -n egress-placer get lease egress-placer-leader --ignore-not-found -o jsonpath='{.spec.holderIdentity}'",
    "kubectl delete -k k8s/ --ignore-not-found --wait",
    "kubectl taint nodes --all egress-placer.io/pool-",
]
AFTERWARDS = [
    "kubectl get daemonsets -A -o jsonpath='{range .items[?(@.metadata.annotations.egress-placer\\.io/pool-tolerations-added)]}"
    "{.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}'",
]
HELM_INSTALL = [
    "helm install egress-placer charts/egress-placer --namespace egress-placer --create-namespace --set createNamespace=false"
    " --set image.repository=registry.example.com/egress-placer",
    "kubectl label namespace egress-placer egress-placer.io/webhook=skip pod-security.kubernetes.io/enforce=restricted",
    "kubectl -n egress-placer rollout status deploy/egress-placer",
]
HELM_UNINSTALL = [
    "helm uninstall egress-placer --namespace egress-placer --wait",
    "EGRESS_PLACER_NAMESPACE=egress-placer egress-placer uninstall --yes",
]
WITHOUT_A_CLUSTER = [
    "python -m bench.scale first-sync-memory NODES PODS TASKRUNS",
    "egress-placer explain --policy <(egress-placer migrate-policy config/policy.example.yaml) devplacer/demo/runs.yaml",
]
# Exit statuses other than 0 that the docs say to expect.
EXPECTED_STATUS = {"kubectl taint nodes --all egress-placer.io/pool-": 1}  # "not found" on the nodes without it
ROUNDS = [  # (install, uninstall), in the order of the docs
    ([*INSTALL, *NO_CONTROLLER_ANSWERS, *POOLS_API], UNINSTALL_WITH_THE_COMMAND),
    ([*INSTALL, *NO_CONTROLLER_ANSWERS, *POOLS_API], UNINSTALL_WITH_KUBECTL),
    (HELM_INSTALL, HELM_UNINSTALL),
]
RUN = [*WITHOUT_A_CLUSTER, *(command for round in ROUNDS for steps in round for command in steps), *AFTERWARDS]


def documented() -> dict[str, str]:
    """Each command of a fenced sh block (comment and prompt stripped) -> the file that shows it."""
    found: dict[str, str] = {}
    for path in DOCS:
        for block in re.findall(r"^```(?:sh|bash|shell|console)\n(.*?)^```", path.read_text(), re.M | re.S):
            for line in block.splitlines():
                command = re.sub(r"\s+#\s.*$", "", line).strip().removeprefix("$ ")
                if command and not command.startswith("#"):
                    found.setdefault(command, str(path.relative_to(REPO)))
    return found


def test_every_documented_command_is_run_or_skipped() -> None:
    shown = documented()
    assert sorted(set(shown) - set(RUN) - set(SKIPPED)) == [], "run them below or say in SKIPPED why not"
    assert sorted((set(RUN) | set(SKIPPED)) - set(shown)) == [], "no longer in the docs: drop them here"


def shell(cluster: Cluster | None, command: str) -> subprocess.CompletedProcess[str]:
    """`command` as a reader types it: bash in the repository, kubectl and helm the local cluster's build's
    (admin), this venv's egress-placer and python first on PATH, no EGRESS_PLACER_* or HELM_* variable
    (Helm's state in a temporary home)."""
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EGRESS_PLACER_", "HELM_"))}
    venv = Path(sys.executable).parent
    tools = [str(venv)]
    if cluster is not None:
        tools += [str(cluster.binary("kubectl").parent), str(helm_binary(cluster.log).parent)]
        env["HELM_CONFIG_HOME"] = env["HELM_CACHE_HOME"] = env["HELM_DATA_HOME"] = str(cluster.dir / "helm-home")
    env["PATH"] = os.pathsep.join([*tools, env.get("PATH", "")])
    if cluster is not None:
        env["KUBECONFIG"] = str(cluster.kubeconfig)
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def run(cluster: Cluster | None, command: str) -> subprocess.CompletedProcess[str]:
    done = shell(cluster, command)
    assert done.returncode == EXPECTED_STATUS.get(command, 0), f"{command}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.parametrize("command", WITHOUT_A_CLUSTER)
def test_commands_without_a_cluster(command: str) -> None:
    run(None, command)


def leftovers(api: Api) -> list[str]:
    """What of egress-placer is on the cluster: the webhook configurations, the namespace, the pools API's
    CRDs, pool taints."""
    things = [
        ("webhook configuration", f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}"),
        ("pools API webhook configuration", f"{VALIDATING_WEBHOOK_CONFIGS}/{POOLS_WEBHOOK_CONFIG}"),
        ("namespace", namespace(NAMESPACE)),
    ]
    things += [(f"CRD {crd['metadata']['name']}", f"{CRDS}/{crd['metadata']['name']}") for crd in custom_resource_definitions()]
    found = [f"{what}{_why_still_there(obj)}" for what, path in things if (obj := api.get(path)) is not None]
    found += [f"taint on {n['metadata']['name']}" for n in api.items(node()) if any(t["key"] == TAINT_KEY for t in n["spec"].get("taints") or [])]
    return found


def _why_still_there(obj: dict) -> str:
    """What an object being deleted waits for (its finalizers, and a CRD's Terminating condition), so a
    timeout says why; "" for one not being deleted."""
    meta = obj.get("metadata") or {}
    if not meta.get("deletionTimestamp"):
        return ""
    waits = [f"{c.get('reason')}: {c.get('message')}" for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Terminating"]
    return f" (being deleted since {meta['deletionTimestamp']}, finalizers {meta.get('finalizers')}{'; ' + '; '.join(waits) if waits else ''})"


def taint_a_pool_node(api: Api) -> None:
    """As a controller that ran leaves a pool node."""
    name = sorted(POOL_NODES)[0]
    taints = api.call("GET", node(name))["spec"].get("taints") or []
    api.merge_patch(node(name), {"spec": {"taints": [*taints, {"key": TAINT_KEY, "value": POOL, "effect": "NoSchedule"}]}})


def pools_api_writable(cluster: Cluster) -> bool:
    """An EgressPool write passes the admission chain (a server-side dry run changes nothing)."""
    command = "egress-placer migrate-policy config/policy.example.yaml | kubectl apply --dry-run=server -f -"
    return shell(cluster, command).returncode == 0


@pytest.fixture
def plain_cluster(devcluster: Cluster, api: Api) -> Iterator[Cluster]:
    """No webhook configuration or CRD conversion of another form (an earlier module's local one) and no namespace
    being deleted."""
    api.delete(f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}")
    api.delete(f"{VALIDATING_WEBHOOK_CONFIGS}/{POOLS_WEBHOOK_CONFIG}")
    adopt_conversion_form(devcluster, [d for d in render_manifests(devcluster) if d.get("kind") == "CustomResourceDefinition"])
    wait_for("no namespace being deleted", lambda: ((api.get(namespace(NAMESPACE)) or {}).get("status") or {}).get("phase") != "Terminating", timeout=180)
    yield devcluster
    remove_pool_taints(api)
    wait_gone(f"namespace {NAMESPACE} to be gone", lambda: namespaces_left(api, NAMESPACE), timeout=180)


@pytest.mark.cluster
@pytest.mark.e2e
def test_install_then_uninstall_four_ways_as_the_docs_say(plain_cluster: Cluster, api: Api) -> None:
    for install, uninstall in ROUNDS:
        for command in install:
            run(plain_cluster, command)
            if command in NO_CONTROLLER_ANSWERS:
                wait_for("the API server to stop calling the deleted webhook", lambda: pools_api_writable(plain_cluster), timeout=60)
        taint_a_pool_node(api)
        for command in uninstall:
            run(plain_cluster, command)
        wait_gone(f"nothing left after {uninstall[-1]!r}", lambda: leftovers(api), timeout=180)
    for command in AFTERWARDS:
        run(plain_cluster, command)
