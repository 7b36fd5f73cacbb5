"""The conversion webhook of the pools API (`/convert` on the webhook's HTTPS server): ConversionReviews
between `v1alpha1` and `v1beta1` (controller/core/conversion.py, docs/pools-api.md, "v1beta1").

Answered from the request alone: no cache, no client, no leader, no readiness. With every replica
down and objects stored as `v1alpha1`, a starting controller's informers list `v1beta1` through this
very endpoint, so it must answer before they have synced (the server routes it whatever the
readiness says). A body that is not a ConversionReview is a 400; an object that cannot be converted
is a Failure naming it (the API server then refuses the read or the write that needed it).
"""

from __future__ import annotations

from typing import Any

from controller.admission.review import MalformedReview
from controller.core.conversion import ConversionError, convert_review
from controller.metrics import Metrics


class PoolConversion:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def review(self, body: Any) -> dict[str, Any]:
        """The ConversionReview response for `body`. Raises only MalformedReview."""
        try:
            return convert_review(body)
        except ConversionError as error:
            self.metrics.count_malformed_review()
            raise MalformedReview(str(error)) from None
