"""The controller's own rights, bounded in the API server: two ValidatingAdmissionPolicies that apply
only to requests of the controller's ServiceAccount. RBAC names verbs and resources; it cannot say
"only the caBundle" or "only the pool taint". These say it, so a stolen token of the controller can do
no more than the controller does. Rendered here; the CEL text lives in this module only; shipped in
`k8s/controller-rights.yaml` and the chart (`make generate`, devplacer/generate.py).

- `RIGHTS_NAME` (no params): on UPDATE of
  - a Mutating- or ValidatingWebhookConfiguration: only a webhook's `clientConfig.caBundle` changes
    (names, rules, service, url, selectors, policies, labels and annotations stay);
  - a Node: only taints whose key is the pool key (`TAINT_KEY`) change (labels, annotations,
    `unschedulable`, other taints, owners and finalizers stay);
  - a TaskRun or PipelineRun: only `spec.status` may be removed (the queue's release: the controller
    never sets it) and annotations under `egress-placer.io/` may change; every other field of `spec`,
    the labels, the other annotations, owners and finalizers stay;
  - an EgressPool or the EgressPlacerConfig (not the status): written back unchanged only (spec, labels,
    annotations, owners and finalizers stay): the storage migration to v1beta1;
  - a CustomResourceDefinition (RBAC: the pools API's two): only `spec.conversion.webhook.clientConfig.caBundle`
    changes (the leader's merge patch; group, names, scope, versions, preserveUnknownFields, the conversion's
    strategy, review versions, url and service, labels, annotations, owners and finalizers stay; the
    resourceVersion, managedFields and generation the API server sets are not compared, and it keeps
    `status` on this endpoint itself);
  - a CustomResourceDefinition's `/status`: only versions removed from `status.storedVersions` (the
    prune after the storage migration; never one added), conditions, acceptedNames, spec, labels,
    annotations, owners and finalizers stay.
  - a Pod: only the schedulingGate `POOL_SLOT_GATE` may be removed (the queue lets in a pod that
    waited for a pool slot); the other gates, every other field of `spec`, the labels, annotations,
    owners and finalizers stay.
- `POD_DELETES_NAME` (params: the pool guard's ConfigMap, controller/pool_guard/core.py): a pod DELETE
  only of a pod whose `oldObject.spec.nodeName` is a pool node of the params (a node name is a key
  there). Params missing: refused (`parameterNotFoundAction: Deny`).

Both match the controller by `request.userInfo.username` (the API server's authenticator sets it; a
request cannot choose it). What they cannot bound (k8s/README.md, docs/security.md): evictions (on a
`pods/eviction` CREATE the object is the Eviction and `oldObject` is null), the params ConfigMap the
pod-delete check reads (the same identity writes it), and the policy and binding objects themselves
(the API server never applies admission policies to them: RBAC alone keeps them, and the controller
has no right on them).

Every list the CEL walks is bounded by the object under review (its webhooks, taints, annotations,
spec keys).
"""

from __future__ import annotations

from typing import Any

from controller.core.admission_policy import (
    DENY,
    admission_policy,
    param_ref,
    policy_binding,
    resource_rule,
    service_account_user,
    validation,
)
from controller.pool_guard.core import GUARD_NAME
from controller.core.model import POOL_SLOT_GATE, TAINT_KEY

RIGHTS_NAME = "egress-placer-controller-rights"
POD_DELETES_NAME = "egress-placer-controller-pod-deletes"
OWN_ANNOTATION_PREFIX = "egress-placer.io/"
VALIDATION_ACTIONS = DENY  # the warn-only rollout: WARN_ONLY (k8s/controller-rights-warn/)

ADMISSION_GROUP = "admissionregistration.k8s.io"
WEBHOOK_RESOURCES = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
TEKTON_GROUP = "tekton.dev"
RUN_RESOURCES = ("taskruns", "pipelineruns")
POOLS_GROUP = "egress-placer.io"
POOLS_RESOURCES = ("egresspools", "egressplacerconfigs")  # not their status: the leader writes a pool's
CRD_GROUP = "apiextensions.k8s.io"
# The resource and its status subresource: a rule on `customresourcedefinitions` does not match `/status`.
CRD_RESOURCES = ("customresourcedefinitions", "customresourcedefinitions/status")


