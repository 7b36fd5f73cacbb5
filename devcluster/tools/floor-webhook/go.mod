// The end-to-end floor of the benchmarks (an optional devcluster component: `--with floor-webhook`):
// a no-op mutating admission webhook on the standard library alone.
module egress-placer/devcluster/tools/floor-webhook

go 1.26.0
