"""The controller's image, built from the Dockerfile without a Docker daemon: `make image`
(`python -m devplacer.image`), and the same code for the end-to-end test that runs it.

- Tools: Debian's buildah (builds the Dockerfile), mmdebstrap (makes the base), podman and runc (run
  the image). `ensure_tools` installs the missing ones with apt-get (one `apt-get update` first): a new
  machine needs nothing installed by hand, only root on Debian.
- Base: the registry's python image cannot be pulled here, so the Dockerfile's `PYTHON_IMAGE` is a
  Debian bookworm root filesystem made by mmdebstrap from Debian's packages (python3.11, and
  python-is-python3 so that the Dockerfile's `python -m venv` works). The tarball is cached under
  `CACHE/devcluster/image-base/KEY.tar`, KEY a hash of what goes into it; the base image in the
  container storage is named by the same key, so a warm run makes nothing.
- Build: `buildah build --layers` (a warm build reuses every layer whose inputs did not change) with
  chroot isolation (no OCI runtime, no cgroups: works inside a container too) and the host's network.
  The RUN steps see the host's CA bundle (pip must trust what the host trusts, e.g. a TLS-inspecting
  proxy); it is a build-time mount, not a layer: nothing of it is in the image.
- Run: `ControllerContainer` is a `launch` for `devplacer.local_placer.start_controller`: each replica
  is a podman container of the image run as the Deployment in `k8s/` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from devcluster.build import cache_root
from devcluster.cluster import Cluster
from devplacer.local_placer import NAMESPACE, SERVICE_ACCOUNT, ControllerReplica, kubectl

Log = Callable[[str], None]

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/egress-placer:{VERSION}"
USER = "65532:65532"  # the Dockerfile's USER and the Deployment's runAsUser/runAsGroup

# command -> Debian package. podman and runc only run the image; runc because crun refuses
# hybrid cgroup hierarchies (as on this machine).
TOOLS = {"buildah": "buildah", "mmdebstrap": "mmdebstrap", "podman": "podman", "runc": "runc"}

# What goes into the base (every item is part of its cache key).
BASE_RECIPE = "1"  # bump when the recipe below changes in a way the key does not see
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
BASE_SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
BASE_EXCLUDED = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
BASE_CONFIG = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # Debian's bundle, also the base's

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where Kubernetes mounts the token
TOKEN_SECONDS = 3600
TMP_SIZE = "64m"  # the Deployment's /tmp emptyDir sizeLimit


class ImageToolsUnavailable(RuntimeError):
    """The container tools are missing and cannot be installed here (not root, no apt-get, apt failed)."""


class ImageBuildError(RuntimeError):
    """A step of making the base or building the image failed; the message carries its output's tail."""


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, error: type[RuntimeError] = ImageBuildError) -> str:
    out = subprocess.run(list(argv), capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    if out.returncode != 0:
        raise error(f"{' '.join(argv)} failed ({out.returncode}):\n{_tail(out.stdout + out.stderr)}")
    return out.stdout


# ---- tools ----------------------------------------------------------------------------------------
def ensure_tools(log: Log = print) -> None:
    """Install the missing container tools with apt-get; ImageToolsUnavailable when that cannot be done."""
    missing = sorted({package for command, package in TOOLS.items() if shutil.which(command) is None})
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise ImageToolsUnavailable(f"{', '.join(missing)} missing and no apt-get to install them (Debian is needed)")
    if os.geteuid() != 0:
        raise ImageToolsUnavailable(f"{', '.join(missing)} missing and apt-get needs root to install them")
    log(f"[image] installing {' '.join(missing)} with apt-get")
    started = time.monotonic()
    apt_env = {"DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update"], env=apt_env, error=ImageToolsUnavailable)
    _run(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=apt_env, error=ImageToolsUnavailable)
    log(f"[image] installed in {time.monotonic() - started:.0f} s")


