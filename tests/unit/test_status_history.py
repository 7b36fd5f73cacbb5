"""`egress-placer status` shows each pool's `history` rule (docs/suggest.md): on or off, the groups in force,
when they were read and the last error, from the EgressPool's `status.history` the leader writes; in the
table and in `-o json|yaml` (a `history` key on each row of the pool)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from controller.cli import main
from controller.cli.errors import Exit
from controller.core.conversion import V1BETA1, to_version
from controller.core.policy import load_policy
from controller.core.pools import objects_from_policy
from tests.unit.test_cli_exit_codes import (  # noqa: F401 - fixtures
    POOLS,
    POOL_TAINT,
    FakeApiServer,
    api_server,
    clean_environment,
    kubeconfig,
    pool_node,
)

WITH_HISTORY = """\
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress-placer.io/pool: overseas}
    namespaces: [team-cdn]
    images: ["*/cdn-*"]
    history:
      p90BytesAtLeast: 1073741824
      window: 7d
      prometheus: {url: "http://prometheus.monitoring:9090"}
  - name: plain
    nodeSelector: {egress-placer.io/pool: plain}
    images: ["*/upload-*"]
"""


def pools_with_status(history: dict | None) -> dict:
    items = [to_version(o, V1BETA1) for o in objects_from_policy(load_policy(WITH_HISTORY))]
    for item in items:
        if item["metadata"]["name"] == "overseas" and history is not None:
            item["status"] = {"history": history}
    return {"items": items}


STATUS = {"groups": 2, "readAt": "2026-12-05T23:50:00Z", "lastError": "http://prometheus.monitoring:9090/api/v1/query: HTTP 401: unauthorized\nmore",
          "measured": []}


def test_the_table_says_per_pool_whether_the_rule_is_on_and_what_it_last_read(
    api_server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api_server.objects[POOLS] = pools_with_status(STATUS)
    assert main(["status", "--kubeconfig", str(kubeconfig)]) == Exit.OK
    out = capsys.readouterr().out
    section = out.split("Measured history (a pool's history rule, docs/suggest.md):\n", 1)[1].splitlines()
    assert section[:2] == [
        "  pool overseas: on (p90 at least 1073741824 bytes over 7d): 2 Task(s) in force, read 2026-12-05T23:50:00Z; "
        "last read failed: http://prometheus.monitoring:9090/api/v1/query: HTTP 401: unauthorized",
        "  pool plain: off",
    ]


def test_json_and_yaml_carry_the_history_of_the_row_s_pool(api_server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api_server.objects[POOLS] = pools_with_status(STATUS)
    assert main(["status", "--kubeconfig", str(kubeconfig), "-o", "json"]) == Exit.OK
    (row,) = json.loads(capsys.readouterr().out)
    assert row["pool"] == "overseas" and row["history"] == {
        "enabled": True, "p90_bytes_at_least": 1073741824, "window": "7d", "groups": 2,
        "read_at": "2026-12-05T23:50:00Z", "last_error": STATUS["lastError"],
    }
    assert main(["status", "--kubeconfig", str(kubeconfig), "-o", "yaml"]) == Exit.OK
    assert yaml.safe_load(capsys.readouterr().out) == [row]


def test_a_rule_not_read_yet_and_a_cluster_without_the_rule(api_server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api_server.objects[POOLS] = pools_with_status(None)
    assert main(["status", "--kubeconfig", str(kubeconfig)]) == Exit.OK
    assert "  pool overseas: on (p90 at least 1073741824 bytes over 7d); no status.history yet" in capsys.readouterr().out
    assert main(["status", "--kubeconfig", str(kubeconfig), "-o", "json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out)[0]["history"]["groups"] is None
    api_server.cluster_with(pool_node([POOL_TAINT]))  # the policy of the other tests: no pool has the rule
    assert main(["status", "--kubeconfig", str(kubeconfig)]) == Exit.OK
    assert "Measured history" not in capsys.readouterr().out  # the table is as it was
    assert main(["status", "--kubeconfig", str(kubeconfig), "-o", "json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out)[0]["history"] == {
        "enabled": False, "p90_bytes_at_least": None, "window": None, "groups": None, "read_at": None, "last_error": None}
