"""The policies that bound the controller's own writes (controller/core/rights.py): their shape (fail-closed,
only the controller's ServiceAccount, the pod deletes' params the pool guard's ConfigMap, missing params
refused), and their CEL, run by cel-python, on the writes the controller makes (admitted) and on the
ones a stolen token would make (refused). `k8s/controller-rights.yaml` holds the render
(tests/unit/test_generated.py checks it); the cluster test is tests/reliability/test_controller_rights.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.pool_guard.core import GUARD_NAME
from controller.core.model import TAINT_KEY
from controller.core.rights import (
    POD_DELETES_NAME,
    RIGHTS_NAME,
    VARIABLES,
    controller_rights,
    pod_deletes_policy,
    rights_bindings,
    rights_policy,
)

celpy = pytest.importorskip("celpy")
from celpy import celtypes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONTROLLER = "system:serviceaccount:egress-placer:egress-placer"
ENV = celpy.Environment()


def program(expression: str) -> Any:
    return ENV.program(ENV.compile(expression))


PROGRAMS = {name: program(expression) for name, expression in VARIABLES}
CHECKS = [(program(v["expression"]), v["message"]) for v in rights_policy()["spec"]["validations"]]
(POD_DELETE,) = [(program(v["expression"]), v["message"]) for v in pod_deletes_policy()["spec"]["validations"]]
(IS_THE_CONTROLLER,) = [program(c["expression"]) for c in rights_policy()["spec"]["matchConditions"]]


class LazyVariables(celtypes.MapType):
    """`variables` as the API server has them: each evaluated when first read, in its own activation."""

    def __init__(self, activation: dict[str, Any], programs: dict[str, Any] | None = None) -> None:
        super().__init__({})
        self.activation = activation
        self.programs = PROGRAMS if programs is None else programs

    def __getitem__(self, key: Any) -> Any:
        name = str(key)
        if not super().__contains__(celtypes.StringType(name)):
            value = self.programs[name].evaluate({**self.activation, "variables": self})
            super().__setitem__(celtypes.StringType(name), value)
        return super().__getitem__(celtypes.StringType(name))

    def __contains__(self, key: Any) -> bool:
        return str(key) in self.programs


def refusals(group: str, resource: str, old: dict[str, Any], new: dict[str, Any], subresource: str = "") -> list[str]:
    """The messages of the rights policy's validations that refuse this UPDATE by the controller."""
    request = {"resource": {"group": group, "resource": resource}, "userInfo": {"username": CONTROLLER}}
    if subresource:  # left out on a request to the resource itself, as the API server's `request` has it (omitempty)
        request["subResource"] = subresource
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
    }
    activation["variables"] = LazyVariables(activation)
    refused = []
    for check, message in CHECKS:
        if check.evaluate(activation) != celtypes.BoolType(True):
            refused.append(message)
    return refused


# -- the shape ---------------------------------------------------------------------------------------


def test_both_policies_fail_closed_and_match_only_the_controller() -> None:
    for policy in (rights_policy(), pod_deletes_policy()):
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert policy["spec"]["matchConditions"] == [
            {"name": "is-the-controller", "expression": f"request.userInfo.username == '{CONTROLLER}'"}
        ]
    for user, matched in ((CONTROLLER, True), ("system:serviceaccount:team-a:egress-placer", False), ("admin", False)):
        assert IS_THE_CONTROLLER.evaluate({"request": celpy.json_to_cel({"userInfo": {"username": user}})}) == celtypes.BoolType(matched)
    assert "system:serviceaccount:ops:placer" in rights_policy("ops", "placer")["spec"]["matchConditions"][0]["expression"]