# ---- base -----------------------------------------------------------------------------------------
def base_key() -> str:
    recipe = {
        "recipe": BASE_RECIPE,
        "suite": BASE_SUITE,
        "packages": BASE_PACKAGES,
        "sources": BASE_SOURCES,
        "excluded": BASE_EXCLUDED,
        "config": BASE_CONFIG,
        "architecture": platform.machine(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def base_image_name() -> str:
    return f"localhost/egress-placer-base:{base_key()}"


def base_tarball() -> Path:
    return cache_root() / "image-base" / f"{BASE_SUITE}-{base_key()}.tar"


@contextlib.contextmanager
def _cache_lock() -> Iterator[None]:
    """One base maker at a time (`make image` and a test may start together)."""
    base_tarball().parent.mkdir(parents=True, exist_ok=True)
    with open(base_tarball().parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_base(log: Log = print) -> str:
    """The base image's name, made first when the container storage does not have it (from the cached
    tarball, or the tarball made first with mmdebstrap)."""
    name = base_image_name()
    with _cache_lock():
        if image_id(name) is not None:
            return name
        tarball = base_tarball()
        if not tarball.exists():
            log(f"[image] making the base with mmdebstrap ({BASE_SUITE}: {', '.join(BASE_PACKAGES)}): a few minutes")
            started = time.monotonic()
            with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
                partial = Path(tmp) / tarball.name
                _run(
                    [
                        "mmdebstrap",
                        "--variant=essential",
                        f"--include={','.join(BASE_PACKAGES)}",
                        *(f"--dpkgopt=path-exclude={pattern}" for pattern in BASE_EXCLUDED),
                        BASE_SUITE,
                        str(partial),
                        *BASE_SOURCES,
                    ]
                )
                os.replace(partial, tarball)  # complete or absent
            log(f"[image] base tarball {tarball} made in {time.monotonic() - started:.0f} s")
        log(f"[image] importing {tarball.name} as {name}")
        started = time.monotonic()
        container = _run(["buildah", "from", "scratch"]).strip()
        try:
            _run(["buildah", "add", "--quiet", container, str(tarball), "/"])
            _run(["buildah", "config", *(a for k, v in BASE_CONFIG.items() for a in ("--env", f"{k}={v}")), "--cmd", "python3", container])
            _run(["buildah", "commit", "--quiet", container, name])
        finally:
            subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        log(f"[image] imported in {time.monotonic() - started:.0f} s")
    return name


# ---- image ----------------------------------------------------------------------------------------
def build_image(tag: str = IMAGE, log: Log = print) -> str:
    """Install the tools, make the base if needed, build the Dockerfile on it as `tag`; return `tag`.

    The builder stage is tagged too (`TAG-builder`): its cached layers then belong to an image, and
    when a change replaces the two images, the previous ones are removed with the parents no other
    image needs (`podman rmi`), so the container storage does not grow by ~200 MB per change."""
    ensure_tools(log)
    base = ensure_base(log)
    log(f"[image] buildah build {tag} (PYTHON_IMAGE={base})")
    started = time.monotonic()
    trust = ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if HOST_CA_BUNDLE.exists() else []
    builds = {f"{tag}-builder": ["--target", "builder"], tag: []}
    previous = {name: image_id(name) for name in builds}
    for name, target in builds.items():
        _run(
            [
                "buildah", "build", "--isolation", "chroot", "--layers", "--network", "host", "--pull=never",
                "--build-arg", f"PYTHON_IMAGE={base}", *trust, *target,
                "--file", str(DOCKERFILE), "--tag", name, str(REPO),
            ]
        )  # fmt: skip
    for name, old in previous.items():
        if old is not None and old != image_id(name):  # a container still using it keeps it
            subprocess.run(["podman", "rmi", "--ignore", old], capture_output=True, check=False)
    log(f"[image] built {tag} in {time.monotonic() - started:.0f} s")
    return tag


def image_id(name: str) -> str | None:
    """The image's id in the container storage, None when there is no such image."""
    out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", name], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def image_size(tag: str = IMAGE) -> str:
    return _run(["buildah", "images", "--format", "{{.Size}}", tag]).strip()


def help_as_nonroot(tag: str = IMAGE) -> str:
    """`egress-placer --help` run in the image as the Dockerfile's user (buildah run needs a container)."""
    container = _run(["buildah", "from", "--pull=never", tag]).strip()
    try:
        return _run(["buildah", "run", "--isolation", "chroot", "--user", USER.split(":")[0], container, "egress-placer", "--help"])
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)


# ---- run ------------------------------------------------------------------------------------------
def _ulimits() -> list[str]:
    """podman asks the runtime for more open files (and processes) than a process without
    CAP_SYS_RESOURCE, e.g. one in a container, may grant: ask for what this process has instead."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=4096:4096"]


@dataclass(frozen=True)
class ControllerContainer:
    """A `launch` for `start_controller`: each replica as a podman container of `image`, run as the
    Deployment runs it (uid/gid 65532, read-only root, /tmp a 64 MiB tmpfs, no capabilities, no new
    privileges) with its ServiceAccount's token, CA and namespace where Kubernetes mounts them and
    KUBERNETES_SERVICE_HOST/PORT naming the API server, so it uses in-cluster credentials. It shares
    the host's network, so its webhook and health ports are on loopback as for a local process."""

    cluster: Cluster
    image: str = IMAGE

    def container_name(self, replica: str) -> str:
        return f"{replica}-{hashlib.sha256(str(self.cluster.dir).encode()).hexdigest()[:8]}"

    def __call__(self, replica: ControllerReplica, env: Mapping[str, str]) -> list[str]:
        token = kubectl(self.cluster, "create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, f"--duration={TOKEN_SECONDS}s").strip()
        mounted = self._service_account_dir(replica.name, token, NAMESPACE)
        port = re.sub(r"^.*:", "", self.cluster.api_url.rstrip("/"))
        # The settings the replica was given, by name (podman takes the values from its own
        # environment); not the kubeconfig: the container has the token instead.
        settings = sorted(k for k in env if k.startswith("EGRESS_PLACER_") and k != "EGRESS_PLACER_KUBECONFIG")
        return [
            "podman", "--runtime", "runc", "run", "--rm", "--replace", "--name", self.container_name(replica.name),
            "--network", "host", "--user", USER, "--read-only", "--tmpfs", f"/tmp:size={TMP_SIZE}",
            "--cap-drop", "all", "--security-opt", "no-new-privileges", *_ulimits(),
            "--volume", f"{mounted}:{SERVICE_ACCOUNT_DIR}:ro",
            "--env", "KUBERNETES_SERVICE_HOST=127.0.0.1", "--env", f"KUBERNETES_SERVICE_PORT={port}",
            *(a for k in settings for a in ("--env", k)),
            self.image, "run",
        ]  # fmt: skip

    def _service_account_dir(self, replica: str, token: str, namespace: str) -> Path:
        """DIR/serviceaccount/REPLICA/{token,ca.crt,namespace}, readable by the container's user only."""
        directory = self.cluster.dir / "serviceaccount" / replica
        directory.mkdir(parents=True, exist_ok=True)
        uid, gid = (int(x) for x in USER.split(":"))
        for name, content in (("token", token), ("ca.crt", self.cluster.ca_file.read_text()), ("namespace", namespace)):
            path = directory / name
            path.write_text(content)
            os.chown(path, uid, gid)
            path.chmod(0o400)
        os.chown(directory, uid, gid)
        directory.chmod(0o500)
        return directory

    def remove(self, replicas: Sequence[str]) -> None:
        """Remove the replicas' containers if any outlived their podman process (it was killed)."""
        names = [self.container_name(r) for r in replicas]
        subprocess.run(["podman", "rm", "--force", "--ignore", *names], capture_output=True, check=False)


# ---- command line ---------------------------------------------------------------------------------
def _log(message: str) -> None:
    print(message, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devplacer.image", description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", default=IMAGE, help=f"the image's name (default {IMAGE})")
    args = p.parse_args(argv)
    started = time.monotonic()
    try:
        build_image(args.tag, _log)
        help_as_nonroot(args.tag)
    except (ImageToolsUnavailable, ImageBuildError) as e:
        print(f"[image] {e}", file=sys.stderr)
        return 1
    print(
        f"[image] {args.tag}: {image_size(args.tag)}, ready in {time.monotonic() - started:.0f} s; "
        f"`egress-placer --help` runs in it as uid {USER.split(':')[0]}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
