"""The worst inputs a tenant can give the image discovery, and what admitting them costs.

    python -m bench.hostile            # one line per input: manifest size, result, seconds, peak memory

Each input is admitted by `Admission.review` (the webhook's handler, in memory, no cluster; the body
already parsed, as the server hands it over) in a
child process of its own, so that its peak resident memory is its own: the figure is the growth of
the child's peak RSS (`ru_maxrss`) over what it had after building the review. The builders are
also used by the tests (tests/unit/test_images_bounds.py, tests/reliability/test_hostile_input.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import time
import uuid
from typing import Any, Callable

MATCHING_PREFIX = "registry.example.com/cdn-"  # matches the pools' `*/cdn-*` of the tests and benches


def doubling_taskrun(name: str, levels: int, seed: int = 64, namespace: str = "team-cdn") -> dict[str, Any]:
    """A TaskRun whose Task params each default to the previous one twice: the step's image is
    `MATCHING_PREFIX` + `seed * 2**levels` characters, from a manifest of about 1 KB + 50 bytes a level.
    Tekton's controller builds that string too (replacementsFromDefaultParams, second pass)."""
    params = [{"name": "p0", "default": "a" * seed}]
    params += [{"name": f"p{i}", "default": f"$(params.p{i - 1})$(params.p{i - 1})"} for i in range(1, levels + 1)]
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "TaskRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "taskSpec": {
                "params": params,
                "steps": [{"name": "upload", "image": f"{MATCHING_PREFIX}$(params.p{levels})", "script": "true"}],
            }
        },
    }


def doubling_image_chars(levels: int, seed: int = 64) -> int:
    return len(MATCHING_PREFIX) + seed * 2**levels


def matrix_bomb_pipelinerun(name: str, params: int, values: int, namespace: str = "team-cdn") -> dict[str, Any]:
    """A PipelineRun with one matrix task of `params` params of `values` values each (`values ** params`
    combinations), every one of them used in the step's image."""
    matrix = [{"name": f"m{i}", "value": [f"v{j}" for j in range(values)]} for i in range(params)]
    image = MATCHING_PREFIX + "".join(f"$(params.m{i})" for i in range(params))
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "pipelineSpec": {
                "tasks": [{
                    "name": "bomb",
                    "matrix": {"params": matrix},
                    "taskSpec": {
                        "params": [{"name": f"m{i}"} for i in range(params)],
                        "steps": [{"name": "upload", "image": image, "script": "true"}],
                    },
                }]
            }
        },
    }


def chain_taskrun(name: str, params: int, namespace: str = "team-cdn") -> dict[str, Any]:
    """A TaskRun of `params` params, each default referring to the next one declared (the last is a
    plain value): a long chain, declared backwards."""
    specs = [{"name": f"c{i}", "default": f"$(params.c{i + 1})"} for i in range(params - 1)]
    specs.append({"name": f"c{params - 1}", "default": "x"})
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "TaskRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"taskSpec": {"params": specs, "steps": [{"name": "s", "image": f"{MATCHING_PREFIX}$(params.c0)"}]}},
    }


def steps_taskrun(name: str, steps: int, namespace: str = "team-cdn") -> dict[str, Any]:
    """A TaskRun of `steps` steps, each with an image of its own."""
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "TaskRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"taskSpec": {"steps": [{"name": f"s{i}", "image": f"{MATCHING_PREFIX}{i}"} for i in range(steps)]}},
    }


def tall_pipelinerun(name: str, tasks: int, steps: int, namespace: str = "team-cdn") -> dict[str, Any]:
    """A PipelineRun of `tasks` embedded tasks of `steps` steps each, every image its own."""
    def task_steps(j: int) -> list[dict[str, str]]:
        return [{"name": f"s{i}", "image": f"{MATCHING_PREFIX}{j}-{i}"} for i in range(steps)]

    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"pipelineSpec": {"tasks": [{"name": f"t{j}", "taskSpec": {"steps": task_steps(j)}} for j in range(tasks)]}},
    }


def wide_task(task_params: int, namespace: str = "team-cdn") -> dict[str, Any]:
    """A Task of `task_params` params, each default referring to the pipeline param `base`."""
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "Task",
        "metadata": {"name": "wide", "namespace": namespace},
        "spec": {
            "params": [{"name": f"t{i}", "default": "$(params.base)"} for i in range(task_params)],
            "steps": [{"name": "s", "image": f"{MATCHING_PREFIX}$(params.t0)"}],
        },
    }


def wide_pipelinerun(name: str, tasks: int, namespace: str = "team-cdn") -> dict[str, Any]:
    """A PipelineRun of `tasks` pipeline tasks, each referring to the Task `wide_task` (kept in the
    cluster, so the review stays small): every pipeline task substitutes every param of that Task."""
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "params": [{"name": "base", "value": "b" * 100}],
            "pipelineSpec": {"tasks": [{"name": f"t{i}", "taskRef": {"name": "wide"}} for i in range(tasks)]},
        },
    }


