"""Checks DaemonSet admission (controller/admission/daemonset.py behind Admission.review): a DaemonSet
of an agent namespace gets one `Exists` toleration per pool taint in its pod template at CREATE, and at
an UPDATE only when the update changes the template (no restart of every pod for a label edit); the
owner's tolerations are kept and none is added twice; the record annotation and a Normal Event say
what was added; a tenant namespace's DaemonSet passes unchanged; a dry run sends no Event."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest

from controller.admission.handlers import Admission
from controller.agents.core import TOLERATIONS_ADDED_ANNOTATION
from controller.core.policy import load_policy
from controller.metrics import Metrics
from controller.settings import Settings
from controller.state import ClusterState

POLICY = load_policy(
    """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
agentNamespaces: [kube-system, monitoring]
pools:
  - {name: egress, nodeSelector: {egress: fast}, namespaces: [team-ci]}
  - {name: lab, nodes: [lab-1], taint: {effect: NoExecute}}
"""
)
POOL = {"key": "egress-placer.io/pool", "operator": "Exists", "effect": "NoSchedule"}
LAB = {"key": "egress-placer.io/pool", "operator": "Exists", "effect": "NoExecute"}
OWN = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}


class RecordingEvents:
    """An in-memory EventsOnCreation: records what would be sent once the object exists."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def hold(self, token: str, regarding: dict, type: str, reason: str, note: str, action: str = "", *,
             generate_name: str = "") -> None:
        self.sent.append({"regarding": regarding, "type": type, "reason": reason, "note": note, "token": token})


class Env:
    def __init__(self) -> None:
        self.metrics = Metrics()
        self.events = RecordingEvents()
        self.admission = Admission(ClusterState(POLICY, clock=lambda: 0.0), self.metrics, self.events, Settings())

    def review(self, obj: dict, operation: str = "CREATE", old: dict | None = None, dry_run: bool = False) -> tuple[dict, list]:
        request = {
            "uid": "u-1",
            "kind": {"group": "apps", "version": "v1", "kind": "DaemonSet"},
            "operation": operation,
            "namespace": obj["metadata"]["namespace"],
            "object": obj,
            "dryRun": dry_run,
        }
        if old is not None:
            request["oldObject"] = old
        answer = self.admission.review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
        response = answer["response"]
        assert response["allowed"] is True and "warnings" not in response
        patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        return jsonpatch.apply_patch(obj, patch), patch


def daemonset(namespace: str = "kube-system", tolerations: list | None = None, annotations: dict | None = None, image: str = "proxy:1") -> dict:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": image}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    meta: dict[str, Any] = {"name": "agent", "namespace": namespace}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {"selector": {"matchLabels": {"app": "a"}}, "template": {"metadata": {"labels": {"app": "a"}}, "spec": spec}},
    }


def tolerations_of(obj: dict) -> list:
    return obj["spec"]["template"]["spec"].get("tolerations") or []


@pytest.mark.parametrize(
    "tolerations, expected",
    [
        pytest.param(None, [POOL, LAB], id="none"),
        pytest.param([OWN], [OWN, POOL, LAB], id="owner's-kept"),
        pytest.param([POOL], [POOL, LAB], id="one-there"),
        pytest.param([{"operator": "Exists"}], [{"operator": "Exists"}], id="tolerates-everything"),
    ],
)
@pytest.mark.parametrize("namespace", ["kube-system", "monitoring"])
def test_an_agent_namespaces_daemonset_gets_the_pool_tolerations_at_create(namespace: str, tolerations: list | None, expected: list) -> None:
    env = Env()
    admitted, patch = env.review(daemonset(namespace, tolerations))
    assert tolerations_of(admitted) == expected
    again, second = env.review(admitted)
    assert second == [] and again == admitted  # idempotent
    if expected == (tolerations or []):
        assert patch == [] and env.events.sent == []
        return
    record = json.loads(admitted["metadata"]["annotations"][TOLERATIONS_ADDED_ANNOTATION])
    assert record["by"] == "admission" and record["added"] == [
        f"{t['key']}:{t['effect']}" for t in expected if t not in (tolerations or [])
    ]
    (event,) = env.events.sent
    assert (event["type"], event["reason"]) == ("Normal", "PoolTolerationsAdded")
    assert event["regarding"]["kind"] == "DaemonSet" and event["regarding"]["namespace"] == namespace
    assert env.metrics.agent_tolerations_added.labels(by="admission")._value.get() == 1


def test_the_annotations_of_the_owner_are_kept() -> None:
    admitted, _ = Env().review(daemonset(annotations={"team": "net"}))
    assert admitted["metadata"]["annotations"]["team"] == "net"
    assert TOLERATIONS_ADDED_ANNOTATION in admitted["metadata"]["annotations"]


@pytest.mark.parametrize("namespace", ["team-ci", "team-other", "default"])
def test_a_daemonset_of_any_other_namespace_passes_unchanged(namespace: str) -> None:
    env = Env()
    obj = daemonset(namespace)
    admitted, patch = env.review(obj)
    assert patch == [] and admitted == obj and env.events.sent == []


def test_an_update_that_changes_the_template_gets_them() -> None:
    old = daemonset(tolerations=[OWN], image="proxy:1")
    new = daemonset(tolerations=[OWN], image="proxy:2")
    admitted, _ = Env().review(new, "UPDATE", old)
    assert tolerations_of(admitted) == [OWN, POOL, LAB]


def test_a_gitops_reapply_without_our_tolerations_ends_with_the_template_as_it_was() -> None:
    env = Env()
    live, _ = env.review(daemonset(tolerations=[OWN]))  # created through the webhook: has them
    from_git = daemonset(tolerations=[OWN])  # the manifest in git, applied again
    from_git["metadata"]["annotations"] = copy.deepcopy(live["metadata"]["annotations"])
    admitted, _ = env.review(from_git, "UPDATE", live)
    assert admitted["spec"]["template"] == live["spec"]["template"]  # no rollout


def test_an_update_that_leaves_the_template_alone_does_not_restart_the_pods() -> None:
    old = daemonset(tolerations=[OWN])
    new = daemonset(tolerations=[OWN], annotations={"owner": "net-team"})
    admitted, patch = Env().review(new, "UPDATE", old)
    assert patch == [] and admitted == new


def test_an_update_without_an_old_object_is_taken_as_a_new_template() -> None:
    admitted, _ = Env().review(daemonset(), "UPDATE")
    assert tolerations_of(admitted) == [POOL, LAB]


def test_a_dry_run_is_patched_without_an_event() -> None:
    env = Env()
    admitted, _ = env.review(daemonset(), dry_run=True)
    assert tolerations_of(admitted) == [POOL, LAB] and env.events.sent == []


@pytest.mark.parametrize(
    "spec",
    [None, "junk", {"template": "junk"}, {"template": {"spec": None}}, {"template": {"spec": {"tolerations": "junk"}}}],
)
def test_a_malformed_daemonset_fails_open(spec: Any) -> None:
    obj = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x", "namespace": "kube-system"}, "spec": spec}
    env = Env()
    request = {
        "uid": "u", "kind": {"group": "apps", "version": "v1", "kind": "DaemonSet"}, "operation": "CREATE",
        "namespace": "kube-system", "object": obj,
    }
    answer = env.admission.review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
    assert answer["response"]["allowed"] is True
    if "patch" in answer["response"]:
        jsonpatch.apply_patch(obj, json.loads(base64.b64decode(answer["response"]["patch"])))
