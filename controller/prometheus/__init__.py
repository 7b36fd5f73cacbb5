"""The Prometheus adapter: measured egress of pool nodes (egress_source: instant queries over `requests`,
one poller per pool). It imports nothing of Kubernetes; it shares the adapters' one retry policy (controller.retry).
"""
