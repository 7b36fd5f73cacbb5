"""DaemonSet CREATE and UPDATE: a node agent's pod template tolerates every pool taint.

The DaemonSet controller makes no pod on a node whose NoSchedule taint the template does not
tolerate, so a toleration added at Pod CREATE comes too late: the template must carry it. A DaemonSet
of an agent namespace (`agentNamespaces`, by default the exempt ones) gets one `Exists` toleration per
pool taint key and effect it does not tolerate yet (agents.core), and the annotation
`egress-placer.io/pool-tolerations-added` says which. The fact relied on: the request's namespace,
which only those who may write DaemonSets there (cluster admins) choose; a tenant's DaemonSet is
left as it is (the pool guard and the pod webhook keep its pods off pools).

- CREATE: always.
- UPDATE: only when the update changes the pod template (its owner restarts the pods anyway, e.g. a
  `kubectl apply` of a new image, or of a manifest without our toleration: it is put back, and the
  template ends as it was). An update that leaves the template alone (labels, annotations, scale of
  nothing) is not turned into a restart of every pod: existing templates are the leader's business,
  reported, and changed only where their owner opted in (agents.reconcile).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from controller.admission.review import Patch, Request, annotation_ops, ops_at, value_at
from controller.agents.core import TOLERATIONS_ADDED_ANNOTATION, added_record, agent_tolerations, missing_tolerations, show_toleration
from controller.core.model import REVIEW_ANNOTATION
from controller.core.policy import PlacementPolicy, is_agent_namespace

TEMPLATE = ("spec", "template")
TOLERATIONS = ("spec", "template", "spec", "tolerations")


@dataclass(frozen=True)
class AgentAdmission:
    """The answer for one DaemonSet: its patch, and the Event note when tolerations were added."""

    patch: Patch
    note: str = ""


def is_daemonset(request: Request) -> bool:
    return (request.group, request.version, request.kind) == ("apps", "v1", "DaemonSet") and request.operation in (
        "CREATE",
        "UPDATE",
    )


def admit_daemonset(request: Request, policy: PlacementPolicy) -> AgentAdmission:
    if not is_agent_namespace(policy, request.namespace):
        return AgentAdmission([])
    template = value_at(request.object, TEMPLATE)
    spec = value_at(template, ("spec",))
    if not isinstance(spec, Mapping):
        return AgentAdmission([])  # no pod template: the API server refuses it anyway
    if request.operation == "UPDATE" and template == value_at(request.old_object, TEMPLATE):
        return AgentAdmission([])  # not a rollout: no restart of every pod for a metadata edit
    added = missing_tolerations(spec.get("tolerations"), policy)
    if not added:
        return AgentAdmission([])
    why = f"agent namespace {request.namespace}, {request.operation}"
    patch = ops_at(request.object, TOLERATIONS, agent_tolerations(spec.get("tolerations"), policy))
    # The review's uid (the token its Event waits for, see CreationEvents) beside the record of what was added.
    record = {TOLERATIONS_ADDED_ANNOTATION: added_record(added, "admission", why), REVIEW_ANNOTATION: request.uid}
    patch += annotation_ops(request.object, record)
    shown = ", ".join(show_toleration(t) for t in added)
    note = (
        f"Pod template tolerates the pool taints ({shown} added at {request.operation}): node agents of "
        f"namespace {request.namespace} run on pool nodes too."
    )
    return AgentAdmission(patch, note)
