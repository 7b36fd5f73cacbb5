"""Controller settings: one typed object read from the environment (prefix EGRESS_PLACER_).

Validated at start and passed explicitly; tests build it with keyword arguments, commands with
`load_settings`, whose one-line `SettingsError` names the variable (or the command-line option) that
is wrong. `config/settings.md` documents every field.
"""

from __future__ import annotations

import re
import socket
from typing import Any, Literal, Mapping

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError

ENV_PREFIX = "EGRESS_PLACER_"


class SettingsError(ValueError):
    """Invalid settings, in one line that names each variable (or option) at fault and why."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    # Where the cluster is, as kubectl finds it: this kubeconfig path, else $KUBECONFIG, else
    # ~/.kube/config when it exists, else the pod's ServiceAccount (controller/kube/client.py).
    kubeconfig: str | None = None
    # The kubeconfig context to use; empty: its current-context.
    kube_context: str | None = None
    # The controller's own namespace (Lease, TLS Secret, policy ConfigMap, Events about itself).
    namespace: str = "egress-placer"
    # Identity of this replica in the leader Lease.
    identity: str = Field(default_factory=socket.gethostname)

    # Policy: a file (reloaded when it changes) or, when no file is given, the EgressPool and
    # EgressPlacerConfig objects of the pools API ("pools", docs/pools-api.md) or a ConfigMap key
    # ("configmap", the documented alternative: k8s/policy-configmap/).
    policy_file: str | None = None
    policy_source: Literal["configmap", "pools"] = "pools"
    policy_configmap: str = "egress-placer-policy"
    policy_key: str = "policy.yaml"

    # Admission webhook (HTTPS) and the plain HTTP port for /healthz, /readyz, /metrics.
    webhook_host: str = "0.0.0.0"
    webhook_port: int = 8443
    health_host: str = "0.0.0.0"
    health_port: int = 8080
    webhook_config_name: str = "egress-placer"
    # The ValidatingWebhookConfiguration of the pools API (fail-closed); its caBundle is kept too.
    pools_webhook_config_name: str = "egress-placer-pools"
    # The serving certificate: made by the controller, kept in this Secret, renewed before it expires.
    tls_secret: str = "egress-placer-webhook-tls"
    tls_hosts: list[str] = ["egress-placer-webhook.egress-placer.svc", "127.0.0.1", "localhost"]
    tls_cert_days: int = 90
    tls_renew_before_days: int = 30
    # Or a certificate someone else keeps (cert-manager's Secret mounted into the pod): both files set.
    # The controller then loads them (again when they change) and writes neither Secret nor caBundle.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # How the pools' `history` rules and `egressLoad` sources reach Prometheus (docs/suggest.md, "Prometheus behind auth"): files of a
    # Secret of the controller's namespace mounted into its pod, read again at every query (rotation needs no
    # restart). A bearer token, or basic auth (a user and a password file), and a CA bundle for its TLS.
    prometheus_token_file: str | None = None
    prometheus_username: str | None = None
    prometheus_password_file: str | None = None
    prometheus_ca_file: str | None = None
    # Connection recycling: the webhook's answer to a connection's Nth request, or its first after this many
    # seconds, says `Connection: close`, so the API server connects again and the Service picks a replica
    # again (docs/architecture.md, "Replicas behind the Service"). 0: never (the chart's and the local cluster's
    # choice with one replica: nothing to pick again). The request after a recycle waits for a TLS handshake: at
    # 1,000 requests that is 0.1 % of them; the 3 s makes it one in 30 at 10 requests a second.
    webhook_connection_max_requests: int = Field(default=1000, ge=0)
    webhook_connection_max_seconds: float = Field(default=3.0, ge=0)

    # Leader election (taints and evictions are done by the leader only).
    leader_election: bool = True
    lease_name: str = "egress-placer-leader"
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0

    # Load: how long an admission-time placement counts before its pod appears.
    assumption_ttl_seconds: float = 120.0
    # Node choice inside a pool: least loaded counting the placements assumed at admission ("load"), or
    # counting only the pods already seen ("load-without-assumptions": the benchmark's baseline).
    balance: Literal["load", "load-without-assumptions"] = "load"
    # Intruders: evict them, or only report (Event + metric + log) on a first install.
    intruder_mode: Literal["evict", "report"] = "evict"
    # An intruder whose evictions a PodDisruptionBudget has refused this long is deleted; None (the
    # variable set to `never` or empty) honours budgets for ever.
    intruder_budget_grace_seconds: float | None = Field(default=30.0, ge=0)
    # An intruder's eviction gives its containers at most this long to stop (its own grace, which the
    # tenant chooses, may be a day); one still there afterwards is deleted with grace 0.
    intruder_eviction_grace_seconds: int = Field(default=10, ge=0)
    # Coscheduled PipelineRuns (Tekton's affinity assistant): move the whole run to the pool when a
    # task needs it ("whole-run"), or leave the whole run on ordinary nodes ("off").
    coscheduled: Literal["whole-run", "off"] = "whole-run"
    # Tekton's coschedule mode (feature-flags ConfigMap); read from the cluster when it can be.
    tekton_namespace: str = "tekton-pipelines"
    # The user Tekton's controller is to the API server (the admission request's userInfo.username): only the
    # TaskRuns and pods it makes are a coscheduled run's; "" is its ServiceAccount,
    # system:serviceaccount:<tekton_namespace>:tekton-pipelines-controller.
    tekton_controller_user: str = ""
    # Tekton's resolvers namespace: its cluster resolver's rules (cluster-resolver-config,
    # resolvers-feature-flags), which `resolver: cluster` references admission follows obey.
    tekton_resolvers_namespace: str = "tekton-pipelines-resolvers"

    # A queued PipelineRun carrying tekton-kueue's LocalQueue label with no Kueue Workload this long after it
    # was queued gets a Warning Event, KueueWorkloadMissing (docs/coexistence.md).
    kueue_workload_wait_seconds: float = Field(default=60.0, gt=0)

    # Level-based reconcile: a full pass at least this often, whatever the events.
    resync_seconds: float = 30.0
    # API client: per-request timeout and the watch's server-side timeout.
    request_timeout_seconds: float = 10.0
    watch_timeout_seconds: int = 300

    log_format: Literal["json", "text"] = "json"
    log_level: str = "INFO"

    @field_validator("intruder_budget_grace_seconds", mode="before")
    @classmethod
    def _never_is_none(cls, value: object) -> object:
        """`never` (or an empty variable) for None: no grace, budgets honoured for ever."""
        return None if isinstance(value, str) and value.strip().lower() in ("", "never") else value

    @model_validator(mode="after")
    def _both_certificate_files_or_none(self) -> "Settings":
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError(
                f"set both {env_name('tls_cert_file')} and {env_name('tls_key_file')} (a certificate kept by "
                "cert-manager), or neither"
            )
        return self

    @model_validator(mode="after")
    def _one_prometheus_auth(self) -> "Settings":
        if self.prometheus_token_file and (self.prometheus_username or self.prometheus_password_file):
            raise ValueError(
                f"set {env_name('prometheus_token_file')} (a bearer token) or {env_name('prometheus_username')} and "
                f"{env_name('prometheus_password_file')} (basic auth), not both"
            )
        if bool(self.prometheus_username) != bool(self.prometheus_password_file):
            raise ValueError(f"basic auth to Prometheus needs both {env_name('prometheus_username')} and {env_name('prometheus_password_file')}")
        return self


def env_name(field: str) -> str:
    """The environment variable of a settings field."""
    return ENV_PREFIX + field.upper()


# A webhook at one endpoint (one replica; the chart with `replicas: 1`, the local cluster without a proxy, the
# admission benchmark's server) recycles no connections: a recycle re-picks a replica behind a Service, and with
# one there is nothing to pick, while the API server's next call waits for a TLS handshake.
ONE_ENDPOINT: dict[str, Any] = {"webhook_connection_max_requests": 0, "webhook_connection_max_seconds": 0}


def load_settings(overrides: Mapping[str, Any] | None = None, options: Mapping[str, str] | None = None) -> Settings:
    """The settings from EGRESS_PLACER_* variables and `overrides` (fields given on a command line,
    named by `options`: field -> option); SettingsError, in one line naming what is wrong, when invalid."""
    overrides = dict(overrides or {})
    names = {**{f: env_name(f) for f in Settings.model_fields}, **(options or {})}
    try:
        return Settings(**overrides)
    except ValidationError as e:
        problems = []
        for error in e.errors(include_url=False):
            loc = error.get("loc") or ()
            message = str(error.get("msg", "")).removeprefix("Value error, ")
            if loc and str(loc[0]) in names:
                field = str(loc[0])
                shown = overrides[field] if field in overrides else error.get("input")
                problems.append(f"{names[field]}={shown!s}: {message}" if shown is not None else f"{names[field]}: {message}")
            else:
                problems.append(message)
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
    except SourceError as e:  # a list or a map that is not JSON, before validation
        found = re.search(r'field "([a-z_]+)"', str(e))
        name = names.get(found.group(1), found.group(1)) if found else "an EGRESS_PLACER_* variable"
        raise SettingsError(f"invalid settings: {name}: not valid JSON (lists are written as JSON)") from None