def admission_review(obj: dict[str, Any]) -> dict[str, Any]:
    group, version = obj["apiVersion"].split("/")
    kind = obj["kind"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
            "operation": "CREATE",
            "namespace": obj["metadata"]["namespace"],
            "userInfo": {"username": "tenant"},
            "object": obj,
            "dryRun": True,
        },
    }


# name -> builder of the run; the sizes are the largest the measurements below report
CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "doubling, 16 levels (4 MiB image in Tekton)": lambda: doubling_taskrun("doubling-16", 16),
    "doubling, 20 levels (64 MiB image in Tekton)": lambda: doubling_taskrun("doubling-20", 20),
    "matrix bomb, 4 params x 64 values (16.8 M combinations)": lambda: matrix_bomb_pipelinerun("bomb", 4, 64),
    "chain of 60,000 defaults declared backwards": lambda: chain_taskrun("chain", 60_000),
    "48,000 steps, an image each": lambda: steps_taskrun("steps", 48_000),
    "1,024 pipeline tasks x 40 steps": lambda: tall_pipelinerun("tall", 1024, 40),
    "1,000 pipeline tasks x a Task of 20,000 params": lambda: wide_pipelinerun("wide", 1_000),
}
# The largest of these reviews (each under the API server's 3 MiB limit), for the tests.
LARGEST = ("chain of 60,000 defaults declared backwards", "48,000 steps, an image each", "1,024 pipeline tasks x 40 steps")
WIDE_TASK_PARAMS = 20_000

POLICY = """\
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress-placer.io/pool: overseas}
    images: ["*/cdn-*"]
    namespaces: ["team-cdn"]
"""


def _measure(name: str, queue: Any) -> None:
    from controller.admission.handlers import Admission
    from controller.core.policy import load_policy
    from controller.metrics import Metrics
    from controller.settings import Settings
    from controller.state import ClusterState

    from loguru import logger

    from bench.workload import NoEvents

    logger.remove()
    state = ClusterState(load_policy(POLICY, "bench.hostile policy"), clock=time.time)
    state.apply("Namespace", "ADDED", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-cdn"}})
    state.apply("Node", "ADDED", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "egress-1", "labels": {"egress-placer.io/pool": "overseas"}}, "status": {"allocatable": {"pods": "110"}}})
    state.apply("Task", "ADDED", wide_task(WIDE_TASK_PARAMS))
    admission = Admission(state, Metrics(), NoEvents(), Settings())
    obj = CASES[name]()
    body = json.loads(json.dumps(admission_review(obj)))
    size = len(json.dumps(obj))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        result = _decisions(admission.review(body))
    except BaseException as error:  # noqa: BLE001 - the figure is what happened, whatever it was
        result = f"{type(error).__name__}: {str(error)[:120]}"
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put({"case": name, "manifest_bytes": size, "seconds": round(seconds, 4), "cpu_seconds": round(cpu_seconds, 4),
               "peak_rss_growth_mib": round((peak - before) / 1024, 1), "result": result})


def _decisions(answer: dict[str, Any]) -> str:
    """The decision annotation(s) the patch writes, shortened."""
    import base64

    patch = json.loads(base64.b64decode(answer["response"]["patch"])) if "patch" in answer["response"] else []
    notes = []
    for op in patch:
        value = op.get("value")
        if isinstance(value, dict) and "egress-placer.io/decision" in value:
            value = value["egress-placer.io/decision"]
        elif not op["path"].endswith("egress-placer.io~1decision"):
            continue
        record = json.loads(value)
        if "tasks" in record:  # a PipelineRun: its tasks' reasons, counted
            reasons: dict[str, int] = {}
            for task in record["tasks"].values():
                reasons[task["reason"]] = reasons.get(task["reason"], 0) + 1
            notes.append("tasks: " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())))
        else:
            notes.append(f"{record.get('reason')}: {'; '.join(record.get('unresolved', []))[:160]}")
    return " | ".join(notes) or "no decision written"


def measure(name: str, timeout: float) -> dict[str, Any]:
    """`name` admitted in a child process; a child still busy after `timeout` s is killed and reported."""
    size = len(json.dumps(CASES[name]()))
    queue: Any = multiprocessing.Queue()
    child = multiprocessing.Process(target=_measure, args=(name, queue))
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        return {"case": name, "manifest_bytes": size, "seconds": None, "result": f"still running after {timeout:.0f} s, killed"}
    if child.exitcode != 0:
        return {"case": name, "manifest_bytes": size, "seconds": None, "result": f"the child died (exit {child.exitcode})"}
    return queue.get()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a case is killed")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    for name in CASES:
        row = measure(name, args.timeout)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            seconds = "-" if row["seconds"] is None else f"{row['seconds'] * 1000:.0f} ms ({row['cpu_seconds'] * 1000:.0f} ms CPU)"
            print(f"{name}: {row.get('manifest_bytes', '?')} B, {seconds}, peak RSS +{row.get('peak_rss_growth_mib', '?')} MiB; "
                  f"{row['result']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
