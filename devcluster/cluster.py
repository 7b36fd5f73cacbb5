"""A real Kubernetes control plane with Tekton on fake (KWOK) nodes, all as local processes.

`Cluster(dir)` owns one cluster directory:

    DIR/kubeconfig          cluster-admin kubeconfig (embedded certificates)
    DIR/cluster.json        ports, paths, owner and every process started (pid + start time)
    DIR/pids/NAME.pid       one pid file per process
    DIR/logs/NAME.log       each process's output
    DIR/pki/                CA, serving certs, service-account key
    DIR/etcd/               etcd data

Every process listens on 127.0.0.1 only, except the profiling servers of Tekton's controller and
webhook, which knative binds on all interfaces (an ephemeral port; see README). Processes are
stopped by pid, never by name. `optional=("tekton-webhook",)` (`up --with tekton-webhook`) also runs
Tekton's own webhook (`devcluster.tekton_webhook`); `karpenter`, `kueue` and `tekton-kueue` run the
platform components egress-placer must coexist with (`devcluster.karpenter`, `devcluster.kueue`).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import requests
import tenacity
import yaml

from devcluster import build, certs, karpenter, kueue, kyverno, tekton_resolvers, tekton_webhook
from devcluster.process import ProcessRecord, free_port, is_alive, listens, spawn, start_time_of, stop

Log = Callable[[str], None]

EGRESS_POOL_LABEL = "egress-placer.io/pool"
EGRESS_POOL = "overseas"
KWOK_NODE_SELECTOR = "type=kwok"
TEKTON_NAMESPACE = "tekton-pipelines"
PROBE_NAMESPACE = "devcluster-probe"
POD_SECONDS_ENV = "EGRESS_PLACER_DEVCLUSTER_POD_SECONDS"
DEFAULT_POD_SECONDS = 1.5
STAGES_FILE = Path(__file__).resolve().parent / "kwok-stages.yaml"
# Optional components `up` can run besides the core (`--with NAME`), each built by `build.ensure_optional`.
UP_OPTIONAL = (tekton_webhook.NAME, tekton_resolvers.NAME, karpenter.NAME, kueue.NAME, kueue.TEKTON_KUEUE, kyverno.NAME)
# Ports of the optional components, picked with the core's.
_OPTIONAL_PORTS = {
    tekton_webhook.NAME: tekton_webhook.PORTS, tekton_resolvers.NAME: tekton_resolvers.PORTS,
    karpenter.NAME: karpenter.PORTS, kueue.NAME: kueue.PORTS, kueue.TEKTON_KUEUE: kueue.TEKTON_KUEUE_PORTS,
    kyverno.NAME: kyverno.PORTS,
}
# The launcher's own entries of DIR/cluster.json (`up` writes them); tools keep theirs with `Cluster.record`.
_LAUNCHER_KEYS = frozenset({
    "dir", "api_url", "kubeconfig", "ca_file", "bin_dir", "tekton_config", "optional", "ports", "nodes",
    "egress_nodes", "pod_seconds", "owner", "processes", "versions",
})
# Tekton's version ConfigMap: its source says "devel", a release stamps the version (`install_tekton_config` does).
PIPELINES_INFO = "config-info.yaml"
# Stop order: clients of the API server first, then the API server, then etcd.
_CONTROL_PLANE = ("kube-apiserver", "etcd")
_CONTROLLERS = (
    "serviceaccount-controller,serviceaccount-token-controller,namespace-controller,garbage-collector-controller,"
    "node-lifecycle-controller,taint-eviction-controller,root-ca-certificate-publisher-controller,"
    "clusterrole-aggregation-controller,replicaset-controller,deployment-controller,statefulset-controller,"
    "daemonset-controller,job-controller,ttl-after-finished-controller,pod-garbage-collector-controller,"
    "disruption-controller,endpointslice-controller,resourcequota-controller"
)


class ClusterError(RuntimeError):
    """A component did not come up (the message carries its log tail) or the cluster is unusable."""


# `up` picks free ports, then starts the components on them: a neighbour can take one in between.
BIND_ATTEMPTS = 3  # sets of fresh ports `up` tries when a component exits because its port was taken
_GO_BIND_FAILURE = re.compile(r"listen tcp \S+: bind: address already in use")
_BIND_FAILURE = re.compile(r"^.*address already in use.*$", re.IGNORECASE | re.MULTILINE)


class PortTaken(ClusterError):
    """A component exited because another process bound the port picked for it first."""

    def __init__(self, component: str, line: str, message: str) -> None:
        super().__init__(message)
        self.component = component
        self.line = line


def bind_failure(log_text: str) -> str | None:
    """What a component's log says about its port being taken, if it does: Go's `listen tcp ADDR: bind:
    address already in use`, or else the line that says `address already in use`."""
    found = _GO_BIND_FAILURE.search(log_text) or _BIND_FAILURE.search(log_text)
    return found.group(0).strip() if found else None


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int
    alive: bool
    healthy: bool
    port: int | None


def _tail(path: str | Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def pod_seconds_default() -> float:
    """Seconds a Tekton pod runs on a fake node: env EGRESS_PLACER_DEVCLUSTER_POD_SECONDS or 1.5."""
    return float(os.environ.get(POD_SECONDS_ENV) or DEFAULT_POD_SECONDS)


def render_stages(pod_seconds: float) -> str:
    """The KWOK stages with the run time of Tekton (and Job) pods set to `pod_seconds`."""
    stages = list(yaml.safe_load_all(STAGES_FILE.read_text()))
    for stage in stages:
        if stage["metadata"]["name"] in ("tekton-pod-complete", "job-pod-complete"):
            stage["spec"]["delay"]["durationMilliseconds"] = int(pod_seconds * 1000)
    return yaml.dump_all(stages, Dumper=_LiteralDumper, sort_keys=False)


class _LiteralDumper(yaml.SafeDumper):
    """Dumps multi-line strings (the stage templates) as literal blocks."""


_LiteralDumper.add_representer(
    str,
    lambda dumper, s: dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


def node_manifest(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """A fake node KWOK manages: Ready once KWOK sees it, no taints, room for 110 pods."""
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"allocatable": resources, "capacity": resources},
    }


@dataclass(frozen=True)
class Command:
    """How to start one component: what `start_process` gets."""

    name: str
    argv: list[str]
    port: int
    health_url: str
    env: dict[str, str] | None = None


def etcd_command(artifacts: build.Artifacts, directory: Path, ports: Mapping[str, int]) -> Command:
    client_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
    argv = [
        str(artifacts.binary("etcd")), "--name=devcluster", f"--data-dir={directory / 'etcd'}",
        f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=devcluster={peer_url}", "--unsafe-no-fsync=true",
        "--quota-backend-bytes=8589934592", "--log-level=warn",
    ]
    return Command("etcd", argv, ports["etcd"], f"{client_url}/health")


def apiserver_command(artifacts: build.Artifacts, pki: certs.Pki, ports: Mapping[str, int]) -> Command:
    port = ports["kube-apiserver"]
    argv = [
        str(artifacts.binary("kube-apiserver")), f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
        f"--cert-dir={pki.dir}", f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}", "--authorization-mode=RBAC", "--anonymous-auth=false",
        "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        "--endpoint-reconciler-type=none",
        "--max-requests-inflight=0", "--max-mutating-requests-inflight=0", "--enable-priority-and-fairness=false",
    ]
    return Command("kube-apiserver", argv, port, f"https://127.0.0.1:{port}/readyz")


def _component_flags(name: str, pki: certs.Pki, kubeconfig: Path, port: int) -> list[str]:
    """Flags kube-controller-manager and kube-scheduler share: identity, loopback HTTPS, no leader election."""
    return [
        f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        "--authentication-skip-lookup=true", f"--client-ca-file={pki.ca_cert}",
        f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1",
        f"--secure-port={port}", f"--tls-cert-file={pki.dir / (name + '.crt')}",
        f"--tls-private-key-file={pki.dir / (name + '.key')}", "--kube-api-qps=200", "--kube-api-burst=400",
    ]


def controller_manager_command(
    artifacts: build.Artifacts, pki: certs.Pki, kubeconfig: Path, ports: Mapping[str, int]
) -> Command:
    name, port = "kube-controller-manager", ports["kube-controller-manager"]
    argv = [
        str(artifacts.binary(name)), *_component_flags(name, pki, kubeconfig, port), f"--controllers={_CONTROLLERS}",
        f"--service-account-private-key-file={pki.service_account_key}", f"--root-ca-file={pki.ca_cert}",
        "--concurrent-gc-syncs=10",
    ]
    return Command(name, argv, port, f"https://127.0.0.1:{port}/healthz")


def scheduler_command(
    artifacts: build.Artifacts, pki: certs.Pki, kubeconfig: Path, ports: Mapping[str, int]
) -> Command:
    name, port = "kube-scheduler", ports["kube-scheduler"]
    argv = [str(artifacts.binary(name)), *_component_flags(name, pki, kubeconfig, port)]
    return Command(name, argv, port, f"https://127.0.0.1:{port}/healthz")


def kwok_command(artifacts: build.Artifacts, directory: Path, kubeconfig: Path, ports: Mapping[str, int]) -> Command:
    port = ports["kwok"]
    argv = [
        str(artifacts.binary("kwok")), f"--kubeconfig={kubeconfig}", "--manage-all-nodes=false",
        f"--manage-nodes-with-label-selector={KWOK_NODE_SELECTOR}", f"--config={directory / 'kwok.yaml'}",
        f"--server-address=127.0.0.1:{port}", "--node-lease-duration-seconds=40",
        "--cidr=10.128.0.1/16", "--node-ip=10.127.0.1",
    ]
    return Command("kwok", argv, port, f"http://127.0.0.1:{port}/healthz")


def tekton_command(artifacts: build.Artifacts, kubeconfig: Path, ports: Mapping[str, int]) -> Command:
    """Flags and environment per upstream's config/controller.yaml; images are never pulled."""
    port = ports["tekton-probes"]
    env = {
        "SYSTEM_NAMESPACE": TEKTON_NAMESPACE,
        "KUBERNETES_MIN_VERSION": "v1.28.0",
        "CONFIG_DEFAULTS_NAME": "config-defaults",
        "CONFIG_LOGGING_NAME": "config-logging",
        "CONFIG_OBSERVABILITY_NAME": "config-observability",
        "CONFIG_FEATURE_FLAGS_NAME": "feature-flags",
        "CONFIG_LEADERELECTION_NAME": "config-leader-election-controller",
        "CONFIG_SPIRE": "config-spire",
        "METRICS_DOMAIN": "tekton.dev/pipeline",
        "PROBES_ADDRESS": f"127.0.0.1:{port}",
        # knative binds the profiling server to ":PORT" (all interfaces); 0 = an ephemeral port,
        # and it answers 404 unless runtime-profiling is enabled in config-observability.
        "PROFILING_PORT": "0",
        "METRICS_PROMETHEUS_HOST": "127.0.0.1",
        "METRICS_PROMETHEUS_PORT": str(ports["tekton-metrics"]),
    }
    image = "devcluster.invalid/tekton"
    argv = [
        str(artifacts.binary("tekton-controller")), f"-kubeconfig={kubeconfig}", "-disable-ha",
        "-kube-api-qps=50", "-kube-api-burst=100", "-threads-per-controller=4",
        f"-entrypoint-image={image}/entrypoint", f"-nop-image={image}/nop",
        f"-sidecarlogresults-image={image}/sidecarlogresults", f"-shell-image={image}/busybox",
        f"-shell-image-win={image}/powershell", f"-workingdirinit-image={image}/workingdirinit",
    ]
    return Command("tekton-controller", argv, port, f"http://127.0.0.1:{port}/health", env)


