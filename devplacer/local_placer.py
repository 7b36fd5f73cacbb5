"""egress-placer on the local cluster, run the way it runs in a real one but as local processes.

(`controller/` is the product; `python -m devcluster controller` is the command line that calls
`start_controller`, through `devplacer.commands`.)

`start_controller` applies the `k8s/` manifests (rendered by the cached kubectl's kustomize) except the
Deployment, Service and PDB, points the MutatingWebhookConfiguration at a loopback URL and the pools
API's ValidatingWebhookConfiguration at the same server's `/validate` (`clientConfig.url`; the
controller fills their `caBundle` itself, as in a cluster), installs the given policy file, mints a
kubeconfig for the manifests' ServiceAccount, and starts `egress-placer run` under that identity, one
process per replica. The policy file goes, by `policy_source`, into the policy ConfigMap (`configmap`,
the component `k8s/policy-configmap/`: what most tests use, since they change the policy as a document,
invalid ones included) or in as the objects of the pools API (`pools`, the product's default: the demo,
tests/e2e/test_pools_api.py), which are applied before the pools API's fail-closed webhook (no
controller answers it yet; `egress-placer migrate-policy`'s objects, read by the loader already). It returns once every replica
answers `/readyz` and both webhook configurations have their caBundle. The processes are recorded in the cluster's
state, so `python -m devcluster down` stops them too. With `proxy=True` the webhook URL points at a
round-robin TCP proxy in front of every replica (`devplacer.webhook_proxy`, recorded as
`egress-placer-proxy`), so admission reaches whichever replica is alive, as through a Service.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import requests
import yaml

from controller.core.conversion import V1BETA1, to_version
from controller.core.pools import load_any_policy, objects_from_policy
from controller.core.rights import POD_DELETES_NAME, RIGHTS_NAME
from controller.core.run_guard import RUN_GUARD_NAME
from controller.settings import ONE_ENDPOINT as ONE_ENDPOINT_SETTINGS, env_name
from devcluster.certs import ADMIN_USER
from devcluster.cluster import Cluster, ClusterError
from devcluster.process import free_port

REPO = Path(__file__).resolve().parents[1]
K8S_DIR = REPO / "k8s"
NAMESPACE = "egress-placer"
SERVICE_ACCOUNT = "egress-placer"
POLICY_CONFIGMAP = "egress-placer-policy"
WEBHOOK_CONFIG = "egress-placer"
POOLS_WEBHOOK_CONFIG = "egress-placer-pools"  # the pools API's validating webhook (k8s/pools-webhook.yaml)
# Pointed at the local server: the webhooks, and the pools API's CRDs' conversion (/convert).
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "CustomResourceDefinition")
PROXY_NAME = "egress-placer-proxy"
LOCAL_ONLY_KINDS = {"Deployment", "Service", "PodDisruptionBudget"}  # the controller runs as a local process instead
# The pool guard (k8s/pool-guard.yaml): applied only with `pool_guard=True`, so suites that measure the
# controller's own lines (webhook, evictions) see pods that the API server would otherwise refuse.
POOL_GUARD_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
# The bounds on the controller's own writes (k8s/controller-rights.yaml, objects of those kinds too):
# applied only with `controller_rights=True`, as the pool guard.
CONTROLLER_RIGHTS_NAMES = {RIGHTS_NAME, POD_DELETES_NAME}
# The run guard (k8s/run-guard.yaml): applied only with `run_guard=True`, so suites that change queued runs
# as an administrator would (to test the queue's own lines) are not refused.
READY_TIMEOUT = 60.0
RECORD = "controller"  # what `start_controller` started, kept in the cluster's state (`Cluster.record`)


@dataclass(frozen=True)
class ControllerReplica:
    name: str
    identity: str
    webhook_port: int
    health_port: int

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}"

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}/mutate"


def validate_url(webhook_url: str) -> str:
    """The pools API's validating webhook beside the mutating one (same server, path /validate)."""
    return webhook_url.removesuffix("/mutate") + "/validate"


# The command line of one replica given its environment (see `start_controller`).
Launch = Callable[[ControllerReplica, Mapping[str, str]], Sequence[str]]
# Installs the controller's objects for replicas whose webhook answers at the given URL (see `start_controller`).
Install = Callable[[str], None]


def service_account_user(namespace: str = NAMESPACE) -> str:
    return f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}"


