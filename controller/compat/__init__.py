"""What this cluster's Tekton and Kubernetes can do (issue #29): the features egress-placer turns off where
they cannot, and why (`core`: pure; its inputs come from the informer on Tekton's `pipelines-info` ConfigMap
and from the API server's discovery at start, `app` wires them)."""