def tekton_webhook_command(bin_dir: Path, kubeconfig: Path, ports: Mapping[str, int]) -> Command:
    """Tekton's webhook: environment per upstream's config/webhook.yaml, loopback ports (see `tekton_webhook`)."""
    env = tekton_webhook.command_env(TEKTON_NAMESPACE, ports)
    port = ports["tekton-webhook-probes"]
    argv = tekton_webhook.command_argv(bin_dir, kubeconfig)
    return Command(tekton_webhook.NAME, argv, port, f"http://127.0.0.1:{port}/health", env)


def tekton_resolvers_command(bin_dir: Path, kubeconfig: Path, ports: Mapping[str, int]) -> Command:
    """Tekton's resolvers controller: environment per upstream's resolvers-deployment.yaml, loopback ports."""
    port = ports["tekton-resolvers-probes"]
    argv = tekton_resolvers.command_argv(bin_dir, kubeconfig)
    return Command(tekton_resolvers.NAME, argv, port, f"http://127.0.0.1:{port}/health", tekton_resolvers.command_env(ports))


def probe_taskrun(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "TaskRun",
        "metadata": {"name": name, "namespace": PROBE_NAMESPACE},
        "spec": {"taskSpec": {"steps": [{"name": "probe", "image": "busybox", "script": "true"}]}},
    }