def test_what_each_policy_matches() -> None:
    rules = rights_policy()["spec"]["matchConstraints"]["resourceRules"]
    assert {(g, r, tuple(rule["operations"])) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]} == {
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", ("UPDATE",)),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", ("UPDATE",)),
        ("", "nodes", ("UPDATE",)),
        ("tekton.dev", "taskruns", ("UPDATE",)),
        ("tekton.dev", "pipelineruns", ("UPDATE",)),
        ("", "pods", ("UPDATE",)),
        ("egress-placer.io", "egresspools", ("UPDATE",)),
        ("egress-placer.io", "egressplacerconfigs", ("UPDATE",)),
        ("apiextensions.k8s.io", "customresourcedefinitions", ("UPDATE",)),
        ("apiextensions.k8s.io", "customresourcedefinitions/status", ("UPDATE",)),
    }
    deletes = pod_deletes_policy()["spec"]
    assert deletes["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["pods"]}
    ]
    assert deletes["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}


def test_the_bindings_deny_and_missing_params_refuse_the_deletes() -> None:
    rights, deletes = rights_bindings("egress-placer")
    assert rights["spec"] == {"policyName": RIGHTS_NAME, "validationActions": ["Deny"], "matchResources": {}}
    assert deletes["spec"]["paramRef"] == {"name": GUARD_NAME, "namespace": "egress-placer", "parameterNotFoundAction": "Deny"}
    assert [b["spec"]["validationActions"] for b in rights_bindings("x", ("Warn", "Audit"))] == [["Warn", "Audit"]] * 2


def test_every_message_names_its_policy() -> None:
    assert all(message.endswith(f"({RIGHTS_NAME})") for _, message in CHECKS)
    assert POD_DELETE[1].endswith(f"({POD_DELETES_NAME})")


def test_k8s_ships_the_render_and_the_warn_component_only_changes_the_actions() -> None:
    assert list(yaml.safe_load_all((ROOT / "k8s" / "controller-rights.yaml").read_text())) == controller_rights()
    assert "controller-rights.yaml" in yaml.safe_load((ROOT / "k8s" / "kustomization.yaml").read_text())["resources"]
    component = yaml.safe_load((ROOT / "k8s" / "controller-rights-warn" / "kustomization.yaml").read_text())
    (patch,) = component["patches"]
    assert patch["target"] == {"kind": "ValidatingAdmissionPolicyBinding", "name": "egress-placer-controller-(rights|pod-deletes)"}
    assert yaml.safe_load(patch["patch"]) == [
        {"op": "test", "path": "/spec/validationActions", "value": ["Deny"]},
        {"op": "replace", "path": "/spec/validationActions", "value": ["Warn", "Audit"]},
    ]


# -- webhook configurations: only caBundle -----------------------------------------------------------

WEBHOOK_CONFIG = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "MutatingWebhookConfiguration",
    "metadata": {"name": "egress-placer", "labels": {"app.kubernetes.io/part-of": "egress-placer"}},
    "webhooks": [
        {
            "name": "placement.egress-placer.io",
            "clientConfig": {"service": {"name": "egress-placer", "namespace": "egress-placer", "path": "/mutate", "port": 443}, "caBundle": "T0xE"},
            "rules": [{"apiGroups": ["tekton.dev"], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["taskruns"], "scope": "*"}],
            "failurePolicy": "Ignore",
            "matchPolicy": "Equivalent",
            "namespaceSelector": {},
            "objectSelector": {},
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
            "reinvocationPolicy": "Never",
        }
    ],
}


