"""End to end, the command line against the local cluster as an administrator runs it: found through
$KUBECONFIG like kubectl (no EGRESS_PLACER_* variable: the policy is the pools API's objects, as the
controller here reads it), directly and as the kubectl plugin
`kubectl egress-placer`. Exit 0 while the controller keeps the pool right; 1 once a pool node lost
its taint (the controller stopped, so that nobody puts it back); 3 when the API server does not answer.
tests/unit/test_cli_exit_codes.py has the whole table."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from controller.cli import PLUGIN_EXECUTABLE
from controller.cli.errors import Exit
from devcluster.process import free_port
from devcluster.cluster import Cluster
from devplacer.local_placer import install_pools, stop_controller
from tests.e2e.harness import POLICY_FILE, Placer, as_an_administrator, egress_placer_command, pool_taints, running_placer
from tests.e2e.tekton_runs import POOL_NODES, POOL_TAINT
from tests.kube import Api, node
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

UNTAINTED = "egress-2"


@pytest.fixture(scope="module")
def egress_placer(devcluster: Cluster, api: Api, tenants: tuple[str, str]) -> Iterator[Placer]:
    """egress-placer as installed by default, reading the e2e policy as pools API objects: what the
    command, with no EGRESS_PLACER_* variable, reads too. The objects and the cluster made plain after."""
    # The pools API objects go before the webhook configuration (deletions pass it anyway).
    with running_placer(devcluster, api, POLICY_FILE, policy_source="pools", undo=lambda: install_pools(devcluster, [])) as placer:
        yield placer


def status_rows(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    return {row["node"]: row for row in json.loads(done.stdout)}


def test_status_is_0_while_the_controller_keeps_the_pool_right(egress_placer: Placer, api: Api) -> None:
    cluster = egress_placer.cluster
    wait_for("every pool node tainted", lambda: all(pool_taints(api, n) == [POOL_TAINT] for n in POOL_NODES), timeout=30)
    done = egress_placer_command(cluster, "status", "--json")
    assert done.returncode == Exit.OK, done.stdout + done.stderr
    rows = status_rows(done)
    assert set(rows) == POOL_NODES and {r["taint"] for r in rows.values()} == {"ok"}


def test_status_is_1_when_a_pool_node_lost_its_taint_also_as_the_kubectl_plugin(egress_placer: Placer, api: Api) -> None:
    cluster = egress_placer.cluster
    stop_controller(cluster)  # the module's teardown makes the cluster plain again
    listed = api.call("GET", node(UNTAINTED))
    kept = [t for t in listed["spec"].get("taints") or [] if t != POOL_TAINT]
    api.json_patch(node(UNTAINTED), [{"op": "replace", "path": "/spec/taints", "value": kept}])

    done = egress_placer_command(cluster, "status", "--json")
    assert done.returncode == Exit.FINDINGS, done.stdout + done.stderr
    assert status_rows(done)[UNTAINTED]["taint"] == "missing"

    assert shutil.which(PLUGIN_EXECUTABLE, path=str(Path(sys.executable).parent)), "pip install -e . makes the plugin"
    plugin = as_an_administrator(cluster, str(cluster.binary("kubectl")), "egress-placer", "status")
    assert plugin.returncode == Exit.FINDINGS, plugin.stdout + plugin.stderr
    (line,) = [ln for ln in plugin.stdout.splitlines() if UNTAINTED in ln]
    assert " missing " in line


def test_status_is_3_when_the_api_server_does_not_answer(egress_placer: Placer, tmp_path: Path) -> None:
    cluster = egress_placer.cluster
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    closed = tmp_path / "kubeconfig"
    closed.write_text(yaml.safe_dump(config))
    done = egress_placer_command(cluster, "status", kubeconfig=closed)
    assert done.returncode == Exit.UNREACHABLE, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("egress-placer status: cannot reach the API server at https://127.0.0.1:") and "Connection refused" in line
