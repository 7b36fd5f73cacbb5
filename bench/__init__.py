"""egress-placer benchmarks: `python -m bench --mode quick|full` (see bench/README.md).

Every figure is measured side by side with its baseline in ONE run (absolute times drift between
runs and machines; ratios hold): the admission server against a no-work aiohttp server on the same
TLS, the controller's balance against the scheduler alone, end-to-end latency with and without the
webhook registered.
"""
