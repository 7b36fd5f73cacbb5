"""Tekton's own webhook (defaulting, validation, CRD conversion) as one of the cluster's processes.

An optional part of `up` (`python -m devcluster up --with tekton-webhook`, and the pytest plugin's
session cluster): built by `build.ensure_optional("tekton-webhook")` into a cache key of its own.

knative's webhook reconcilers insist on a `clientConfig.service`, and there is no kube-proxy here.
The API server resolves a Service of type ExternalName by dialing `https://<externalName>:<port of
the webhook's service reference>` and still checks the certificate against `<name>.<namespace>.svc`
(k8s.io/apiserver `pkg/util/proxy`, `ResolveCluster`). So:

- Service `tekton-pipelines-webhook` is an ExternalName `localhost`;
- Tekton's three webhook configurations (`config/500-webhooks.yaml` of the pinned module) and every
  Tekton CRD's `spec.conversion.webhook.clientConfig` name that service with the webhook's loopback
  port, before the webhook starts (knative keeps the service and port, and fills the rules, the
  path and the `caBundle` from the certificate it writes into Secret `webhook-certs`);
- the webhook listens on 127.0.0.1:PORT only (see tools/tekton-webhook/webhook/main.go).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

NAME = "tekton-webhook"  # the optional component, the `--with` value and the process name
SERVICE_NAME = "tekton-pipelines-webhook"
SECRET_NAME = "webhook-certs"
ADMISSION_CONTROLLER_NAME = "webhook.pipeline.tekton.dev"
CONVERSION_PATH = "/resource-conversion"
WEBHOOKS_FILE = "config/500-webhooks.yaml"  # of the pinned Tekton module, copied by the build
# The configurations knative fills once it runs: kind -> name.
CONFIGURATIONS = {
    "MutatingWebhookConfiguration": (ADMISSION_CONTROLLER_NAME,),
    "ValidatingWebhookConfiguration": (f"validation.{ADMISSION_CONTROLLER_NAME}", f"config.{ADMISSION_CONTROLLER_NAME}"),
}
PORTS = ("tekton-webhook", "tekton-webhook-probes", "tekton-webhook-metrics")


def service_manifest(namespace: str) -> dict[str, Any]:
    """The webhook's Service: an ExternalName `localhost`, so the API server dials loopback."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE_NAME, "namespace": namespace},
        "spec": {"type": "ExternalName", "externalName": "localhost"},
    }


def registration(webhooks_yaml: str, namespace: str, port: int) -> list[dict[str, Any]]:
    """The Service, then Tekton's Secret and webhook configurations with `port` on every service reference."""
    docs = [doc for doc in yaml.safe_load_all(webhooks_yaml) if doc]
    for doc in docs:
        for webhook in doc.get("webhooks", []):
            service = webhook["clientConfig"]["service"]
            if (service["name"], service["namespace"]) != (SERVICE_NAME, namespace):
                raise ValueError(f"{doc['metadata']['name']}: unexpected service {service}")
            service["port"] = port
    return [service_manifest(namespace), *docs]


def with_conversion_webhook(crd: dict[str, Any], namespace: str, port: int) -> dict[str, Any]:
    """A CRD whose versions are all served, converted by Tekton's webhook on loopback `port`.

    Tekton's CRDs declare `strategy: Webhook` with the service but no port; the port is added here
    (before the webhook runs, as knative only fills in the path and caBundle)."""
    crd = copy.deepcopy(crd)
    conversion = crd["spec"].get("conversion") or {}
    if conversion.get("strategy") != "Webhook":
        return crd
    webhook = conversion.setdefault("webhook", {})
    webhook.setdefault("conversionReviewVersions", ["v1"])
    webhook["clientConfig"] = {
        "service": {"name": SERVICE_NAME, "namespace": namespace, "path": CONVERSION_PATH, "port": port},
    }
    return crd


def command_env(namespace: str, ports: Mapping[str, int]) -> dict[str, str]:
    """The environment of upstream's config/webhook.yaml, with loopback ports."""
    return {
        "SYSTEM_NAMESPACE": namespace,
        "KUBERNETES_MIN_VERSION": "v1.28.0",
        "CONFIG_LOGGING_NAME": "config-logging",
        "CONFIG_OBSERVABILITY_NAME": "config-observability",
        "CONFIG_LEADERELECTION_NAME": "config-leader-election-webhook",
        "CONFIG_FEATURE_FLAGS_NAME": "feature-flags",
        "WEBHOOK_PORT": str(ports["tekton-webhook"]),
        "PROBES_ADDRESS": f"127.0.0.1:{ports['tekton-webhook-probes']}",
        "WEBHOOK_ADMISSION_CONTROLLER_NAME": ADMISSION_CONTROLLER_NAME,
        "WEBHOOK_SERVICE_NAME": SERVICE_NAME,
        "WEBHOOK_SECRET_NAME": SECRET_NAME,
        "METRICS_DOMAIN": "tekton.dev/pipeline",
        # As for the controller: knative binds the profiling server to ":PORT"; 0 = an ephemeral
        # port, answering 404 unless runtime-profiling is enabled in config-observability.
        "PROFILING_PORT": "0",
        "METRICS_PROMETHEUS_HOST": "127.0.0.1",
        "METRICS_PROMETHEUS_PORT": str(ports["tekton-webhook-metrics"]),
    }


def command_argv(bin_dir: Path, kubeconfig: Path) -> list[str]:
    return [str(bin_dir / NAME), f"-kubeconfig={kubeconfig}", "-disable-ha"]


def configuration_ready(configuration: Mapping[str, Any] | None) -> bool:
    """knative has filled this webhook configuration: every webhook has rules, a path and a caBundle."""
    webhooks = (configuration or {}).get("webhooks") or []
    return bool(webhooks) and all(
        w.get("rules")
        and w["clientConfig"].get("caBundle")
        and w["clientConfig"].get("service", {}).get("path")
        for w in webhooks
    )


def conversion_ready(crd: Mapping[str, Any] | None) -> bool:
    """The CRD converts through the webhook with the caBundle knative wrote (or needs no conversion)."""
    conversion = ((crd or {}).get("spec") or {}).get("conversion") or {}
    if conversion.get("strategy") != "Webhook":
        return crd is not None
    return bool(conversion.get("webhook", {}).get("clientConfig", {}).get("caBundle"))


def configuration_paths() -> Iterable[str]:
    """API paths of the three webhook configurations."""
    base = "/apis/admissionregistration.k8s.io/v1"
    for kind, names in CONFIGURATIONS.items():
        plural = "mutatingwebhookconfigurations" if kind.startswith("Mutating") else "validatingwebhookconfigurations"
        for name in names:
            yield f"{base}/{plural}/{name}"
