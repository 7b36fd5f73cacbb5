"""The validating webhook of the pools API: EgressPool and EgressPlacerConfig CREATE and UPDATE, judged by
the policy loader's own code before the API server stores them (k8s/pools-webhook.yaml, fail-closed).

The API server's schema and CEL rules refuse most bad objects; what they cannot see (a URL Go's parser
takes and the loader's does not, such as `http://prometheus:99999`) would otherwise reach the
controller and be refused there, as a whole, with the last good policy kept. Here the candidate is
judged together with the other objects the informer cache holds (`objects()`; without it, in
ConfigMap mode or before the first list, alone) through `core.pools.policy_from_objects`, the
controller's one path: a problem that names the candidate denies it, the message naming the object
and the field (`EgressPool overseas: spec.egressLoad.prometheus.url: invalid port number`). Problems
of other objects (stored before this webhook existed, or while it was deleted) do not deny the
candidate: they are said in a warning. An UPDATE that leaves the spec as it was (labels, annotations)
is allowed as it is, so that a stored object the loader refuses can still be labelled or annotated.

A pool whose priority another pool has too gets a warning: the order between them is by name.

Answered from memory, no API call. An internal error denies (the webhook is fail-closed: the API
server would deny too), saying so.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from loguru import logger

from controller.admission.review import ADMISSION_API_VERSION, MalformedReview, Request, parse_review, text, value_at
from controller.core.policy import API_VERSION, PolicyError
from controller.core.conversion import V1BETA1, VERSIONS, ConversionError, to_version
from controller.core.pools import GROUP, KINDS, POOL_KIND, policy_from_objects
from controller.metrics import ERROR, Metrics

ALLOWED, DENIED = "allowed", "denied"
# The objects of the pools API as the informers hold them (apiVersion, kind, metadata, spec), or None
# when there is no such cache (the policy comes from a ConfigMap, or the first list has not come).
CachedObjects = Callable[[], Sequence[Mapping[str, Any]] | None]


class PoolValidation:
    def __init__(self, objects: CachedObjects, metrics: Metrics, clock: Callable[[], float] = time.perf_counter) -> None:
        self.objects = objects
        self.metrics = metrics
        self.clock = clock

    def review(self, body: Any) -> dict[str, Any]:
        """The AdmissionReview response for `body`. Raises only MalformedReview."""
        try:
            request = parse_review(body)
        except MalformedReview:
            self.metrics.count_malformed_review()
            raise
        started = self.clock()
        kind = request.kind if request.kind in KINDS else "other"
        try:
            denial, warnings = self._judge(request)
            outcome = DENIED if denial else ALLOWED
        except Exception as error:  # noqa: BLE001 - fail-closed: the API server would deny on no answer too
            logger.bind(kind=request.kind, name=request.name).opt(exception=error).error("pools API validation failed")
            denial, warnings, outcome = f"egress-placer could not check the object: {type(error).__name__}: {error}", [], ERROR
        finally:
            self.metrics.admission_seconds.labels(kind=kind).observe(max(self.clock() - started, 0.0))
        self.metrics.admission_reviews.labels(kind=kind, outcome=outcome).inc()
        if denial:
            logger.bind(kind=request.kind, name=request.name, operation=request.operation).info("denied: {}", denial)
        return validation_response(request.uid, denial, warnings)

    def _judge(self, request: Request) -> tuple[str | None, list[str]]:
        """(why the object is denied, or None; warnings)."""
        if request.group != GROUP or request.kind not in KINDS or request.operation not in ("CREATE", "UPDATE"):
            return None, []
        if request.operation == "UPDATE" and value_at(request.object, ("spec",)) == value_at(request.old_object, ("spec",)):
            return None, []
        version = f"{GROUP}/{request.version}"  # each version's fields, named in its own terms (core.conversion)
        candidate = {**request.object, "apiVersion": version if version in VERSIONS else API_VERSION, "kind": request.kind}
        cached = self.objects()
        others = [
            o for o in cached or ()
            if not (o.get("kind") == request.kind and text(value_at(o, ("metadata", "name"))) == request.name)
        ]
        warnings = _same_priority(candidate, others)
        try:
            policy_from_objects([candidate, *others])
        except PolicyError as error:
            mine, theirs = _split(str(error), request.kind, request.name)
            if mine:
                return "\n".join(mine), warnings
            if theirs:
                warnings.append(
                    f"egress-placer: other objects are refused, and the pools are taken as a whole: {theirs[0]}"
                    + (f" (and {len(theirs) - 1} more)" if len(theirs) > 1 else "")
                )
        return None, warnings


def _split(error: str, kind: str, name: str) -> tuple[list[str], list[str]]:
    """The lines of a loader error about the candidate, and the others."""
    prefix = f"{kind} {name}:"
    lines = error.splitlines()
    return [line for line in lines if line.startswith(prefix)], [line for line in lines if not line.startswith(prefix)]


def _same_priority(candidate: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> list[str]:
    """A warning when another pool has the candidate pool's priority (the order is then by name)."""
    if candidate.get("kind") != POOL_KIND:
        return []
    priority = value_at(candidate, ("spec", "priority"))
    priority = 0 if priority is None else priority
    ordered = _ordered_priority(candidate)
    if not isinstance(priority, int) or ordered is None:
        return []  # the loader says what is wrong with it
    name = text(value_at(candidate, ("metadata", "name")))
    ties = sorted(
        text(value_at(o, ("metadata", "name")))
        for o in others
        if o.get("kind") == POOL_KIND and _ordered_priority(o) == ordered
    )
    if not ties:
        return []
    return [
        f"egress-placer: EgressPool {name} has the priority of EgressPool {', '.join(ties)} ({priority}): "
        "between them, for a node both claim or a run both take, the order is by name"
    ]


def _ordered_priority(obj: Mapping[str, Any]) -> int | None:
    """A pool's priority in v1beta1's terms (objects of either version compare), None when it has none that converts."""
    if obj.get("apiVersion") not in VERSIONS:
        obj = {**obj, "apiVersion": API_VERSION}
    try:
        priority = value_at(to_version(obj, V1BETA1), ("spec", "priority"))
    except ConversionError:
        return None
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else None


def validation_response(uid: str, denial: str | None, warnings: Sequence[str] = ()) -> dict[str, Any]:
    """An AdmissionReview v1 response: allowed, or denied with `denial` (HTTP 422 Invalid: the object's
    fields, not the user's rights, are wrong)."""
    response: dict[str, Any] = {"uid": uid, "allowed": denial is None}
    if denial is not None:
        response["status"] = {"code": 422, "reason": "Invalid", "message": denial}
    if warnings:
        response["warnings"] = list(warnings)
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}
