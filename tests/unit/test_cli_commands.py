"""Every subcommand of `egress-placer` (issue 28): an unreachable cluster (a closed local port) is exit 3
in one line with no DEBUG, bad input is exit 2 in one line, and `-o yaml` prints one YAML document that
parses (`-o json` too); `-` reads standard input. The fake API server and fixtures are those of
test_cli_exit_codes.py."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.cli import COMMANDS, main
from controller.cli.errors import Exit
from controller.cli.status import storage_line
from tests.unit.test_cli_exit_codes import (  # noqa: F401 - fixtures
    POLICY,
    FakeApiServer,
    api_server,
    clean_environment,
    closed_kubeconfig,
    kubeconfig,
    stderr_line,
)

UNREACHABLE = "cannot reach the API server at https://127.0.0.1:1: Failed to establish a new connection: [Errno 111] Connection refused"
TASKRUN = """\
apiVersion: tekton.dev/v1
kind: TaskRun
metadata: {name: upload-1, namespace: team-cdn}
spec:
  taskSpec:
    steps: [{name: up, image: registry.example.com/cdn-uploader:1.2}]
"""
CLUSTER_COMMANDS = {"run", "status", "uninstall", "migrate-storage"}


def test_every_command_is_covered_here() -> None:
    assert set(COMMANDS) == CLUSTER_COMMANDS | {"explain", "migrate-policy", "completion", "suggest"}


# -- an unreachable cluster: 3, one line, no DEBUG, at once -------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [["status"], ["status", "-o", "yaml"], ["uninstall", "--dry-run"], ["uninstall", "--yes"], ["uninstall", "--dry-run", "-o", "yaml"],
     ["migrate-storage"], ["migrate-storage", "--dry-run", "-o", "yaml"]],
)
def test_an_unreachable_cluster_is_3_in_one_line(argv: list[str], closed_kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--kubeconfig", str(closed_kubeconfig)]) == Exit.UNREACHABLE
    assert stderr_line(capsys) == f"egress-placer {argv[0]}: {UNREACHABLE}"


def test_uninstall_of_an_unreachable_cluster_prints_no_debug_and_does_not_retry(closed_kubeconfig: Path) -> None:
    """The report of issue 28: DEBUG lines, an AttributeError, exit 4, after 8 s."""
    script = "import sys; sys.argv[0] = 'egress-placer'; from controller.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", script, "uninstall", "--dry-run", "--kubeconfig", str(closed_kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (Exit.UNREACHABLE, "", f"egress-placer uninstall: {UNREACHABLE}\n")


def test_run_of_an_unreachable_cluster_is_3() -> None:
    """`run` waits for its caches (the controller retries by design): test_cli_exit_codes.py,
    test_run_that_never_syncs_its_caches_is_3."""
    import tests.unit.test_cli_exit_codes as exit_codes

    assert callable(exit_codes.test_run_that_never_syncs_its_caches_is_3)


# -- bad input: 2, one line ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["status", "-o", "xml"], "argument -o/--output: invalid choice: 'xml'"),
        (["uninstall", "-o", "table", "--dry-run"], "argument -o/--output: invalid choice: 'table'"),
        (["uninstall", "--dry-run", "--timeout", "soon"], "argument --timeout: invalid float value: 'soon'"),
        (["migrate-storage", "-o", "table"], "argument -o/--output: invalid choice: 'table'"),
        (["migrate-storage", "--yes"], "unrecognized arguments: --yes"),
        (["run", "--verbose"], "unrecognized arguments: --verbose"),
        (["completion", "fish"], "argument shell: invalid choice: 'fish'"),
        (["migrate-policy"], "the following arguments are required: POLICY.yaml"),
        (["explain", "--policy", "p.yaml", "-o", "csv", "x.yaml"], "argument -o/--output: invalid choice: 'csv'"),
    ],
)
def test_bad_arguments_are_2_in_one_line(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == Exit.USAGE
    assert said in stderr_line(capsys)


def test_uninstall_without_a_mode_is_2(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["uninstall", "--kubeconfig", str(kubeconfig), "-o", "yaml"]) == Exit.USAGE
    assert stderr_line(capsys) == "egress-placer uninstall: say --dry-run (show what would be removed) or --yes (remove it)"


def test_status_with_a_bad_policy_file_is_2(kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.yaml").write_text("pools: [{name: 1}]\n")
    assert main(["status", "--kubeconfig", str(kubeconfig), "--policy", str(tmp_path / "p.yaml"), "-o", "yaml"]) == Exit.USAGE
    assert yaml.safe_load(capsys.readouterr().out) == []  # no policy in force: no pool (the problem is on stderr)


def test_migrate_policy_of_a_bad_policy_is_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.yaml").write_text("kind: Deployment\n")
    assert main(["migrate-policy", str(tmp_path / "p.yaml"), "-o", "yaml"]) == Exit.USAGE
    assert capsys.readouterr().out == ""


def test_explain_of_a_deployment_is_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.yaml").write_text(POLICY)
    (tmp_path / "d.yaml").write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n")
    assert main(["explain", "--policy", str(tmp_path / "p.yaml"), str(tmp_path / "d.yaml"), "-o", "yaml"]) == Exit.USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and "nothing to explain: found a Deployment" in captured.err


def test_standard_input_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(POLICY))
    assert main(["explain", "--policy", "-", "-"]) == Exit.USAGE
    assert "(stdin): standard input (-) can be given once" in capsys.readouterr().err


# -- -o yaml (and json): one document that parses --------------------------------------------------------
def test_status_as_yaml_and_json(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--kubeconfig", str(kubeconfig), "-o", "yaml"]) == Exit.OK
    rows = yaml.safe_load(capsys.readouterr().out)
    assert [(r["pool"], r["node"], r["taint"], r["agents_missing"]) for r in rows] == [("overseas", "egress-1", "ok", [])]
    assert main(["status", "--kubeconfig", str(kubeconfig), "-o", "json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out) == rows
    assert main(["status", "--kubeconfig", str(kubeconfig), "--json"]) == Exit.OK  # as before
    assert json.loads(capsys.readouterr().out) == rows


def test_uninstall_dry_run_as_yaml(api_server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api_server.objects["/version"] = {"major": "1"}
    assert main(["uninstall", "--dry-run", "--kubeconfig", str(kubeconfig), "-o", "yaml"]) == Exit.OK
    report = yaml.safe_load(capsys.readouterr().out)
    assert report["dryRun"] is True and report["leader"] is None
    assert report["taintedNodes"] == ["egress-1"]
    assert report["objects"][0] == {
        "what": "deployment egress-placer/egress-placer",
        "path": "/apis/apps/v1/namespaces/egress-placer/deployments/egress-placer",
        "present": False,
    }


def test_explain_as_yaml_and_json_from_standard_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "p.yaml").write_text(POLICY)
    monkeypatch.setattr(sys, "stdin", io.StringIO(TASKRUN))
    assert main(["explain", "--policy", str(tmp_path / "p.yaml"), "-", "-o", "yaml"]) == Exit.OK
    (result,) = yaml.safe_load(capsys.readouterr().out)
    assert (result["kind"], result["name"], result["pool"], result["reason"]) == ("TaskRun", "upload-1", "overseas", "image-match")
    (tmp_path / "r.yaml").write_text(TASKRUN)
    assert main(["explain", "--policy", str(tmp_path / "p.yaml"), str(tmp_path / "r.yaml"), "-o", "json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out) == [result]
    assert main(["explain", "--policy", str(tmp_path / "p.yaml"), str(tmp_path / "r.yaml")]) == Exit.OK  # as before
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [result]


def test_migrate_policy_as_yaml_and_json_from_standard_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(POLICY))
    assert main(["migrate-policy", "-", "-o", "yaml"]) == Exit.OK
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [("EgressPool", "overseas")]
    monkeypatch.setattr(sys, "stdin", io.StringIO(POLICY))
    assert main(["migrate-policy", "-", "-o", "json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out) == objects


# -- completion and help ----------------------------------------------------------------------------------
@pytest.mark.parametrize("shell", ["bash", "zsh", "tcsh"])
def test_completion_names_every_command(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == Exit.OK
    script = capsys.readouterr().out
    assert all(name in script for name in COMMANDS) and "--output" in script


def test_help_says_the_policy_comes_from_the_pools_api_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: the pools API's EgressPool objects" in text
    assert "default: the ConfigMap in the settings" not in text


def crd_storing(plural: str, stored: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{plural}.egress-placer.io"},
        "spec": {"names": {"kind": "EgressPool"}, "versions": [{"name": "v1alpha1"}, {"name": "v1beta1", "storage": True}]},
        "status": {"storedVersions": stored},
    }


def test_migrate_storage_dry_run_as_yaml_and_text(api_server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    api_server.objects.update({
        "/version": {"major": "1"},
        f"{crds}/egresspools.egress-placer.io": crd_storing("egresspools", ["v1alpha1", "v1beta1"]),
        f"{crds}/egressplacerconfigs.egress-placer.io": crd_storing("egressplacerconfigs", ["v1beta1"]),
    })
    assert main(["migrate-storage", "--dry-run", "--kubeconfig", str(kubeconfig), "-o", "yaml"]) == Exit.OK
    assert yaml.safe_load(capsys.readouterr().out) == {
        "dryRun": True,
        "steps": [
            "egresspools/overseas: would be stored as v1beta1",
            "egresspools.egress-placer.io: storedVersions would be [v1beta1] (was [v1alpha1, v1beta1])",
        ],
    }
    assert main(["migrate-storage", "--dry-run", "--kubeconfig", str(kubeconfig)]) == Exit.OK
    assert "egresspools/overseas: would be stored as v1beta1" in capsys.readouterr().out


def test_migrate_storage_refused_is_3_and_old_crds_are_2(api_server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    api_server.objects["/version"] = {"major": "1"}
    assert main(["migrate-storage", "--kubeconfig", str(kubeconfig)]) == Exit.UNREACHABLE  # no CRD: 404
    assert stderr_line(capsys).startswith("egress-placer migrate-storage: cannot read the cluster: ")
    old = crd_storing("egresspools", ["v1alpha1"])
    old["spec"]["versions"] = [{"name": "v1alpha1", "storage": True}]
    api_server.objects[f"{crds}/egresspools.egress-placer.io"] = old
    assert main(["migrate-storage", "--kubeconfig", str(kubeconfig), "-o", "json"]) == Exit.USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "egresspools.egress-placer.io stores v1alpha1, not v1beta1: install the CRDs that serve v1beta1 first" in captured.err


# -- status: a line while a CRD's storedVersions still lists v1alpha1 ---------------------------------------
@pytest.mark.parametrize(
    "stored, line",
    [
        ({}, None),  # no CRD installed, or not readable by this user
        ({"egresspools.egress-placer.io": ["v1beta1"], "egressplacerconfigs.egress-placer.io": ["v1beta1"]}, None),
        ({"egresspools.egress-placer.io": ["v1alpha1", "v1beta1"], "egressplacerconfigs.egress-placer.io": ["v1beta1"]},
         "storage: status.storedVersions still lists v1alpha1: egresspools.egress-placer.io [v1alpha1, v1beta1]. "
         "The leader migrates the stored objects to v1beta1 after its election (a failure: Warning Event "
         "StorageMigrationFailed, kubectl describe crd egresspools.egress-placer.io); egress-placer migrate-storage does it now"),
        ({"egresspools.egress-placer.io": ["v1alpha1"], "egressplacerconfigs.egress-placer.io": ["v1alpha1", "v1beta1"]},
         "storage: status.storedVersions still lists v1alpha1: egresspools.egress-placer.io [v1alpha1]; "
         "egressplacerconfigs.egress-placer.io [v1alpha1, v1beta1]. The leader"),
    ],
)
def test_the_storage_line_names_the_crds_behind(stored: dict[str, list[str]], line: str | None) -> None:
    """`line`: the line, or its beginning."""
    said = storage_line(stored)
    assert (said is None) == (line is None) and (said or "").startswith(line or "")


@pytest.mark.parametrize(
    "output, on_stdout",
    [([], True), (["-o", "json"], False), (["-o", "yaml"], False), (["--json"], False)],
)
def test_status_says_when_stored_versions_still_list_v1alpha1(
    api_server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str], output: list[str], on_stdout: bool
) -> None:
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    api_server.objects.update({
        f"{crds}/egresspools.egress-placer.io": crd_storing("egresspools", ["v1alpha1", "v1beta1"]),
        f"{crds}/egressplacerconfigs.egress-placer.io": crd_storing("egressplacerconfigs", ["v1beta1"]),
    })
    assert main(["status", "--kubeconfig", str(kubeconfig), *output]) == Exit.OK  # the leader tries again: no finding
    captured = capsys.readouterr()
    said = "storage: status.storedVersions still lists v1alpha1: egresspools.egress-placer.io [v1alpha1, v1beta1]."
    assert (said in captured.out, said in captured.err) == (on_stdout, not on_stdout)
    if not on_stdout:  # the rows, as before
        rows = yaml.safe_load(captured.out)
        assert [(r["pool"], r["node"], r["taint"]) for r in rows] == [("overseas", "egress-1", "ok")]
    api_server.objects[f"{crds}/egresspools.egress-placer.io"] = crd_storing("egresspools", ["v1beta1"])  # migrated
    assert main(["status", "--kubeconfig", str(kubeconfig), *output]) == Exit.OK
    assert "storage:" not in "".join(capsys.readouterr())
