"""End-to-end checks of the local cluster (marker `cluster`): the real Tekton controller finishes
TaskRuns and PipelineRuns on KWOK nodes, the real scheduler obeys node selectors and taints, RBAC
refuses a ServiceAccount without rights, the command line's up/status/kubeconfig/down leave
no process behind, a failed `up` stops what it started, a port taken under `up` makes it start again
on fresh ports, and the pytest fixture's cluster goes when its pytest process is killed."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from kubernetes.client.exceptions import ApiException

import devcluster.cluster as cluster_module
from devcluster import build, tekton_resolvers
from devcluster.cluster import EGRESS_POOL, EGRESS_POOL_LABEL, Cluster, ClusterError
from devcluster.process import ProcessRecord, spawn
from devcluster.pytest_plugin import session_optional
from tests.kube import TEKTON, Api, api_for, namespaced, node, pods
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
TAINT = {"key": EGRESS_POOL_LABEL, "value": EGRESS_POOL, "effect": "NoSchedule"}


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def _finished_run(api: Api, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
    """The run once Succeeded=True; fails the test at once on Succeeded=False."""
    run = api.call("GET", namespaced(namespace, plural, name, group=TEKTON))
    succeeded = _condition(run, "Succeeded")
    if succeeded and succeeded["status"] == "False":
        pytest.fail(f"{plural}/{name} failed: {succeeded.get('reason')}: {succeeded.get('message')}")
    return run if succeeded and succeeded["status"] == "True" else None


def _create(api: Api, namespace: str, plural: str, body: dict[str, Any]) -> None:
    api.create(namespaced(namespace, plural, group=TEKTON), body)


def _step(name: str) -> dict[str, Any]:
    return {"name": name, "image": "busybox", "script": f"echo {name}"}


def _time(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_taskrun_with_inline_task_runs_on_a_kwok_node_and_succeeds(
    api: Api, namespace: str
) -> None:
    body = {
        "apiVersion": "tekton.dev/v1",
        "kind": "TaskRun",
        "metadata": {"name": "hello"},
        "spec": {"taskSpec": {"steps": [_step("hello"), _step("bye")]}},
    }
    _create(api, namespace, "taskruns", body)

    run = wait_for("TaskRun hello to succeed", lambda: _finished_run(api, namespace, "taskruns", "hello"))

    pod = api.call("GET", pods(namespace, run["status"]["podName"]))
    assert pod["status"]["phase"] == "Succeeded"
    assert api.call("GET", node(pod["spec"]["nodeName"]))["metadata"]["labels"]["type"] == "kwok"
    steps = run["status"]["steps"]
    assert [s["name"] for s in steps] == ["hello", "bye"]
    assert all(s["terminated"]["exitCode"] == 0 for s in steps)


def test_pipelinerun_runs_its_second_task_after_the_first_and_succeeds(
    api: Api, namespace: str
) -> None:
    body = {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": "two-tasks"},
        "spec": {
            "pipelineSpec": {
                "tasks": [
                    {"name": "first", "taskSpec": {"steps": [_step("one")]}},
                    {"name": "second", "runAfter": ["first"], "taskSpec": {"steps": [_step("two")]}},
                ]
            }
        },
    }
    _create(api, namespace, "pipelineruns", body)

    run = wait_for(
        "PipelineRun two-tasks to succeed", lambda: _finished_run(api, namespace, "pipelineruns", "two-tasks")
    )

    children = {c["pipelineTaskName"]: c["name"] for c in run["status"]["childReferences"]}
    assert set(children) == {"first", "second"}
    first, second = (
        api.call("GET", namespaced(namespace, "taskruns", children[task], group=TEKTON)) for task in ("first", "second")
    )
    assert _time(second["status"]["startTime"]) >= _time(first["status"]["completionTime"])


@contextlib.contextmanager
def _egress_nodes_tainted(api: Api, namespace: str, tainted: bool) -> Iterator[list[str]]:
    """Put the pool taint on every egress node for the duration (removed afterwards), once the scheduler
    has seen it on each of them (its cache follows the API server by a watch, late on a loaded machine)."""
    names = [n["metadata"]["name"] for n in api.items(node(), labelSelector=f"{EGRESS_POOL_LABEL}={EGRESS_POOL}")]
    assert names, "the cluster has no egress nodes"
    if not tainted:
        yield names
        return
    for name in names:
        api.merge_patch(node(name), {"spec": {"taints": [TAINT]}})
    try:
        for name in names:
            _scheduler_sees_the_taint(api, namespace, name)
        yield names
    finally:
        for name in names:
            api.merge_patch(node(name), {"spec": {"taints": None}})


def _scheduler_sees_the_taint(api: Api, namespace: str, node_name: str) -> None:
    """Wait until the scheduler refuses a pod pinned to `node_name` without the toleration: it has seen the
    taint. A sentinel it binds instead (its cache was behind) is deleted and another one tried."""
    attempts = itertools.count()
    sentinel: list[str] = []

    def refused() -> bool:
        if not sentinel:
            sentinel.append(f"sentinel-{node_name}-{next(attempts)}")
            body = _pod(sentinel[0], selector=False, toleration=False)
            body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node_name}
            api.create(pods(namespace), body)
            return False
        outcome = _scheduling_outcome(api, namespace, sentinel[0])
        if outcome is None:
            return False
        api.delete(pods(namespace, sentinel.pop()))
        return outcome == "unschedulable"

    wait_for(f"the scheduler to see the pool taint on {node_name}", refused, timeout=60)


def _pod(name: str, selector: bool, toleration: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if selector:
        spec["nodeSelector"] = {EGRESS_POOL_LABEL: EGRESS_POOL}
    if toleration:
        spec["tolerations"] = [{**TAINT, "operator": "Equal"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _scheduling_outcome(api: Api, namespace: str, name: str) -> str | None:
    """The node a pod was bound to, "unschedulable" once the scheduler gave up on it, else None."""
    pod = api.call("GET", pods(namespace, name))
    if pod["spec"].get("nodeName"):
        return pod["spec"]["nodeName"]
    scheduled = _condition(pod, "PodScheduled")
    if scheduled and scheduled["status"] == "False" and scheduled.get("reason") == "Unschedulable":
        return "unschedulable"
    return None


def _listening(pid: int) -> set[tuple[str, int]]:
    """(hex local address, port) of the TCP sockets process `pid` listens on (/proc/PID/net/tcp{,6})."""
    fd_dir = Path(f"/proc/{pid}/fd")
    inodes = set()
    for fd in fd_dir.iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # state LISTEN, one of the process' sockets
                address, port = fields[1].split(":")
                found.add((address, int(port, 16)))
    return found


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def test_tekton_webhook_serves_conversion_and_listens_on_loopback(devcluster: Cluster, api: Api, namespace: str) -> None:
    """With `--with tekton-webhook` (the session cluster): a v1beta1 Task goes in and comes out as v1
    through Tekton's conversion webhook, and the webhook's admission and probe ports are loopback
    only (its one other listener is knative's profiling server on an ephemeral port, see README)."""
    if not devcluster.runs_with("tekton-webhook"):
        pytest.skip("this cluster runs without Tekton's webhook")
    body = {"apiVersion": "tekton.dev/v1beta1", "kind": "Task", "metadata": {"name": "beta"},
            "spec": {"steps": [{"name": "s", "image": "busybox", "script": "true"}]}}
    api.create(namespaced(namespace, "tasks", group="/apis/tekton.dev/v1beta1"), body)

    as_v1 = api.call("GET", namespaced(namespace, "tasks", "beta", group=TEKTON))

    assert as_v1["apiVersion"] == "tekton.dev/v1"
    assert [s["name"] for s in as_v1["spec"]["steps"]] == ["s"]
    record = devcluster.process("tekton-webhook")
    assert record is not None and record.alive()
    listening = _listening(record.pid)
    ports = devcluster.state()["ports"]
    loopback_ports = {port for address, port in listening if address in LOOPBACK}
    assert {ports["tekton-webhook"], ports["tekton-webhook-probes"]} <= loopback_ports
    others = {port for address, port in listening if address not in LOOPBACK}
    assert len(others) <= 1 and not others & set(ports.values()), listening


PODS_PER_CASE = 6  # twice the egress nodes: a scheduler ignoring the taint would use some of them


@pytest.mark.parametrize(
    ("tainted", "selector", "toleration", "expected"),
    [
        pytest.param(False, True, False, "egress", id="selector-lands-on-egress"),
        pytest.param(True, False, False, "ordinary", id="taint-keeps-plain-pods-off"),
        pytest.param(True, True, False, "unschedulable", id="selector-without-toleration-stays-pending"),
        pytest.param(True, True, True, "egress", id="selector-with-toleration-lands-on-egress"),
    ],
)
def test_scheduler_enforces_selector_and_taint(
    api: Api,
    namespace: str,
    tainted: bool,
    selector: bool,
    toleration: bool,
    expected: str,
) -> None:
    with _egress_nodes_tainted(api, namespace, tainted) as egress_nodes:
        names = [f"pod-{i}" for i in range(PODS_PER_CASE)]
        for name in names:
            api.create(pods(namespace), _pod(name, selector, toleration))
        outcomes = [
            wait_for(f"the scheduler to decide on {name}", lambda n=name: _scheduling_outcome(api, namespace, n))
            for name in names
        ]

    if expected == "unschedulable":
        assert outcomes == ["unschedulable"] * PODS_PER_CASE
    elif expected == "egress":
        assert all(node in egress_nodes for node in outcomes), outcomes
    else:
        assert all(node != "unschedulable" and node not in egress_nodes for node in outcomes), outcomes


def test_service_account_without_rights_is_refused_until_granted(
    devcluster: Cluster, api: Api, namespace: str, tmp_path: Path
) -> None:
    user = f"system:serviceaccount:{namespace}:nobody"
    as_nobody = api_for(devcluster.mint_kubeconfig(user, out=tmp_path / "k"))

    review = as_nobody.create(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews", {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    assert review["status"]["userInfo"]["username"] == user
    assert {"system:serviceaccounts", f"system:serviceaccounts:{namespace}"} <= set(review["status"]["userInfo"]["groups"])
    with pytest.raises(ApiException) as refused:
        as_nobody.items(pods(namespace))
    assert refused.value.status == 403

    # Control: the same identity is allowed once a Role is bound to the ServiceAccount.
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    api.create(namespaced(namespace, "roles", group=rbac), {"metadata": {"name": "list-pods"}, "rules": [rule]})
    api.create(
        namespaced(namespace, "rolebindings", group=rbac),
        {
            "metadata": {"name": "nobody-lists-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "list-pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "nobody", "namespace": namespace}],
        },
    )

    def allowed() -> bool:
        try:
            as_nobody.items(pods(namespace))
            return True
        except ApiException as err:
            assert err.status == 403
            return False

    wait_for("the RoleBinding to take effect", allowed)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "devcluster", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def test_cli_up_status_kubeconfig_down_leaves_no_process(tmp_path: Path) -> None:
    directory = (tmp_path / f"cli-{uuid.uuid4().hex[:6]}").resolve()
    try:
        up = _cli("up", "--dir", str(directory), "--nodes", "1", "--egress-nodes", "1")
        assert up.returncode == 0, up.stdout + up.stderr
        assert up.stdout.strip().splitlines()[-1] == f"export KUBECONFIG={directory}/kubeconfig"

        cluster = Cluster(directory)
        cluster.start_process("sleeper", ["sleep", "600"])  # an extra process `down` must stop too
        records = cluster.processes()
        assert {r.name for r in records} == {
            "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "tekton-controller",
            "sleeper",
        }
        assert all((directory / "pids" / f"{r.name}.pid").read_text().strip() == str(r.pid) for r in records)
        assert _cli("status", "--dir", str(directory)).returncode == 0
        # without Tekton's resolvers, their namespace still exists (a release always has it; k8s/ puts a Role there)
        assert cluster.api().get(f"/api/v1/namespaces/{tekton_resolvers.NAMESPACE}") is not None

        minted = _cli("kubeconfig", "--dir", str(directory), "--user", "system:serviceaccount:default:someone")
        assert minted.returncode == 0, minted.stderr
        assert Path(minted.stdout.strip()).is_file()

        down = _cli("down", "--dir", str(directory))
        assert down.returncode == 0, down.stdout + down.stderr
        assert [r.name for r in records if r.alive()] == []
        assert _cli("status", "--dir", str(directory)).returncode == 1
        assert _cli("down", "--dir", str(directory)).returncode == 0  # idempotent
    finally:
        Cluster(directory).down()


INNER_SESSION = '''
import pathlib, time

def test_hold(devcluster):
    pids = " ".join(str(p.pid) for p in devcluster.processes())
    (pathlib.Path(__file__).parent / "cluster-pids").write_text(pids)
    # Part of the scenario: the session holds its cluster until the outer test kills it.
    time.sleep(600)
'''


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_fixture_cluster_goes_when_the_pytest_process_is_killed(
    tmp_path: Path, signum: signal.Signals
) -> None:
    (tmp_path / "test_inner.py").write_text(INNER_SESSION)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "EGRESS_PLACER_DEVCLUSTER": "",
    }
    argv = [sys.executable, "-m", "pytest", "-p", "devcluster.pytest_plugin", "-p", "no:cacheprovider",
            f"--basetemp={tmp_path / 'base'}", f"--rootdir={tmp_path}", str(tmp_path / "test_inner.py")]
    inner = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid_file = tmp_path / "cluster-pids"
        wait_for("the inner session's cluster", lambda: pid_file.exists() or inner.poll() is not None, timeout=300)
        assert inner.poll() is None, "the inner pytest session ended before its cluster was up"
        pids = [int(p) for p in pid_file.read_text().split()]
        assert len(pids) == 6 + len(session_optional())  # the core's six, and e.g. Tekton's webhook

        inner.send_signal(signum)
        inner.wait(timeout=60)

        def gone(pid: int) -> bool:
            try:
                return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith(("Z", "X"))
            except FileNotFoundError:
                return True

        wait_for("every cluster process to be gone", lambda: all(gone(pid) for pid in pids), timeout=60)
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()