def served_storage_version_only(crd: dict[str, Any]) -> dict[str, Any]:
    """A CRD that serves only its storage version and needs no conversion webhook.

    Tekton's CRDs convert between versions through Tekton's webhook, which the devcluster does
    not run. Serving the other versions anyway makes the API server keep a watch cache per
    version that fails to convert on every change (log noise and CPU), so they are not served.
    """
    versions = crd["spec"]["versions"]
    if len(versions) < 2:
        return crd
    spec = {**crd["spec"], "conversion": {"strategy": "None"}}
    spec["versions"] = [{**v, "served": bool(v.get("storage"))} for v in versions]
    return {**crd, "spec": spec}


def _registry_entry(directory: Path) -> Path:
    digest = hashlib.sha256(str(directory).encode()).hexdigest()[:16]
    return build.cache_root() / "clusters" / f"{digest}.json"


def reap_stale_clusters(log: Log = print) -> list[Path]:
    """Bring down clusters whose owner process died (e.g. a killed pytest run); return their dirs."""
    reaped = []
    for entry in sorted((build.cache_root() / "clusters").glob("*.json")):
        try:
            data = json.loads(entry.read_text())
        except (OSError, ValueError):
            entry.unlink(missing_ok=True)
            continue
        owner = data.get("owner")
        directory = Path(data["dir"])
        if owner and is_alive(owner["pid"], owner["start_time"]):
            continue
        if not owner and (directory / "cluster.json").exists():
            continue  # started from the command line: lives until `down`
        log(f"[devcluster] reaping a cluster whose owner is gone: {directory}")
        Cluster(directory, log=log).down()
        entry.unlink(missing_ok=True)
        reaped.append(directory)
    return reaped


def _http_ok(url: str) -> bool:
    session = requests.Session()
    session.trust_env = False
    try:
        return session.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


class _Api:
    """Minimal JSON client for the launcher's own calls (admin client certificate)."""

    def __init__(self, url: str, ca: Path, cert: Path, key: Path) -> None:
        self.url = url
        self.session = requests.Session()
        self.session.trust_env = False  # else REQUESTS_CA_BUNDLE overrides `verify` (psf/requests#3829)
        self.session.verify = str(ca)
        self.session.cert = (str(cert), str(key))

    def get(self, path: str) -> dict[str, Any] | None:
        resp = self.session.get(self.url + path, timeout=5)
        if resp.status_code == 404:
            return None
        resp.raise_for_status()
        return resp.json()

    def create(self, path: str, body: Mapping[str, Any]) -> None:
        resp = self.session.post(self.url + path, json=body, timeout=10)
        if resp.status_code != 409:
            resp.raise_for_status()

    def delete(self, path: str) -> None:
        resp = self.session.delete(self.url + path, timeout=10)
        if resp.status_code != 404:
            resp.raise_for_status()

    def ok(self, path: str) -> bool:
        try:
            return self.session.get(self.url + path, timeout=2).status_code == 200
        except requests.RequestException:
            return False


