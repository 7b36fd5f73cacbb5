"""The CRDs of the pools API serving `v1alpha1` and `v1beta1` (docs/pools-api.md, "v1beta1"): `v1beta1`
the storage version, `v1alpha1` served and deprecated, converted by the pools webhook's `/convert`.

`serving_v1beta1(crds, namespace, service)` derives them from the `v1alpha1` CRDs that
`core.pools.custom_resource_definitions()` renders: the `v1beta1` schema is the `v1alpha1` one with the
fields of `core.conversion.RENAMES` renamed (their descriptions too), `spec.priority` higher-first,
every condition metav1-complete (`message` and `observedGeneration` required), a status for the
EgressPlacerConfig in both versions, and the printer columns reading the renamed fields. One table
of renames (core.conversion) for the conversion, the schema and the docs.

`served_crds(namespace)` is what `make generate` writes into k8s/crds/ and the chart: converted through
the Service `CONVERSION_SERVICE` (publishNotReadyAddresses: a replica answers /convert before it is
ready), its caBundle kept by the leader (docs/pools-api.md, "Serving, storing, converting").
"""

from __future__ import annotations

import copy
import re
from typing import Any

from controller.core.conversion import CONFIG_KIND, MAX_PRIORITY, POOL_KIND, RENAMES, V1ALPHA1, V1BETA1
from controller.core.policy import MAX_NAMESPACES
from controller.core.schema import openapi_schema
from controller.core.pools import Condition, LastError, custom_resource_definitions

CONVERT_PATH = "/convert"
CONVERSION_SERVICE = "egress-placer-conversion"  # k8s/service.yaml: publishes not-ready addresses
SHORT_NAMES = {POOL_KIND: ["epool"], CONFIG_KIND: ["epc"]}
DEPRECATION_WARNING = (
    "egress-placer.io/v1alpha1 is deprecated: use egress-placer.io/v1beta1 (docs/pools-api.md, \"Deprecation policy\")"
)
PRIORITY_DESCRIPTION = (
    "Orders pools that claim the same node (it belongs to the pool of the HIGHEST priority; ties by name) and "
    "pools whose images both match a run (the first of them, highest first, the run's namespace may use), as "
    f"queue.priorities[].priority does. 0 to {MAX_PRIORITY}, default 0 (last). v1alpha1's lower-first priority "
    f"p reads as {MAX_PRIORITY} - p."
)


def _version(crd: dict[str, Any]) -> dict[str, Any]:
    (only,) = crd["spec"]["versions"]
    return only


def _renamed_words(kind: str) -> list[tuple[re.Pattern[str], str]]:
    """Each renamed field's old name, as a whole word, and its new one (for descriptions)."""
    return [(re.compile(rf"\b{re.escape(a[-1])}\b"), b[-1]) for a, b in RENAMES[kind] if a[-1] != "capacity"]


def _reword(node: Any, words: list[tuple[re.Pattern[str], str]]) -> None:
    if isinstance(node, dict):
        if isinstance(node.get("description"), str):
            for old, new in words:
                node["description"] = old.sub(new, node["description"])
        for value in node.values():
            _reword(value, words)
    elif isinstance(node, list):
        for item in node:
            _reword(item, words)


def _rename_property(schema: dict[str, Any], path: tuple[str, ...], new: str) -> None:
    """Rename the property at `path` (a "[]" step goes into a list's items), keeping it required."""
    node = schema
    for step in path[:-1]:
        node = node["items"] if step == "[]" else node["properties"][step]
    properties = node["properties"]
    properties[new] = properties.pop(path[-1])
    node["required"] = [new if r == path[-1] else r for r in node.get("required", [])]


def _complete_conditions(status: dict[str, Any]) -> None:
    items = status["properties"]["conditions"]["items"]
    items["required"] = ["type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"]
    items["properties"]["message"]["minLength"] = 1


def config_status_schema() -> dict[str, Any]:
    """An EgressPlacerConfig's status: PolicyAccepted and Ready, the pools in force, the last error."""
    conditions = openapi_schema(Condition)
    _complete_conditions({"properties": {"conditions": {"items": conditions}}})
    return {
        "description": "What egress-placer sees of the policy-wide settings; written by its leader.",
        "type": "object",
        "properties": {
            "conditions": {
                "description": "PolicyAccepted (the loader took the settings) and Ready (the policy is in force).",
                "type": "array",
                "maxItems": 8,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": conditions,
            },
            "poolsInForce": {"description": "Pools of the policy in force.", "type": "integer", "minimum": 0},
            "lastError": {"description": "The last error about the settings (none: nothing went wrong).", **openapi_schema(LastError)},
        },
    }


def _beta(kind: str, alpha: dict[str, Any]) -> dict[str, Any]:
    beta = copy.deepcopy(alpha)
    beta["name"] = V1BETA1.rpartition("/")[2]
    beta["served"], beta["storage"] = True, True
    root = beta["schema"]["openAPIV3Schema"]
    root["properties"]["apiVersion"]["description"] = f"APIVersion: {V1BETA1}."
    for old, new in RENAMES[kind]:
        _rename_property(root, old, new[-1])
    _reword(root, _renamed_words(kind))
    if kind == POOL_KIND:
        root["properties"]["spec"]["properties"]["priority"]["description"] = PRIORITY_DESCRIPTION
        root["properties"]["spec"]["properties"]["namespaces"]["maxItems"] = MAX_NAMESPACES
        _complete_conditions(root["properties"]["status"])
        for column in beta["additionalPrinterColumns"]:
            column["jsonPath"] = column["jsonPath"].replace(".status.load.capacity", ".status.load.loadCapacity")
    return beta


def serving_v1beta1(crds: list[dict[str, Any]], namespace: str, service: str) -> list[dict[str, Any]]:
    """The v1alpha1-only CRDs as CRDs serving both versions, v1beta1 stored, converted at `service`'s
    /convert (its caBundle kept by the leader, as the webhooks' are)."""
    out = []
    for crd in crds:
        crd = copy.deepcopy(crd)
        kind = crd["spec"]["names"]["kind"]
        alpha = _version(crd)
        assert f"{crd['spec']['group']}/{alpha['name']}" == V1ALPHA1
        if kind == CONFIG_KIND:
            alpha["schema"]["openAPIV3Schema"]["properties"]["status"] = config_status_schema()
            alpha["subresources"] = {"status": {}}
        beta = _beta(kind, alpha)
        alpha.update(storage=False, deprecated=True, deprecationWarning=DEPRECATION_WARNING)
        crd["spec"]["names"]["shortNames"] = SHORT_NAMES[kind]
        crd["spec"]["versions"] = [alpha, beta]
        crd["spec"]["conversion"] = {
            "strategy": "Webhook",
            "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"service": {"namespace": namespace, "name": service, "path": CONVERT_PATH, "port": 443}},
            },
        }
        out.append(crd)
    return out


def served_crds(namespace: str = "egress-placer") -> list[dict[str, Any]]:
    """The CRDs k8s/crds/ and the chart install: both versions, v1beta1 stored, converted at the Service
    CONVERSION_SERVICE of `namespace`."""
    return serving_v1beta1(custom_resource_definitions(), namespace, CONVERSION_SERVICE)


def crd_names() -> list[str]:
    """The names of the pools API's CRDs (the leader keeps their conversion caBundle and migrates them)."""
    return [crd["metadata"]["name"] for crd in custom_resource_definitions()]