def kustomize(kubectl: Path, components: Sequence[str] = ()) -> list[dict[str, Any]]:
    """`k8s/` rendered by `kubectl kustomize`, through an overlay with `components` (folders of k8s/) if any."""
    with tempfile.TemporaryDirectory(prefix="egress-placer-overlay-") as tmp:
        target = str(K8S_DIR)
        if components:
            base = os.path.relpath(K8S_DIR, tmp)  # kustomize refuses absolute paths
            overlay = {"resources": [base], "components": [f"{base}/{c}" for c in components]}
            (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
            target = tmp
        out = subprocess.run([str(kubectl), "kustomize", target], capture_output=True, text=True, check=False, timeout=120)
    if out.returncode != 0:
        raise ClusterError(f"kubectl kustomize {K8S_DIR} (components: {list(components)}) failed: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def render_manifests(cluster: Cluster, components: Sequence[str] = ()) -> list[dict[str, Any]]:
    return kustomize(cluster.binary("kubectl"), components)


def convert_url(webhook_url: str) -> str:
    """The pools API's conversion webhook beside the mutating one (same server, path /convert)."""
    return webhook_url.removesuffix("/mutate") + "/convert"


def webhooks_calling(doc: Mapping[str, Any], webhook_url: str, ca_bundle: bytes | None = None) -> dict[str, Any]:
    """A copy of a MutatingWebhookConfiguration whose webhooks call `webhook_url` instead of the
    Service, or of the pools API's ValidatingWebhookConfiguration whose webhook calls the same server's
    /validate (with `ca_bundle`, they trust that CA from the start), or of a CRD converted by a webhook
    (the pools API's) whose conversion calls the same server's /convert."""
    doc = json.loads(json.dumps(doc))  # a deep copy
    if doc.get("kind") == "CustomResourceDefinition":
        webhook = ((doc.get("spec") or {}).get("conversion") or {}).get("webhook")
        if webhook is not None:
            ca = base64.b64encode(ca_bundle).decode() if ca_bundle else (webhook.get("clientConfig") or {}).get("caBundle")
            webhook["clientConfig"] = {"url": convert_url(webhook_url), **({"caBundle": ca} if ca else {})}
        return doc
    url = validate_url(webhook_url) if doc.get("kind") == "ValidatingWebhookConfiguration" else webhook_url
    for hook in doc.get("webhooks") or []:
        ca = base64.b64encode(ca_bundle).decode() if ca_bundle else (hook.get("clientConfig") or {}).get("caBundle")
        hook["clientConfig"] = {"url": url, **({"caBundle": ca} if ca else {})}
    return doc


def adopt_conversion_form(cluster: Cluster, crds: Iterable[Mapping[str, Any]]) -> None:
    """Make the installed CRDs among `crds` call their conversion webhook the way `crds` do (a `url`, the
    local form, or a `service`, k8s/'s), before those are applied: an apply that sets one while another field
    manager still owns the other leaves both, which the API server refuses ("exactly one of url or service")."""
    for crd in crds:
        config = (((crd.get("spec") or {}).get("conversion") or {}).get("webhook") or {}).get("clientConfig")
        name = crd["metadata"]["name"]
        if not config or not kubectl(cluster, "get", "crd", name, "--ignore-not-found", "-o", "name").strip():
            continue
        wanted = {"url": config.get("url"), "service": config.get("service")}  # None removes the other form
        kubectl(cluster, "patch", "crd", name, "--type", "merge", "-p", json.dumps({"spec": {"conversion": {"webhook": {"clientConfig": wanted}}}}))


def local_manifests(
    docs: Iterable[Mapping[str, Any]], policy_text: str, webhook_url: str, ca_bundle: bytes | None = None
) -> list[dict[str, Any]]:
    """The manifests as they apply to a controller that runs as a local process (with `ca_bundle`,
    the webhooks trust that CA from the start)."""
    result = []
    for doc in docs:
        doc = json.loads(json.dumps(doc))  # a deep copy
        kind = doc.get("kind")
        if kind in LOCAL_ONLY_KINDS:
            continue
        if kind in WEBHOOK_KINDS:
            doc = webhooks_calling(doc, webhook_url, ca_bundle)
        if kind == "ConfigMap" and doc["metadata"]["name"] == POLICY_CONFIGMAP:
            doc["data"] = {"policy.yaml": policy_text}
        result.append(doc)
    return result


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None, kubeconfig: Path | None = None) -> str:
    out = subprocess.run(
        [str(cluster.binary("kubectl")), "--kubeconfig", str(kubeconfig or cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


def await_namespace_deleted(cluster: Cluster, name: str, timeout: float = 300.0) -> None:
    """A namespace being deleted refuses new content ("unable to create new content in namespace ... because
    it is being terminated"): if `name` is terminating (an uninstall just before), wait until it is gone."""
    deleting = kubectl(cluster, "get", "namespace", name, "--ignore-not-found", "-o", "jsonpath={.metadata.deletionTimestamp}").strip()
    if deleting:
        kubectl(cluster, "wait", "--for=delete", f"namespace/{name}", f"--timeout={int(timeout)}s")


def pool_objects(policy_text: str, source: str = "<policy>") -> list[dict[str, Any]]:
    """The pools API's objects of a policy file in either form (a PlacementPolicy document, or the
    objects themselves), as the loader reads it: `egress-placer migrate-policy --api-version v1beta1`'s
    objects (the storage version: written with no conversion, so also while no controller answers)."""
    return [to_version(o, V1BETA1) for o in objects_from_policy(load_any_policy(policy_text, source))]


def install_pools(cluster: Cluster, objects: Sequence[Mapping[str, Any]], timeout: float = 30.0) -> None:
    """Make `objects` the pools API's objects (others deleted), with no controller to answer the pools
    API's webhook: its configuration is deleted first and applied again afterwards (with the rest of the
    manifests, by the caller); the objects come from the loader, which the webhook would run."""
    kubectl(cluster, "delete", "validatingwebhookconfiguration", POOLS_WEBHOOK_CONFIG, "--ignore-not-found")
    for crd in ("egresspools.egress-placer.io", "egressplacerconfigs.egress-placer.io"):
        kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}")
    wanted = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for plural, kind in (("egresspools", "EgressPool"), ("egressplacerconfigs", "EgressPlacerConfig")):
        for listed in json.loads(kubectl(cluster, "get", plural, "-o", "json"))["items"]:
            if (kind, listed["metadata"]["name"]) not in wanted:
                kubectl(cluster, "delete", plural, listed["metadata"]["name"], "--ignore-not-found")
    if not objects:
        return
    text = yaml.safe_dump_all([dict(o) for o in objects])
    deadline = time.monotonic() + timeout
    while True:  # the API server's cache of webhook configurations may call the deleted one a moment longer
        try:
            kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=text)
            return
        except ClusterError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def apply_policy(cluster: Cluster, policy_text: str) -> None:
    """Replace the policy ConfigMap's content (the running controller reloads it)."""
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": POLICY_CONFIGMAP, "namespace": NAMESPACE},
        "data": {"policy.yaml": policy_text},
    }
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(cm))