def _same(a: str, b: str, field: str) -> str:
    """CEL: `field` is set alike on a and b (both unset, or both set and equal)."""
    return f"(has({a}.{field}) ? (has({b}.{field}) && {a}.{field} == {b}.{field}) : !has({b}.{field}))"


def _same_but(a: str, b: str, tree: dict[str, Any]) -> str:
    """CEL: every field of `tree` is set alike on a and b; a field mapped to a subtree is compared field by
    field (each level guarded by has()), so what the tree leaves out may differ."""
    parts = []
    for field, sub in tree.items():
        if sub is None:
            parts.append(_same(a, b, field))
        else:
            inner = _same_but(f"{a}.{field}", f"{b}.{field}", sub)
            parts.append(f"(has({a}.{field}) ? (has({b}.{field}) && {inner}) : !has({b}.{field}))")
    return "(" + " && ".join(parts) + ")"


def _same_metadata(*fields: str) -> str:
    return " && ".join(_same("object.metadata", "oldObject.metadata", f) for f in fields)


# Every field of a webhook but clientConfig.caBundle (admissionregistration/v1).
WEBHOOK_FIELDS = (
    "clientConfig.url",
    "clientConfig.service",
    "rules",
    "failurePolicy",
    "matchPolicy",
    "namespaceSelector",
    "objectSelector",
    "sideEffects",
    "timeoutSeconds",
    "admissionReviewVersions",
    "matchConditions",
)

# The fields of a pod's spec an UPDATE may change but schedulingGates (the rest is immutable): images,
# tolerations (added), deadlines, grace, and a gated pod's nodeSelector and node affinity (narrowed).
POD_MUTABLE_FIELDS = (
    "containers",
    "initContainers",
    "activeDeadlineSeconds",
    "terminationGracePeriodSeconds",
    "tolerations",
    "nodeSelector",
    "affinity",
)

# Every field of a CustomResourceDefinition's spec (apiextensions/v1) but the conversion webhook's caBundle.
CRD_SPEC_BUT_CA_BUNDLE: dict[str, Any] = {
    "group": None,
    "names": None,
    "scope": None,
    "versions": None,
    "preserveUnknownFields": None,
    "conversion": {"strategy": None, "webhook": {"conversionReviewVersions": None, "clientConfig": {"url": None, "service": None}}},
}
# A CustomResourceDefinition's status but storedVersions.
CRD_STATUS_BUT_STORED_VERSIONS: dict[str, Any] = {"conditions": None, "acceptedNames": None}

_WEBHOOK_SAME = " && ".join(_same("w", "o", f) for f in WEBHOOK_FIELDS)

