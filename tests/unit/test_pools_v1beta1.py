"""The CRDs serving v1alpha1 and v1beta1 (controller/core/pools_v1beta1.py): v1beta1 stored, the renamed
fields in its schema, shortNames, metav1-complete conditions, a status for the config, /convert."""

from __future__ import annotations

from typing import Any

from controller.core.pools import custom_resource_definitions
from controller.core.pools_v1beta1 import serving_v1beta1


def crds() -> dict[str, dict[str, Any]]:
    return {c["spec"]["names"]["kind"]: c for c in serving_v1beta1(custom_resource_definitions(), "egress-placer", "egress-placer-conversion")}


def schema(kind: str, version: str) -> dict[str, Any]:
    (v,) = [v for v in crds()[kind]["spec"]["versions"] if v["name"] == version]
    return v["schema"]["openAPIV3Schema"]


def test_both_versions_are_served_v1beta1_stored_v1alpha1_deprecated_and_converted_at_convert() -> None:
    for kind, short in (("EgressPool", ["epool"]), ("EgressPlacerConfig", ["epc"])):
        crd = crds()[kind]
        versions = {v["name"]: v for v in crd["spec"]["versions"]}
        assert [(v["served"], v["storage"]) for v in versions.values()] == [(True, False), (True, True)]
        assert versions["v1alpha1"]["deprecated"] is True and "v1beta1" in versions["v1alpha1"]["deprecationWarning"]
        assert crd["spec"]["names"]["shortNames"] == short
        assert crd["spec"]["conversion"] == {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": {
            "service": {"namespace": "egress-placer", "name": "egress-placer-conversion", "path": "/convert", "port": 443}}}}


def test_v1beta1_names_load_and_limits_and_v1alpha1_keeps_its_names() -> None:
    beta = schema("EgressPool", "v1beta1")["properties"]
    alpha = schema("EgressPool", "v1alpha1")["properties"]
    assert "loadCapacityPerNode" in beta["spec"]["properties"] and "capacity" not in beta["spec"]["properties"]
    assert "capacity" in alpha["spec"]["properties"] and "loadCapacityPerNode" not in alpha["spec"]["properties"]
    queue = beta["spec"]["properties"]["queue"]
    assert queue["required"] == ["maxRunsPerNode"] and "runsPerNode" not in queue["properties"]
    assert "runsPerNode" not in str(queue) .replace("maxRunsPerNode", "")
    assert "HIGHEST" in beta["spec"]["properties"]["priority"]["description"]
    load = beta["status"]["properties"]["load"]
    assert "loadCapacity" in load["properties"] and "loadCapacity" in load["properties"]["mostLoaded"]["items"]["properties"]
    assert beta["spec"]["properties"]["namespaces"]["maxItems"] == alpha["spec"]["properties"]["namespaces"]["maxItems"] == 256


def test_v1beta1_conditions_are_metav1_complete_and_the_config_has_a_status() -> None:
    items = schema("EgressPool", "v1beta1")["properties"]["status"]["properties"]["conditions"]["items"]
    assert items["required"] == ["type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"]
    for version in ("v1alpha1", "v1beta1"):
        status = schema("EgressPlacerConfig", version)["properties"]["status"]
        assert set(status["properties"]) == {"conditions", "poolsInForce", "lastError"}


def test_the_printer_columns_read_the_renamed_status() -> None:
    (beta,) = [v for v in crds()["EgressPool"]["spec"]["versions"] if v["name"] == "v1beta1"]
    assert {"name": "Capacity", "type": "integer", "description": "Runs the pool's ready nodes take.", "jsonPath": ".status.load.loadCapacity"} in beta["additionalPrinterColumns"]


def test_the_v1alpha1_only_crds_are_left_as_they_are() -> None:
    before = custom_resource_definitions()
    serving_v1beta1(before, "n", "s")
    assert before == custom_resource_definitions()