def replicas_of(cluster: Cluster) -> list[ControllerReplica]:
    return [ControllerReplica(**r) for r in (cluster.recorded(RECORD) or {}).get("replicas", [])]


def start_controller(
    cluster: Cluster,
    policy_file: Path,
    *,
    replicas: int = 1,
    env: Mapping[str, str] | None = None,
    webhook_port: int | None = None,
    proxy: bool = False,
    ca_bundle: bytes | None = None,
    pool_guard: bool = False,
    controller_rights: bool = False,
    run_guard: bool = False,
    launch: Launch | None = None,
    install: Install | None = None,
    policy_source: str = "configmap",
    ready_timeout: float = READY_TIMEOUT,
    namespace: str = NAMESPACE,
) -> list[ControllerReplica]:
    """Install the manifests (local form) and start `replicas` controller processes; see the module docstring.

    The webhook URL points at the first replica's port (the API server calls one URL), or with `proxy`
    at a round-robin proxy (on `webhook_port` if given) in front of all of them; every replica serves
    admission on its own port, and they elect one leader for taints and evictions. `ca_bundle`: the
    serving certificate is kept by someone else (`env` names its files, cert-manager's way); the
    webhooks trust this CA from the start, as cert-manager's CA injector would make them. `pool_guard`:
    also install the pool guard (ValidatingAdmissionPolicy and binding of `k8s/pool-guard.yaml`).
    `controller_rights`: also install the policies that bound the controller's own writes, and their
    bindings (`k8s/controller-rights.yaml`); the replicas run as the controller's ServiceAccount, so they
    hold for them. `run_guard`: also install the run guard (`k8s/run-guard.yaml`).
    `launch`: the command line of a replica given its environment, instead of this checkout's
    `python -m controller run` (e.g. a container of the image: `devplacer.image.ControllerContainer`).
    `install`: installs the objects given the webhook URL, instead of applying `k8s/` in its local form
    (e.g. the Helm chart: `devplacer.chart.Release.install`); the policy is then whatever it installs.
    `policy_source`: the policy file into the ConfigMap (`configmap`) or as pools API objects (`pools`);
    see the module docstring. `env` may still set EGRESS_PLACER_POLICY_SOURCE itself. `ready_timeout`:
    how long the replicas may take to report ready (their first list of the cluster's objects).
    `namespace`: the controller's, where `install` put it (e.g. the chart's release namespace); the replicas
    run as the ServiceAccount egress-placer there. If it is still terminating (an uninstall just before), this
    waits until it is gone first: a terminating namespace refuses new content.
    """
    if policy_source not in ("configmap", "pools"):
        raise ValueError(f"policy_source is configmap or pools, not {policy_source!r}")
    if not cluster.state():
        raise ClusterError(f"no cluster in {cluster.dir}: run `python -m devcluster up --dir {cluster.dir}` first")
    policy_text = Path(policy_file).read_text()
    proxy_port = (webhook_port or free_port()) if proxy else None
    ports = [(None if proxy else webhook_port) or free_port()] + [free_port() for _ in range(replicas - 1)]
    planned = [
        ControllerReplica(name=f"egress-placer-{i}", identity=f"egress-placer-{i}", webhook_port=ports[i], health_port=free_port())
        for i in range(replicas)
    ]
    webhook_url = f"https://127.0.0.1:{proxy_port}/mutate" if proxy_port else planned[0].webhook_url
    if proxy_port:
        backends = [arg for r in planned for arg in ("--backend", f"127.0.0.1:{r.webhook_port}")]
        cluster.start_process(
            PROXY_NAME,
            [sys.executable, "-m", "devplacer.webhook_proxy", "--listen", f"127.0.0.1:{proxy_port}", *backends],
            {"PYTHONPATH": str(REPO)},
            port=proxy_port,
        )
    await_namespace_deleted(cluster, namespace)
    if install is not None:
        install(webhook_url)
    else:
        components = ("policy-configmap",) if policy_source == "configmap" else ()
        docs = local_manifests(render_manifests(cluster, components), policy_text, webhook_url, ca_bundle)
        adopt_conversion_form(cluster, [d for d in docs if d.get("kind") == "CustomResourceDefinition"])
        docs = [d for d in docs if controller_rights or d.get("metadata", {}).get("name") not in CONTROLLER_RIGHTS_NAMES]
        docs = [d for d in docs if d.get("kind") not in POOL_GUARD_KINDS or d["metadata"]["name"] in CONTROLLER_RIGHTS_NAMES
                or (run_guard if d["metadata"]["name"] == RUN_GUARD_NAME else pool_guard)]
        if policy_source == "pools":
            objects = pool_objects(policy_text, str(policy_file))  # refused here when the file is invalid
            guarded = [d for d in docs if d.get("kind") == "ValidatingWebhookConfiguration"]
            rest = [d for d in docs if d.get("kind") != "ValidatingWebhookConfiguration"]
            kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump_all(rest))
            install_pools(cluster, objects)
            docs = guarded
        kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump_all(docs))
    kubeconfig = cluster.mint_kubeconfig(service_account_user(namespace))
    # One endpoint (no proxy: the webhook URL is replica 0's): nothing to spread, no connection recycling, as
    # the chart does with one replica (config/settings.md). `env` still decides.
    one_endpoint = {} if proxy_port else ONE_ENDPOINT
    for replica in planned:
        replica_env = {**controller_env(replica, kubeconfig), "EGRESS_PLACER_NAMESPACE": namespace, "EGRESS_PLACER_POLICY_SOURCE": policy_source,
                       **one_endpoint, **(env or {})}
        cluster.start_process(
            replica.name,
            launch(replica, replica_env) if launch else [sys.executable, "-m", "controller", "run"],
            replica_env,
            port=replica.webhook_port,
            health_url=replica.health_url + "/healthz",
        )
    cluster.record(
        RECORD,
        {"replicas": [r.__dict__ for r in planned], "policy": str(Path(policy_file).resolve()), "webhook_url": webhook_url},
    )
    wait_ready(cluster, planned, ready_timeout)
    return planned


