"""The base of every model of the policy (pools, selectors, the `egressLoad` block), and the OpenAPI
schema the Kubernetes API server checks them with, rendered from those same models.

`openapi_schema(Model)` walks a model's fields: each field's `description` (every field has one:
`kubectl explain` prints it), its type (strings, integers, numbers, lists, maps, nested models,
`Literal` enums), pydantic's bounds (`Field(gt=0)`...) and the `OpenAPI` marks written beside the
validators (`Annotated[str, AfterValidator(check), OpenAPI(pattern=...)]`). A model's own CEL rules
(checks across its fields) are its class attribute `openapi`. Pydantic ignores the marks; the loader's
validators stay the judge in Python, and tests/unit/test_pools_schema.py holds the patterns to them.
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Mapping, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo


# A glob, a query: some character other than a space, a tab or a line break (found anywhere).
NOT_BLANK = r"[^ \t\n\r\f\v]"


@dataclass(frozen=True)
class Rule:
    """One `x-kubernetes-validations` entry: a CEL expression the API server evaluates on the value,
    the message it refuses with, and the field it blames (relative to the value, e.g. `.values`)."""

    rule: str
    message: str
    field_path: str | None = None
    reason: str | None = None  # FieldValueInvalid (the default), FieldValueRequired, FieldValueForbidden...

    def render(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class OpenAPI:
    """What the API server checks of a value beyond its type. Written beside the Python check it
    mirrors (pydantic ignores it). `patterns`: Go regular expressions the whole value must match (the
    first is the schema's `pattern`, more go in `allOf`; as a map's key type, a CEL rule per pattern).
    `int_or_string`: an integer or a string (durations). `default`: what the API server fills in."""

    patterns: tuple[str, ...] = ()
    max_length: int | None = None
    max_items: int | None = None
    max_properties: int | None = None
    rules: tuple[Rule, ...] = ()
    int_or_string: bool = False
    default: Any = None
    message: str | None = None  # what a map's key rules refuse with (a pattern's own message is the API server's)
    extra: Mapping[str, Any] | None = None  # anything else, verbatim (e.g. {"format": "date-time"})


class PolicyModel(BaseModel):
    """camelCase keys in YAML (snake_case accepted too), unknown keys refused, frozen once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    # Checks across fields, for the API server (the model's validators check the same in Python).
    openapi: ClassVar[OpenAPI] = OpenAPI()


class SchemaError(TypeError):
    """A model field this renderer cannot express (a bug of the model, found by the unit tests)."""


