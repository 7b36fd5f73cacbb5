"""Node agents and the pools: the pool tolerations a DaemonSet's pod template needs, the pool nodes a
DaemonSet misses for want of them, and what the leader may do about it.

The DaemonSet controller creates a pod on a node only when the *template* tolerates the node's
NoSchedule and NoExecute taints (and its node selector and required node affinity match the node), so
a toleration added at Pod CREATE comes too late: the pod is never made. Hence:

- at admission (DaemonSet CREATE and UPDATE), a DaemonSet of an agent namespace gets one `Exists`
  toleration per pool taint key and effect in its pod template (`agent_tolerations`, idempotent);
- a DaemonSet that was there before (before the install, a policy change, or made while the webhook
  was down) is changed only where its owner opted in, because changing a template restarts every pod
  of it: `plan_agents` says which agents miss which pool nodes, and which may be patched.

Only agent namespaces (`is_agent_namespace`): the namespace of a DaemonSet is the request's or the
cached object's, which a tenant cannot choose for an object of another namespace, and only cluster
admins write DaemonSets there. Every other namespace's DaemonSets stay off pools (the pool guard).
Pure: plain data in, a plan out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.intruders.core import controller_owner
from controller.core.model import AgentTemplate, DaemonSetState, NodeState, PodState, Taint
from controller.core.patches import tolerates
from controller.core.policy import PlacementPolicy, Pool, is_agent_namespace

# On a DaemonSet: what egress-placer does with an EXISTING template that lacks the pool tolerations:
# "patch" (add them, restarting its pods) or "report" (only say so). Unset: the policy's
# `patchExistingAgents` decides. New templates (CREATE, and UPDATEs that change the template) always
# get them at admission.
POOL_TOLERATIONS_ANNOTATION = "egress-placer.io/pool-tolerations"
PATCH, REPORT = "patch", "report"
# Written by egress-placer on a DaemonSet whose template it changed: which tolerations, by whom, why.
TOLERATIONS_ADDED_ANNOTATION = "egress-placer.io/pool-tolerations-added"

# What the DaemonSet controller adds to every pod it makes (kubernetes pkg/controller/daemon/util
# AddOrUpdateDaemonPodTolerations), so taints with these keys never keep an agent off a node; the
# network-unavailable one only for host-network pods.
_DAEMON_POD_TOLERATIONS: tuple[Mapping[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
_HOST_NETWORK_TOLERATION = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists", "effect": "NoSchedule"}


# -- the tolerations ------------------------------------------------------------------------------


def pool_taints(policy: PlacementPolicy) -> list[Taint]:
    """Every pool's taint, in policy order."""
    return [pool.taint_for() for pool in policy.pools]


def missing_tolerations(tolerations: Any, policy: PlacementPolicy) -> list[dict[str, str]]:
    """One `Exists` toleration per pool taint key and effect that `tolerations` do not tolerate yet
    (entries that are not objects are ignored: admission sees whatever was sent)."""
    present = [t for t in tolerations or () if isinstance(t, Mapping)] if isinstance(tolerations, list) else []
    added: list[dict[str, str]] = []
    for taint in pool_taints(policy):
        if not any(tolerates(t, taint) for t in (*present, *added)):
            added.append({"key": taint.key, "operator": "Exists", "effect": taint.effect})
    return added


def agent_tolerations(tolerations: Any, policy: PlacementPolicy) -> list[Any]:
    """`tolerations` (kept as they are, in order) plus `missing_tolerations`. Idempotent."""
    kept = list(tolerations) if isinstance(tolerations, list) else []
    return kept + missing_tolerations(kept, policy)


def show_toleration(toleration: Mapping[str, Any]) -> str:
    """`key:effect` (Exists) or `key=value:effect`, for Events and the record annotation."""
    key, effect = toleration.get("key") or "*", toleration.get("effect") or "*"
    value = "" if (toleration.get("operator") or "Equal") == "Exists" else f"={toleration.get('value') or ''}"
    return f"{key}{value}:{effect}"


# -- which nodes a template targets (the DaemonSet controller's rule) --------------------------------