def edited(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `obj` with the field at the dotted `path` (list items by index) set, or removed when
    `value` is ...; an intermediate mapping is made when missing."""
    out = copy.deepcopy(obj)
    *parents, last = path.split(".")
    here: Any = out
    for part in parents:
        here = here[int(part)] if isinstance(here, list) else here.setdefault(part, {})
    if value is ...:
        here.pop(last, None)
    else:
        here[last] = value
    return out


MUTATING = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
VALIDATING = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")


def test_a_new_ca_bundle_is_admitted() -> None:
    assert refusals(*MUTATING, WEBHOOK_CONFIG, edited(WEBHOOK_CONFIG, "webhooks.0.clientConfig.caBundle", "TkVX")) == []
    validating = edited(WEBHOOK_CONFIG, "webhooks.0.reinvocationPolicy", ...)
    assert refusals(*VALIDATING, validating, edited(validating, "webhooks.0.clientConfig.caBundle", "TkVX")) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("webhooks.0.rules", []),
        ("webhooks.0.clientConfig.service", {"name": "evil", "namespace": "team-a", "port": 443}),
        ("webhooks.0.clientConfig.url", "https://evil.example/mutate"),
        ("webhooks.0.failurePolicy", "Fail"),
        ("webhooks.0.namespaceSelector", {"matchLabels": {"x": "y"}}),
        ("webhooks.0.objectSelector", {"matchLabels": {"x": "y"}}),
        ("webhooks.0.timeoutSeconds", 30),
        ("webhooks.0.sideEffects", "Some"),
        ("webhooks.0.matchConditions", [{"name": "never", "expression": "false"}]),
        ("webhooks.0.reinvocationPolicy", "IfNeeded"),
        ("webhooks.0.name", "other.egress-placer.io"),
        ("metadata.annotations", {"cert-manager.io/inject-ca-from": "team-a/evil"}),
        ("metadata.labels", {}),
    ],
)
def test_any_other_change_of_a_webhook_configuration_is_refused(path: str, value: Any) -> None:
    assert refusals(*MUTATING, WEBHOOK_CONFIG, edited(WEBHOOK_CONFIG, path, value)) == [
        f"the controller may change only the caBundle of a webhook configuration ({RIGHTS_NAME})"
    ]


def test_a_webhook_added_or_removed_is_refused() -> None:
    two = edited(WEBHOOK_CONFIG, "webhooks", [*WEBHOOK_CONFIG["webhooks"], {**WEBHOOK_CONFIG["webhooks"][0], "name": "b.egress-placer.io"}])
    assert refusals(*MUTATING, WEBHOOK_CONFIG, two) != []
    assert refusals(*MUTATING, WEBHOOK_CONFIG, edited(WEBHOOK_CONFIG, "webhooks", [])) != []


# -- nodes: only the pool taint ----------------------------------------------------------------------

NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "egress-1", "labels": {"egress-placer.io/pool": "overseas"}, "annotations": {"a": "b"}},
    "spec": {"taints": [{"key": "other.io/dedicated", "value": "x", "effect": "NoSchedule"}]},
}
POOL_TAINT = {"key": TAINT_KEY, "value": "overseas", "effect": "NoSchedule"}
NODES = ("", "nodes")


def test_the_pool_taint_added_changed_or_removed_is_admitted() -> None:
    tainted = edited(NODE, "spec.taints", [*NODE["spec"]["taints"], POOL_TAINT])
    assert refusals(*NODES, NODE, tainted) == []
    assert refusals(*NODES, tainted, edited(tainted, "spec.taints", [NODE["spec"]["taints"][0], {**POOL_TAINT, "value": "lab"}])) == []
    assert refusals(*NODES, tainted, NODE) == []
    bare = edited(NODE, "spec.taints", ...)
    assert refusals(*NODES, bare, edited(bare, "spec.taints", [POOL_TAINT])) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.labels", {"egress-placer.io/pool": "lab"}),
        ("metadata.labels", {}),
        ("metadata.annotations", {}),
        ("spec.unschedulable", True),
        ("spec.taints", []),  # the foreign taint removed
        ("spec.taints", [{"key": "other.io/dedicated", "value": "y", "effect": "NoSchedule"}]),
        ("spec.taints", [{"key": "other.io/dedicated", "value": "x", "effect": "NoSchedule"}, {"key": "evil", "effect": "NoExecute"}]),
        ("spec.providerID", "kwok://elsewhere"),
        ("metadata.finalizers", ["evil.io/keep"]),
    ],
)
def test_any_other_change_of_a_node_is_refused(path: str, value: Any) -> None:
    assert refusals(*NODES, NODE, edited(NODE, path, value)) == [
        f"the controller may change only the node's taints with key {TAINT_KEY} ({RIGHTS_NAME})"
    ]


# -- runs: only removing spec.status, and our own annotations ----------------------------------------

RUN = {
    "apiVersion": "tekton.dev/v1",
    "kind": "TaskRun",
    "metadata": {
        "name": "held",
        "namespace": "team-a",
        "labels": {"app": "x"},
        "annotations": {"egress-placer.io/queue": '{"pool": "overseas"}', "team.io/owner": "a"},
    },
    "spec": {"status": "TaskRunPending", "params": [{"name": "url", "value": "https://a"}], "taskRef": {"name": "upload"}},
}
RUNS = ("tekton.dev", "taskruns")


def test_the_release_and_our_own_annotations_are_admitted() -> None:
    assert refusals(*RUNS, RUN, edited(RUN, "spec.status", ...)) == []
    assert refusals(*RUNS, RUN, edited(RUN, "metadata.annotations", {"team.io/owner": "a"})) == []  # the queue entry removed
    assert refusals(*RUNS, RUN, edited(RUN, "metadata.annotations", {**RUN["metadata"]["annotations"], "egress-placer.io/decision": "{}"})) == []
    assert refusals("tekton.dev", "pipelineruns", RUN, edited(RUN, "spec.status", ...)) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.params", [{"name": "url", "value": "https://evil"}]),
        ("spec.taskRef", {"name": "other"}),
        ("spec.serviceAccountName", "builder"),
        ("spec.status", "TaskRunCancelled"),
        ("spec.taskRef", ...),
        ("metadata.labels", {}),
        ("metadata.annotations", {"egress-placer.io/queue": '{"pool": "overseas"}'}),  # a foreign one removed
        ("metadata.annotations.team.io/owner", "b"),
        ("metadata.ownerReferences", [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}]),
        ("metadata.finalizers", ["evil.io/keep"]),
    ],
)
def test_any_other_change_of_a_run_is_refused(path: str, value: Any) -> None:
    run = RUN
    if path.startswith("metadata.annotations."):  # an annotation key holds dots: set it whole
        key = path[len("metadata.annotations."):]
        new = edited(RUN, "metadata.annotations", {**RUN["metadata"]["annotations"], key: value})
    else:
        new = edited(run, path, value)
    assert refusals(*RUNS, run, new) == [
        f"the controller may only remove a run's spec.status and change its egress-placer.io/* annotations ({RIGHTS_NAME})"
    ]


def test_a_pending_status_set_on_a_started_run_is_refused() -> None:
    started = edited(RUN, "spec.status", ...)
    assert refusals(*RUNS, started, RUN) != []


GATED = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "build-pod", "namespace": "team-a", "labels": {"tekton.dev/taskRun": "build"}, "annotations": {"a": "b"}},
    "spec": {
        "containers": [{"name": "step-build", "image": "kaniko"}],
        "tolerations": [{"key": "egress-placer.io/pool", "operator": "Equal", "value": "overseas", "effect": "NoSchedule"}],
        "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}, {"name": "egress-placer.io/pool-slot"}],
    },
}
PODS = ("", "pods")
POD_REFUSED = f"the controller may only remove a pod's schedulingGate egress-placer.io/pool-slot ({RIGHTS_NAME})"


def test_removing_our_gate_is_admitted() -> None:
    assert refusals(*PODS, GATED, edited(GATED, "spec.schedulingGates", [{"name": "kueue.x-k8s.io/admission"}])) == []
    alone = edited(GATED, "spec.schedulingGates", [{"name": "egress-placer.io/pool-slot"}])
    assert refusals(*PODS, alone, edited(alone, "spec.schedulingGates", ...)) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.schedulingGates", ...),  # another manager's gate removed too
        ("spec.schedulingGates", [{"name": "egress-placer.io/pool-slot"}]),  # only another's removed
        ("spec.containers", [{"name": "step-build", "image": "evil"}]),
        ("spec.tolerations", []),
        ("spec.nodeSelector", {"kubernetes.io/hostname": "egress-1"}),
        ("spec.activeDeadlineSeconds", 1),
        ("metadata.labels", {}),
        ("metadata.annotations", {"a": "c"}),
        ("metadata.ownerReferences", [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}]),
        ("metadata.finalizers", ["evil.io/keep"]),
    ],
)
def test_any_other_change_of_a_pod_is_refused(path: str, value: Any) -> None:
    new = edited(GATED, "spec.schedulingGates", [{"name": "kueue.x-k8s.io/admission"}])
    assert refusals(*PODS, GATED, edited(new, path, value) if path != "spec.schedulingGates" else edited(GATED, path, value)) == [POD_REFUSED]


def test_a_pod_without_our_gate_is_not_changed() -> None:
    plain = edited(GATED, "spec.schedulingGates", ...)
    assert refusals(*PODS, plain, edited(plain, "metadata.labels", {})) == [POD_REFUSED]


# -- pod deletes: only on pool nodes -----------------------------------------------------------------

PARAMS = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"Pools": "overseas", "LeftOut": "kube-system", "egress-1": "overseas"}}


def deletable(node: str | None, params: dict[str, Any] | None = PARAMS) -> bool:
    old = {"metadata": {"name": "p", "namespace": "team-a"}, "spec": {"containers": [{"name": "c"}]}}
    if node is not None:
        old["spec"]["nodeName"] = node
    result = POD_DELETE[0].evaluate({"oldObject": celpy.json_to_cel(old), "object": None, "params": celpy.json_to_cel(params)})
    return result == celtypes.BoolType(True)


def test_a_pod_on_a_pool_node_may_be_deleted_and_no_other() -> None:
    assert deletable("egress-1")
    assert not deletable("node-1")
    assert not deletable(None)  # not scheduled: on no pool node
    assert not deletable("egress-1", params=None)
    assert not deletable("egress-1", params={"apiVersion": "v1", "kind": "ConfigMap"})


# -- the pools API's objects: written back unchanged only (the storage migration) -------------------------

POOL_OBJECT = {
    "apiVersion": "egress-placer.io/v1beta1", "kind": "EgressPool",
    "metadata": {"name": "overseas", "labels": {"team": "cdn"}, "resourceVersion": "7"},
    "spec": {"priority": 999_990, "nodes": ["egress-1"], "images": ["*/cdn-*"]},
}


def test_a_pool_written_back_unchanged_is_admitted() -> None:
    assert refusals("egress-placer.io", "egresspools", POOL_OBJECT, edited(POOL_OBJECT, "metadata.resourceVersion", "8")) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [("spec.priority", 1), ("spec.nodes", ["egress-2"]), ("spec.taint", {"effect": "NoExecute"}), ("metadata.labels.team", "x"),
     ("metadata.annotations", {"a": "b"}), ("metadata.finalizers", ["x"])],
)
def test_any_change_of_a_pool_object_is_refused(path: str, value: Any) -> None:
    assert refusals("egress-placer.io", "egresspools", POOL_OBJECT, edited(POOL_OBJECT, path, value)) != []


# -- the pools API's CRDs: only the conversion's caBundle; storedVersions only pruned ----------------------

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "egresspools.egress-placer.io", "labels": {"app.kubernetes.io/part-of": "egress-placer"},
                 "resourceVersion": "7", "generation": 2, "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
    "spec": {
        "group": "egress-placer.io",
        "names": {"kind": "EgressPool", "plural": "egresspools", "singular": "egresspool", "listKind": "EgressPoolList"},
        "scope": "Cluster",
        "versions": [
            {"name": "v1alpha1", "served": True, "storage": False, "schema": {"openAPIV3Schema": {"type": "object"}}},
            {"name": "v1beta1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {"type": "object"}}},
        ],
        "conversion": {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": {
            "service": {"namespace": "egress-placer", "name": "egress-placer-conversion", "path": "/convert", "port": 443},
            "caBundle": "T0xE"}}},
    },
    "status": {
        "storedVersions": ["v1alpha1", "v1beta1"],
        "acceptedNames": {"kind": "EgressPool", "plural": "egresspools"},
        "conditions": [{"type": "Established", "status": "True"}],
    },
}
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
CRD_REFUSED = f"the controller may change only the conversion webhook's caBundle of a CustomResourceDefinition ({RIGHTS_NAME})"
STORED_REFUSED = f"the controller may only remove versions from a CustomResourceDefinition's status.storedVersions ({RIGHTS_NAME})"


def merge_patched(crd: dict[str, Any], ca_bundle: str) -> dict[str, Any]:
    """The CRD after the leader's merge patch of the caBundle: what the API server changes besides is
    the resourceVersion, managedFields and (a spec change) the generation."""
    new = edited(crd, "spec.conversion.webhook.clientConfig.caBundle", ca_bundle)
    new = edited(new, "metadata.resourceVersion", "8")
    new = edited(new, "metadata.generation", 3)
    return edited(new, "metadata.managedFields", [*crd["metadata"]["managedFields"], {"manager": "egress-placer", "operation": "Update"}])


def test_a_new_conversion_ca_bundle_is_admitted() -> None:
    assert refusals(*CRDS, CRD, merge_patched(CRD, "TkVX")) == []
    assert refusals(*CRDS, edited(CRD, "spec.conversion.webhook.clientConfig.caBundle", ...), merge_patched(CRD, "TkVX")) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.versions.1.schema", {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}),
        ("spec.versions.0.served", False),
        ("spec.versions", [{"name": "v1beta1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {"type": "object"}}}]),
        ("spec.conversion.webhook.clientConfig.service", {"namespace": "team-a", "name": "evil", "path": "/convert", "port": 443}),
        ("spec.conversion.webhook.clientConfig.url", "https://evil.example/convert"),
        ("spec.conversion.webhook.conversionReviewVersions", ["v1beta1"]),
        ("spec.conversion.webhook", ...),
        ("spec.conversion", {"strategy": "None"}),
        ("spec.names.shortNames", ["ep"]),
        ("spec.scope", "Namespaced"),
        ("spec.preserveUnknownFields", True),
        ("metadata.labels", {}),
        ("metadata.annotations", {"a": "b"}),
        ("metadata.finalizers", ["evil.io/keep"]),
        ("metadata.ownerReferences", [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}]),
    ],
)
def test_any_other_change_of_a_crd_is_refused(path: str, value: Any) -> None:
    assert refusals(*CRDS, CRD, edited(merge_patched(CRD, "TkVX"), path, value)) == [CRD_REFUSED]


def pruned(crd: dict[str, Any], versions: list[str]) -> dict[str, Any]:
    """The CRD as the leader PUTs it to /status (storedVersions set), resourceVersion moved on."""
    return edited(edited(crd, "status.storedVersions", versions), "metadata.resourceVersion", "8")


def test_stored_versions_pruned_are_admitted() -> None:
    assert refusals(*CRDS, CRD, pruned(CRD, ["v1beta1"]), "status") == []
    assert refusals(*CRDS, CRD, pruned(CRD, ["v1alpha1", "v1beta1"]), "status") == []  # nothing to prune


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("status.storedVersions", ["v1alpha1", "v1beta1", "v2"]),
        ("status.storedVersions", ["v1"]),
        ("status.conditions", []),
        ("status.acceptedNames", {"kind": "Evil", "plural": "evils"}),
        ("spec.scope", "Namespaced"),
        ("metadata.labels", {}),
        ("metadata.finalizers", ["evil.io/keep"]),
    ],
)
def test_any_other_change_of_a_crds_status_is_refused(path: str, value: Any) -> None:
    assert refusals(*CRDS, CRD, edited(pruned(CRD, ["v1beta1"]), path, value), "status") == [STORED_REFUSED]


def test_a_version_added_to_a_pruned_crd_is_refused() -> None:
    done = pruned(CRD, ["v1beta1"])
    assert refusals(*CRDS, done, pruned(done, ["v1alpha1", "v1beta1"]), "status") == [STORED_REFUSED]


def test_the_status_rule_is_not_the_spec_rule() -> None:
    """A caBundle changed through /status (the API server keeps spec there) is judged by the status rule
    only; a storedVersions change through the resource is not judged by it (the API server keeps status)."""
    assert refusals(*CRDS, CRD, merge_patched(CRD, "TkVX"), "status") == [STORED_REFUSED]
    assert refusals(*CRDS, CRD, pruned(CRD, ["v1beta1"])) == []