class Cluster:
    """One local cluster, identified by its directory."""

    def __init__(
        self,
        directory: str | Path,
        *,
        nodes: int = 3,
        egress_nodes: int = 3,
        pod_seconds: float | None = None,
        log: Log = print,
        optional: Sequence[str] = (),
    ) -> None:
        """`optional`: components of `UP_OPTIONAL` that `up` starts too (e.g. "tekton-webhook"), with what they
        imply (`build.IMPLIED`: tekton-kueue needs kueue)."""
        unknown = sorted(set(optional) - set(UP_OPTIONAL))
        if unknown:
            raise ClusterError(f"no optional component {', '.join(unknown)} to run; known: {', '.join(UP_OPTIONAL)}")
        self.optional = build.with_implied(optional)
        self.dir = Path(directory).resolve()
        self.nodes = nodes
        self.egress_nodes = egress_nodes
        self.pod_seconds = pod_seconds_default() if pod_seconds is None else pod_seconds
        self.log = log
        self.pki = certs.Pki(self.dir / "pki")

    # ---- paths and recorded state -------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.pki.ca_cert

    @property
    def state_file(self) -> Path:
        return self.dir / "cluster.json"

    @property
    def api_url(self) -> str:
        return self.state()["api_url"]

    def state(self) -> dict[str, Any]:
        """The contents of DIR/cluster.json ({} when no cluster was brought up here)."""
        try:
            return json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}

    def processes(self) -> list[ProcessRecord]:
        return [ProcessRecord.from_dict(p) for p in self.state().get("processes", [])]

    def process(self, name: str) -> ProcessRecord | None:
        return next((p for p in self.processes() if p.name == name), None)

    def runs_with(self, name: str) -> bool:
        """Whether this cluster was brought up with optional component `name` (`up --with NAME`)."""
        return name in self.state().get("optional", {})

    def binary(self, name: str) -> Path:
        """Path of a cached binary (kubectl, kube-apiserver, ...)."""
        return Path(self.state()["bin_dir"]) / name

    def record(self, key: str, value: Any) -> None:
        """Keep `value` (JSON) under `key` in DIR/cluster.json, for a tool that runs on this cluster
        (what it started there, how to reach it); `recorded(key)` reads it back. The launcher's own
        keys (ports, processes, ...) are not a tool's to write."""
        if key in _LAUNCHER_KEYS:
            raise ValueError(f"{key!r} is the launcher's own entry in {self.state_file}")
        with self._locked_state() as state:
            if not state:
                raise ClusterError(f"no cluster in {self.dir}")
            state[key] = value

    def recorded(self, key: str) -> Any:
        """What a tool `record`ed under `key` (None when nothing was)."""
        return None if key in _LAUNCHER_KEYS else self.state().get(key)

    @contextlib.contextmanager
    def _locked_state(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write DIR/cluster.json under a file lock (other processes may add to it)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self.state()
            yield state
            tmp = self.state_file.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(state, indent=2) + "\n")
            os.replace(tmp, self.state_file)

    def is_running(self) -> bool:
        procs = self.processes()
        return bool(procs) and all(p.alive() for p in procs)

    # ---- processes --------------------------------------------------------------------------
    def _owned_by_me(self) -> bool:
        owner = self.state().get("owner")
        return bool(owner) and owner["pid"] == os.getpid()

    def start_process(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        port: int | None = None,
        health_url: str | None = None,
    ) -> ProcessRecord:
        """Start a process and record it (pid file, cluster.json) so `down` stops it too."""
        current = self.process(name)
        if current is not None and current.alive():
            raise ClusterError(f"{name} already runs (pid {current.pid})")
        extra = {"health_url": health_url} if health_url else {}
        record = spawn(
            name,
            argv,
            self.dir / "logs" / f"{name}.log",
            env,
            port=port,
            die_with_parent=self._owned_by_me(),
            extra=extra,
        )
        with self._locked_state() as state:
            state["processes"] = [p for p in state.get("processes", []) if p["name"] != name] + [record.to_dict()]
        (self.dir / "pids").mkdir(exist_ok=True)
        (self.dir / "pids" / f"{name}.pid").write_text(f"{record.pid}\n")
        return record

    def stop_process(self, name: str, timeout: float = 10.0) -> None:
        """Stop one recorded process (SIGTERM, then SIGKILL) and forget it."""
        record = self.process(name)
        if record is None:
            return
        left = stop([record], timeout)
        if left:
            raise ClusterError(f"{name} (pid {record.pid}) survived SIGKILL")
        with self._locked_state() as state:
            state["processes"] = [p for p in state.get("processes", []) if p["name"] != name]
        (self.dir / "pids" / f"{name}.pid").unlink(missing_ok=True)

    # ---- certificates -----------------------------------------------------------------------
    def mint_kubeconfig(self, user: str, groups: Sequence[str] | None = None, out: str | Path | None = None) -> Path:
        """A kubeconfig whose client certificate says CN=`user`, O=`groups` (ServiceAccount groups
        by default for `system:serviceaccount:NS:NAME`), signed by the cluster's client CA."""
        groups = certs.service_account_groups(user) if groups is None else tuple(groups)
        credentials = certs.issue_client_cert(self.pki, user, groups)
        path = Path(out) if out else self.dir / "users" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", user) + ".kubeconfig")
        return certs.write_kubeconfig(path.resolve(), self.api_url, self.pki, user, credentials)

    def serving_cert(self, name: str, dns_names: Sequence[str] = ("localhost",)) -> tuple[Path, Path]:
        """A TLS serving certificate for 127.0.0.1 signed by the cluster CA (e.g. for an admission
        webhook registered with `clientConfig.url: https://127.0.0.1:PORT/...` and `caBundle` =
        the contents of `ca_file`). Returns (cert, key) paths under DIR/pki/."""
        issued = certs.issue_serving_cert(self.pki, name, dns_names=dns_names)
        cert, key = self.pki.dir / f"{name}.crt", self.pki.dir / f"{name}.key"
        key.touch(mode=0o600, exist_ok=True)
        key.write_bytes(issued.key_pem)
        cert.write_bytes(issued.cert_pem)
        return cert, key

    # ---- up ---------------------------------------------------------------------------------
    def up(self, owner_pid: int | None = None) -> None:
        """Build if needed, start every component and return once Tekton ran a probe TaskRun.

        `owner_pid`: the process whose death means the cluster must go (the pytest run); its
        children get SIGTERM when it dies, and the next `up` reaps what is left.
        """
        if self.nodes < 0 or self.egress_nodes < 0 or self.nodes + self.egress_nodes == 0:
            raise ClusterError("the cluster needs at least one node")
        reap_stale_clusters(self.log)
        if any(p.alive() for p in self.processes()):
            raise ClusterError(f"a cluster already runs in {self.dir}; run `down` first")
        started = time.monotonic()
        artifacts = build.ensure_built(self.log)
        optional = {name: str(build.ensure_optional(name, self.log)) for name in self.optional}
        # A port taken between picking and binding: start again on fresh ports, a bounded number of times.
        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(PortTaken),
            stop=tenacity.stop_after_attempt(BIND_ATTEMPTS),
            before_sleep=self._on_port_taken,
            reraise=True,
        ):
            with attempt:
                self._prepare(artifacts, owner_pid, optional)
                try:
                    self._start_all(artifacts)
                except BaseException as err:
                    self.log(f"[devcluster] {type(err).__name__}: stopping what was started")
                    self.down()
                    raise
        self.log(f"[devcluster] up in {time.monotonic() - started:.1f} s: {self.api_url}")

    def _on_port_taken(self, state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        assert isinstance(error, PortTaken)
        self.log(
            f"[devcluster] {error.component} could not bind its port ({error.line}): another process took it "
            f"after it was picked; starting again on fresh ports (attempt {state.attempt_number + 1} of {BIND_ATTEMPTS})"
        )

    def _prepare(self, artifacts: build.Artifacts, owner_pid: int | None, optional: Mapping[str, str]) -> None:
        for sub in ("logs", "pids", "etcd", "users"):  # a fresh start: nothing of an earlier cluster
            shutil.rmtree(self.dir / sub, ignore_errors=True)
            (self.dir / sub).mkdir(parents=True)
        certs.create_pki(self.pki.dir)
        ports = {name: free_port() for name in (
            "etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
            "tekton-probes", "tekton-metrics", *(port for name in optional for port in _OPTIONAL_PORTS[name]),
        )}
        api_url = f"https://127.0.0.1:{ports['kube-apiserver']}"
        owner = None
        if owner_pid is not None:
            owner = {"pid": owner_pid, "start_time": start_time_of(owner_pid)}
        state = {
            "dir": str(self.dir),
            "api_url": api_url,
            "kubeconfig": str(self.kubeconfig),
            "ca_file": str(self.ca_file),
            "bin_dir": str(artifacts.bin_dir),
            "tekton_config": str(artifacts.tekton_config),
            "versions": artifacts.versions,  # the Kubernetes and Tekton versions it runs
            "optional": dict(optional),  # optional component -> its bin/ directory
            "ports": ports,
            "nodes": self.nodes,
            "egress_nodes": self.egress_nodes,
            "pod_seconds": self.pod_seconds,
            "owner": owner,
            "processes": [],
        }
        with self._locked_state() as current:
            current.clear()
            current.update(state)
        entry = _registry_entry(self.dir)
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(json.dumps({"dir": str(self.dir), "owner": owner}))
        admin = certs.issue_client_cert(self.pki, certs.ADMIN_USER, certs.ADMIN_GROUPS)
        certs.write_kubeconfig(self.kubeconfig, api_url, self.pki, certs.ADMIN_USER, admin)
        admin_dir = self.pki.dir / "admin"
        admin_dir.mkdir(exist_ok=True)
        (admin_dir / "admin.crt").write_bytes(admin.cert_pem)
        (admin_dir / "admin.key").touch(mode=0o600)
        (admin_dir / "admin.key").write_bytes(admin.key_pem)
        (self.dir / "kwok.yaml").write_text(render_stages(self.pod_seconds))

    def api(self) -> _Api:
        admin = self.pki.dir / "admin"
        return _Api(self.api_url, self.ca_file, admin / "admin.crt", admin / "admin.key")

    def _wait(self, what: str, check: Callable[[], bool], components: Sequence[str], timeout: float = 60) -> None:
        """Poll `check` until true; fail with the log tail of a dead or of the first component."""
        deadline = time.monotonic() + timeout
        while True:
            for name in components:
                record = self.process(name)
                if record is not None and not record.alive():
                    message = f"{name} exited while waiting for {what}; last log lines:\n{_tail(record.log)}"
                    line = bind_failure(Path(record.log).read_text(errors="replace"))
                    raise PortTaken(name, line, message) if line else ClusterError(message)
            with contextlib.suppress(requests.RequestException):
                if check():
                    return
            if time.monotonic() > deadline:
                record = self.process(components[0])
                tail = _tail(record.log) if record else "(not started)"
                raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}; {components[0]} log:\n{tail}")
            time.sleep(0.25)

    def _start(self, command: Command) -> ProcessRecord:
        return self.start_process(
            command.name, command.argv, command.env, port=command.port, health_url=command.health_url
        )

    def _start_all(self, artifacts: build.Artifacts) -> None:
        ports: dict[str, int] = self.state()["ports"]
        t0 = time.monotonic()

        def step(msg: str) -> None:
            self.log(f"[devcluster] {time.monotonic() - t0:5.1f} s  {msg}")

        etcd = self._start(etcd_command(artifacts, self.dir, ports))
        self._wait("etcd health", lambda: _http_ok(etcd.extra["health_url"]), ["etcd"])
        step("etcd ready")

        self._start(apiserver_command(artifacts, self.pki, ports))
        api = self.api()
        self._wait("the API server's /readyz", lambda: api.ok("/readyz"), ["kube-apiserver", "etcd"], timeout=90)
        step("kube-apiserver ready")

        for name in ("kube-controller-manager", "kube-scheduler"):
            self.serving_cert(name)
        self._start(controller_manager_command(artifacts, self.pki, self.kubeconfig, ports))
        self._start(scheduler_command(artifacts, self.pki, self.kubeconfig, ports))
        self._start(kwok_command(artifacts, self.dir, self.kubeconfig, ports))
        step("controller-manager, scheduler and kwok started")

        for i in range(1, self.nodes + 1):
            api.create("/api/v1/nodes", node_manifest(f"node-{i}", {}))
        for i in range(1, self.egress_nodes + 1):
            api.create("/api/v1/nodes", node_manifest(f"egress-{i}", {EGRESS_POOL_LABEL: EGRESS_POOL}))
        self.install_tekton_config()
        crd_names = self._crd_names(artifacts)
        with_webhook = self.runs_with(tekton_webhook.NAME)
        if with_webhook:  # it watches the CRDs, its Secret and configurations, no tekton.dev objects: start it now
            bin_dir = Path(self.state()["optional"][tekton_webhook.NAME])
            self._start(tekton_webhook_command(bin_dir, self.kubeconfig, ports))
        self._wait(
            f"Tekton CRDs Established ({', '.join(crd_names)})",
            lambda: all(self._crd_established(api, name) for name in crd_names),
            ["kube-apiserver"],
        )
        step("nodes created, Tekton CRDs established")

        self._start(tekton_command(artifacts, self.kubeconfig, ports))
        if self.runs_with(tekton_resolvers.NAME):
            bin_dir = Path(self.state()["optional"][tekton_resolvers.NAME])
            self._start(tekton_resolvers_command(bin_dir, self.kubeconfig, ports))
        self._wait("nodes Ready and schedulable", lambda: self._nodes_ready(api), ["kwok", "kube-controller-manager"])
        step(f"{self.nodes + self.egress_nodes} nodes Ready")
        self._wait("the default ServiceAccount", lambda: self._default_sa(api), ["kube-controller-manager"])
        if with_webhook:
            self._wait(
                "Tekton's webhook to fill its configurations and the CRDs' conversion caBundle",
                lambda: self._tekton_webhook_ready(api, crd_names),
                [tekton_webhook.NAME],
            )
            step("Tekton's webhook serves defaulting, validation and conversion")
        self._probe_tekton(api)
        step("Tekton ran the probe TaskRun")
        if self.runs_with(karpenter.NAME):
            self._start_karpenter(api)
            step("Karpenter (KWOK provider) ready")
        if self.runs_with(kueue.NAME):
            self._start_kueue(api)
            step("Kueue ready")
        if self.runs_with(kueue.TEKTON_KUEUE):
            self._start_tekton_kueue(api)
            step("tekton-kueue holds new PipelineRuns for Kueue")
        if self.runs_with(kyverno.NAME):
            self._start_kyverno(api)
            step("Kyverno listens")

    # ---- optional platform components (egress-placer's neighbours) ---------------------------
    def apply(self, files: Sequence[Path], what: str) -> None:
        """`kubectl apply --server-side` of `files` (large CRDs do not fit client-side apply's annotation)."""
        argv = [str(self.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", "apply", "--server-side",
                "--force-conflicts", "--field-manager=devcluster"]
        for f in files:
            argv += ["-f", str(f)]
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            raise ClusterError(f"kubectl apply of {what} failed:\n{result.stderr[-3000:]}")

    def _manifest_file(self, name: str, docs: Sequence[Mapping[str, Any]]) -> Path:
        path = self.dir / "manifests" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
        return path

    def _wait_crds(self, api: _Api, files: Sequence[Path], component: str) -> None:
        names = [doc["metadata"]["name"] for f in files for doc in yaml.safe_load_all(f.read_text())
                 if doc and doc.get("kind") == "CustomResourceDefinition"]
        self._wait(f"{component}'s CRDs Established", lambda: all(self._crd_established(api, n) for n in names),
                   ["kube-apiserver"])

    def _start_karpenter(self, api: _Api) -> None:
        """Karpenter's CRDs and the KWOKNodeClass, then Karpenter; ready once it answers /readyz."""
        bin_dir, ports = Path(self.state()["optional"][karpenter.NAME]), self.state()["ports"]
        crds = karpenter.crd_files(bin_dir)
        self.apply(crds, "Karpenter's CRDs")
        self._wait_crds(api, crds, karpenter.NAME)
        self.apply([self._manifest_file("karpenter-nodeclass", [karpenter.node_class_manifest()])], "the KWOKNodeClass")
        url = karpenter.health_url(ports)
        self.start_process(karpenter.NAME, karpenter.command_argv(bin_dir), karpenter.command_env(self.kubeconfig, ports),
                           port=ports["karpenter-probes"], health_url=url)
        self._wait("Karpenter's /readyz", lambda: _http_ok(url), [karpenter.NAME], timeout=90)

    def _start_kyverno(self, api: _Api) -> None:
        """Kyverno's CRDs, namespace and ConfigMap, then Kyverno; ready once its webhook port accepts connections."""
        bin_dir, ports = Path(self.state()["optional"][kyverno.NAME]), self.state()["ports"]
        crds = [build.optional_file(bin_dir, name) for name in build.KYVERNO.module_files]
        self.apply(crds, "Kyverno's CRDs")
        self._wait_crds(api, crds, kyverno.NAME)
        self.apply([self._manifest_file("kyverno", [kyverno.namespace_manifest(), kyverno.config_map()])], "Kyverno's namespace")
        port = ports["kyverno-webhook"]
        self.start_process(kyverno.NAME, kyverno.command_argv(bin_dir, self.kubeconfig, port, ports["kyverno-metrics"]),
                           kyverno.command_env(), port=port)
        self._wait("Kyverno's webhook port", lambda: listens(port), [kyverno.NAME], timeout=180)

    def _webhook_ca(self) -> str:
        return base64.b64encode(self.ca_file.read_bytes()).decode()

    def _start_kueue(self, api: _Api) -> None:
        """Kueue's CRDs and namespace, its certificate, Kueue itself, then its webhooks registered by URL."""
        bin_dir, ports = Path(self.state()["optional"][kueue.NAME]), self.state()["ports"]
        crds = kueue.crd_files(bin_dir)
        self.apply([*crds, self._manifest_file("kueue-namespace", [kueue.namespace_manifest(kueue.NAMESPACE)])],
                   "Kueue's CRDs")
        self._wait_crds(api, crds, kueue.NAME)
        cert, key = self.serving_cert(kueue.NAME)
        cert_dir = self.pki.dir / kueue.NAME  # the names Kueue reads: tls.crt, tls.key
        cert_dir.mkdir(exist_ok=True)
        shutil.copyfile(cert, cert_dir / "tls.crt")
        (cert_dir / "tls.key").touch(mode=0o600, exist_ok=True)
        shutil.copyfile(key, cert_dir / "tls.key")
        config = self.dir / "kueue-config.yaml"
        config.write_text(yaml.safe_dump(kueue.configuration(ports, cert_dir), sort_keys=False))
        url = kueue.kueue_health_url(ports)
        self.start_process(kueue.NAME, kueue.kueue_argv(bin_dir, config), kueue.kueue_env(self.kubeconfig, cert_dir),
                           port=ports["kueue-probes"], health_url=url)
        self._wait("Kueue's /readyz (its webhook server listens)", lambda: _http_ok(url), [kueue.NAME], timeout=90)
        webhooks = build.optional_file(bin_dir, kueue.KUEUE_WEBHOOKS_FILE).read_text()
        registration = kueue.by_url(webhooks, ports["kueue-webhook"], self._webhook_ca(), kueue.NAME, keep=kueue.KUEUE_GROUP)
        self.apply([self._manifest_file("kueue-webhooks", registration)], "Kueue's webhook configurations")

    def _start_tekton_kueue(self, api: _Api) -> None:
        """tekton-kueue's namespace and ConfigMap, its controller and webhook, the webhook registered by URL;
        ready once a new PipelineRun (dry run) comes back PipelineRunPending with its queue label."""
        bin_dir, ports = Path(self.state()["optional"][kueue.TEKTON_KUEUE]), self.state()["ports"]
        setup = [kueue.namespace_manifest(kueue.TEKTON_KUEUE_NAMESPACE), kueue.tekton_kueue_config()]
        self.apply([self._manifest_file("tekton-kueue-config", setup)], "tekton-kueue's namespace and ConfigMap")
        cert, key = self.serving_cert(kueue.TEKTON_KUEUE)
        env = kueue.tekton_kueue_env(self.kubeconfig)
        for name, argv in (
            (kueue.TEKTON_KUEUE_CONTROLLER, kueue.tekton_kueue_controller_argv(bin_dir, ports)),
            (kueue.TEKTON_KUEUE_WEBHOOK, kueue.tekton_kueue_webhook_argv(bin_dir, ports, cert, key)),
        ):
            url = kueue.probe_url(ports, name)
            self.start_process(name, argv, env, port=ports[f"{name}-probes"], health_url=url)
            self._wait(f"{name}'s /readyz", lambda url=url: _http_ok(url), [name], timeout=90)
        webhooks = build.optional_file(bin_dir, kueue.TEKTON_KUEUE_WEBHOOKS_FILE).read_text()
        registration = kueue.by_url(webhooks, ports["tekton-kueue-webhook"], self._webhook_ca(), kueue.TEKTON_KUEUE)
        self.apply([self._manifest_file("tekton-kueue-webhooks", registration)], "tekton-kueue's webhook configuration")
        self._wait("tekton-kueue's webhook to hold a new PipelineRun", lambda: self._tekton_kueue_holds(api),
                   [kueue.TEKTON_KUEUE_WEBHOOK, kueue.TEKTON_KUEUE_CONTROLLER])

    @staticmethod
    def _tekton_kueue_holds(api: _Api) -> bool:
        path = f"/apis/tekton.dev/v1/namespaces/{PROBE_NAMESPACE}/pipelineruns?dryRun=All"
        body = {
            "apiVersion": "tekton.dev/v1",
            "kind": "PipelineRun",
            "metadata": {"name": "kueue-probe", "namespace": PROBE_NAMESPACE},
            "spec": {"pipelineSpec": {"tasks": [{"name": "probe", "taskSpec": probe_taskrun("x")["spec"]["taskSpec"]}]}},
        }
        admitted = api.session.post(api.url + path, json=body, timeout=10)
        if admitted.status_code != 201:
            return False
        run = admitted.json()
        return run["spec"].get("status") == "PipelineRunPending" and kueue.QUEUE_LABEL in run["metadata"].get("labels", {})

    def install_tekton_config(self) -> None:
        """Apply Tekton's namespace, CRDs (storage versions only), ConfigMaps and aggregated ClusterRoles, and
        the resolvers' namespace (with their ConfigMaps only when they run: `up --with tekton-resolvers`).

        With Tekton's webhook (`up --with tekton-webhook`): the CRDs serve every version and convert
        through the webhook, and its Service, Secret and webhook configurations are applied too."""
        state = self.state()
        config = Path(state["tekton_config"])
        webhook_bin = state.get("optional", {}).get(tekton_webhook.NAME)
        webhook_port = state["ports"].get(tekton_webhook.NAME)
        crds = [
            tekton_webhook.with_conversion_webhook(doc, TEKTON_NAMESPACE, webhook_port)
            if webhook_bin
            else served_storage_version_only(doc)
            for path in sorted((config / "300-crds").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text())
            if doc
        ]
        crd_file = self.dir / "tekton-crds.yaml"
        crd_file.write_text(yaml.safe_dump_all(crds, sort_keys=False))
        files = [*sorted((config / "100-namespace").glob("*.yaml")), crd_file, *sorted(config.glob("config-*.yaml"))]
        tekton_version = state.get("versions", {}).get("tekton")
        if tekton_version and (config / PIPELINES_INFO).is_file():  # as a release is: pipelines-info says its version
            info = self.dir / "tekton-pipelines-info.yaml"
            info.write_text(re.sub(r'(?m)^(\s*version:\s*)"?devel"?', rf'\g<1>"{tekton_version}"', (config / PIPELINES_INFO).read_text()))
            files[files.index(config / PIPELINES_INFO)] = info
        files += build.tekton_aggregate_roles(config)  # as a release installs them: `edit` users write runs
        resolvers_bin = state.get("optional", {}).get(tekton_resolvers.NAME)
        if resolvers_bin:
            files += tekton_resolvers.config_files(Path(resolvers_bin))
        else:  # as a Tekton release always has it: egress-placer's manifests put a Role there
            files.append(self.dir / "tekton-resolvers-namespace.yaml")
            files[-1].write_text(yaml.safe_dump(tekton_resolvers.namespace_manifest(), sort_keys=False))
        if webhook_bin:
            webhooks_yaml = build.optional_file(Path(webhook_bin), tekton_webhook.WEBHOOKS_FILE).read_text()
            registration = tekton_webhook.registration(webhooks_yaml, TEKTON_NAMESPACE, webhook_port)
            files.append(self.dir / "tekton-webhook-registration.yaml")
            files[-1].write_text(yaml.safe_dump_all(registration, sort_keys=False))
        self.apply(files, "Tekton's config")

    @staticmethod
    def _crd_names(artifacts: build.Artifacts) -> list[str]:
        names = []
        for path in sorted((artifacts.tekton_config / "300-crds").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    names.append(doc["metadata"]["name"])
        return names

    @staticmethod
    def _crd_established(api: _Api, name: str) -> bool:
        crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = (crd or {}).get("status", {}).get("conditions", [])
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    @staticmethod
    def _tekton_webhook_ready(api: _Api, crd_names: Sequence[str]) -> bool:
        """knative filled every configuration and CRD, and the API server uses them: a v1beta1
        TaskRun (dry run) goes through Tekton's defaulting, validation and conversion to v1."""
        if not all(tekton_webhook.configuration_ready(api.get(path)) for path in tekton_webhook.configuration_paths()):
            return False
        crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        if not all(tekton_webhook.conversion_ready(api.get(f"{crds}/{name}")) for name in crd_names):
            return False
        path = f"/apis/tekton.dev/v1beta1/namespaces/{PROBE_NAMESPACE}/taskruns?dryRun=All"
        body = {**probe_taskrun("conversion-probe"), "apiVersion": "tekton.dev/v1beta1"}
        admitted = api.session.post(api.url + path, json=body, timeout=10)
        return admitted.status_code == 201 and admitted.json()["spec"].get("timeout") == "1h0m0s"  # defaulted

    def _nodes_ready(self, api: _Api) -> bool:
        nodes = (api.get(f"/api/v1/nodes?labelSelector={KWOK_NODE_SELECTOR}") or {}).get("items", [])
        if len(nodes) < self.nodes + self.egress_nodes:
            return False
        for node in nodes:
            conditions = node.get("status", {}).get("conditions", [])
            if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return False
            if any(t["key"].startswith("node.kubernetes.io/") for t in node["spec"].get("taints", [])):
                return False
        return True

    @staticmethod
    def _default_sa(api: _Api) -> bool:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PROBE_NAMESPACE}}
        api.create("/api/v1/namespaces", namespace)
        return api.get(f"/api/v1/namespaces/{PROBE_NAMESPACE}/serviceaccounts/default") is not None

    def _probe_tekton(self, api: _Api) -> None:
        """Create a TaskRun and wait until Tekton, the scheduler and KWOK together finish it."""
        path = f"/apis/tekton.dev/v1/namespaces/{PROBE_NAMESPACE}/taskruns"
        name = f"probe-{int(time.time())}"
        api.create(path, probe_taskrun(name))

        def succeeded() -> bool:
            run = api.get(f"{path}/{name}") or {}
            for c in run.get("status", {}).get("conditions", []):
                if c["type"] == "Succeeded" and c["status"] == "False":
                    raise ClusterError(f"the probe TaskRun failed: {c.get('reason')}: {c.get('message')}")
                if c["type"] == "Succeeded" and c["status"] == "True":
                    return True
            return False

        components = ["tekton-controller", "kube-scheduler", "kwok", "kube-apiserver"]
        self._wait("the Tekton controller to run a probe TaskRun", succeeded, components, timeout=60 + self.pod_seconds)
        api.delete(f"{path}/{name}")

    # ---- status and down --------------------------------------------------------------------
    def status(self) -> list[ComponentStatus]:
        """What runs: every recorded process, whether it is alive and answers its health URL."""
        session = requests.Session()
        session.trust_env = False
        session.verify = str(self.ca_file)
        admin = self.pki.dir / "admin"
        session.cert = (str(admin / "admin.crt"), str(admin / "admin.key"))
        out = []
        for p in self.processes():
            alive = p.alive()
            url = p.extra.get("health_url")
            healthy = alive
            if alive and url:
                try:
                    healthy = session.get(url, timeout=2).status_code == 200
                except requests.RequestException:
                    healthy = False
            out.append(ComponentStatus(p.name, p.pid, alive, healthy, p.port))
        return out

    def down(self, timeout: float = 10.0) -> None:
        """Stop every recorded process (clients first, then the API server, then etcd); idempotent."""
        procs = self.processes()
        stages = [
            [p for p in procs if p.name not in _CONTROL_PLANE],
            [p for p in procs if p.name == "kube-apiserver"],
            [p for p in procs if p.name == "etcd"],
        ]
        survivors = [r for stage in stages for r in stop(stage, timeout)]
        if survivors:
            raise ClusterError(f"still running after SIGKILL: {[(r.name, r.pid) for r in survivors]}")
        if self.state_file.exists():
            with self._locked_state() as state:
                state["processes"] = []
        for pid_file in (self.dir / "pids").glob("*.pid"):
            pid_file.unlink()
        _registry_entry(self.dir).unlink(missing_ok=True)

