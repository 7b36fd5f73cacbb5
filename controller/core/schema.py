"""The base of every model of the policy document (pools, selectors, the `egressLoad` block)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class PolicyModel(BaseModel):
    """camelCase keys in YAML (snake_case accepted too), unknown keys refused, frozen once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)
