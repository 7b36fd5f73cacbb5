"""The exit-code table of `egress-placer` (controller/cli/errors.py), one row per cause, and the
errors that go with it: one line on stderr, no traceback, naming what to fix.

| status | cause |
|---|---|
| 0 | all well; --version |
| 1 | drift or findings (`status`: a pool node without its taint) |
| 2 | usage (unknown command or option), invalid settings (the variable named), no usable kubeconfig, an invalid policy |
| 3 | the API server does not answer, or refuses the requests (403) |
| 4 | a bug (an exception no command expected) |

No cluster is needed: "the cluster" here is a small HTTP server that answers the few GETs `status`
sends (tests/e2e/test_cli_on_the_cluster.py runs the same command against the local cluster). The
cluster is found as kubectl finds it: --kubeconfig, EGRESS_PLACER_KUBECONFIG, $KUBECONFIG,
~/.kube/config, then in-cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
from loguru import logger

import controller
import controller.app
import controller.cli.status
from controller.cli import PLUGIN_EXECUTABLE, main, program_name
from controller.cli.errors import Exit
from controller.core.model import TAINT_KEY
from controller.core.policy import load_policy
from controller.core.conversion import V1BETA1, to_version
from controller.core.pools import objects_from_policy
from controller.kube.client import kubeconfig_source
from controller.settings import Settings
from devcluster.build import find_artifacts
from devcluster.process import free_port

POLICY = """\
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress-placer.io/pool: overseas}
    namespaces: [team-cdn]
    images: ["*/cdn-*"]