def _requirement_holds(requirement: Any, values_of: Mapping[str, str]) -> bool:
    if not isinstance(requirement, Mapping):
        return False
    key, operator = requirement.get("key"), requirement.get("operator")
    values = [v for v in requirement.get("values") or () if isinstance(v, str)]
    present = key in values_of
    value = values_of.get(key) if isinstance(key, str) else None
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(value or ""), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term_matches(term: Any, node: NodeState) -> bool:
    """A NodeSelectorTerm: every requirement holds; a term without requirements matches no node."""
    if not isinstance(term, Mapping):
        return False
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    return all(_requirement_holds(r, node.labels) for r in expressions) and all(
        _requirement_holds(r, {"metadata.name": node.name}) for r in fields
    )


def targets(template: AgentTemplate, node: NodeState) -> bool:
    """Would the template's pods be placed on `node` by its node selector and required node affinity
    (taints aside)? Terms are ORed, requirements in a term ANDed."""
    if any(node.labels.get(k) != v for k, v in template.node_selector.items()):
        return False
    if template.required_terms is None:
        return True
    return any(_term_matches(term, node) for term in template.required_terms)


def _tolerated(template: AgentTemplate, taint: Taint) -> bool:
    extra = (_HOST_NETWORK_TOLERATION,) if template.host_network else ()
    return any(tolerates(t, taint) for t in (*template.tolerations, *_DAEMON_POD_TOLERATIONS, *extra))


def kept_off_by_pool_taint(template: AgentTemplate, node: NodeState, pool_taint: Taint, owned: frozenset[str]) -> bool:
    """The template targets `node`, tolerates every other taint that keeps pods off it (NoSchedule,
    NoExecute), and does not tolerate its pool's taint: the pool taint alone keeps the agent off."""
    if not targets(template, node) or _tolerated(template, pool_taint):
        return False
    others = (t for t in node.taints if t.key not in owned and t.effect in ("NoSchedule", "NoExecute"))
    return all(_tolerated(template, t) for t in others)


# -- the plan -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentGap:
    """A DaemonSet of an agent namespace whose template lacks a pool toleration, where it matters."""

    namespace: str
    name: str
    uid: str
    pools: tuple[str, ...]  # pools with nodes it targets but whose taint it does not tolerate
    nodes: tuple[str, ...]  # those pool nodes, sorted
    missing: tuple[str, ...]  # of them, the nodes where no pod of it is (a pod there now stays until it restarts)
    add: tuple[Mapping[str, str], ...]  # the tolerations that would let it run there
    patch: bool  # its owner opted in: the leader adds them (restarting its pods)
    why: str  # who decided `patch`, for the Event and the log

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def opt_in(policy: PlacementPolicy, daemonset: DaemonSetState) -> tuple[bool, str]:
    """May the leader patch this existing DaemonSet's template? The annotation (the DaemonSet's owner
    writes it, in an agent namespace: a cluster admin) wins over the policy's `patchExistingAgents`."""
    value = (daemonset.annotations.get(POOL_TOLERATIONS_ANNOTATION) or "").strip()
    if value == PATCH:
        return True, f"annotation {POOL_TOLERATIONS_ANNOTATION}={PATCH}"
    if value == REPORT:
        return False, f"annotation {POOL_TOLERATIONS_ANNOTATION}={REPORT}"
    if daemonset.namespace in policy.patch_existing_agents:
        return True, f"policy patchExistingAgents lists namespace {daemonset.namespace}"
    return False, f"not opted in (annotation {POOL_TOLERATIONS_ANNOTATION}={PATCH}, or policy patchExistingAgents)"


def agent_pod_nodes(pods: Iterable[PodState], daemonsets: Mapping[str, DaemonSetState]) -> dict[str, set[str]]:
    """DaemonSet uid -> the nodes a pod of it is on. A pod counts for a DaemonSet only when its
    controller owner's uid resolves to that DaemonSet in the pod's own namespace (an owner reference is
    the pod author's to write; the uid and the namespace are not)."""
    out: dict[str, set[str]] = {}
    for pod in pods:
        owner = controller_owner(pod.owners)
        if owner is None or owner.kind != "DaemonSet" or not pod.on_node or pod.node_name is None:
            continue
        daemonset = daemonsets.get(owner.uid)
        if daemonset is not None and daemonset.namespace == pod.namespace and daemonset.name == owner.name:
            out.setdefault(owner.uid, set()).add(pod.node_name)
    return out