def test_up_that_fails_reports_the_log_tail_and_stops_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = build.ensure_built(lambda _: None)
    broken = build.Artifacts(tmp_path / "artifacts")
    broken.bin_dir.mkdir(parents=True)
    for binary in real.bin_dir.iterdir():
        (broken.bin_dir / binary.name).symlink_to(binary)
    broken.tekton_config.symlink_to(real.tekton_config)
    tekton = broken.binary("tekton-controller")
    tekton.unlink()
    tekton.write_text("#!/bin/sh\necho 'tekton: refusing to start (test)'\nexit 3\n")
    tekton.chmod(0o755)
    monkeypatch.setattr(cluster_module.build, "ensure_built", lambda log: broken)
    started: list[ProcessRecord] = []

    def recording_spawn(*args: Any, **kwargs: Any) -> ProcessRecord:
        started.append(spawn(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(cluster_module, "spawn", recording_spawn)
    cluster = Cluster(tmp_path / "cluster", nodes=1, egress_nodes=1, log=lambda _: None)

    with pytest.raises(ClusterError, match="tekton-controller exited") as failure:
        cluster.up()

    assert "refusing to start (test)" in str(failure.value)
    assert [r.name for r in started] == [
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "tekton-controller",
    ]
    assert [r.name for r in started if r.alive()] == []


def test_up_starts_again_on_fresh_ports_when_a_neighbour_takes_one(tmp_path: Path) -> None:
    """`up` picks free ports and binds them later: here another process takes the API server's port in
    between (once etcd is ready, the API server's turn next), as a neighbouring cluster did in CI. `up`
    says so in a line and comes up on fresh ports."""
    lines: list[str] = []
    taken: list[int] = []
    neighbour = socket.socket(socket.AF_INET, socket.SOCK_STREAM)

    def log(line: str) -> None:
        lines.append(line)
        if line.endswith("etcd ready") and not taken:
            taken.append(cluster.state()["ports"]["kube-apiserver"])
            neighbour.bind(("127.0.0.1", taken[0]))
            neighbour.listen()

    cluster = Cluster(tmp_path / "cluster", nodes=1, egress_nodes=1, log=log)
    try:
        cluster.up()

        assert taken and cluster.state()["ports"]["kube-apiserver"] != taken[0]
        retries = [line for line in lines if "starting again on fresh ports" in line]
        assert len(retries) == 1, lines
        assert retries[0].startswith("[devcluster] kube-apiserver could not bind its port")
        assert f"127.0.0.1:{taken[0]}: bind: address already in use" in retries[0]
        assert "(attempt 2 of 3)" in retries[0]
        assert cluster.is_running()
    finally:
        neighbour.close()
        cluster.down()