def openapi_schema(model: type[BaseModel], exclude: frozenset[str] = frozenset(), only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of `model` (camelCase property names), without the fields
    named in `exclude` (Python names) or with only those in `only`."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, info in model.model_fields.items():
        if name in exclude or (only is not None and name not in only):
            continue
        key = info.alias or name
        if not info.description:
            raise SchemaError(f"{model.__name__}.{name} has no description (kubectl explain prints it)")
        properties[key] = {"description": info.description, **_schema_of(info.annotation, tuple(info.metadata))}
        if info.is_required():
            required.append(key)
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = required
    marks = getattr(model, "openapi", None)
    if isinstance(marks, OpenAPI) and marks.rules:
        names = set(properties)
        out["x-kubernetes-validations"] = [r.render() for r in marks.rules if _reads_only(r, names)]
        if not out["x-kubernetes-validations"]:
            del out["x-kubernetes-validations"]
    return out


_FIELD_READ = re.compile(r"\bself\.(\w+)")


def _reads_only(rule: Rule, names: set[str]) -> bool:
    """A model's rule goes into a rendering of part of the model only when every field it reads is there."""
    return set(_FIELD_READ.findall(rule.rule)) <= names


def _schema_of(annotation: Any, metadata: tuple[Any, ...] = ()) -> dict[str, Any]:
    """The schema of one value: its type, then the bounds and marks in `metadata` (and in Annotated)."""
    if get_origin(annotation) is Annotated:
        base, *more = get_args(annotation)
        return _schema_of(base, (*more, *metadata))
    marks = [m for m in metadata if isinstance(m, OpenAPI)]
    bounds = _bounds(metadata)
    if any(m.int_or_string for m in marks):
        out: dict[str, Any] = {"x-kubernetes-int-or-string": True}
    else:
        out = _type_schema(annotation)
        out.update(_numeric_bounds(out.get("type"), {k: v for k, v in bounds.items() if k != "max_length"}))
        if "max_length" in bounds:  # pydantic's max_length: of a string, a list or a map
            size = {"string": "maxLength", "array": "maxItems", "object": "maxProperties"}[out["type"]]
            out[size] = bounds["max_length"]
    for mark in marks:
        _apply(out, mark)
    return out


def _type_schema(annotation: Any) -> dict[str, Any]:
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        if len(present) != 1:
            raise SchemaError(f"a union other than `X | None` has no structural schema: {annotation!r}")
        return _schema_of(present[0])
    if origin is Literal:
        if not all(isinstance(a, str) for a in args):
            raise SchemaError(f"only string literals become an enum: {annotation!r}")
        return {"type": "string", "enum": list(args)}
    if origin in (tuple, list):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise SchemaError(f"only tuple[X, ...] is a list: {annotation!r}")
        return {"type": "array", "items": _schema_of(args[0])}
    if origin is dict:
        key, value = args
        out = {"type": "object", "additionalProperties": _schema_of(value)}
        key_rules = _key_rules(key)
        if key_rules:
            out["x-kubernetes-validations"] = key_rules
        return out
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return openapi_schema(annotation)
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer"}
    if annotation is float:
        return {"type": "number"}
    if annotation is str:
        return {"type": "string"}
    url = getattr(annotation, "__name__", "")
    if url in ("HttpUrl", "AnyHttpUrl", "AnyUrl"):
        return {"type": "string"}
    raise SchemaError(f"no OpenAPI type for {annotation!r}")


def _key_rules(key: Any) -> list[dict[str, str]]:
    """A map's key type, as CEL rules on the map (OpenAPI checks no key): its patterns and rules."""
    if get_origin(key) is not Annotated:
        return []
    _, *metadata = get_args(key)
    out = []
    for mark in (m for m in metadata if isinstance(m, OpenAPI)):
        checks = [f"k.matches({_cel_string(p)})" for p in mark.patterns]
        if mark.max_length is not None:
            checks.insert(0, f"size(k) <= {mark.max_length}")
        if checks:
            message = mark.message or f"every key must match {' and '.join(mark.patterns)}"
            out.append(Rule(f"self.all(k, {' && '.join(checks)})", message).render())
    return out


def _cel_string(text: str) -> str:
    """A CEL string literal of `text` (single-quoted, raw: no escape is interpreted)."""
    if "'" in text:
        raise SchemaError(f"a pattern with a single quote cannot be a raw CEL string: {text!r}")
    return f"r'{text}'"


def _bounds(metadata: tuple[Any, ...]) -> dict[str, Any]:
    """pydantic's bounds (Field(gt=...), PositiveInt, Field(max_length=...)): annotated-types' Gt, Ge,
    Lt, Le and MaxLen, also inside a FieldInfo."""
    out: dict[str, Any] = {}
    for m in metadata:
        if isinstance(m, FieldInfo):
            out.update(_bounds(tuple(m.metadata)))
        kind = type(m).__name__.lower()
        if kind in ("gt", "ge", "lt", "le") and hasattr(m, kind):
            out[kind] = getattr(m, kind)
        if kind == "maxlen" and hasattr(m, "max_length"):
            out["max_length"] = m.max_length
    return out


def _numeric_bounds(kind: str | None, bounds: Mapping[str, Any]) -> dict[str, Any]:
    if kind not in ("integer", "number"):
        if bounds:
            raise SchemaError(f"numeric bounds on a {kind}")
        return {}
    out: dict[str, Any] = {}
    if "gt" in bounds:
        if kind == "integer":
            out["minimum"] = bounds["gt"] + 1
        else:
            out.update(minimum=bounds["gt"], exclusiveMinimum=True)
    if "ge" in bounds:
        out["minimum"] = bounds["ge"]
    if "lt" in bounds:
        if kind == "integer":
            out["maximum"] = bounds["lt"] - 1
        else:
            out.update(maximum=bounds["lt"], exclusiveMaximum=True)
    if "le" in bounds:
        out["maximum"] = bounds["le"]
    return out


def _apply(out: dict[str, Any], mark: OpenAPI) -> None:
    if mark.patterns:
        out["pattern"] = mark.patterns[0]
        if mark.patterns[1:]:
            out["allOf"] = [{"pattern": p} for p in mark.patterns[1:]]
    for key, value in (("maxLength", mark.max_length), ("maxItems", mark.max_items), ("maxProperties", mark.max_properties)):
        if value is not None:
            out[key] = value
    if mark.default is not None:
        out["default"] = mark.default
    if mark.rules:
        out.setdefault("x-kubernetes-validations", []).extend(r.render() for r in mark.rules)
    out.update(mark.extra or {})
