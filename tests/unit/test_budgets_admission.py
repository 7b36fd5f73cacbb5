"""Egress budgets at Pod CREATE (controller/admission/handlers.py, docs/budgets.md): a run's pod touching
a destination goes to a node whose egress address has room, its REQUIRED affinity keeps off the full
nodes, and the use is recorded; a record the tenant brings is not kept."""

from __future__ import annotations

import json
from typing import Any

from controller.budgets.core import BUDGETS_ANNOTATION, read_record, record_annotation
from controller.core.policy import load_policy
from tests.unit.test_admission_handlers import Env, tekton_pod

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
POLICY = """\
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: egress
    nodeSelector: {egress-placer.io/egress: "fast"}
    images: ["gcr.io/kaniko-project/*"]
    namespaces: ["team-ci", "team-web"]
    destinations:
      - name: kaniko-pulls
        match: {images: ["gcr.io/kaniko-project/*"]}
        maxConcurrentPerAddress: 1
"""


def env_with_budgets() -> Env:
    env = Env()
    env.state.set_policy(load_policy(POLICY))
    return env


def running(env: Env, name: str, node: str) -> None:
    """A run's pod of the pool, bound to `node`, with admission's record."""
    env.add_taskrun("team-ci", name, f"uid-{name}")
    pod = tekton_pod(name=f"{name}-pod", taskrun_name=name, annotations={BUDGETS_ANNOTATION: record_annotation("egress", ["kaniko-pulls"], node, env.now)})
    pod["metadata"]["uid"] = f"pod-{name}"
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    env.state.apply("Pod", "ADDED", pod)


def node_of(patched: dict[str, Any]) -> str:
    record = read_record(patched["metadata"]["annotations"][BUDGETS_ANNOTATION])
    assert record is not None
    return record.node


def test_a_pod_goes_where_the_address_has_room_and_its_use_is_recorded() -> None:
    env = env_with_budgets()
    running(env, "a", "egress-1")
    running(env, "b", "egress-2")
    _, patched, _ = env.review(tekton_pod(name="c-pod", taskrun_name="c"))
    assert node_of(patched) == "egress-3"
    terms = patched["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    for term in terms:  # a preferred node alone would let the scheduler put it on a full node
        assert {"key": "metadata.name", "operator": "NotIn", "values": ["egress-1"]} in term["matchFields"]
        assert {"key": "metadata.name", "operator": "NotIn", "values": ["egress-2"]} in term["matchFields"]
    assert json.loads(patched["metadata"]["annotations"][BUDGETS_ANNOTATION])["destinations"] == ["kaniko-pulls"]


def test_a_record_a_tenant_brings_on_a_pod_that_touches_nothing_is_removed() -> None:
    env = env_with_budgets()
    forged = record_annotation("egress", ["kaniko-pulls"], "egress-1", env.now)
    _, patched, _ = env.review(tekton_pod(image="docker.io/library/golang:1.22", annotations={BUDGETS_ANNOTATION: forged}))
    assert BUDGETS_ANNOTATION not in (patched["metadata"].get("annotations") or {})


def test_a_forged_record_is_replaced_by_admissions_own() -> None:
    env = env_with_budgets()
    forged = record_annotation("egress", ["made-up"], "egress-9", 1.0)
    _, patched, _ = env.review(tekton_pod(annotations={BUDGETS_ANNOTATION: forged}))
    record = read_record(patched["metadata"]["annotations"][BUDGETS_ANNOTATION])
    assert record is not None and record.destinations == ("kaniko-pulls",) and record.node.startswith("egress-") and record.node != "egress-9"


def test_with_no_room_anywhere_the_pod_is_placed_and_a_warning_says_so() -> None:
    """The hold belongs before the pod (TaskRun CREATE, the queue's release: not built yet): the pod is
    still placed on its pool, counted, and a Warning names the budget."""
    env = env_with_budgets()
    for name, node in (("a", "egress-1"), ("b", "egress-2"), ("d", "egress-3")):
        running(env, name, node)
    _, patched, _ = env.review(tekton_pod(name="c-pod", taskrun_name="c"))
    assert node_of(patched).startswith("egress-")
    [warning] = [e for e in env.events.sent if e["reason"] == "BudgetExceeded"]
    assert warning["type"] == "Warning"
    assert warning["note"].startswith("placed although budget kaniko-pulls on egress-")
    assert warning["note"].endswith(": 1 of 1 at once had no room")


def test_report_only_never_narrows_and_says_what_would_have_waited() -> None:
    env = Env()
    env.state.set_policy(load_policy(POLICY + "        mode: ReportOnly\n"))
    for name, node in (("a", "egress-1"), ("b", "egress-2"), ("d", "egress-3")):
        running(env, name, node)
    _, patched, _ = env.review(tekton_pod(name="c-pod", taskrun_name="c"))
    terms = patched["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert not any("matchFields" in term for term in terms)
    [report] = [e for e in env.events.sent if e["reason"] == "BudgetReport"]
    assert report["note"].startswith("would have waited for budget kaniko-pulls on egress-")
