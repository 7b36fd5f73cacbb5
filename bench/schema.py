"""The shape of bench/results/latest.json: every key is always there (null when a section did not
run or failed). bench/README.md documents each key; `missing_keys` is what the test checks."""

from __future__ import annotations

import copy
from typing import Any

SCHEMA_VERSION = 1

# Keys of the rows of each list (the list itself may be empty when its section did not run).
ROWS: dict[str, tuple[str, ...]] = {
    "admission.closed_loop": ("target", "concurrency", "requests", "throughput_rps", "p50_ms", "p99_ms", "max_ms",
                              "errors", "send_lag_p99_ms", "server_cpu_ms_per_request", "p99_ms_each"),
    "admission.open_loop": ("target", "rate_rps", "requests", "throughput_rps", "p50_ms", "p99_ms", "max_ms",
                            "errors", "send_lag_p99_ms", "server_cpu_ms_per_request", "p99_ms_each"),
    "core.rows": ("pool_nodes", "decisions_per_s", "decision_us", "handler_reviews_per_s", "handler_us",
                  "rss_mb", "rss_peak_mb"),
    "balance.cases": ("case", "runs", "pool_nodes", "pods_per_node", "pods_outside_pool", "max_pods_on_a_node",
                      "even_share", "imbalance", "created_s", "scheduled_s", "preferred_node_honored"),
    "balance.replicas": ("replicas", "pool", "worst_ratio", "bound_ratio", "runs", "pool_nodes", "preloaded", "load_per_node",
                         "outside_pool", "pod_calls", "min_pod_call_share", "created_s", "admitted_s"),
    "targets": ("name", "target", "value", "unit", "met", "margin"),
}

# e2e.call_latency per hook: the API server's time per call to egress-placer over the floor's, bootstrap 95% interval.
CALL_LATENCY = {"ratio": None, "ci_low": None, "ci_high": None, "ms": None, "floor_ms": None, "ms_each": [],
                "floor_ms_each": [], "blocks": None, "floor_blocks": None}
E2E_MODE = {
    "runs": None, "p50_s": None, "p99_s": None, "mean_s": None, "webhook_answered": None,
    "stage_p50_ms": {"create": None, "to_pod": None, "to_bound": None},
    "cpu_ms_per_run": {},
}
EGRESS_PLACEMENT = {"pods_per_node": {}, "pods_outside_pool": None, "busy_node_pods": None, "busy_node_share": None,
                    "seconds_to_bind": None}
EGRESS_CASE = {
    "case": None, "burst": None, "pool_nodes": [], "busy_node": None, "busy_fraction": None, "idle_fraction": None,
    "bandwidth_bytes_per_second": None, "exporter_bytes_per_second": {}, "prometheus_bytes_per_second": {},
    "prometheus_start_seconds": None, "even_share": None,
    "egress_aware": copy.deepcopy(EGRESS_PLACEMENT), "run_counts_only": copy.deepcopy(EGRESS_PLACEMENT),
}
# peers: admission through the API server, one row per mode (bench/peers.py).
PEER_ADMISSION = {
    "requests": None, "p50_ms": None, "p99_ms": None, "max_ms": None, "errors": None, "mutated": None,
    "send_lag_p99_ms": None, "p99_ms_each": [], "cpu_ms_per_request": {}, "cores_at_rate": None,
}
PEER_ADDED = {"added_p50_ms": None, "added_p99_ms": None}
PEERS = {
    "admission": {
        "rate_rps": None, "seconds": None, "rounds": None, "p99_ratio_to_floor": None,
        "modes": {
            "none": copy.deepcopy(PEER_ADMISSION),
            "floor": {**copy.deepcopy(PEER_ADMISSION), **PEER_ADDED},
            "egress_placer": {**copy.deepcopy(PEER_ADMISSION), **PEER_ADDED},
            "kyverno": {**copy.deepcopy(PEER_ADMISSION), **PEER_ADDED},
        },
    },
    "kyverno": {
        "version": None, "start_s": None, "admission_p99_ms": None, "egress_placer_admission_p99_ms": None,
        "e2e_added_p50_ms": None, "egress_placer_e2e_added_p50_ms": None,
        "e2e": {**copy.deepcopy(E2E_MODE), "pods_in_pool": None},
        "rss_mb": None, "rss_at_scale_mb": None, "scale_nodes": None, "scale_pods": None, "scale_cpu_s": None,
        "cannot": [],
    },
}
PROFILE = {"tool": None, "load": None, "samples": None, "top_self": [], "top_inclusive": []}

