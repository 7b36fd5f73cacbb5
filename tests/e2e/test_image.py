"""End to end, the image: the controller built from the Dockerfile (`make image`, the same code:
devplacer.image) runs FROM THAT IMAGE on the local cluster as the Deployment in `k8s/` runs it:
uid/gid 65532, read-only root with /tmp a tmpfs, no capabilities, no new privileges, the
ServiceAccount's token and CA where Kubernetes mounts them (in-cluster credentials, no kubeconfig).
It shares the host's network, so the webhook registered by `start_controller` on loopback reaches it.
A TaskRun that needs the pool is placed through it; the leader in the container taints the pool.

Skipped, saying why, only when the container tools are missing and cannot be installed (not root, no
apt-get). A cold machine installs them and makes the base first: minutes (see README)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from controller.core.model import TAINT_KEY
from devcluster.cluster import Cluster
from devplacer.image import SERVICE_ACCOUNT_DIR, ControllerContainer, ImageToolsUnavailable, build_image
from tests.e2e.harness import POLICY_FILE, Placer, pool_taints, running_placer
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL, POOL_NODES, TEAM_CDN, Runs, decision_of, taskrun
from tests.kube import Api
from tests.waiting import wait_for

# The fixture's setup may install the tools and make the base (about 5 minutes cold on 2 cores).
pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def image() -> str:
    """The image built from this checkout (a warm build reuses its layers: seconds)."""
    try:
        return build_image(log=print)
    except ImageToolsUnavailable as e:
        pytest.skip(f"the container tools (buildah, mmdebstrap, podman, runc) cannot be installed: {e}")


@pytest.fixture(scope="module")
def container(devcluster: Cluster, image: str) -> ControllerContainer:
    return ControllerContainer(devcluster, image)


@pytest.fixture(scope="module")
def egress_placer(
    devcluster: Cluster, api: Api, tenants: tuple[str, str], container: ControllerContainer
) -> Iterator[Placer]:
    """conftest's `egress_placer`, but the replica is a container of the image."""
    names: list[str] = []
    try:
        with running_placer(devcluster, api, POLICY_FILE, launch=container) as placer:
            names = [r.name for r in placer.replicas]
            yield placer
    finally:
        container.remove(names)  # only if one outlived its podman process


def controller_pid(container: ControllerContainer, replica: str) -> int:
    """The host pid of the container's main process: the controller itself."""
    out = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Pid}}", container.container_name(replica)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def mounts_of(pid: int) -> dict[str, tuple[str, set[str]]]:
    """Mount point -> (filesystem type, mount options) as the process sees them (/proc/PID/mountinfo)."""
    mounts = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        after = fields.index("-")
        mounts[fields[4]] = (fields[after + 1], set(fields[5].split(",")))
    return mounts


def status_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def test_the_controller_runs_from_the_image_as_the_deployment_runs_it(
    egress_placer: Placer, container: ControllerContainer
) -> None:
    # Read from the kernel about the controller process, not from the container's configuration.
    pid = controller_pid(container, egress_placer.replica.name)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[:3] == [b"/opt/egress-placer/bin/python", b"/opt/egress-placer/bin/egress-placer", b"run"], argv
    status = status_of(pid)
    assert status["Uid"].split() == ["65532"] * 4
    assert status["Gid"].split() == ["65532"] * 4
    assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"] == "1"
    mounts = mounts_of(pid)
    assert "ro" in mounts["/"][1], mounts["/"]
    assert mounts["/tmp"][0] == "tmpfs" and "rw" in mounts["/tmp"][1], mounts["/tmp"]
    token_mount = mounts[SERVICE_ACCOUNT_DIR.removeprefix("/var")]  # the image's /var/run links to /run
    assert "ro" in token_mount[1], token_mount
    environ = dict(
        item.decode().partition("=")[::2] for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if item
    )
    assert "EGRESS_PLACER_KUBECONFIG" not in environ  # in-cluster credentials: the mounted token
    assert environ["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"


def test_a_matching_taskrun_is_placed_on_the_pool_through_the_image(egress_placer: Placer, runs: Runs, api: Api) -> None:
    tainted = [{"key": TAINT_KEY, "value": POOL, "effect": "NoSchedule"}]
    wait_for(
        "the leader in the container to taint every pool node",
        lambda: all(pool_taints(api, name) == tainted for name in POOL_NODES),
        timeout=30,
    )
    placed = {"kind": "TaskRun", "reason": "image-match", "pool": POOL}
    before = egress_placer.metric("egress_placer_decisions_total", placed)
    name = runs.name("cdn")
    runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))

    done = runs.wait_succeeded(TEAM_CDN, "taskruns", [name])
    decision = decision_of(done[name])
    assert (decision.get("pool"), decision.get("reason")) == (POOL, "image-match"), decision
    assert runs.nodes_of(TEAM_CDN, [name])[name] in POOL_NODES
    # The decision was made in the container: its /metrics (on the health port) counted it.
    assert egress_placer.metric("egress_placer_decisions_total", placed) == before + 1