@dataclass(frozen=True)
class NodeAgents:
    """What one pool node tells `plan_agents`: its pool, the agents its pool's taint alone keeps off it
    (DaemonSet uids), and the agents with a pod on it. A reconciler keeps one per pool node and works out
    again only the nodes that changed (controller.changes)."""

    pool: str
    kept_off: frozenset[str]
    here: frozenset[str]


def candidate_agents(policy: PlacementPolicy, daemonsets: Mapping[str, DaemonSetState]) -> list[DaemonSetState]:
    """The DaemonSets that may be agents: of an agent namespace and not being deleted (one being deleted is
    left alone)."""
    return [d for d in daemonsets.values() if not d.deleting and is_agent_namespace(policy, d.namespace)]


def node_agents(
    policy: PlacementPolicy,
    node: NodeState,
    pool: Pool,
    candidates: Iterable[DaemonSetState],
    daemonsets: Mapping[str, DaemonSetState],
    pods: Iterable[PodState],
) -> NodeAgents:
    """The pool node `node`'s part of the plan; `pods`: the pods on it. It counts with its pool's taint as
    the policy wants it (the taint reconciler puts it there), whatever it carries now."""
    owned, taint = policy.owned_taint_keys(), pool.taint_for()
    return NodeAgents(
        pool=pool.name,
        kept_off=frozenset(d.uid for d in candidates if kept_off_by_pool_taint(d.template, node, taint, owned)),
        here=frozenset(agent_pod_nodes(pods, daemonsets)),
    )


def agent_gaps(policy: PlacementPolicy, candidates: Iterable[DaemonSetState], nodes: Mapping[str, NodeAgents]) -> list[AgentGap]:
    """The gaps from each pool node's part (`node_agents`, by node name), sorted by namespace and name."""
    gaps = []
    for daemonset in candidates:
        kept_off = [(name, part.pool) for name, part in nodes.items() if daemonset.uid in part.kept_off]
        if not kept_off:
            continue
        names = tuple(sorted(name for name, _ in kept_off))
        patch, why = opt_in(policy, daemonset)
        gaps.append(
            AgentGap(
                namespace=daemonset.namespace,
                name=daemonset.name,
                uid=daemonset.uid,
                pools=tuple(dict.fromkeys(pool for _, pool in sorted(kept_off))),
                nodes=names,
                missing=tuple(n for n in names if daemonset.uid not in nodes[n].here),
                add=tuple(missing_tolerations(list(daemonset.template.tolerations), policy)),
                patch=patch,
                why=why,
            )
        )
    return sorted(gaps, key=lambda g: (g.namespace, g.name, g.uid))


def plan_agents(
    policy: PlacementPolicy,
    nodes: Iterable[NodeState],
    daemonsets: Mapping[str, DaemonSetState],
    pods: Iterable[PodState],
) -> list[AgentGap]:
    """The DaemonSets of agent namespaces kept off pool nodes only by a pool taint their template does
    not tolerate, sorted by namespace and name. `pods`: the pods on pool nodes (others are ignored).

    A pool node counts with its pool's taint as the policy wants it (the taint reconciler puts it
    there), whatever it carries now; a DaemonSet being deleted is left alone."""
    candidates = candidate_agents(policy, daemonsets)
    by_node: dict[str, list[PodState]] = {}
    for pod in pods:
        if pod.node_name is not None:
            by_node.setdefault(pod.node_name, []).append(pod)
    parts = {
        node.name: node_agents(policy, node, pool, candidates, daemonsets, by_node.get(node.name, ()))
        for node in nodes
        if (pool := policy.pool_of(node)) is not None
    }
    return agent_gaps(policy, candidates, parts)


def added_record(added: Sequence[Mapping[str, Any]], by: str, why: str) -> str:
    """The value of TOLERATIONS_ADDED_ANNOTATION: compact JSON of what was added, by whom, why."""
    return json.dumps({"added": [show_toleration(t) for t in added], "by": by, "why": why}, separators=(",", ":"))