# controller.settings.ONE_ENDPOINT as variables (charts/egress-placer/templates/deployment.yaml sets the same, replicas 1).
ONE_ENDPOINT = {env_name(field): str(value) for field, value in ONE_ENDPOINT_SETTINGS.items()}

# Short leader timings: the local cluster has no network delays to absorb.
LEADER_TIMINGS = {
    "EGRESS_PLACER_LEASE_DURATION_SECONDS": "6",
    "EGRESS_PLACER_RENEW_DEADLINE_SECONDS": "4",
    "EGRESS_PLACER_RETRY_PERIOD_SECONDS": "1",
}


def controller_env(replica: ControllerReplica, kubeconfig: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("EGRESS_PLACER_")},
        "PYTHONPATH": str(REPO),
        "EGRESS_PLACER_KUBECONFIG": str(kubeconfig),
        "EGRESS_PLACER_NAMESPACE": NAMESPACE,
        "EGRESS_PLACER_IDENTITY": replica.identity,
        "EGRESS_PLACER_WEBHOOK_HOST": "127.0.0.1",
        "EGRESS_PLACER_WEBHOOK_PORT": str(replica.webhook_port),
        "EGRESS_PLACER_HEALTH_HOST": "127.0.0.1",
        "EGRESS_PLACER_HEALTH_PORT": str(replica.health_port),
        "EGRESS_PLACER_TLS_HOSTS": json.dumps(["127.0.0.1", "localhost"]),
        "EGRESS_PLACER_LOG_FORMAT": "json",
        # The local cluster runs Tekton's controller with its admin certificate, not a ServiceAccount.
        "EGRESS_PLACER_TEKTON_CONTROLLER_USER": ADMIN_USER,
        **LEADER_TIMINGS,
    }