TEMPLATE: dict[str, Any] = {
    "schema": SCHEMA_VERSION,
    "mode": None,
    "started": None,
    "duration_s": None,
    "machine": {
        "cpu_model": None, "cores": None, "memory_gb": None, "os": None, "python": None, "go": None,
        "kubernetes": None, "etcd": None, "kwok": None, "tekton": None, "aiohttp": None,
        "loadavg_start": None, "loadavg_end": None,
    },
    "admission": {
        "requests": {"bodies": None, "taskruns": None, "pods": None, "placed_fraction": None, "mean_body_bytes": None},
        "closed_loop": [],
        "open_loop": [],
        "headline": {
            "rate_rps": None, "runs": None, "p50_ms": None, "p99_ms": None, "floor_p50_ms": None, "floor_p99_ms": None,
            "p99_ratio": None, "p99_ms_each": [], "floor_p99_ms_each": [], "cpu_ms_per_request": None,
            "floor_cpu_ms_per_request": None,
            "pooled": {"p99_ms": None, "floor_p99_ms": None, "p99_ratio": None, "ci_low": None, "ci_high": None},
        },
        "sustained_rps": None,
        "floor_sustained_rps": None,
        "max_throughput_rps": None,
        "floor_max_throughput_rps": None,
        "profile": copy.deepcopy(PROFILE),
        # bench/admission.py:handler_cost: the handler in-process on the same mix, without HTTP and TLS.
        "handler": {"us_per_review": None, "us_per_review_each": [], "first_pass_us": None, "reviews": None,
                    "after_idle_us": {}},
        # bench/under_relist.py: p99 at 200 req/s while the pod informer relists, next to it idle.
        "under_relist": {
            "idle_p99_ms": None, "relist_p99_ms": None, "idle_p99_ms_each": [], "relist_p99_ms_each": [],
            "idle_p50_ms": None, "relist_p50_ms": None, "pods": None, "rate_rps": None, "seconds": None,
            "relists": None, "relist_s": None, "errors": None,
        },
        # bench/under_reconcile.py: p99 at 200 req/s while the leader reconciles 5,000 pool nodes (heartbeats and pod
        # restarts, each pass over the nodes that changed), next to it idle.
        "under_reconcile": {
            "idle_p99_ms": None, "busy_p99_ms": None, "idle_p99_ms_each": [], "busy_p99_ms_each": [],
            "idle_p50_ms": None, "busy_p50_ms": None, "nodes": None, "pods": None, "rate_rps": None, "seconds": None,
            "node_events_per_s": None, "pod_restarts_per_s": None, "passes": None, "pass_s": None, "errors": None,
            "lock": {"nodes": None, "pods": None, "passes": None, "pass_ms": None, "longest_hold_ms": None,
                     "longest_hold_ms_each": [], "holds_per_pass": None, "whole_pool_hold_ms": None,
                     "full_collection_ms": None, "frozen_full_collection_ms": None},
        },
    },
    "core": {"rows": [], "profile": copy.deepcopy(PROFILE)},
    "balance": {"cases": [], "worst_imbalance": {"a": None, "b": None, "c": None}, "egress": copy.deepcopy(EGRESS_CASE),
                "replicas": [], "replicas_worst_ratio": {"1": None, "2": None, "3": None}},
    "scale": {
        "nodes": None, "pods": None, "create_s": None, "create_per_s": None, "first_sync_s": None, "ready_s": None,
        "start_controller_s": None, "rss_mb": None, "rss_peak_mb": None, "rss_after_events_mb": None,
        "events": None, "baseline_load": None, "load_at_end": None, "api_write_s": None, "seen_after_s": None, "events_seen_per_s": None,
        "lag_after_last_write_s": None, "in_process_events_per_s": None, "state_mb": None, "rss_baseline_mb": None,
        "profile": copy.deepcopy(PROFILE),
        "first_sync_memory": {
            "nodes": None, "pods": None, "taskruns": None, "tenant_extra_mb": None, "met": None,
            "lean": {"tenant": None, "rss_before_mb": None, "rss_mb": None, "rss_peak_mb": None, "sync_s": None, "kept": {}},
            "tenant": {"tenant": None, "rss_before_mb": None, "rss_mb": None, "rss_peak_mb": None, "sync_s": None, "kept": {}},
        },
    },
    "e2e": {
        "with": copy.deepcopy(E2E_MODE),
        "without": copy.deepcopy(E2E_MODE),
        "floor": copy.deepcopy(E2E_MODE),
        "floor_patch": copy.deepcopy(E2E_MODE),  # the floor answering with a patch that changes nothing (bench/floor.py)
        "webhook_call_ms": {"taskruns": None, "pods": None},
        "handler_ms": {"taskruns": None, "pods": None},
        "floor_webhook_call_ms": {"taskruns": None, "pods": None},
        "patch_floor_webhook_call_ms": {"taskruns": None, "pods": None},
        "added_p50_ms": None,
        "p50_ratio": None,
        "p99_ratio": None,
        "floor_added_p50_ms": None,
        "floor_ratio": None,
        "floor_ratio_note": None,  # why floor_ratio is noisy: read call_latency
        "floor_call_ratio": None,
        "call_latency": {"taskrun": copy.deepcopy(CALL_LATENCY), "pod": copy.deepcopy(CALL_LATENCY)},
        # The same against the patching floor: what is egress-placer's own, the API server's patch apart.
        "call_latency_patch_floor": {"taskrun": copy.deepcopy(CALL_LATENCY), "pod": copy.deepcopy(CALL_LATENCY)},
        # Over the "with" blocks: the controller's reads of a pod's TaskRun ("owner_reads.found", ...) and its
        # webhook's connections ("webhook_connections.opened", ".recycled"), bench/e2e.py:controller_counts.
        "controller_counts": {},
    },
    "peers": copy.deepcopy(PEERS),
    # bench/queue.py: the queue's admission cost and a burst on a queued pool.
    "queue": {
        "admission_us": {"no_queue": None, "queued": {}},
        "burst": None, "slots": None, "run_seconds": None, "seconds": None, "succeeded": None,
        "max_running": None, "max_running_per_node": {}, "capacity_per_node": None,
        "release_latency_ms": {"p50": None, "p99": None, "samples": None},
        "timeline": [],
        # bench/queue.py:untouched: runs touching no destination, without and with egress budgets on the pool.
        "budgets_untouched": {
            "burst": None, "rounds": None, "within_interval": None, "not_slowed": None,
            "without": {"p50": None, "p99": None, "samples": None, "ci_low": None, "ci_high": None},
            "with": {"p50": None, "p99": None, "samples": None, "ci_low": None, "ci_high": None},
        },
    },
    "targets": [],
    "errors": [],
}


def empty() -> dict[str, Any]:
    return copy.deepcopy(TEMPLATE)


def merge(into: dict[str, Any], part: dict[str, Any]) -> None:
    """Fill `into` (a template section) with `part`, keeping template keys that `part` lacks."""
    for key, value in part.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and into[key]:
            merge(into[key], value)
        else:
            into[key] = value


def missing_keys(results: dict[str, Any], template: dict[str, Any] = TEMPLATE, prefix: str = "") -> list[str]:
    """Template keys absent from `results`, and row keys absent from any row, as dotted paths."""
    missing = []
    for key, value in template.items():
        path = f"{prefix}{key}"
        if key not in results:
            missing.append(path)
        elif isinstance(value, dict) and value and isinstance(results[key], dict):
            missing += missing_keys(results[key], value, path + ".")
        elif path in ROWS:
            for i, row in enumerate(results[key] or []):
                missing += [f"{path}[{i}].{k}" for k in ROWS[path] if k not in row]
    return missing


def documented_keys() -> set[str]:
    """Every key name README.md must document."""
    names: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        for key, value in node.items():
            names.add(key)
            if isinstance(value, dict):
                walk(value)

    walk(TEMPLATE)
    for keys in ROWS.values():
        names.update(keys)
    return names
