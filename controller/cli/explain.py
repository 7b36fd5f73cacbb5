"""`egress-placer explain`: what the admission webhook would decide for the runs and pods in manifest files.

The policy is a PlacementPolicy file or EgressPool and EgressPlacerConfig objects (one or many YAML
documents, as `kubectl get egresspools -o yaml` writes them too), read with no cluster.

Every YAML document of every manifest is read first (and must be understood); Namespaces, Tasks,
StepActions and Pipelines among them are context, and so are Tekton's `cluster-resolver-config` and
`resolvers-feature-flags` ConfigMaps (the rules of `resolver: cluster` references; as Tekton ships them
when not given). Then each TaskRun, each pipeline task (and finally
task) of a PipelineRun and each Tekton pod gives one JSON line, in input order, built by the same core
functions admission uses: `taskrun_images` / `pipelinerun_images` / `pod_images`, then `decide`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, TextIO

import yaml

from controller.budgets.core import RunFacts, explained, string_params, taskrun_facts
from controller.core import cluster_resolver
from controller.core.decide import decide
from controller.core.images import (
    WHOLE_RUN,
    is_tekton_pod,
    pipeline_spec,
    pipelinerun_images,
    pod_images,
    resolve,
    taskrun_images,
)
from controller.tekton.core import TektonObjects
from controller.core.model import Decision, ImageSet, NamespaceState, Reason
from controller.suggest.core import MeasuredSet, measured_matches, pod_group, sets_from_status, taskrun_group
from controller.core.policy import PlacementPolicy, PolicyError, yaml_problem
from controller.core.pools import load_any_policy

STDIN = "-"  # a path that means standard input

class ManifestError(ValueError):
    """A manifest cannot be read. The message names the file, the document and the line."""


@dataclass(frozen=True)
class Document:
    source: str
    index: int  # 1-based position of the YAML document in its file
    line: int  # 1-based line where the object starts
    obj: Mapping[str, Any]


def read_documents(text: str, source: str) -> list[Document]:
    """The Kubernetes objects of a multi-document YAML text (`kind: List` items spread out)."""
    documents: list[Document] = []
    loader = yaml.SafeLoader(text)
    index = 0
    try:
        while True:
            index += 1  # the document being read, so that an error names it
            if not loader.check_node():
                break
            node = loader.get_node()
            obj = loader.construct_document(node)
            if obj is None:
                continue
            documents.extend(_objects(obj, node, source, index))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f" (line {mark.line + 1})" if mark else ""
        raise ManifestError(f"{source}: document {index}{line}: invalid YAML: {yaml_problem(e)}") from None
    finally:
        loader.dispose()
    return documents


def _objects(obj: Any, node: yaml.Node, source: str, index: int) -> Iterator[Document]:
    where = f"{source}: document {index} (line {node.start_mark.line + 1})"
    _check_object(obj, where)
    if obj["kind"] != "List":
        yield Document(source, index, node.start_mark.line + 1, obj)
        return
    items = obj.get("items") or []
    if not isinstance(items, list):
        raise ManifestError(f"{where}: the items of a List must be a list")
    item_nodes = next((v.value for k, v in node.value if k.value == "items" and isinstance(v, yaml.SequenceNode)), [])
    for i, item in enumerate(items):
        line = item_nodes[i].start_mark.line + 1 if i < len(item_nodes) else node.start_mark.line + 1
        _check_object(item, f"{source}: document {index} (line {line}): items[{i}]")
        yield Document(source, index, line, item)


def _check_object(obj: Any, where: str) -> None:
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}: expected a Kubernetes object (a mapping), got {type(obj).__name__}")
    if not isinstance(obj.get("kind"), str) or not obj["kind"]:
        raise ManifestError(f"{where}: the object has no kind")
    if obj.get("metadata") is not None and not isinstance(obj["metadata"], dict):
        raise ManifestError(f"{where}: metadata must be a mapping")


def not_a_run(documents: Sequence[Document]) -> str | None:
    """None when a document is a TaskRun, a PipelineRun or a Tekton pod; else why there is nothing to
    explain (naming what was found: a Deployment, a Pod that is no Tekton pod...). Other objects next to
    runs are context or ignored, as before."""
    if any(doc.obj["kind"] in ("TaskRun", "PipelineRun") or (doc.obj["kind"] == "Pod" and is_tekton_pod(doc.obj)) for doc in documents):
        return None
    found = [
        f"{'a non-Tekton ' if doc.obj['kind'] == 'Pod' else 'a '}{doc.obj['kind']} ({doc.source}: document {doc.index}, line {doc.line})"
        for doc in documents
    ]
    what = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "") if found else "no object"
    return f"nothing to explain: found {what}; explain reads TaskRuns, PipelineRuns and Tekton pods (and their context)"


def explain_documents(
    policy: PlacementPolicy, documents: Sequence[Document], measured: Mapping[str, MeasuredSet] | None = None
) -> list[dict[str, Any]]:
    """One result per TaskRun, pipeline task and Tekton pod, in input order (context read first).
    `measured`: the pools' measured sets (a pool's `history` rule), by pool: a TaskRun or pod whose Task is
    in one is decided as admission decides it; a PipelineRun's tasks are not (their TaskRuns are)."""
    measured = measured or {}
    objects = TektonObjects(cluster_resolver.TEKTON_DEFAULTS)
    namespaces: dict[str, NamespaceState] = {}
    for doc in documents:
        kind, meta = doc.obj["kind"], doc.obj.get("metadata") or {}
        if kind in TektonObjects.KINDS:
            objects.put(doc.obj)
        elif kind == "ConfigMap" and meta.get("name") == cluster_resolver.CONFIG_MAP:
            objects.cluster_resolver = objects.cluster_resolver.with_settings(cluster_resolver.config_map_data(doc.obj))
        elif kind == "ConfigMap" and meta.get("name") == cluster_resolver.FEATURE_FLAGS:
            objects.cluster_resolver = objects.cluster_resolver.with_flags(cluster_resolver.config_map_data(doc.obj))
        elif kind == "Namespace" and meta.get("name"):
            namespaces[str(meta["name"])] = NamespaceState.from_namespace(doc.obj)

    results: list[dict[str, Any]] = []
    for doc in documents:
        kind, meta = doc.obj["kind"], doc.obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or meta.get("generateName") or "")
        ns = namespaces.get(namespace) or NamespaceState(name=namespace)
        annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}

        def line(task: str | None, images: ImageSet) -> dict[str, Any]:
            key = None
            if kind == "TaskRun":
                key = taskrun_group(namespace, doc.obj)
            elif kind == "Pod":
                key = pod_group(namespace, meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {})
            matches = measured_matches(policy, key, measured) if measured else ()
            decision: Decision = decide(policy, ns, annotations, images, matches)
            out = {
                "kind": kind,
                "namespace": namespace,
                "name": name,
                "task": task,
                "pool": decision.pool,
                "reason": decision.reason.value,
                "images": list(decision.images),
            }
            if decision.reason is Reason.MEASURED:
                out["message"] = decision.message
            pool = policy.pool(decision.pool) if decision.pool else None
            if pool is not None and pool.destinations:  # the key only where the pool has destinations
                out["budgets"] = explained(pool.destinations, _facts(doc.obj, task, decision.images, objects))
            return out

        if kind == "TaskRun":
            results.append(line(None, taskrun_images(doc.obj, objects)))
        elif kind == "PipelineRun":
            for task, images in pipelinerun_images(doc.obj, objects):
                results.append(line(None if task == WHOLE_RUN else task, images))
        elif kind == "Pod" and is_tekton_pod(doc.obj):
            results.append(line(None, pod_images(doc.obj)))
    return results


