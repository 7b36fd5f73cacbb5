"""The placement decision for one run, pipeline task or pod: which pool, if any, and why.

Order of the rules (the first that applies wins):
1. `egress-placer.io/placement: none` opts out.
2. `egress-placer.io/placement: <pool>` opts in, if the pool exists and the namespace may use it.
3. Otherwise (`auto` or absent) the first pool, in file order, whose image globs match one of the
   resolved images and that allows the namespace.
4. Otherwise the first pool with a `history` rule whose measured set holds the run's Task (or Pipeline
   task) in the run's own namespace (`measured`, looked up by the caller) and that allows the namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from controller.core.model import PLACEMENT_ANNOTATION, Decision, ImageSet, MeasuredMatch, NamespaceState, Reason
from controller.core.policy import PlacementPolicy

OPT_OUT_VALUE = "none"
AUTO_VALUE = "auto"


def decide(
    policy: PlacementPolicy,
    namespace: NamespaceState,
    annotations: Mapping[str, Any],
    images: ImageSet,
    measured: Sequence[MeasuredMatch] = (),
) -> Decision:
    """Decide placement. Total: any odd input gives a Decision, never an exception. `measured`: the
    run's matches in the pools' measured sets; only a match of a pool that has a `history` rule, for
    this namespace, and a pool that allows it, places the run."""
    known = tuple(i for i in images.images if isinstance(i, str))
    unknown = tuple(str(u) for u in images.unresolved)

    def answer(reason: Reason, message: str, pool: str | None = None) -> Decision:
        return Decision(pool=pool, reason=reason, images=known, unresolved=unknown, message=message)

    requested = _requested(annotations)
    if requested == OPT_OUT_VALUE:
        return answer(Reason.OPT_OUT, f"Not placed: the run opts out with {PLACEMENT_ANNOTATION}={OPT_OUT_VALUE}.")
    if requested not in ("", AUTO_VALUE):
        pool = policy.pool(requested)
        if pool is None:
            return answer(
                Reason.UNKNOWN_POOL,
                f"Not placed: {PLACEMENT_ANNOTATION} names pool {requested!r}, which the policy does not define.",
            )
        if not pool.allows(namespace):
            return answer(
                Reason.NAMESPACE_NOT_ALLOWED,
                f"Not placed: namespace {namespace.name!r} may not use pool {pool.name!r} "
                f"named by {PLACEMENT_ANNOTATION}.",
            )
        return answer(
            Reason.OPT_IN, f"Placed in pool {pool.name!r}: the run asks for it with {PLACEMENT_ANNOTATION}.", pool.name
        )

    refused: list[str] = []
    for pool in policy.pools:
        image = next((i for i in known if pool.matches_image(i)), None)
        if image is None:
            continue
        if pool.allows(namespace):
            return answer(
                Reason.IMAGE_MATCH, f"Placed in pool {pool.name!r}: image {image!r} matches its image globs.", pool.name
            )
        refused.append(pool.name)
    for match in measured:
        pool = policy.pool(match.pool)
        if pool is None or pool.history is None or match.namespace != namespace.name or not pool.allows(namespace):
            continue
        return answer(Reason.MEASURED, f"Placed in pool {pool.name!r} by measured history: {match.why}.", pool.name)
    if refused:
        names = ", ".join(repr(p) for p in refused)
        return answer(
            Reason.NAMESPACE_NOT_ALLOWED,
            f"Not placed: images match pool{'s' if len(refused) > 1 else ''} {names}, "
            f"but namespace {namespace.name!r} may not use {'them' if len(refused) > 1 else 'it'}.",
        )
    if unknown:
        return answer(
            Reason.UNRESOLVED,
            f"Not placed: no known image matches a pool and {len(unknown)} image(s) cannot be known yet "
            f"({'; '.join(unknown)}).",
        )
    return answer(Reason.NO_MATCH, "Not placed: no image of the run matches a pool.")


def _requested(annotations: Mapping[str, Any] | None) -> str:
    """The stripped value of the placement annotation ("" when absent or unusable)."""
    try:
        value = (annotations or {}).get(PLACEMENT_ANNOTATION)
    except (AttributeError, TypeError):
        return ""
    return value.strip() if isinstance(value, str) else ""
