"""End to end, metrics: the controller running on the local cluster (one replica, the leader) exports
the contract of tests/unit/test_metrics.py and nothing else, and the series set by the leader's pass,
the certificate and the policy say what the cluster shows: each pool node's load and capacity, the
ready pool nodes, no taint drift and no intruder, a certificate valid for its days, the policy ready,
and the run admitted here counted as a mutated review."""

from __future__ import annotations

import re
import time

import pytest
import requests

import controller
from tests.e2e.harness import Placer
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL, POOL_NODES, TEAM_CDN, Runs, taskrun
from tests.unit.test_metrics import CONTRACT, families
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]


def test_the_controller_exports_the_contract_and_what_the_cluster_shows(egress_placer: Placer, runs: Runs) -> None:
    name = runs.name("metrics")
    runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
    runs.wait_succeeded(TEAM_CDN, "taskruns", [name], timeout=90)
    metric = egress_placer.metric

    text = requests.get(egress_placer.replica.health_url + "/metrics", timeout=5).text
    exported = families(text)
    assert set(exported) <= set(CONTRACT)
    for family, (kind, labels) in exported.items():  # a family without samples yet shows no labels
        assert kind == CONTRACT[family][0] and set(labels) <= set(CONTRACT[family][1]), family
    assert re.search(rf'^egress_placer_build_info\{{python_version="[\d.]+",version="{re.escape(controller.__version__)}"\}} 1\.0$', text, re.M)
    assert metric("process_resident_memory_bytes", {}) > 0

    assert metric("egress_placer_leader", {}) == 1
    def scrape() -> str:
        return requests.get(egress_placer.replica.health_url + "/metrics", timeout=5).text

    # (metric() reads a missing series as 0: these must be there, and 0.)
    wait_for("no taint drift", lambda: f'egress_placer_taint_drift_nodes{{pool="{POOL}"}} 0.0' in scrape(), timeout=30)
    assert f'egress_placer_intruders{{pool="{POOL}"}} 0.0' in scrape()
    assert metric("egress_placer_pool_ready_nodes", {"pool": POOL}) == len(POOL_NODES)
    for node in POOL_NODES:
        assert metric("egress_placer_pool_node_capacity", {"pool": POOL, "node": node}) > 0
    assert {n for n in POOL_NODES if f'node="{n}",pool="{POOL}",state="placed"' in text} == POOL_NODES
    assert {n for n in POOL_NODES if f'node="{n}",pool="{POOL}",state="assumed"' in text} == POOL_NODES

    expires = metric("egress_placer_webhook_certificate_expiration_timestamp_seconds", {})
    assert 80 * 86400 < expires - time.time() <= 90 * 86400  # a certificate the controller made: 90 days
    assert metric("egress_placer_policy_ready", {}) == metric("egress_placer_policy_in_force", {}) == 1
    assert metric("egress_placer_admission_reviews_total", {"kind": "TaskRun", "outcome": "mutated"}) >= 1
    assert metric("egress_placer_admission_reviews_total", {"kind": "TaskRun", "outcome": "error"}) == 0
