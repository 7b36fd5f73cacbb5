"""The run guard: a ValidatingAdmissionPolicy that keeps a tenant from moving a queued run ahead, inside the
API server and fail-closed (it holds while the webhook is down). Rendered here; the CEL text lives in this
module only. `make generate` (devplacer/generate.py) writes it to `k8s/run-guard.yaml` and the chart.

The attack it stops: a tenant with `edit` (plus Tekton's `tekton-aggregate-edit`, which every Tekton release
aggregates into `edit`) may UPDATE its own TaskRuns and PipelineRuns. A run held in a pool's queue is created
pending (`spec.status: TaskRunPending` / `PipelineRunPending`) with our entry (`egress-placer.io/queue`);
the leader alone releases it. Clearing or emptying `spec.status`, or rewriting the entry (naming another
pool, another time), would start it early on a full pool, and Tekton refuses to set a started run back to
pending: undoing it afterwards is no option. So, on UPDATE of a TaskRun, PipelineRun or Pod by anyone but the
controller's ServiceAccount (`request.userInfo.username`, which the API server sets from the credential):

- a run whose old object carries our entry (held, or released and still running) may change `spec.status`
  only to one of Tekton's cancel values for its kind, and may not change, add or remove admission's
  annotations (`OWN_ANNOTATIONS`: the entry, the decision record, the review uid);
- no run may gain our entry by UPDATE (an entry added to any run of any namespace would take a slot, or
  name a made-up pool);
- a pod waiting for a pool slot (admission gave it the schedulingGate `POOL_SLOT_GATE`: its run is not one
  our queue holds, queue.core.gates_pod) keeps that gate: `edit` may patch pods, and the API server lets
  any updater remove a gate, which would start the pod at once on a full pool. The controller removes it
  when a slot frees. Other pod UPDATEs are not judged (a match condition leaves them at once), nor other
  gates;
- a pod carrying admission's egress budget record (`egress-placer.io/budgets`, docs/budgets.md) keeps it
  unchanged: removing it would free the room its pod takes.

The facts relied on: the request's user (API server), `oldObject` (what is stored: admission's own decision
at CREATE, see `controller/admission/handlers.py`, `_enqueue`, which strips a forged entry then).
Other queue managers (tekton-kueue, Pipelines-as-Code) still clear `spec.status` of runs with no entry of
ours. The owner can still cancel or delete its held run (DELETE is not matched). Status writes
(`/status` subresource: Tekton's controller) are not matched.
"""

from __future__ import annotations

from typing import Any

from controller.core.admission_policy import DENY, WARN_ONLY, admission_policy, resource_rule, service_account_user, validation
from controller.core.admission_policy import policy_binding as binding
from controller.budgets.core import BUDGETS_ANNOTATION
from controller.core.model import DECISION_ANNOTATION, POOL_SLOT_GATE, REVIEW_ANNOTATION
from controller.queue.core import QUEUE_ANNOTATION