# (name, expression), evaluated lazily in this order.
VARIABLES: tuple[tuple[str, str], ...] = (
    ("webhookConfig", f"request.resource.group == '{ADMISSION_GROUP}'"),
    ("node", "request.resource.group == '' && request.resource.resource == 'nodes'"),
    ("run", f"request.resource.group == '{TEKTON_GROUP}'"),
    ("pod", "request.resource.group == '' && request.resource.resource == 'pods'"),
    ("poolObject", f"request.resource.group == '{POOLS_GROUP}'"),
    # request.subResource is left out, not empty, on a request to the resource itself (omitempty).
    ("crdStatus", f"request.resource.group == '{CRD_GROUP}' && has(request.subResource) && request.subResource == 'status'"),
    ("crd", f"request.resource.group == '{CRD_GROUP}' && !variables.crdStatus"),
    ("webhooks", "has(object.webhooks) ? object.webhooks : []"),
    ("oldWebhooks", "has(oldObject.webhooks) ? oldObject.webhooks : []"),
    (
        "webhooksKept",
        "size(variables.webhooks) == size(variables.oldWebhooks)"
        f" && variables.webhooks.all(w, variables.oldWebhooks.exists_one(o, o.name == w.name && {_WEBHOOK_SAME}"
        " && (request.resource.resource != 'mutatingwebhookconfigurations' || "
        + _same("w", "o", "reinvocationPolicy")
        + ")))",
    ),
    ("taints", f"has(object.spec.taints) ? object.spec.taints.filter(t, t.key != '{TAINT_KEY}') : []"),
    ("oldTaints", f"has(oldObject.spec.taints) ? oldObject.spec.taints.filter(t, t.key != '{TAINT_KEY}') : []"),
    ("annotations", "has(object.metadata.annotations) ? object.metadata.annotations : {}"),
    ("oldAnnotations", "has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"),
    (
        "foreignAnnotationsKept",
        f"variables.annotations.all(k, k.startsWith('{OWN_ANNOTATION_PREFIX}')"
        " || (k in variables.oldAnnotations && variables.oldAnnotations[k] == variables.annotations[k]))"
        f" && variables.oldAnnotations.all(k, k.startsWith('{OWN_ANNOTATION_PREFIX}') || k in variables.annotations)",
    ),
    ("spec", "has(object.spec) ? object.spec : {}"),
    ("oldSpec", "has(oldObject.spec) ? oldObject.spec : {}"),
    (
        "runSpecKept",
        "variables.spec.all(k, k in variables.oldSpec && variables.oldSpec[k] == variables.spec[k])"
        " && variables.oldSpec.all(k, k == 'status' || k in variables.spec)",
    ),
    ("gates", "has(object.spec.schedulingGates) ? object.spec.schedulingGates.map(g, g.name) : []"),
    ("oldGates", "has(oldObject.spec.schedulingGates) ? oldObject.spec.schedulingGates.map(g, g.name) : []"),
    # A pod's spec on UPDATE: the API server lets these change (the rest is immutable), the fields are typed
    # (no walk over keys as for a run's spec).
    ("podSpecKept", " && ".join(_same("object.spec", "oldObject.spec", f) for f in POD_MUTABLE_FIELDS)),
    (
        "storedVersions",
        "has(object.status) && has(object.status.storedVersions) ? object.status.storedVersions : []",
    ),
    (
        "oldStoredVersions",
        "has(oldObject.status) && has(oldObject.status.storedVersions) ? oldObject.status.storedVersions : []",
    ),
    # Only removed: each version listed now was listed before (never one added).
    ("storedVersionsPruned", "variables.storedVersions.all(v, v in variables.oldStoredVersions)"),
    (
        "poolSlotGateRemoved",
        f"'{POOL_SLOT_GATE}' in variables.oldGates"
        f" && variables.gates == variables.oldGates.filter(g, g != '{POOL_SLOT_GATE}')",
    ),
)

VALIDATIONS: tuple[tuple[str, str], ...] = (
    (
        "!variables.webhookConfig || (variables.webhooksKept && "
        + _same_metadata("labels", "annotations", "ownerReferences", "finalizers")
        + ")",
        "the controller may change only the caBundle of a webhook configuration",
    ),
    (
        "!variables.node || (variables.taints == variables.oldTaints && "
        + _same_metadata("labels", "annotations", "ownerReferences", "finalizers")
        + " && "
        + _same("object.spec", "oldObject.spec", "unschedulable")
        + " && "
        + _same("object.spec", "oldObject.spec", "providerID")
        + " && "
        + _same("object.spec", "oldObject.spec", "podCIDRs")
        + ")",
        f"the controller may change only the node's taints with key {TAINT_KEY}",
    ),
    (
        "!variables.run || (variables.runSpecKept && variables.foreignAnnotationsKept && "
        + _same_metadata("labels", "ownerReferences", "finalizers")
        + ")",
        f"the controller may only remove a run's spec.status and change its {OWN_ANNOTATION_PREFIX}* annotations",
    ),
    (
        "!variables.pod || (variables.poolSlotGateRemoved && variables.podSpecKept && "
        + _same_metadata("labels", "annotations", "ownerReferences", "finalizers")
        + ")",
        f"the controller may only remove a pod's schedulingGate {POOL_SLOT_GATE}",
    ),
)

