"""`make release-dry-run` (`python -m devplacer.release`): the release workflow's steps
(.github/workflows/release.yaml, docs/releasing.md) on this machine, against a real OCI registry on 127.0.0.1.

1. The image: the Dockerfile built with buildah for the host's architecture (devplacer/image.py); arm64 too
   only where binfmt_misc has an aarch64 handler, otherwise it says so and goes on.
2. A registry: the CNCF distribution registry (`cmd/registry`, built from its Go module, an optional
   devcluster component `oci-registry`), listening on 127.0.0.1 only, filesystem storage in the cluster's
   directory, run as a process of the local cluster (so `down` stops it).
3. The image pushed there (`buildah push`), signed by digest with a cosign key pair made for this run
   (keyless signing needs Fulcio and Rekor, out of reach here; no transparency log) and verified with the
   public key.
4. The chart packaged and pushed as an OCI artifact (`helm push --plain-http`), then installed from the
   registry (`helm install --plain-http oci://127.0.0.1:PORT/egress-placer/charts/egress-placer`) onto a
   local cluster, its image value the pushed digest.
5. The pushed image pulled back by digest and run the way the chart's Deployment runs it (its command,
   settings, uid 65532, read-only root, the ServiceAccount's token; devplacer.image.ControllerContainer),
   until its /healthz and /readyz answer. KWOK's nodes run no containers: podman runs it on this host's kernel.

`--keep` leaves the cluster (and the registry) running and prints how to stop it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import requests

from devcluster.build import ensure_optional, find_optional
from devcluster.cluster import Cluster, ClusterError
from devcluster.process import free_port
from devplacer.chart import CHART_DIR, RELEASE, RELEASE_NAMESPACE, Release, helm_binary, run_helm, settings_env, template
from devplacer.version import VERSION

Log = Callable[[str], None]

REGISTRY_PROCESS = "oci-registry"
IMAGE_PATH = "egress-placer/egress-placer"  # the registry's repository of the image, as ghcr.io/egress-placer/egress-placer
CHART_PATH = "egress-placer/charts"  # where `helm push` puts the chart: .../charts/egress-placer
BINFMT_AARCH64 = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
REGISTRY_CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
  headers:
    X-Content-Type-Options: [nosniff]
"""


class ReleaseError(RuntimeError):
    """A step of the dry run failed; the message carries the tool's output."""


