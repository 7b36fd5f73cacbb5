"""The Kubernetes adapter: the only package that imports the `kubernetes` client.

client (ApiClient, raw JSON requests), informer (list + watch into plain dicts), writer (every
write, one error classification, Events), leader (Lease election), policy_source (the policy
from a ConfigMap or a file). Kubernetes only: Prometheus has its own adapter (controller.prometheus).
"""