"""
POOL_TAINT = {"key": TAINT_KEY, "value": "overseas", "effect": "NoSchedule"}
POOLS = "/apis/egress-placer.io/v1beta1/egresspools"
CONFIGS = "/apis/egress-placer.io/v1beta1/egressplacerconfigs"
ARTIFACTS = find_artifacts()  # the local cluster's binaries, found before the tests empty HOME


def kubeconfig_text(server: str) -> str:
    return f"""\
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}, {{name: closed, context: {{cluster: closed, user: u}}}}]
current-context: x
"""


def pool_node(taints: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "metadata": {"name": "egress-1", "uid": "u1", "labels": {"egress-placer.io/pool": "overseas"}},
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"pods": "110"}},
    }


class FakeApiServer:
    """Answers GETs from `objects` (path -> JSON); `refuse`: every request gets 403."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        self.refuse = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if fake.refuse:
                    self._answer(403, {"kind": "Status", "status": "Failure", "message": f"forbidden: {path}", "code": 403})
                elif path in fake.objects:
                    self._answer(200, fake.objects[path])
                else:
                    self._answer(404, {"kind": "Status", "status": "Failure", "message": "not found", "code": 404})

            def _answer(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def cluster_with(self, node: dict[str, Any]) -> None:
        """The policy as the pools API's objects (the default source), and one node."""
        self.objects = {
            POOLS: {"items": [to_version(o, V1BETA1) for o in objects_from_policy(load_policy(POLICY))]},
            CONFIGS: {"items": []},
            "/api/v1/nodes": {"items": [node]},
            "/api/v1/namespaces": {"items": []},
            "/api/v1/pods": {"items": []},
            "/apis/apps/v1/daemonsets": {"items": []},
        }


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No EGRESS_PLACER_* or KUBECONFIG from the caller, an empty home, not in a pod."""
    for name in [n for n in os.environ if n.startswith("EGRESS_PLACER_")]:
        monkeypatch.delenv(name)
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EGRESS_PLACER_LOG_FORMAT", "text")
    monkeypatch.setenv("EGRESS_PLACER_REQUEST_TIMEOUT_SECONDS", "2")
    yield
    logger.remove()  # `run` configured logging to the captured stderr of this test
    logger.add(sys.stderr)


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.cluster_with(pool_node([POOL_TAINT]))
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


def write_kubeconfig(path: Path, server: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(kubeconfig_text(server))
    return path


@pytest.fixture
def kubeconfig(api_server: FakeApiServer, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "fake.kubeconfig", api_server.url)


@pytest.fixture
def closed_kubeconfig(tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "closed.kubeconfig", "https://127.0.0.1:1")


def stderr_line(capsys: pytest.CaptureFixture[str], logged: bool = False) -> str:
    """What the command wrote on stderr: one line, no traceback. `logged`: `run`, once its logging is
    set up, logs why it cannot start first (a JSON line in a cluster, for the log collector)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    if logged:
        assert len(lines) == 2 and "egress-placer cannot start: " in lines[0], err
        return lines[1]
    assert len(lines) == 1, err
    return lines[0]


# -- 0 and 1: the command did its work ----------------------------------------------------------------
def test_status_of_a_cluster_where_all_is_well_is_0(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--kubeconfig", str(kubeconfig)]) == Exit.OK
    assert "egress-1" in capsys.readouterr().out


def test_status_of_a_pool_node_without_its_taint_is_1(
    api_server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api_server.cluster_with(pool_node([]))
    assert main(["status", "--kubeconfig", str(kubeconfig), "--json"]) == Exit.FINDINGS
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["node"], row["taint"]) == ("egress-1", "missing")


def test_version_is_0_and_names_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"{program_name()} {controller.__version__}"
    assert controller.__version__ not in ("", "0+unknown")


# -- finding the cluster as kubectl does --------------------------------------------------------------
@pytest.mark.parametrize(
    ("setting", "variable", "home_config", "expected"),
    [
        ("own", "listed", True, "own"),  # EGRESS_PLACER_KUBECONFIG first: the e2e tests run the controller as itself
        (None, "listed", True, "listed"),  # then $KUBECONFIG (several files joined by ':' are merged)
        (None, None, True, "home"),  # then ~/.kube/config
        (None, None, False, None),  # then the pod's ServiceAccount
        (None, "", True, "home"),  # an empty $KUBECONFIG is no $KUBECONFIG
    ],
)
def test_the_kubeconfig_is_found_as_kubectl_finds_it(
    tmp_path: Path, setting: str | None, variable: str | None, home_config: bool, expected: str | None
) -> None:
    home = tmp_path / "someone"
    if home_config:
        write_kubeconfig(home / ".kube" / "config", "https://home")
    paths = {"own": "/etc/own.kubeconfig", "listed": "/a.kubeconfig:/b.kubeconfig", "home": str(home / ".kube" / "config")}
    environ = {} if variable is None else {"KUBECONFIG": paths.get(variable, variable)}
    settings = Settings(kubeconfig=paths[setting] if setting else None)
    assert kubeconfig_source(settings, environ, home) == (paths[expected] if expected else None)


def test_status_reads_KUBECONFIG(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: N802
    monkeypatch.setenv("KUBECONFIG", f"/nowhere/missing:{kubeconfig}")
    assert main(["status"]) == Exit.OK


def test_status_reads_the_kubeconfig_in_home(api_server: FakeApiServer) -> None:
    write_kubeconfig(Path(os.environ["HOME"]) / ".kube" / "config", api_server.url)
    assert main(["status"]) == Exit.OK


def test_EGRESS_PLACER_KUBECONFIG_comes_before_KUBECONFIG(  # noqa: N802
    kubeconfig: Path, closed_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(closed_kubeconfig))
    monkeypatch.setenv("EGRESS_PLACER_KUBECONFIG", str(kubeconfig))
    assert main(["status"]) == Exit.OK


def test_the_context_option_picks_a_context(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--kubeconfig", str(kubeconfig), "--context", "nosuch"]) == Exit.USAGE
    assert "nosuch" in stderr_line(capsys)


# -- 2: usage or configuration ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["stats"], "invalid choice: 'stats'"),
        (["status", "--jsn"], "unrecognized arguments: --jsn"),
        (["explain", "x.yaml"], "the following arguments are required: --policy"),
    ],
)
def test_usage_errors_are_2_in_one_line(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == Exit.USAGE
    line = stderr_line(capsys)
    assert said in line and line.endswith("--help)")


@pytest.mark.parametrize("command", ["run", "status"])
@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("EGRESS_PLACER_LEASE_DURATION_SECONDS", "fifteen"),
        ("EGRESS_PLACER_INTRUDER_MODE", "kill"),
        ("EGRESS_PLACER_TLS_HOSTS", "a.svc,b.svc"),  # a list is written as JSON
    ],
)
def test_invalid_settings_are_2_and_name_the_variable(
    command: str, variable: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(variable, value)
    assert main([command]) == Exit.USAGE
    line = stderr_line(capsys)
    assert line.startswith(f"egress-placer {command}: invalid settings: {variable}")
    assert variable.removeprefix("EGRESS_PLACER_").lower() + " " not in line  # the variable, not the field


def test_settings_that_only_fail_together_name_both_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EGRESS_PLACER_TLS_CERT_FILE", "/tls/tls.crt")
    assert main(["run"]) == Exit.USAGE
    assert "EGRESS_PLACER_TLS_CERT_FILE and EGRESS_PLACER_TLS_KEY_FILE" in stderr_line(capsys)


@pytest.mark.parametrize("command", ["run", "status"])
def test_no_kubeconfig_outside_a_pod_is_2(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command]) == Exit.USAGE
    line = stderr_line(capsys, logged=command == "run")
    assert "no kubeconfig (EGRESS_PLACER_KUBECONFIG, KUBECONFIG, ~/.kube/config) and no in-cluster ServiceAccount" in line


@pytest.mark.parametrize("command", ["run", "status"])
def test_an_unreadable_kubeconfig_is_2(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken").write_text("clusters: [oops\n")
    assert main([command, "--kubeconfig", str(tmp_path / "broken")]) == Exit.USAGE
    assert f"kubeconfig {tmp_path / 'broken'}:" in stderr_line(capsys, logged=command == "run")


def test_run_with_leader_timings_that_cannot_work_is_2(
    closed_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EGRESS_PLACER_KUBECONFIG", str(closed_kubeconfig))
    monkeypatch.setenv("EGRESS_PLACER_LEASE_DURATION_SECONDS", "2")
    monkeypatch.setenv("EGRESS_PLACER_RENEW_DEADLINE_SECONDS", "3")
    assert main(["run"]) == Exit.USAGE
    assert "leader election needs lease_duration > renew_deadline > retry_period" in stderr_line(capsys, logged=True)


def test_status_with_an_invalid_policy_file_is_2(
    closed_kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npools: [{name: 1}]\n")
    assert main(["status", "--kubeconfig", str(closed_kubeconfig), "--policy", str(policy)]) == Exit.USAGE
    line = stderr_line(capsys)
    assert "egress-placer status: invalid policy:" in line and str(policy) in line


def test_status_with_an_invalid_policy_in_the_cluster_is_2_after_the_table(
    api_server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api_server.objects[POOLS] = {"items": [{"metadata": {"name": "overseas"}, "spec": {"nodes": ["egress-1"], "loadCapacityPerNode": 0}}]}
    assert main(["status", "--kubeconfig", str(kubeconfig)]) == Exit.USAGE
    assert "policy: " in capsys.readouterr().out


# -- 3: the cluster cannot be reached or read ---------------------------------------------------------
def test_status_without_an_api_server_is_3(closed_kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--kubeconfig", str(closed_kubeconfig)]) == Exit.UNREACHABLE
    assert stderr_line(capsys) == (
        "egress-placer status: cannot reach the API server at https://127.0.0.1:1: "
        "Failed to establish a new connection: [Errno 111] Connection refused"
    )


def test_status_refused_by_the_api_server_is_3(
    api_server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api_server.refuse = True
    assert main(["status", "--kubeconfig", str(kubeconfig)]) == Exit.UNREACHABLE
    assert stderr_line(capsys) == "egress-placer status: cannot read the cluster: HTTP 403 Forbidden: forbidden: /apis/egress-placer.io/v1beta1/egresspools"


def test_run_that_never_syncs_its_caches_is_3(
    closed_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(controller.app, "STARTUP_TIMEOUT", 1.0)
    # The servers start before the first list (the conversion webhook must answer while caches sync): on free
    # ports, not the defaults another process on this machine may hold.
    monkeypatch.setenv("EGRESS_PLACER_WEBHOOK_PORT", str(free_port()))
    monkeypatch.setenv("EGRESS_PLACER_HEALTH_PORT", str(free_port()))
    policy = closed_kubeconfig.with_name("policy.yaml")
    policy.write_text(POLICY)  # a file: no ConfigMap to wait for
    assert main(["run", "--kubeconfig", str(closed_kubeconfig), "--policy", str(policy)]) == Exit.UNREACHABLE
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the log of the retries
    assert last.startswith("egress-placer run: the ") and last.endswith("cache did not sync in 1s")


# -- 4: a bug -----------------------------------------------------------------------------------------
def test_an_unexpected_exception_is_4_in_one_line_not_1(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: Any, **kwargs: Any) -> int:
        raise KeyError("spec")

    monkeypatch.setattr(controller.cli.status, "run_status", broken)
    assert main(["status", "--kubeconfig", str(kubeconfig)]) == Exit.INTERNAL
    assert stderr_line(capsys) == "egress-placer status: internal error (a bug in egress-placer): KeyError: 'spec'"


# -- the kubectl plugin -------------------------------------------------------------------------------
def test_the_plugin_executable_says_kubectl_egress_placer() -> None:
    assert program_name(f"/usr/local/bin/{PLUGIN_EXECUTABLE}") == "kubectl egress-placer"
    assert program_name("/usr/local/bin/egress-placer") == "egress-placer"


def test_kubectl_runs_it_as_the_plugin_egress_placer(tmp_path: Path) -> None:
    """The installed console script, found on PATH by the local cluster's kubectl."""
    artifacts = ARTIFACTS
    if artifacts is None:
        pytest.skip("the local cluster's kubectl is not built yet (python -m devcluster build)")
    script = shutil.which(PLUGIN_EXECUTABLE, path=str(Path(sys.executable).parent))
    assert script, f"{PLUGIN_EXECUTABLE} is a console script of the package (pyproject.toml)"
    env = {"PATH": f"{Path(script).parent}{os.pathsep}/usr/bin:/bin", "HOME": str(tmp_path)}
    kubectl = str(artifacts.binary("kubectl"))
    listed = subprocess.run([kubectl, "plugin", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert script in listed.stdout, listed.stdout + listed.stderr
    version = subprocess.run([kubectl, "egress-placer", "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert (version.returncode, version.stdout.strip()) == (0, f"kubectl egress-placer {controller.__version__}")
    status = subprocess.run([kubectl, "egress-placer", "status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == Exit.USAGE and status.stderr.startswith("kubectl egress-placer status: no kubeconfig")