def _run(argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    out = subprocess.run(list(argv), capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if out.returncode != 0:
        raise ReleaseError(f"{' '.join(map(str, argv))} failed ({out.returncode}):\n{(out.stdout + out.stderr).strip()[-3000:]}")
    return out.stdout


# ---- the registry ---------------------------------------------------------------------------------
def registry_binary(log: Log = print) -> Path:
    return ensure_optional("oci-registry", log) / "registry"


def cached_registry() -> Path | None:
    """The registry binary when it is built (the OCI test skips, saying so, when it is not)."""
    bin_dir = find_optional("oci-registry")
    return None if bin_dir is None else bin_dir / "registry"


def start_registry(cluster: Cluster, binary: Path) -> str:
    """The registry on 127.0.0.1:PORT as a process of `cluster`; its `host:port` once /v2/ answers."""
    port = free_port()
    root = cluster.dir / "oci-registry"
    (root / "storage").mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(REGISTRY_CONFIG.format(root=root / "storage", port=port))
    address = f"127.0.0.1:{port}"
    # OTEL_TRACES_EXPORTER=none: the registry would otherwise export traces to an OTLP endpoint.
    cluster.start_process(REGISTRY_PROCESS, [str(binary), "serve", str(config)], {"OTEL_TRACES_EXPORTER": "none"}, port=port,
                          health_url=f"http://{address}/v2/")
    cluster._wait("the OCI registry", lambda: requests.get(f"http://{address}/v2/", timeout=2).status_code == 200, [REGISTRY_PROCESS])  # pylint: disable=protected-access
    return address


def manifest_digest(registry: str, repository: str, reference: str) -> str:
    """The digest the registry serves for `repository:reference` (an OCI or Docker manifest or index)."""
    accept = ", ".join(
        ("application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json",
         "application/vnd.docker.distribution.manifest.v2+json", "application/vnd.docker.distribution.manifest.list.v2+json")
    )
    answer = requests.head(f"http://{registry}/v2/{repository}/manifests/{reference}", headers={"Accept": accept}, timeout=10)
    answer.raise_for_status()
    return answer.headers["Docker-Content-Digest"]


# ---- the chart ------------------------------------------------------------------------------------
def push_chart(helm: Path, registry: str, directory: Path) -> str:
    """`helm package` then `helm push --plain-http` to REGISTRY/CHART_PATH; the chart's oci:// reference."""
    run_helm(helm, "package", str(CHART_DIR), "--destination", str(directory))
    (archive,) = directory.glob(f"egress-placer-{VERSION}.tgz")
    run_helm(helm, "push", str(archive), f"oci://{registry}/{CHART_PATH}", "--plain-http")
    return f"oci://{registry}/{CHART_PATH}/egress-placer"


@dataclass
class RegistryRelease(Release):
    """The chart installed from the registry (`helm install --plain-http oci://…`) instead of the checkout."""

    reference: str = ""  # oci://HOST:PORT/PATH/egress-placer
    version: str = VERSION
    installed_with: list[str] = field(default_factory=list)  # the helm command line, for the report

    def install(self, webhook_url: str) -> None:
        source = (self.reference, "--version", self.version, "--plain-http")
        self.installed_with = ["helm", "install", RELEASE, *source, "--namespace", self.namespace, "--create-namespace"]
        self.install_from(webhook_url, source)


# ---- the image ------------------------------------------------------------------------------------
def arm64_note() -> str | None:
    """None when arm64 can be built here (binfmt_misc runs aarch64 binaries), else why not."""
    if BINFMT_AARCH64.exists() and "enabled" in BINFMT_AARCH64.read_text():
        return None
    return (
        "arm64: not built here, binfmt_misc has no aarch64 handler (/proc/sys/fs/binfmt_misc is not mounted in this "
        "container, and qemu-user-static needs it); the release workflow builds it on QEMU (docker/setup-qemu-action)"
    )


def push_image(local: str, registry: str) -> str:
    """`buildah push` of the local image to REGISTRY/IMAGE_PATH:VERSION; the pushed manifest's digest."""
    with tempfile.TemporaryDirectory(prefix="egress-placer-push-") as tmp:
        digest_file = Path(tmp) / "digest"
        _run(["buildah", "push", "--tls-verify=false", "--digestfile", str(digest_file), local,
              f"docker://{registry}/{IMAGE_PATH}:{VERSION}"])  # fmt: skip
        digest = digest_file.read_text().strip()
    if digest != manifest_digest(registry, IMAGE_PATH, VERSION):
        raise ReleaseError(f"the registry serves {IMAGE_PATH}:{VERSION} with another digest than buildah pushed ({digest})")
    return digest


def pull_image(reference: str) -> str:
    """`podman pull` by digest from the plain-HTTP registry; the reference, now in the local storage."""
    _run(["podman", "pull", "--tls-verify=false", "--quiet", reference])
    return reference


def runs_as_the_container(container: Mapping[str, Any]) -> list[str]:
    """How the chart's Deployment container differs from what `ControllerContainer` runs (the image's
    entrypoint with `run`, uid/gid 65532, read-only root, no capabilities, no new privileges); [] when alike."""
    from devplacer.image import USER  # pylint: disable=import-outside-toplevel

    uid, gid = (int(x) for x in USER.split(":"))
    context = container.get("securityContext") or {}
    wanted = {
        "command and args": ([*container.get("command", []), *container.get("args", [])], ["egress-placer", "run"]),
        "runAsUser": (context.get("runAsUser"), uid),
        "runAsGroup": (context.get("runAsGroup"), gid),
        "readOnlyRootFilesystem": (context.get("readOnlyRootFilesystem"), True),
        "allowPrivilegeEscalation": (context.get("allowPrivilegeEscalation"), False),
        "capabilities.drop": ((context.get("capabilities") or {}).get("drop"), ["ALL"]),
    }
    return [f"{name}: the Deployment's {theirs!r}, the container's {ours!r}" for name, (theirs, ours) in wanted.items() if theirs != ours]


# ---- signature ------------------------------------------------------------------------------------
def sign_and_verify(cosign: Path, reference: str, directory: Path) -> str:
    """A cosign key pair made for this run; the image signed by digest (no transparency log), then verified
    with the public key. What `cosign verify` printed (the verified claims, JSON)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(directory), "COSIGN_PASSWORD": "", "TUF_ROOT": str(directory / "tuf")}
    _run([str(cosign), "generate-key-pair"], env=env, cwd=directory)
    registry_flags = ["--allow-insecure-registry", "--allow-http-registry"]
    _run([str(cosign), "sign", "--yes", "--key", "cosign.key", "--tlog-upload=false", *registry_flags, reference], env=env, cwd=directory)
    return _run([str(cosign), "verify", "--key", "cosign.pub", "--insecure-ignore-tlog=true", *registry_flags, reference], env=env, cwd=directory)


def verify_with_another_key_fails(cosign: Path, reference: str, directory: Path) -> bool:
    """The verification means something: a key pair that did not sign is refused."""
    other = directory / "other"
    other.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(directory), "COSIGN_PASSWORD": "", "TUF_ROOT": str(directory / "tuf")}
    _run([str(cosign), "generate-key-pair"], env=env, cwd=other)
    out = subprocess.run(
        [str(cosign), "verify", "--key", "cosign.pub", "--insecure-ignore-tlog=true", "--allow-insecure-registry", "--allow-http-registry", reference],
        env=env, cwd=other, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.returncode != 0


# ---- the dry run ----------------------------------------------------------------------------------
@dataclass
class Report:
    steps: list[tuple[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def timed(self, name: str, started: float) -> None:
        self.steps.append((name, time.monotonic() - started))


def dry_run(cluster_dir: Path | None, keep: bool, log: Log) -> Report:
    """Every step above; the cluster is brought down at the end unless `keep`."""
    from devplacer.image import build_image, ControllerContainer  # pylint: disable=import-outside-toplevel
    from devplacer.local_placer import start_controller, stop_controller  # pylint: disable=import-outside-toplevel

    report = Report()
    started = time.monotonic()
    local = build_image(log=log)
    report.timed(f"image {local} built for {subprocess.run(['uname', '-m'], capture_output=True, text=True, check=False).stdout.strip()}", started)
    note = arm64_note()
    if note:
        report.notes.append(note)
        log(f"[release] {note}")
    started = time.monotonic()
    helm, registry_bin, cosign = helm_binary(log), registry_binary(log), ensure_optional("cosign", log) / "cosign"
    report.timed("helm, registry and cosign from their Go modules (cache)", started)

    directory = Path(cluster_dir or tempfile.mkdtemp(prefix="egress-placer-release-"))
    cluster = Cluster(directory, log=log)
    launch: ControllerContainer | None = None
    try:
        started = time.monotonic()
        cluster.up()
        report.timed("local cluster up", started)
        started = time.monotonic()
        registry = start_registry(cluster, registry_bin)
        report.timed(f"registry on {registry}", started)
        started = time.monotonic()
        digest = push_image(local, registry)
        pushed = f"{registry}/{IMAGE_PATH}@{digest}"
        report.timed(f"image pushed: {pushed}", started)
        started = time.monotonic()
        keys = directory / "cosign"
        keys.mkdir(exist_ok=True)
        claims = sign_and_verify(cosign, pushed, keys)
        if digest not in claims:
            raise ReleaseError(f"cosign verify did not name the digest {digest}: {claims}")
        if not verify_with_another_key_fails(cosign, pushed, keys):
            raise ReleaseError("cosign verify accepted a key that did not sign")
        report.timed("signed with a generated key; verified (another key refused)", started)
        started = time.monotonic()
        reference = push_chart(helm, registry, directory / "chart")
        report.timed(f"chart pushed: {reference} --version {VERSION}", started)
        started = time.monotonic()
        values = {"image": {"repository": f"{registry}/{IMAGE_PATH}", "digest": digest}}
        release = RegistryRelease(cluster, helm, values, reference=reference)
        image = pull_image(pushed)
        launch = ControllerContainer(cluster, image)
        env = settings_env(template(helm, {**values, "createNamespace": False}, namespace=RELEASE_NAMESPACE))
        replicas = start_controller(
            cluster, CHART_DIR.parents[1] / "config" / "pools.example.yaml", env=env, install=release.install,
            launch=launch, policy_source="pools", ready_timeout=120,
        )  # fmt: skip
        deployed = release.status()["info"]["status"]
        (container,) = [d for d in release.manifest() if d["kind"] == "Deployment"][0]["spec"]["template"]["spec"]["containers"]
        if deployed != "deployed" or container["image"] != pushed:
            raise ReleaseError(f"helm status {deployed}, the Deployment's image {container['image']} (pushed {pushed})")
        unlike = runs_as_the_container(container)
        if unlike:
            raise ReleaseError("the pulled image did not run as the installed Deployment runs it: " + "; ".join(unlike))
        for replica in replicas:
            for probe in ("/healthz", "/readyz"):
                answer = requests.get(replica.health_url + probe, timeout=5)
                if answer.status_code != 200:
                    raise ReleaseError(f"{probe} of the pulled image answered {answer.status_code}")
        report.timed(f"{' '.join(release.installed_with)}: {deployed}; the pulled image runs as the Deployment, /healthz and /readyz 200", started)
        if not keep:
            stop_controller(cluster)
    finally:
        if keep:
            log(f"[release] the cluster and the registry keep running: python -m devcluster down --dir {directory}")
        else:
            cluster.down()
            if launch is not None:  # a container that outlived its podman process
                launch.remove(["egress-placer-0"])  # start_controller names its one replica so
            shutil.rmtree(directory, ignore_errors=True)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devplacer.release", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, help="the cluster directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster and the registry running afterwards")
    args = parser.parse_args(argv)
    started = time.monotonic()

    def log(message: str) -> None:
        print(message, flush=True)

    try:
        report = dry_run(args.dir, args.keep, log)
    except (ReleaseError, ClusterError, RuntimeError, requests.RequestException) as e:
        print(f"[release] dry run failed: {e}", file=sys.stderr, flush=True)
        return 1
    for name, seconds in report.steps:
        log(f"[release] {seconds:6.0f} s  {name}")
    for note in report.notes:
        log(f"[release] note: {note}")
    log(f"[release] dry run of {VERSION} passed in {time.monotonic() - started:.0f} s " + json.dumps({"version": VERSION}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
