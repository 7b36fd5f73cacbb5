"""The pod and DaemonSet webhooks are `reinvocationPolicy: IfNeeded` (k8s/webhook.yaml, docs/coexistence.md):
when a later mutating webhook (a Kyverno mutate policy) changes the object after us, the API server calls us
once more with what it made. Checked here with the REAL handler (`Env` of test_admission_handlers):

- a second call on an object we already handled changes nothing in its spec (only the review uid and the
  decision record are written again, the same record), and assumes nothing twice;
- what a Kyverno policy adds (an unrelated toleration, a blanket `operator: Exists` toleration, a
  nodeSelector on the pool's label) comes out of our second call as it would from a first call on the
  pod that already carried it: the result does not depend on which webhook runs first.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.model import DECISION_ANNOTATION
from tests.unit.test_admission_handlers import Env, plain_pod, preferred_node, tekton_pod

UNRELATED = {"key": "example.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
BLANKET = {"operator": "Exists"}
POOL_LABEL = "egress-placer.io/pool"


def add_toleration(toleration: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def mutate(pod: dict[str, Any]) -> dict[str, Any]:
        pod = copy.deepcopy(pod)
        pod["spec"]["tolerations"] = [*(pod["spec"].get("tolerations") or []), toleration]
        return pod

    return mutate


def add_node_selector(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["nodeSelector"] = {**(pod["spec"].get("nodeSelector") or {}), POOL_LABEL: "egress"}
    return pod


KYVERNO_POLICIES = {
    "unrelated-toleration": add_toleration(UNRELATED),
    "blanket-exists-toleration": add_toleration(BLANKET),
    "pool-node-selector": add_node_selector,
}
PODS = {
    "allowed-tekton-pod": lambda: tekton_pod(),
    "not-allowed-tekton-pod": lambda: tekton_pod(namespace="team-other", name="other-pod", taskrun_name="other"),
    "not-allowed-plain-pod": lambda: plain_pod(tolerations=[]),
}


def placed(pod: dict[str, Any]) -> tuple[Any, Any]:
    """(pool, node) of our decision record, (None, None) without one."""
    record = json.loads((pod["metadata"].get("annotations") or {}).get(DECISION_ANNOTATION, "{}"))
    return record.get("pool"), record.get("node")


def unordered(spec: dict[str, Any]) -> dict[str, Any]:
    return {**spec, "tolerations": sorted(json.dumps(t, sort_keys=True) for t in spec.get("tolerations") or [])}


def spec_ops(patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [op for op in patch if not op["path"].startswith("/metadata/annotations")]


@pytest.mark.parametrize("make", PODS.values(), ids=PODS.keys())
def test_a_second_call_on_a_handled_pod_changes_nothing(make: Callable[[], dict[str, Any]]) -> None:
    env = Env()
    _, once, _ = env.review(make())
    assumed = len(env.state.load.ledger)
    _, twice, patch = env.review(once)
    assert spec_ops(patch) == []
    assert twice == once  # the same decision record, the same (fixed) review uid
    assert len(env.state.load.ledger) == assumed  # nothing assumed twice


@pytest.mark.parametrize("policy", KYVERNO_POLICIES.values(), ids=KYVERNO_POLICIES.keys())
@pytest.mark.parametrize("make", PODS.values(), ids=PODS.keys())
def test_what_kyverno_adds_after_us_ends_as_if_it_came_first(
    make: Callable[[], dict[str, Any]], policy: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    """Ours, then Kyverno, then ours again (reinvoked) == Kyverno, then ours: the same spec, pool and node."""
    after = Env()
    _, ours, _ = after.review(make())
    _, reinvoked, _ = after.review(policy(ours))
    before = Env()
    _, first, _ = before.review(policy(make()))
    assert unordered(reinvoked["spec"]) == unordered(first["spec"])  # toleration order means nothing
    assert placed(reinvoked) == placed(first)


def test_a_blanket_toleration_on_a_not_allowed_pod_is_stripped_again() -> None:
    env = Env()
    _, ours, _ = env.review(plain_pod(tolerations=[]))
    _, reinvoked, _ = env.review(add_toleration(BLANKET)(ours))
    assert reinvoked["spec"].get("tolerations") in (None, [])


def test_an_allowed_run_pod_keeps_its_node_through_a_reinvocation() -> None:
    env = Env()
    _, ours, _ = env.review(tekton_pod())
    _, reinvoked, _ = env.review(add_toleration(UNRELATED)(ours))
    assert preferred_node(reinvoked["spec"]) == preferred_node(ours["spec"])
    assert UNRELATED in reinvoked["spec"]["tolerations"]


TOLERATIONS = st.lists(
    st.fixed_dictionaries(
        {"operator": st.sampled_from(["Exists", "Equal"])},
        optional={
            "key": st.sampled_from(["", POOL_LABEL, "example.com/gpu"]),
            "value": st.sampled_from(["egress", "lab", "x"]),
            "effect": st.sampled_from(["NoSchedule", "NoExecute"]),
        },
    ),
    max_size=3,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(tolerations=TOLERATIONS, kind=st.sampled_from(sorted(PODS)))
def test_any_pod_reviewed_twice_gets_no_second_spec_change(tolerations: list[dict[str, Any]], kind: str) -> None:
    env = Env()
    pod = PODS[kind]()
    pod["spec"]["tolerations"] = [{k: v for k, v in t.items() if not (k == "value" and t["operator"] == "Exists")} for t in tolerations]
    _, once, _ = env.review(pod)
    _, _, patch = env.review(once)
    assert spec_ops(patch) == []
