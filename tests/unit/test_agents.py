"""Checks the node agents' core (controller/agents/core.py): which pool tolerations a DaemonSet's pod
template gains (one `Exists` per pool taint key and effect, none twice, the owner's kept), which nodes a
template targets (node selector, required node affinity as the DaemonSet controller reads them), which
pool nodes a pool taint alone keeps an agent off, and the plan: only agent namespaces, pods counted
only when their owner resolves by uid, the owner's opt-in (annotation over policy). Properties: adding
the tolerations twice changes nothing, and a template with them is kept off no pool node."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.agents.core import (
    POOL_TOLERATIONS_ANNOTATION,
    AgentGap,
    agent_tolerations,
    kept_off_by_pool_taint,
    missing_tolerations,
    opt_in,
    plan_agents,
    targets,
)
from controller.core.model import AgentTemplate, DaemonSetState, NodeState, OwnerRef, PodState, Taint
from controller.core.policy import PolicyError, load_policy

POLICY_TEXT = """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
agentNamespaces: [kube-system, monitoring]
{extra}
pools:
  - name: fast
    nodeSelector: {{egress: fast}}
    namespaces: [team-a]
  - name: lab
    nodes: [lab-1]
    taint: {{effect: NoExecute}}
"""
POLICY = load_policy(POLICY_TEXT.format(extra=""))
FAST = {"key": "egress-placer.io/pool", "operator": "Exists", "effect": "NoSchedule"}
LAB = {"key": "egress-placer.io/pool", "operator": "Exists", "effect": "NoExecute"}
FAST_TAINT = Taint("egress-placer.io/pool", "fast", "NoSchedule")
LAB_TAINT = Taint("egress-placer.io/pool", "lab", "NoExecute")
NODES = [
    NodeState("fast-1", labels={"egress": "fast", "os": "linux"}, taints=(FAST_TAINT,)),
    NodeState("fast-2", labels={"egress": "fast", "os": "windows"}),  # joined the pool, not tainted yet
    NodeState("lab-1", labels={"os": "linux"}, taints=(LAB_TAINT,)),
    NodeState("plain-1", labels={"os": "linux"}),
]


def policy(extra: str) -> Any:
    return load_policy(POLICY_TEXT.format(extra=extra))


# -- the tolerations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tolerations, added",
    [
        pytest.param(None, [FAST, LAB], id="none"),
        pytest.param([], [FAST, LAB], id="empty"),
        pytest.param([FAST], [LAB], id="one-there"),
        pytest.param([{"key": "egress-placer.io/pool", "operator": "Equal", "value": "fast", "effect": "NoSchedule"}], [LAB],
                     id="equal-of-the-only-pool-with-that-key"),
        pytest.param([{"key": "egress-placer.io/pool", "operator": "Exists"}], [], id="the-key-any-effect"),
        pytest.param([{"operator": "Exists"}], [], id="tolerates-everything"),
        pytest.param([{"key": "egress-placer.io/pool", "operator": "Exists", "effect": "NoExecute"}], [FAST],
                     id="one-effect"),
        pytest.param([{"key": "other.example.com/pool", "operator": "Exists"}], [FAST, LAB], id="another-key"),
        pytest.param(["junk", 3, {"key": "gpu", "operator": "Exists"}], [FAST, LAB], id="junk-and-others-ignored"),
        pytest.param("not a list", [FAST, LAB], id="not-a-list"),
    ],
)
def test_missing_tolerations_are_one_exists_per_pool_taint_key_and_effect(tolerations: Any, added: list) -> None:
    assert missing_tolerations(tolerations, POLICY) == added


def test_the_owners_tolerations_are_kept_in_order_and_ours_appended() -> None:
    own = [{"key": "gpu", "operator": "Exists"}, {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]
    assert agent_tolerations(own, POLICY) == [*own, FAST, LAB]


def test_pools_sharing_a_taint_key_and_effect_need_one_toleration() -> None:
    shared = load_policy(
        """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - {name: a, nodes: [a-1]}
  - {name: b, nodes: [b-1]}