RUN_GUARD_NAME = "egress-placer-run-guard"  # the policy and its binding
# The annotations admission writes on a run, which the queue reads (the entry) or which stand for
# admission's record (the decision, the review's uid). Not every `egress-placer.io/` key: Tekton's own
# controller copies a Task's annotations onto its TaskRun by UPDATE (`prepare`, annotations of the Task
# under the run's), so a user key such as `egress-placer.io/placement` written on a Task would make
# Tekton's updates of a queued run fail.
OWN_ANNOTATIONS = (QUEUE_ANNOTATION, DECISION_ANNOTATION, REVIEW_ANNOTATION)
# Tekton's cancel values of `spec.status` (pkg/apis/pipeline/v1: TaskRunSpecStatusCancelled,
# PipelineRunSpecStatusCancelled, ...CancelledRunFinally, ...StoppedRunFinally).
CANCEL_VALUES = {
    "TaskRun": ("TaskRunCancelled",),
    "PipelineRun": ("Cancelled", "CancelledRunFinally", "StoppedRunFinally"),
}
def _quoted(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _has(obj: str, key: str) -> str:
    return f"(has({obj}.metadata.annotations) && '{key}' in {obj}.metadata.annotations)"


def _kept(key: str) -> str:
    """CEL: annotation `key` is on both objects with the same value, or on neither."""
    same = f"{_has('object', key)} && object.metadata.annotations['{key}'] == oldObject.metadata.annotations['{key}']"
    return f"({_has('oldObject', key)} ? ({same}) : !{_has('object', key)})"


def validating_admission_policy(namespace: str = "egress-placer", service_account: str = "egress-placer") -> dict[str, Any]:
    """The policy; `namespace`/`service_account`: the controller's, whose writes it never judges."""
    user = service_account_user(namespace, service_account)
    return admission_policy(
        RUN_GUARD_NAME,
        [resource_rule(["tekton.dev"], ["UPDATE"], ["taskruns", "pipelineruns"]), resource_rule([""], ["UPDATE"], ["pods"], versions=["v1"])],
        [
            ("not-egress-placer", f"request.userInfo.username != '{user}'"),
            # Of pods, only those waiting for a pool slot or carrying a budget record: every other pod UPDATE is left at once.
            ("a-run-or-a-gated-pod", "request.resource.resource != 'pods' || (has(oldObject.spec.schedulingGates)"
                                     f" && oldObject.spec.schedulingGates.exists(g, g.name == '{POOL_SLOT_GATE}'))"
                                     f" || {_has('oldObject', BUDGETS_ANNOTATION)}"),
        ],
        [
            validation(
                "variables.pod || !variables.held || variables.newStatus == variables.oldStatus"
                " || variables.newStatus in variables.cancelValues",
                "this run is in an egress-placer pool queue: egress-placer releases it when a slot is free; its spec.status "
                "may only be set to a cancel value (a TaskRun: " + ", ".join(CANCEL_VALUES["TaskRun"]) + "; a PipelineRun: "
                + ", ".join(CANCEL_VALUES["PipelineRun"]) + "), or the run deleted",
            ),
            validation(
                "variables.pod || !variables.held || variables.oursKept",
                "this run is in an egress-placer pool queue: its annotations " + ", ".join(OWN_ANNOTATIONS) + " are egress-placer's",
            ),
            validation(
                "variables.pod || variables.held || !variables.entryAdded",
                f"only egress-placer adds a queue entry ({QUEUE_ANNOTATION}), when it admits the run",
            ),
            validation(
                f"!variables.pod || {_kept(BUDGETS_ANNOTATION)}",
                f"this pod's egress budget record ({BUDGETS_ANNOTATION}) is egress-placer's: it counts the pod's use of a "
                "destination's budget (docs/budgets.md)",
            ),
            validation(
                f"!variables.pod || !variables.gated || '{POOL_SLOT_GATE}' in variables.gates",
                f"this pod waits for a slot of an egress-placer pool queue: only egress-placer removes its schedulingGate "
                f"{POOL_SLOT_GATE}, when a slot frees",
            ),
        ],
        variables=[
            ("pod", "request.resource.resource == 'pods'"),
            ("gates", "has(object.spec.schedulingGates) ? object.spec.schedulingGates.map(g, g.name) : []"),
            ("gated", f"has(oldObject.spec.schedulingGates) && oldObject.spec.schedulingGates.exists(g, g.name == '{POOL_SLOT_GATE}')"),
            ("held", f"has(oldObject.metadata.annotations) && '{QUEUE_ANNOTATION}' in oldObject.metadata.annotations"),
            ("entryAdded", f"has(object.metadata.annotations) && '{QUEUE_ANNOTATION}' in object.metadata.annotations"),
            ("oldStatus", "has(oldObject.spec.status) ? string(oldObject.spec.status) : ''"),
            ("newStatus", "has(object.spec.status) ? string(object.spec.status) : ''"),
            ("cancelValues", f"request.kind.kind == 'TaskRun' ? {_quoted(CANCEL_VALUES['TaskRun'])} : {_quoted(CANCEL_VALUES['PipelineRun'])}"),
            ("oursKept", " && ".join(_kept(key) for key in OWN_ANNOTATIONS)),
        ],
    )


def policy_binding(warn_only: bool = False) -> dict[str, Any]:
    """The binding: every namespace (a tenant's runs are anywhere); `warn_only` answers with a warning
    and an audit annotation instead of refusing (the rollout mode, k8s/run-guard-warn/)."""
    return binding(RUN_GUARD_NAME, WARN_ONLY if warn_only else DENY)