def _measured(text: str, source: str) -> dict[str, MeasuredSet]:
    """The measured sets in the EgressPools' status (objects as `kubectl get egresspools -o yaml` gives them)."""
    try:
        return sets_from_status(doc.obj for doc in read_documents(text, source))
    except ManifestError:  # a policy file in another shape: no status, no set
        return {}


TASK_LABEL = "tekton.dev/task"  # on a Tekton pod: its Task's name (Tekton copies it from the TaskRun)


def _facts(obj: Mapping[str, Any], task: str | None, images: Sequence[str], objects: TektonObjects) -> RunFacts:
    """What a run shows for matching destinations (budgets.core.match): a TaskRun's Task name and params;
    a pipeline task's Task name and params (its `$(params.x)` resolved from the run's params and the
    Pipeline's defaults); a pod's Task label."""
    kind, meta = obj.get("kind"), obj.get("metadata") or {}
    if kind == "TaskRun":
        return taskrun_facts(obj, images)
    if kind == "Pod":
        labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
        name = labels.get(TASK_LABEL)
        return RunFacts(tuple(images), (name,) if isinstance(name, str) and name else ())
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    run_params = string_params(spec.get("params"))
    if isinstance(spec.get("pipelineSpec"), Mapping):
        pipeline = pipeline_spec(spec["pipelineSpec"])
    else:
        ref = spec.get("pipelineRef") if isinstance(spec.get("pipelineRef"), Mapping) else {}
        namespace = str(meta.get("namespace") or "default")
        pipeline = objects.pipeline(namespace, str(ref.get("name") or "")) if isinstance(ref.get("name"), str) else None
    found = next((t for t in (*pipeline.tasks, *pipeline.finally_tasks) if t.name == task), None) if pipeline else None
    if pipeline is None or found is None:
        return RunFacts(tuple(images), (), run_params)
    scope: dict[str, Any] = {p.name: p.default for p in pipeline.params if p.default is not None}
    scope.update(run_params)
    params = {k: v for k, raw in found.params.items() if isinstance(v := resolve(raw, scope), str)}
    tasks = (found.ref.name,) if found.ref is not None and found.ref.name else ()
    return RunFacts(tuple(images), tasks, params)


