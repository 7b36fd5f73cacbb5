"""Tekton's own examples of the cluster's Tekton version, run with and without placement (issue #29, a cell of
`make matrix`): every example file is created in team-cdn, which pool `overseas` takes whole (images "*"), and in
team-other, which it does not. Each example must end the same in both (the runs the file creates: kind, name or
generateName, and their Succeeded condition's status and reason, or still running at the deadline), and every
bound Tekton pod of team-cdn is on the pool, none of team-other's. Placement changes where a run goes, never
how it ends.

KWOK ends every step with exit code 0 after the cluster's pod seconds; an example whose workspace needs a
volume provisioner, or a resolver that fetches from the network, does not end here, the same way in both
namespaces. Long (the examples in both namespaces at once: ~10-15 min on 2 cores), so it runs when
EGRESS_PLACER_MATRIX=1 (`python -m devplacer.matrix` sets it) and is skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from devcluster import build
from devcluster.cluster import Cluster
from tests.e2e.harness import ControllerSpec
from tests.e2e.tekton_runs import ORDINARY_NODES, POOL_NODES, TEAM_CDN, TEAM_OTHER
from tests.kube import Api, namespaced
from tests.waiting import WaitTimeout, wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("EGRESS_PLACER_MATRIX") != "1", reason="the matrix's differential (~15 min): EGRESS_PLACER_MATRIX=1 runs it"),
    pytest.mark.timeout(2400),  # creating the examples twice and waiting up to DEADLINE_SECONDS: past the suite's 900 s
]

POLICY = Path(__file__).resolve().parents[1] / "data" / "e2e" / "policy-everything.yaml"
CONTROLLER = ControllerSpec(policy=POLICY)
DEADLINE_SECONDS = 900.0
RUN_KINDS = {"TaskRun": "taskruns", "PipelineRun": "pipelineruns"}


def examples_of(cluster: Cluster) -> Path:
    """`examples/` of the Tekton module the cluster runs (its version in cluster.json)."""
    version = (cluster.state().get("versions") or {}).get("tekton")
    previous = os.environ.get(build.TEKTON_VERSION_ENV)
    if version:
        os.environ[build.TEKTON_VERSION_ENV] = version
    try:
        return build.tekton_module_dir() / "examples"
    finally:
        if previous is None:
            os.environ.pop(build.TEKTON_VERSION_ENV, None)
        else:
            os.environ[build.TEKTON_VERSION_ENV] = previous


def example_files(examples: Path) -> list[Path]:
    """Files with a TaskRun or PipelineRun and no document pinned to a namespace of its own."""
    out = []
    for path in sorted(examples.rglob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
        if any(d.get("kind") in RUN_KINDS for d in docs) and not any((d.get("metadata") or {}).get("namespace") for d in docs):
            out.append(path)
    return out


def create(cluster: Cluster, path: Path, namespace: str) -> list[tuple[str, str]]:
    """`kubectl create` of the file in `namespace` (a document refused is left out, in both namespaces alike);
    the (kind, name) of the runs made."""
    out = subprocess.run(
        [str(cluster.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig), "create", "-n", namespace, "-f", str(path), "-o", "name"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    made = []
    for line in out.stdout.split():
        resource, _, name = line.partition("/")
        kind = {"taskrun.tekton.dev": "TaskRun", "pipelinerun.tekton.dev": "PipelineRun"}.get(resource)
        if kind:
            made.append((kind, name))
    return made


def outcome(run: dict[str, Any] | None) -> tuple[str, str]:
    """(status, reason) of the Succeeded condition; ("Unknown", reason) while it runs; ("Gone", "") when deleted."""
    if run is None:
        return ("Gone", "")
    for condition in (run.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Succeeded":
            return (condition.get("status", "Unknown"), condition.get("reason", ""))
    return ("Unknown", "not started")


def key_of(run: dict[str, Any]) -> str:
    meta = run.get("metadata") or {}
    return meta.get("generateName") or meta.get("name", "")


@pytest.fixture(scope="module")
def created(api: Api, devcluster: Cluster, egress_placer: object) -> Iterator[dict[str, dict[str, list[tuple[str, str]]]]]:
    """Every example file created in both namespaces: {file: {namespace: [(kind, name)]}}."""
    files = example_files(examples_of(devcluster))
    assert len(files) >= 50, f"{len(files)} example files: the module's examples/ were not found whole"
    made = {str(p): {ns: create(devcluster, p, ns) for ns in (TEAM_CDN, TEAM_OTHER)} for p in files}
    yield made
    # The examples' PVCs carry `kubernetes.io/pvc-protection`, which no controller here removes (the devcluster runs no
    # pvc-protection controller): without this their namespaces would never finish deleting (seen: the first v1.9.2 run).
    for ns in (TEAM_CDN, TEAM_OTHER):
        for pvc in api.items(namespaced(ns, "persistentvolumeclaims")):
            if pvc["metadata"].get("finalizers"):
                api.json_patch(namespaced(ns, "persistentvolumeclaims", pvc["metadata"]["name"]), [{"op": "remove", "path": "/metadata/finalizers"}])


def runs_state(api: Api, made: dict[str, dict[str, list[tuple[str, str]]]]) -> dict[str, dict[str, Counter]]:
    """{file: {namespace: Counter((kind, name or generateName, outcome))}}, read from the cluster."""
    listed: dict[tuple[str, str, str], dict[str, Any]] = {}
    for namespace in (TEAM_CDN, TEAM_OTHER):
        for kind, plural in RUN_KINDS.items():
            for run in api.items(namespaced(namespace, plural, group="/apis/tekton.dev/v1")):
                listed[(namespace, kind, run["metadata"]["name"])] = run
    state: dict[str, dict[str, Counter]] = {}
    for path, by_namespace in made.items():
        state[path] = {}
        for namespace, runs in by_namespace.items():
            objs = [(kind, listed.get((namespace, kind, name))) for kind, name in runs]
            state[path][namespace] = Counter((kind, key_of(obj) if obj else name, *outcome(obj)) for (kind, obj), (_, name) in zip(objs, runs))
    return state


def all_ended(state: dict[str, dict[str, Counter]]) -> bool:
    return all(entry[2] != "Unknown" for by_ns in state.values() for counter in by_ns.values() for entry in counter)


def test_each_example_ends_the_same_with_and_without_the_pool(api: Api, created: dict) -> None:
    try:
        state = wait_for("every example run to end in both namespaces", lambda: (s := runs_state(api, created)) and all_ended(s) and s,
                         timeout=DEADLINE_SECONDS, interval=5)
    except WaitTimeout:
        state = runs_state(api, created)  # what has not ended by now must be as unended in the other namespace
    ran = sum(sum(c.values()) for by_ns in state.values() for c in by_ns.values())
    assert ran >= 100, f"only {ran} runs were created"
    different = {Path(path).name: {ns: sorted(c.elements()) for ns, c in by_ns.items()}
                 for path, by_ns in state.items() if by_ns[TEAM_CDN] != by_ns[TEAM_OTHER]}
    assert not different, f"{len(different)} example(s) end differently with the pool: {different}"


def test_every_placed_pod_is_on_the_pool_and_no_other(api: Api, created: dict) -> None:
    wait_for("the examples' pods to exist", lambda: api.items(namespaced(TEAM_CDN, "pods")), timeout=120)
    nodes = {ns: {p["metadata"]["name"]: (p.get("spec") or {}).get("nodeName") for p in api.items(namespaced(ns, "pods"))}
             for ns in (TEAM_CDN, TEAM_OTHER)}
    bound = {ns: {pod: node for pod, node in by_pod.items() if node} for ns, by_pod in nodes.items()}
    assert bound[TEAM_CDN] and bound[TEAM_OTHER]
    assert {pod: node for pod, node in bound[TEAM_CDN].items() if node not in POOL_NODES} == {}
    assert {pod: node for pod, node in bound[TEAM_OTHER].items() if node not in ORDINARY_NODES} == {}
