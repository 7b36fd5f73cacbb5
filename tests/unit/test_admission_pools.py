"""The pools API's validating webhook (controller/admission/pools.py), no cluster: which writes it denies
and with what message (a table: what the loader refuses and the API server's CEL lets through, names
the object and the field), judged with the other objects of the cache but denied only for its own
problems; an UPDATE that keeps the spec passes; a priority shared with another pool is a warning;
other kinds and operations pass; an internal error denies; the outcome is counted."""

from __future__ import annotations

from typing import Any

import pytest

from controller.core.conversion import V1BETA1, to_version

from controller.admission.pools import PoolValidation
from controller.admission.review import MalformedReview
from controller.metrics import Metrics

API_VERSION = "egress-placer.io/v1alpha1"


def egress_pool(name: str = "overseas", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "EgressPool", "metadata": {"name": name}, "spec": {"nodes": ["egress-1"], **spec}}


def config(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "EgressPlacerConfig", "metadata": {"name": "cluster"}, "spec": spec}


def prometheus(url: str) -> dict[str, Any]:
    return {"egressLoad": {"prometheus": {"url": url}}}


def review(obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None, group: str = "egress-placer.io") -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": "u-1",
        "kind": {"group": group, "version": obj["apiVersion"].rpartition("/")[2], "kind": obj["kind"]},
        "operation": operation,
        "name": obj["metadata"]["name"],
        "object": obj,
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def beta(obj: dict[str, Any]) -> dict[str, Any]:
    return to_version(obj, V1BETA1)


def answer(obj: dict[str, Any], cached: list[dict[str, Any]] | None = None, **kw: Any) -> dict[str, Any]:
    validation = PoolValidation(lambda: cached, Metrics())
    response = validation.review(review(obj, **kw))["response"]
    assert response["uid"] == "u-1"
    return response


# What the API server's schema and CEL let through and the loader refuses: the webhook's own rules.
LOADER_ONLY = [
    ("a port above 65535", egress_pool(**prometheus("http://prometheus:99999")),
     "EgressPool overseas: spec.egressLoad.prometheus.url: invalid port number"),
    ("an IPv4 address with five parts", egress_pool(**prometheus("http://10.0.0.1.5:9090")),
     "EgressPool overseas: spec.egressLoad.prometheus.url: invalid IPv4 address"),
    ("an IPv4 address out of range", egress_pool(**prometheus("http://10.0.0.256:9090")),
     "EgressPool overseas: spec.egressLoad.prometheus.url: invalid IPv4 address"),
]


@pytest.mark.parametrize(("what", "obj", "message"), LOADER_ONLY, ids=[w for w, _, _ in LOADER_ONLY])
def test_what_the_loader_refuses_is_denied_naming_the_object_and_the_field(what: str, obj: dict[str, Any], message: str) -> None:
    response = answer(obj)
    assert response["allowed"] is False
    assert response["status"] == {"code": 422, "reason": "Invalid", "message": message}


@pytest.mark.parametrize(
    ("obj", "cached"),
    [
        (egress_pool(**prometheus("http://prometheus.monitoring:9090")), None),
        (egress_pool(priority=10), [egress_pool("lab", priority=20)]),
        (config(agentNamespaces=["monitoring"]), [egress_pool("lab")]),
        (egress_pool(), [egress_pool()]),  # the stored version of the same object is replaced, not a duplicate
    ],
    ids=["alone", "with-others", "config", "replaces-itself"],
)
def test_a_good_object_is_allowed(obj: dict[str, Any], cached: list[dict[str, Any]] | None) -> None:
    assert answer(obj, cached)["allowed"] is True


