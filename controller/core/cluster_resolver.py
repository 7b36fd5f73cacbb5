"""Tekton's cluster resolver rules: which namespace's Task, Pipeline or StepAction a `resolver: cluster`
reference may be read from, as the pinned Tekton (v1.15.0) decides it
(pkg/resolution/resolver/cluster/resolver.go, `populateParamsWithDefaults` and `isDisabled`).

Tekton reads two ConfigMaps in its resolvers namespace (tekton-pipelines-resolvers):
- `cluster-resolver-config`: `default-kind`, `default-namespace`, `allowed-namespaces`,
  `blocked-namespaces` (comma-separated; each entry trimmed, empty entries ignored);
- `resolvers-feature-flags`: `enable-cluster-resolver` (Go's strconv.ParseBool; true when absent).

A namespace is refused when it is in `blocked-namespaces`; else allowed when it is in
`allowed-namespaces`; else refused when `blocked-namespaces` holds "*" ("only explicit allowed access");
else refused when `allowed-namespaces` is set and does not hold it; else allowed. A "*" in
`allowed-namespaces` means nothing (no namespace is called "*"). A list that is set but holds only
spaces and commas still counts as set, as in Tekton.

Admission reads another namespace's definition only where Tekton would let the run resolve it, so a
decision or Event never shows a tenant images from a namespace Tekton keeps from it. While either
ConfigMap is unknown (not read yet, absent, unreadable, or a flag Tekton cannot parse), no cluster
reference is followed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

CONFIG_MAP = "cluster-resolver-config"
FEATURE_FLAGS = "resolvers-feature-flags"
ENABLE_FLAG = "enable-cluster-resolver"
DEFAULT_KIND = "default-kind"
DEFAULT_NAMESPACE = "default-namespace"
ALLOWED = "allowed-namespaces"
BLOCKED = "blocked-namespaces"
SUPPORTED_KINDS = ("task", "pipeline", "stepaction")

# Go's strconv.ParseBool
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})

NOT_READ = "not read yet"


@dataclass(frozen=True)
class ResolverConfig:
    """Tekton's cluster resolver configuration: the ConfigMaps' data, or why each is unknown."""

    settings: Mapping[str, str] | str = NOT_READ  # cluster-resolver-config's data
    flags: Mapping[str, str] | str = NOT_READ  # resolvers-feature-flags' data

    def with_settings(self, data: Mapping[str, Any] | str) -> "ResolverConfig":
        return replace(self, settings=_data(data))

    def with_flags(self, data: Mapping[str, Any] | str) -> "ResolverConfig":
        return replace(self, flags=_data(data))

    def unknown(self) -> str:
        """Why Tekton's cluster resolver configuration is not known ("" when it is)."""
        if isinstance(self.settings, str):
            return f"ConfigMap {CONFIG_MAP} {self.settings}"
        if isinstance(self.flags, str):
            return f"ConfigMap {FEATURE_FLAGS} {self.flags}"
        value = self.flags.get(ENABLE_FLAG)
        if value is not None and value not in _TRUE | _FALSE:
            return f"{FEATURE_FLAGS} {ENABLE_FLAG}={value[:40]!r} is not a boolean Tekton reads"
        return ""

    @property
    def enabled(self) -> bool:
        value = self.flags.get(ENABLE_FLAG) if isinstance(self.flags, Mapping) else None
        return value is None or value in _TRUE


def _data(data: Mapping[str, Any] | str) -> Mapping[str, str] | str:
    if isinstance(data, str):
        return data
    return {str(k): v if isinstance(v, str) else str(v) for k, v in data.items()}


# As Tekton ships it (config/resolvers/cluster-resolver-config.yaml, resolvers-feature-flags): what
# `explain` assumes when it is given no ConfigMaps.
TEKTON_DEFAULTS = ResolverConfig(
    settings={DEFAULT_KIND: "task", DEFAULT_NAMESPACE: "", ALLOWED: "", BLOCKED: ""},
    flags={ENABLE_FLAG: "true"},
)


def config_map_data(configmap: Mapping[str, Any] | None) -> Mapping[str, Any] | str:
    """A ConfigMap's data as ResolverConfig takes it, or why there is none."""
    if not configmap:
        return "not found in Tekton's resolvers namespace"
    data = configmap.get("data") or {}
    return data if isinstance(data, Mapping) else "has data that is not a map"


@dataclass(frozen=True)
class Target:
    kind: str  # task, pipeline or stepaction
    name: str
    namespace: str


def _listed(value: str, comma_list: str) -> bool:
    return any(entry.strip() and entry.strip() == value for entry in comma_list.split(","))


def namespace_refusal(namespace: str, settings: Mapping[str, str]) -> str:
    """Why Tekton's cluster resolver may not read from `namespace` ("" when it may; a tenant's long
    namespace param is cut short in the reason)."""
    allowed, blocked = settings.get(ALLOWED, ""), settings.get(BLOCKED, "")
    shown = namespace if len(namespace) <= 80 else f"{namespace[:80]}..."
    if blocked and _listed(namespace, blocked):
        return f"access to namespace {shown} is blocked ({CONFIG_MAP} {BLOCKED})"
    if allowed and _listed(namespace, allowed):
        return ""
    if blocked and _listed("*", blocked):
        return f"only namespaces in {ALLOWED} may be read ({CONFIG_MAP} {BLOCKED} holds '*'), not {shown}"
    if allowed:
        return f"access to namespace {shown} is not allowed ({CONFIG_MAP} {ALLOWED})"
    return ""


def target(params: Mapping[str, str], config: ResolverConfig) -> Target | str:
    """What a cluster resolver reference with these (substituted) string params reads, or why Tekton
    would refuse to resolve it. A param that is absent or empty takes the configured default."""
    why = config.unknown()
    if why:
        return f"Tekton's cluster resolver configuration is not known ({why}): the reference is not followed"
    if not config.enabled:
        return f"Tekton's cluster resolver is disabled ({FEATURE_FLAGS} {ENABLE_FLAG})"
    assert isinstance(config.settings, Mapping)
    settings = config.settings
    found: dict[str, str] = {}
    missing: list[str] = []
    for param, default_key in (("kind", DEFAULT_KIND), ("name", None), ("namespace", DEFAULT_NAMESPACE)):
        value = params.get(param) or ""
        if value:
            found[param] = value
        elif default_key is not None and default_key in settings:
            found[param] = settings[default_key]
        else:
            missing.append(param)
        if param == "kind" and "kind" in found and found["kind"] not in SUPPORTED_KINDS:
            return f"unknown or unsupported resource kind {found['kind'][:80]!r}"
    if "namespace" in found and not found["namespace"].strip():
        missing.append("namespace")
    if missing:
        return f"missing required cluster resolver params: {', '.join(missing)}"
    refusal = namespace_refusal(found["namespace"], settings)
    if refusal:
        return f"Tekton's cluster resolver refuses it: {refusal}"
    return Target(found["kind"], found["name"], found["namespace"])
