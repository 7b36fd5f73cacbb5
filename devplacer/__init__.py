"""egress-placer on the local cluster (`devcluster/` is the launcher; this is the product on it).

- `local_placer`: egress-placer started the way it runs in a cluster (k8s/ manifests, its ServiceAccount,
  webhook registered), as recorded processes of the cluster; `python -m devcluster controller`.
- `commands`: the launcher's `controller` and `demo` commands, found through entry points.
- `demo`: the main job (`make demo`, `python -m devcluster demo`).
- `webhook_proxy`: a round-robin TCP proxy in front of several replicas (what a Service does).
- `faults`: kill a recorded component and start it again (the reliability suite).
- `egress_exporter`: fake node_exporters whose transmit rate a test sets (egress-load tests, benchmark).
"""