def test_another_objects_problem_does_not_deny_but_is_said():
    stored_bad = egress_pool("lab", priority=20, **prometheus("http://prometheus:99999"))
    response = answer(egress_pool(priority=10), [stored_bad])
    assert response["allowed"] is True
    assert response["warnings"] == [
        "egress-placer: other objects are refused, and the pools are taken as a whole: "
        "EgressPool lab: spec.egressLoad.prometheus.url: invalid port number"
    ]
    fixed = answer(egress_pool("lab", priority=20), [stored_bad, egress_pool(priority=10)])  # the fix itself
    assert fixed["allowed"] is True and "warnings" not in fixed


def test_an_update_that_keeps_the_spec_passes_even_when_the_loader_refuses_it():
    bad = egress_pool(**prometheus("http://prometheus:99999"))
    labelled = {**bad, "metadata": {**bad["metadata"], "labels": {"team": "cdn"}}}
    assert answer(labelled, operation="UPDATE", old=bad)["allowed"] is True
    changed = egress_pool(images=["*/cdn-*"], **prometheus("http://prometheus:99999"))
    assert answer(changed, operation="UPDATE", old=bad)["allowed"] is False


def test_a_shared_priority_is_a_warning():
    response = answer(egress_pool(priority=10), [egress_pool("lab", priority=10), egress_pool("zoo", priority=10), egress_pool("far", priority=30)])
    assert response["allowed"] is True
    assert response["warnings"] == [
        "egress-placer: EgressPool overseas has the priority of EgressPool lab, zoo (10): between them, for a "
        "node both claim or a run both take, the order is by name"
    ]
    assert "warnings" not in answer(egress_pool(), [egress_pool("lab", priority=5)])  # 0, the default, against 5


@pytest.mark.parametrize(
    "kw",
    [{"operation": "DELETE"}, {"group": "example.com"}],
    ids=["delete", "another-group"],
)
def test_other_operations_and_groups_pass(kw: dict[str, Any]) -> None:
    assert answer(egress_pool(**prometheus("http://prometheus:99999")), **kw)["allowed"] is True


def test_an_internal_error_denies_and_is_counted():
    def broken() -> list[dict[str, Any]]:
        raise RuntimeError("cache gone")

    metrics = Metrics()
    response = PoolValidation(broken, metrics).review(review(egress_pool()))["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == "egress-placer could not check the object: RuntimeError: cache gone"
    assert metrics.admission_reviews.labels(kind="EgressPool", outcome="error")._value.get() == 1


def test_outcomes_are_counted_and_a_malformed_review_raises():
    metrics = Metrics()
    validation = PoolValidation(lambda: None, metrics)
    validation.review(review(egress_pool()))
    validation.review(review(egress_pool(**prometheus("http://prometheus:99999"))))
    validation.review(review(config()))
    counted = lambda kind, outcome: metrics.admission_reviews.labels(kind=kind, outcome=outcome)._value.get()  # noqa: E731
    assert (counted("EgressPool", "allowed"), counted("EgressPool", "denied"), counted("EgressPlacerConfig", "allowed")) == (1, 1, 1)
    with pytest.raises(MalformedReview):
        validation.review({"kind": "AdmissionReview"})
    assert counted("unknown", "malformed") == 1


def test_a_v1beta1_object_is_judged_in_its_own_terms():
    """Its renamed fields are its own (not "extra inputs"), a problem names its own field path, and a
    priority tie is seen across versions (the cache holds v1beta1, a write may be v1alpha1)."""
    good = {**beta(egress_pool()), "spec": {"nodes": ["egress-1"], "loadCapacityPerNode": 2, "queue": {"maxRunsPerNode": 1}}}
    assert answer(good)["allowed"] is True
    bad = {**good, "spec": {**good["spec"], **prometheus("http://prometheus:99999")}}
    assert answer(bad)["status"]["message"] == "EgressPool overseas: spec.egressLoad.prometheus.url: invalid port number"
    tie = answer(egress_pool(priority=10), [beta(egress_pool("lab", priority=10))])
    assert tie["warnings"] == [
        "egress-placer: EgressPool overseas has the priority of EgressPool lab (10): between them, for a "
        "node both claim or a run both take, the order is by name"
    ]