def run_explain(
    policy_path: str,
    manifest_paths: Sequence[str],
    out: TextIO,
    err: TextIO,
    output: str | None = None,
    stdin: TextIO | None = None,
) -> int:
    """Read everything, print one JSON line per result (`output` "json": one JSON list, "yaml": one YAML
    list). A path `-` is standard input (once). Exit status 0, or 2 (and nothing on `out`): an
    unreadable or invalid input, or input that is not a run."""
    errors: list[str] = []
    reader = _Reader(stdin if stdin is not None else sys.stdin)
    policy: PlacementPolicy | None = None
    measured: dict[str, MeasuredSet] = {}
    try:
        policy_text = reader.read(policy_path)
        policy = load_any_policy(policy_text, source=reader.name(policy_path))
        measured = _measured(policy_text, reader.name(policy_path))
    except (PolicyError, ManifestError) as e:
        errors.append(str(e))
    documents: list[Document] = []
    for path in manifest_paths:  # every file is checked, so that one run shows every broken file
        try:
            documents.extend(read_documents(reader.read(path), source=reader.name(path)))
        except ManifestError as e:
            errors.append(str(e))
    if not errors and (problem := not_a_run(documents)) is not None:
        errors.append(problem)
    if errors or policy is None:
        for error in errors:
            print(f"egress-placer explain: {error}", file=err)
        return 2
    results = explain_documents(policy, documents, measured)
    if output == "json":
        print(json.dumps(results, indent=2), file=out)
    elif output == "yaml":
        out.write(yaml.safe_dump(results, sort_keys=False))
    else:
        for result in results:
            print(json.dumps(result), file=out)
    return 0


class _Reader:
    """Files by path, and standard input for `-` (it can be read once)."""

    def __init__(self, stdin: TextIO) -> None:
        self.stdin = stdin
        self.stdin_read = False

    @staticmethod
    def name(path: str) -> str:
        return "(stdin)" if path == STDIN else path

    def read(self, path: str) -> str:
        if path != STDIN:
            return _read(path)
        if self.stdin_read:
            raise ManifestError("(stdin): standard input (-) can be given once")
        self.stdin_read = True
        try:
            return self.stdin.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ManifestError(f"(stdin): cannot read standard input: {e}") from None


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path}: cannot read the file: {e}") from None