"""
    )
    assert agent_tolerations([], shared) == [FAST]


TOLERATION = st.fixed_dictionaries(
    {},
    optional={
        "key": st.sampled_from(["", "egress-placer.io/pool", "egress-placer.io/pool", "gpu"]),
        "operator": st.sampled_from(["Exists", "Equal"]),
        "value": st.sampled_from(["", "fast", "lab"]),
        "effect": st.sampled_from(["", "NoSchedule", "NoExecute", "PreferNoSchedule"]),
    },
)


@given(st.lists(TOLERATION, max_size=5))
def test_adding_twice_changes_nothing_and_every_pool_taint_is_tolerated(tolerations: list) -> None:
    once = agent_tolerations(tolerations, POLICY)
    assert agent_tolerations(once, POLICY) == once
    assert once[: len(tolerations)] == tolerations
    template = AgentTemplate(tolerations=tuple(once))
    owned = POLICY.owned_taint_keys()
    assert not any(kept_off_by_pool_taint(template, n, t, owned) for n in NODES for t in (FAST_TAINT, LAB_TAINT))


# -- which nodes a template targets -------------------------------------------------------------------


def required(*terms: dict) -> tuple[dict, ...]:
    return terms


@pytest.mark.parametrize(
    "template, node, expected",
    [
        (AgentTemplate(), NODES[0], True),
        (AgentTemplate(node_selector={"os": "linux"}), NODES[0], True),
        (AgentTemplate(node_selector={"os": "linux"}), NODES[1], False),
        (AgentTemplate(required_terms=required({"matchExpressions": [{"key": "os", "operator": "In", "values": ["linux"]}]})),
         NODES[0], True),
        (AgentTemplate(required_terms=required({"matchExpressions": [{"key": "os", "operator": "NotIn", "values": ["linux"]}]})),
         NODES[0], False),
        (AgentTemplate(required_terms=required({"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["x"]}]})),
         NODES[0], True),  # NotIn: an absent label is not in the list
        (AgentTemplate(required_terms=required({"matchExpressions": [{"key": "egress", "operator": "Exists"}]})), NODES[2], False),
        (AgentTemplate(required_terms=required({"matchExpressions": [{"key": "egress", "operator": "DoesNotExist"}]})),
         NODES[2], True),
        (AgentTemplate(required_terms=required({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["lab-1"]}]})),
         NODES[2], True),  # how the DaemonSet controller pins each pod
        (AgentTemplate(required_terms=required(
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["plain-1"]}]},
            {"matchExpressions": [{"key": "egress", "operator": "In", "values": ["fast"]}]})), NODES[0], True),  # terms ORed
        (AgentTemplate(required_terms=required(
            {"matchExpressions": [{"key": "egress", "operator": "In", "values": ["fast"]},
                                  {"key": "os", "operator": "In", "values": ["windows"]}]})), NODES[0], False),  # ANDed
        (AgentTemplate(required_terms=required({})), NODES[0], False),  # an empty term matches no node
        (AgentTemplate(required_terms=()), NODES[0], False),
        (AgentTemplate(required_terms=required({"matchExpressions": [{"key": "os", "operator": "Gt", "values": ["1"]}]})),
         NODES[0], False),  # not a number
        (AgentTemplate(required_terms=required({"matchExpressions": [{"key": "n", "operator": "Gt", "values": ["1"]}]})),
         NodeState("x", labels={"n": "2"}), True),
        (AgentTemplate(required_terms=required({"matchExpressions": [{"key": "n", "operator": "Lt", "values": ["1"]}]})),
         NodeState("x", labels={"n": "2"}), False),
        (AgentTemplate(required_terms=required("junk", {"matchExpressions": ["junk"]})), NODES[0], False),
    ],
)
def test_a_template_targets_the_nodes_its_selector_and_required_affinity_match(
    template: AgentTemplate, node: NodeState, expected: bool
) -> None:
    assert targets(template, node) is expected


@pytest.mark.parametrize(
    "template, node, expected",
    [
        pytest.param(AgentTemplate(), NODES[0], True, id="pool-taint-only"),
        pytest.param(AgentTemplate(), NODES[1], True, id="pool-node-not-tainted-yet"),
        pytest.param(AgentTemplate(tolerations=(FAST,)), NODES[0], False, id="tolerated"),
        pytest.param(AgentTemplate(node_selector={"os": "windows"}), NODES[0], False, id="not-targeted"),
        pytest.param(AgentTemplate(), NodeState("g", labels={"egress": "fast"}, taints=(Taint("gpu", None, "NoSchedule"),)),
                     False, id="another-taint-keeps-it-off-anyway"),
        pytest.param(AgentTemplate(tolerations=({"key": "gpu", "operator": "Exists"},)),
                     NodeState("g", labels={"egress": "fast"}, taints=(Taint("gpu", None, "NoSchedule"),)),
                     True, id="other-taint-tolerated"),
        pytest.param(AgentTemplate(), NodeState("g", labels={"egress": "fast"}, taints=(Taint("soft", None, "PreferNoSchedule"),)),
                     True, id="prefer-no-schedule-does-not-keep-off"),
        pytest.param(AgentTemplate(),
                     NodeState("c", labels={"egress": "fast"}, taints=(Taint("node.kubernetes.io/unschedulable", None, "NoSchedule"),)),
                     True, id="cordoned: the daemonset controller tolerates it"),
        pytest.param(AgentTemplate(),
                     NodeState("n", labels={"egress": "fast"}, taints=(Taint("node.kubernetes.io/network-unavailable", None, "NoSchedule"),)),
                     False, id="network-unavailable-without-host-network"),
        pytest.param(AgentTemplate(host_network=True),
                     NodeState("n", labels={"egress": "fast"}, taints=(Taint("node.kubernetes.io/network-unavailable", None, "NoSchedule"),)),
                     True, id="network-unavailable-with-host-network"),
    ],
)
def test_kept_off_by_the_pool_taint_alone(template: AgentTemplate, node: NodeState, expected: bool) -> None:
    assert kept_off_by_pool_taint(template, node, FAST_TAINT, POLICY.owned_taint_keys()) is expected


# -- the plan -----------------------------------------------------------------------------------------


def ds(namespace: str, name: str, uid: str, *, tolerations: tuple = (), annotations: dict | None = None, **kw: Any) -> DaemonSetState:
    return DaemonSetState(namespace, name, uid, template=AgentTemplate(tolerations=tolerations, **kw),
                          annotations=annotations or {})


def agent_pod(namespace: str, node: str, owner_uid: str, owner_name: str, phase: str = "Running") -> PodState:
    owner = OwnerRef("apps/v1", "DaemonSet", owner_name, owner_uid, controller=True)
    return PodState(namespace, f"{owner_name}-{node}", node_name=node, phase=phase, owners=(owner,))


def test_only_agent_namespaces_daemonsets_that_lack_the_tolerations_are_planned() -> None:
    daemonsets = {
        d.uid: d
        for d in (
            ds("kube-system", "kube-proxy", "u-proxy"),
            ds("monitoring", "node-exporter", "u-exp", tolerations=(FAST, LAB)),
            ds("monitoring", "linux-only", "u-lin", tolerations=(LAB,), node_selector={"os": "linux"}),
            ds("team-a", "miner", "u-miner"),  # not an agent namespace: the guard keeps it off
        )
    }
    gaps = plan_agents(POLICY, NODES, daemonsets, [])
    assert [(g.key, g.pools, g.nodes, g.missing, g.add) for g in gaps] == [
        ("kube-system/kube-proxy", ("fast", "lab"), ("fast-1", "fast-2", "lab-1"), ("fast-1", "fast-2", "lab-1"), (FAST, LAB)),
        ("monitoring/linux-only", ("fast",), ("fast-1",), ("fast-1",), (FAST,)),
    ]


def test_a_node_counts_as_missing_only_without_a_pod_that_resolves_to_the_daemonset() -> None:
    daemonsets = {"u-proxy": ds("kube-system", "kube-proxy", "u-proxy"), "u-other": ds("kube-system", "other", "u-other")}
    pods = [
        agent_pod("kube-system", "fast-1", "u-proxy", "kube-proxy"),  # there since before the taint
        agent_pod("team-a", "fast-2", "u-proxy", "kube-proxy"),  # a tenant's pod claiming its uid
        agent_pod("kube-system", "lab-1", "u-other", "kube-proxy"),  # the uid of another DaemonSet
        agent_pod("kube-system", "lab-1", "u-proxy", "kube-proxy", phase="Succeeded"),  # finished
    ]
    (gap, _) = plan_agents(POLICY, NODES, daemonsets, pods)
    assert gap.key == "kube-system/kube-proxy"
    assert gap.missing == ("fast-2", "lab-1")


def test_a_daemonset_being_deleted_is_left_alone() -> None:
    deleting = DaemonSetState("kube-system", "old", "u-old", deleting=True)
    assert plan_agents(POLICY, NODES, {"u-old": deleting}, []) == []


@pytest.mark.parametrize(
    "extra, annotations, patch",
    [
        ("", {}, False),
        ("", {POOL_TOLERATIONS_ANNOTATION: "patch"}, True),
        ("", {POOL_TOLERATIONS_ANNOTATION: " patch "}, True),
        ("", {POOL_TOLERATIONS_ANNOTATION: "yes"}, False),
        ("patchExistingAgents: [kube-system]", {}, True),
        ("patchExistingAgents: [monitoring]", {}, False),
        ("patchExistingAgents: [kube-system]", {POOL_TOLERATIONS_ANNOTATION: "report"}, False),  # the owner's word wins
    ],
)
def test_the_owner_opts_in_by_annotation_or_the_policy(extra: str, annotations: dict, patch: bool) -> None:
    daemonset = ds("kube-system", "kube-proxy", "u", annotations=annotations)
    decided, why = opt_in(policy(extra), daemonset)
    assert decided is patch and why
    (gap,) = plan_agents(policy(extra), NODES, {"u": daemonset}, [])
    assert isinstance(gap, AgentGap) and gap.patch is patch and gap.why == why


@pytest.mark.parametrize(
    "extra, error",
    [
        ("patchExistingAgents: [team-a]", ":5: patchExistingAgents[0]: 'team-a' is not an agent namespace"),
        ("patchExistingAgents: [Kube-System]", "patchExistingAgents[0]: 'Kube-System' is not a DNS-1123 label"),
    ],
)
def test_patch_existing_agents_names_agent_namespaces_only(extra: str, error: str) -> None:
    with pytest.raises(PolicyError, match=error.replace("[", r"\[").replace("]", r"\]")):
        policy(extra)


def test_patch_existing_agents_defaults_to_none_and_follows_the_default_agent_namespaces() -> None:
    assert POLICY.patch_existing_agents == ()
    default_agents = load_policy("apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\npatchExistingAgents: [kube-system]\n")
    assert default_agents.patch_existing_agents == ("kube-system",)
