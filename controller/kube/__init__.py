"""The Kubernetes adapter: the only package that imports the `kubernetes` client.

client (the transport: raw JSON requests, one error classification), reader (the one retrying
call, reads), writer (every write, the one optimistic-concurrency loop, Events), informer (list +
watch into plain dicts), leader (Lease election), policy_source (the policy
from a ConfigMap or a file). Kubernetes only: Prometheus has its own adapter (controller.prometheus).
"""
