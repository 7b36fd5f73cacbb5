"""Controller settings: one typed object read from the environment (prefix EGRESS_PLACER_).

Validated at start and passed explicitly; tests build it with keyword arguments.
`config/settings.md` documents every field.
"""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EGRESS_PLACER_", extra="ignore")

    # Where the cluster is: a kubeconfig path, or in-cluster credentials when empty.
    kubeconfig: str | None = None
    # The controller's own namespace (Lease, TLS Secret, policy ConfigMap, Events about itself).
    namespace: str = "egress-placer"
    # Identity of this replica in the leader Lease.
    identity: str = Field(default_factory=socket.gethostname)

    # Policy: a file (reloaded when it changes) or, when no file is given, a ConfigMap key.
    policy_file: str | None = None
    policy_configmap: str = "egress-placer-policy"
    policy_key: str = "policy.yaml"

    # Admission webhook (HTTPS) and the plain HTTP port for /healthz, /readyz, /metrics.
    webhook_host: str = "0.0.0.0"
    webhook_port: int = 8443
    health_host: str = "0.0.0.0"
    health_port: int = 8080
    webhook_config_name: str = "egress-placer"
    # The serving certificate: made by the controller, kept in this Secret, renewed before it expires.
    tls_secret: str = "egress-placer-webhook-tls"
    tls_hosts: list[str] = ["egress-placer-webhook.egress-placer.svc", "127.0.0.1", "localhost"]
    tls_cert_days: int = 90
    tls_renew_before_days: int = 30
    # Or a certificate someone else keeps (cert-manager's Secret mounted into the pod): both files set.
    # The controller then loads them (again when they change) and writes neither Secret nor caBundle.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

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
            raise ValueError("set both tls_cert_file and tls_key_file (a certificate kept by cert-manager), or neither")
        return self
