// The prometheus-operator CRDs (ServiceMonitor, PrometheusRule), an optional component of files only:
// the chart's e2e test installs them to have the API server check the chart's ServiceMonitor and
// PrometheusRule against their schemas. Nothing is built from this module.
module egress-placer/devcluster/tools/prometheus-operator

go 1.26.7

require github.com/prometheus-operator/prometheus-operator v0.85.0