def wait_ready(cluster: Cluster, replicas: Iterable[ControllerReplica], timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    pending = list(replicas)
    while pending and time.monotonic() < deadline:
        for replica in list(pending):
            record = cluster.process(replica.name)
            if record is None or not record.alive():
                log = cluster.dir / "logs" / f"{replica.name}.log"
                tail = log.read_text()[-4000:] if log.exists() else ""
                raise ClusterError(f"{replica.name} exited while starting; log tail:\n{tail}")
            try:
                if requests.get(replica.health_url + "/readyz", timeout=2).status_code == 200:
                    pending.remove(replica)
            except requests.RequestException:
                pass
        time.sleep(0.3)
    if pending:
        names = ", ".join(r.name for r in pending)
        tails = "\n".join(
            (cluster.dir / "logs" / f"{r.name}.log").read_text()[-3000:] for r in pending if (cluster.dir / "logs" / f"{r.name}.log").exists()
        )
        raise ClusterError(f"{names} not ready within {timeout:.0f}s; log tail:\n{tails}")
    # Both webhook configurations, the pools API's too: until it has its caBundle, EgressPool writes fail.
    configs = [("mutatingwebhookconfiguration", WEBHOOK_CONFIG), ("validatingwebhookconfiguration", POOLS_WEBHOOK_CONFIG)]
    while time.monotonic() < deadline:
        if all(_has_ca_bundle(cluster, kind, name) for kind, name in configs) and _crds_have_ca_bundle(cluster):
            return
        time.sleep(0.3)
    raise ClusterError(
        f"the webhook configurations {WEBHOOK_CONFIG}, {POOLS_WEBHOOK_CONFIG} or the pools API's CRDs got no caBundle within {timeout:.0f}s"
    )


def _crds_have_ca_bundle(cluster: Cluster) -> bool:
    """Each pools API CRD that converts by a webhook has its caBundle (True when none is installed)."""
    listed = json.loads(kubectl(cluster, "get", "crd", "-l", "app.kubernetes.io/part-of=egress-placer", "-o", "json"))["items"]
    hooks = [((c["spec"].get("conversion") or {}).get("webhook") or {}) for c in listed]
    return all((h.get("clientConfig") or {}).get("caBundle") for h in hooks if h)


def _has_ca_bundle(cluster: Cluster, kind: str, name: str) -> bool:
    """Every webhook of the configuration has a caBundle (True when it is not installed: nothing to wait for)."""
    listed = json.loads(kubectl(cluster, "get", kind, "--field-selector", f"metadata.name={name}", "-o", "json"))["items"]
    return all((h.get("clientConfig") or {}).get("caBundle") for c in listed for h in c.get("webhooks") or [])


def stop_controller(cluster: Cluster) -> None:
    for replica in replicas_of(cluster):
        cluster.stop_process(replica.name)
    cluster.stop_process(PROXY_NAME)
