"""Every documented limit of the pools API is enforced, by the loader and by the schema the API server
checks (docs/pools-api.md, "v1beta1": 256 namespace globs; exemptNamespaces are namespace names)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.core.policy import MAX_NAMESPACES, PolicyError
from controller.core.pools import config_spec_schema, policy_from_objects, pool_spec_schema
from controller.core.conversion import V1ALPHA1


def pool(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": V1ALPHA1, "kind": "EgressPool", "metadata": {"name": "overseas"}, "spec": {"nodes": ["n"], **spec}}


def config(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": V1ALPHA1, "kind": "EgressPlacerConfig", "metadata": {"name": "cluster"}, "spec": spec}


def test_a_pool_takes_256_namespace_globs_and_not_257() -> None:
    assert pool_spec_schema()["properties"]["namespaces"]["maxItems"] == MAX_NAMESPACES == 256
    policy_from_objects([pool(namespaces=[f"team-{i}" for i in range(256)])])
    with pytest.raises(PolicyError, match=r"EgressPool overseas: spec\.namespaces: .*at most 256"):
        policy_from_objects([pool(namespaces=[f"team-{i}" for i in range(10_000)])])


@pytest.mark.parametrize("name", ["Kube_System", "team.a", "-x", "a" * 64, ""])
def test_an_exempt_namespace_is_a_namespace_name(name: str) -> None:
    items = config_spec_schema()["properties"]["exemptNamespaces"]["items"]
    assert items["pattern"] == "^([a-z0-9]([-a-z0-9]*[a-z0-9])?)$" and items["maxLength"] == 63
    with pytest.raises(PolicyError, match=r"EgressPlacerConfig cluster: spec\.exemptNamespaces\[0\]: .*DNS-1123 label"):
        policy_from_objects([config(exemptNamespaces=[name])])


def test_namespace_names_are_taken_as_exempt_namespaces() -> None:
    policy = policy_from_objects([config(exemptNamespaces=["kube-system", "infra-2"])])
    assert policy.exempt_namespaces == ("kube-system", "infra-2")
