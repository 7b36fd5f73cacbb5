"""Section 2: the decision core in-process, for pools of 10, 100 and 1,000 nodes.

`decisions_per_s`: the pure core for TaskRuns the policy places: images (`taskrun_images`),
`decide`, the pool's eligible nodes and their loads, `choose_node` (the placement assumed in a
`LoadLedger`), `unplace` + `place` on the podTemplate, and the JSON patch.
`handler_reviews_per_s`: `Admission.review` on the admission benchmark's request mix (TaskRuns and
their pods, half placed), JSON decoding and encoding included: everything the HTTPS server does
per request except HTTP and TLS. The pool also has 100 ordinary nodes and 5 running pods per node.
Each figure is the best of 5 short runs (the least disturbed by the rest of the machine).
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from controller.admission.handlers import Admission
from controller.core.balance import LoadLedger, choose_node, eligible_nodes, ledger_key
from controller.core.decide import decide
from controller.core.images import taskrun_images
from controller.core.patches import json_patch, place, unplace
from controller.metrics import Metrics
from controller.settings import Settings
from controller.state import ClusterState

from bench import profiling
from bench.sizes import Sizes
from bench.workload import NoEvents, admission_policy, catalog_tasks, fill, inventory, request_mix, taskrun

ORDINARY_NODES = 100
PODS_PER_NODE = 5
RUNS = 128
REPEATS = 5
Log = Callable[[str], None]


def _best_rate(step: Callable[[int], None], seconds: float, repeats: int = REPEATS) -> float:
    """Calls of step(i) per second: the best of `repeats` runs of seconds/repeats each (the run the
    rest of the machine disturbed least)."""
    best, i = 0.0, 0
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        deadline = start + seconds / repeats
        while True:
            for _ in range(20):
                step(i)
                i += 1
                count += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, count / (now - start))
    return best


def measure(pool_nodes: int, seconds: float) -> tuple[dict[str, Any], Callable[[], None]]:
    policy = admission_policy()
    state = ClusterState(policy, clock=time.time)
    fill(state.apply, inventory(pool_nodes, ORDINARY_NODES, PODS_PER_NODE))
    admission = Admission(state, Metrics(), NoEvents(), Settings())

    # The pure core on placed TaskRuns.
    runs = []
    for task in catalog_tasks():
        run = taskrun(task, "team-1", f"{task['metadata']['name']}-1")
        images = taskrun_images(run, state.tekton)
        if images.complete and decide(policy, state.namespace("team-1"), {}, images).placed:
            runs.append(run)
    nodes = list(state.nodes.values())
    pool = policy.pools[0]
    placed = state.placed_counts([n.name for n in eligible_nodes(pool, policy, nodes)])
    namespace = state.namespace("team-1")
    ledger = LoadLedger()
    now = time.time()

    def decision(i: int) -> None:
        run = runs[i % len(runs)]
        decided = decide(policy, namespace, run["metadata"]["annotations"], taskrun_images(run, state.tekton))
        target = policy.pool(decided.pool or "")
        assert target is not None
        members = eligible_nodes(target, policy, nodes)
        name = f"{run['metadata']['name']}-{i % RUNS}"
        node = choose_node(members, ledger.loads(members, placed, target.capacity), salt=name)
        assert node is not None
        ledger.assume(ledger_key("taskrun", "team-1", name), target.name, node, now)
        template = place(unplace(None, policy, keep_pool=target.name), target, node)
        json_patch({}, template, "/spec/podTemplate")

    decisions_per_s = _best_rate(decision, seconds)

    # The whole handler, JSON in and out, on the request mix.
    bodies = request_mix(admission.review, RUNS // 2).bodies

    def handle(i: int) -> None:
        json.dumps(admission.review(json.loads(bodies[i % len(bodies)])))

    reviews_per_s = _best_rate(handle, seconds)
    row = {
        "pool_nodes": pool_nodes,
        "decisions_per_s": round(decisions_per_s),
        "decision_us": round(1e6 / decisions_per_s, 1),
        "handler_reviews_per_s": round(reviews_per_s),
        "handler_us": round(1e6 / reviews_per_s, 1),
    }
    return row, lambda: [handle(i) for i in range(2000)]


def run(sizes: Sizes, log: Log) -> dict[str, Any]:
    rows = []
    profile_work: Callable[[], None] | None = None
    for pool_nodes in sizes.core_pool_nodes:
        row, profile_work = measure(pool_nodes, sizes.core_seconds)
        rows.append(row)
        log(f"core: {pool_nodes:>5} pool nodes  {row['decisions_per_s']:>7} decisions/s  "
            f"{row['handler_reviews_per_s']:>6} reviews/s (handler)")
    largest = max(sizes.core_pool_nodes)
    profile = {"tool": "cProfile", "load": f"Admission.review, {largest} pool nodes", **profiling.cprofile(profile_work)} \
        if profile_work else None
    return {"rows": rows, "profile": profile}