VALIDATIONS += (
    (
        "!variables.poolObject || ("
        + _same("object", "oldObject", "spec")
        + " && "
        + _same_metadata("labels", "annotations", "ownerReferences", "finalizers")
        + ")",
        "the controller may only write a pools API object back unchanged (the storage migration to v1beta1)",
    ),
)

_KEPT_METADATA = _same_metadata("labels", "annotations", "ownerReferences", "finalizers")
VALIDATIONS += (
    (
        "!variables.crd || (" + _same_but("object.spec", "oldObject.spec", CRD_SPEC_BUT_CA_BUNDLE) + " && " + _KEPT_METADATA + ")",
        "the controller may change only the conversion webhook's caBundle of a CustomResourceDefinition",
    ),
    (
        "!variables.crdStatus || (variables.storedVersionsPruned && "
        + _same_but("object", "oldObject", {"status": CRD_STATUS_BUT_STORED_VERSIONS})
        + " && "
        + _same("object", "oldObject", "spec")
        + " && "
        + _KEPT_METADATA
        + ")",
        "the controller may only remove versions from a CustomResourceDefinition's status.storedVersions",
    ),
)

POD_DELETE_VALIDATION = (
    "params == null ? false : has(params.data) && has(oldObject.spec.nodeName) && oldObject.spec.nodeName in params.data",
    "the controller may delete only pods on pool nodes (the pool guard's params list them)",
)


def _is_the_controller(namespace: str, service_account: str) -> list[tuple[str, str]]:
    return [("is-the-controller", f"request.userInfo.username == '{service_account_user(namespace, service_account)}'")]


def _message(policy: str, text: str) -> str:
    return f"{text} ({policy})"


def rights_policy(namespace: str = "egress-placer", service_account: str = "egress-placer") -> dict[str, Any]:
    """The ValidatingAdmissionPolicy on the controller's updates of webhook configurations, nodes, runs, pods,
    the pools API's objects and CustomResourceDefinitions."""
    return admission_policy(
        RIGHTS_NAME,
        [
            resource_rule([ADMISSION_GROUP], ["UPDATE"], WEBHOOK_RESOURCES),
            resource_rule([""], ["UPDATE"], ["nodes"], versions=["v1"]),
            resource_rule([TEKTON_GROUP], ["UPDATE"], RUN_RESOURCES),
            resource_rule([""], ["UPDATE"], ["pods"], versions=["v1"]),
            resource_rule([POOLS_GROUP], ["UPDATE"], POOLS_RESOURCES),
            resource_rule([CRD_GROUP], ["UPDATE"], CRD_RESOURCES, versions=["v1"]),
        ],
        _is_the_controller(namespace, service_account),
        [validation(expression, _message(RIGHTS_NAME, text)) for expression, text in VALIDATIONS],
        variables=VARIABLES,
    )


def pod_deletes_policy(namespace: str = "egress-placer", service_account: str = "egress-placer") -> dict[str, Any]:
    """The ValidatingAdmissionPolicy on the controller's pod deletes: only pods on pool nodes."""
    expression, text = POD_DELETE_VALIDATION
    return admission_policy(
        POD_DELETES_NAME,
        [resource_rule([""], ["DELETE"], ["pods"], versions=["v1"])],
        _is_the_controller(namespace, service_account),
        [validation(expression, _message(POD_DELETES_NAME, text))],
        param_kind="ConfigMap",
    )


def rights_bindings(namespace: str = "egress-placer", actions: tuple[str, ...] = VALIDATION_ACTIONS) -> list[dict[str, Any]]:
    """The two bindings: every namespace (the policies pick the controller's requests themselves); the
    pod deletes' params are the pool guard's ConfigMap in `namespace`."""
    return [
        policy_binding(RIGHTS_NAME, actions),
        policy_binding(POD_DELETES_NAME, actions, param_ref(GUARD_NAME, namespace, "Deny")),
    ]


def controller_rights(
    namespace: str = "egress-placer", service_account: str = "egress-placer", actions: tuple[str, ...] = VALIDATION_ACTIONS
) -> list[dict[str, Any]]:
    """The two policies, then their bindings."""
    return [rights_policy(namespace, service_account), pod_deletes_policy(namespace, service_account), *rights_bindings(namespace, actions)]
