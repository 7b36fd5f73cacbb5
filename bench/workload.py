"""Realistic inputs: cluster objects for the controller's state, TaskRuns and Tekton pods made from
the Tekton catalog (`shared/catalog` beside the repository, else the catalog Tasks in tests/data/tekton:
`bench.corpus`), and the AdmissionReview bodies the
API server would send for them.

TaskRuns reference catalog Tasks (required params filled, workspaces bound to emptyDirs). Their
pods are built the way Tekton builds them (step-* containers with the run's images, Tekton's init
containers and volumes, labels, annotations and owner reference copied from the run) and carry
the placement the TaskRun was admitted with, as Tekton copies the podTemplate into the pod.
"""

from __future__ import annotations

import base64
import copy
import json
import random
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping

import jsonpatch
import yaml

from bench.corpus import task_corpus_dir
from controller.core.images import taskrun_images
from controller.tekton.core import TektonObjects
from controller.core.model import DECISION_ANNOTATION
from controller.core.policy import PlacementPolicy, load_policy

TEKTON_RELEASE = "v1.15.0"
POOL_LABEL = "egress-placer.io/pool"
TAINT_KEY = "egress-placer.io/pool"
RUN_DURATION_ANNOTATION = "devcluster.egress-placer.io/run-duration"  # KWOK stage: how long the pod runs
ENTRYPOINT_IMAGE = f"ghcr.io/tektoncd/pipeline/entrypoint-bff0a22da108bc2f16c818c97641a296:{TEKTON_RELEASE}"
SHELL_IMAGE = "cgr.dev/chainguard/busybox@sha256:19f02276bf8dbdd62f069b922f10c65262cc34b710eea26ff928129a736be791"
TEKTON_CONTROLLER_USER = "system:serviceaccount:tekton-pipelines:tekton-pipelines-controller"

# The admission benchmark's policy: a label-selected pool for builds and clones that fetch from the
# internet, and a small pool listed by node names. Globs match catalog images.
ADMISSION_POLICY = """\
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress-placer.io/pool: overseas}
    images:
      - "gcr.io/kaniko-project/*"
      - "ghcr.io/tektoncd-catalog/git-clone:*"
      - "docker.io/library/golang:*"
      - "gcr.io/google.com/cloudsdktool/*"
      - "*/buildpacks*"
    namespaces: ["team-*"]
  - name: lab
    nodes: [lab-1, lab-2]
    images: ["quay.io/openshift/*"]
    namespaces: ["team-0"]
"""


class NoEvents:
    """An EventSink (and EventsOnCreation) that drops every Event (in-process measurements)."""

    def emit(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "") -> None:
        pass

    def hold(self, token: str, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "", *, generate_name: str = "") -> None:
        pass


def catalog_docs(kind: str) -> list[dict[str, Any]]:
    """Every catalog document of `kind` (Task, StepAction, Pipeline), in path order: the public catalog
    where it is given, else the catalog Tasks copied into tests/data/tekton (`bench.corpus`)."""
    out = []
    for path in sorted(task_corpus_dir().glob("*/*/*/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == kind and doc.get("apiVersion", "").startswith("tekton.dev/"):
                out.append(doc)
    return out


@lru_cache(maxsize=1)
def catalog_tasks() -> tuple[dict[str, Any], ...]:
    """Catalog Tasks, one per name (the last version wins)."""
    return tuple({t["metadata"]["name"]: t for t in catalog_docs("Task")}.values())


def catalog_task(name: str) -> dict[str, Any]:
    return copy.deepcopy(next(t for t in catalog_tasks() if t["metadata"]["name"] == name))


def in_namespace(obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(obj))
    out["metadata"]["namespace"] = namespace
    return out


# --- cluster objects ---------------------------------------------------------------------------


def node(name: str, labels: Mapping[str, str] | None = None, taints: Iterable[Mapping[str, str]] = ()) -> dict[str, Any]:
    """A Ready node as the API serves it (the fields kubelet reports, trimmed of images)."""
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "200Gi"}
    stamp = "2026-07-01T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "m6i.4xlarge",
                "topology.kubernetes.io/region": "eu-west-1",
                "topology.kubernetes.io/zone": f"eu-west-1{'abc'[zlib.crc32(name.encode()) % 3]}",
                **(labels or {}),
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            "resourceVersion": "1",
        },
        "spec": {"taints": [dict(t) for t in taints]},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {"type": t, "status": s, "lastHeartbeatTime": stamp, "lastTransitionTime": stamp, "reason": r, "message": ""}
                for t, s, r in (
                    ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                    ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                    ("PIDPressure", "False", "KubeletHasSufficientPID"),
                    ("Ready", "True", "KubeletReady"),
                )
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2.1.0", "osImage": "Linux"},
        },
    }


def running_pod(namespace: str, name: str, node_name: str, *, tolerate: str | None = None) -> dict[str, Any]:
    """A plain running pod (a Deployment's) bound to `node_name`; `tolerate` adds a pool toleration."""
    spec: dict[str, Any] = {
        "nodeName": node_name,
        "containers": [{"name": "app", "image": "registry.example.com/team/app:1.4.2", "ports": [{"containerPort": 8080}]}],
    }
    if tolerate:
        spec["tolerations"] = [{"key": TAINT_KEY, "operator": "Equal", "value": tolerate, "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": name.rsplit("-", 2)[0], "pod-template-hash": "6d9f7c8b5"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "app-6d9f7c8b5", "uid": "u"}],
        },
        "spec": spec,
        "status": {"phase": "Running"},
    }


@dataclass(frozen=True)
class Inventory:
    """The objects a benchmark's ClusterState is filled with (plain API dicts, by kind)."""

    objects: tuple[tuple[str, dict[str, Any]], ...]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for kind, _ in self.objects:
            out[kind] = out.get(kind, 0) + 1
        return out


MIX_RUNS = 512  # the most runs a request mix has (bench/admission.py DISTINCT_RUNS): the inventory holds their TaskRuns


def mix_run(i: int, namespaces: int = 10) -> tuple[str, str, str]:
    """(namespace, name, uid) of the request mix's run `i`: its pod's controller owner."""
    return f"team-{i % namespaces}", f"mix-run-{i}", f"{i:08x}-5b1e-4c7e-9d1a-7f2b3c4d5e6f"


def inventory(pool_nodes: int, ordinary_nodes: int, pods_per_node: int, namespaces: int = 10) -> Inventory:
    """Pool nodes `egress-N` (labelled and tainted for pool overseas), two `lab-N` nodes, ordinary
    nodes `node-N`, namespaces team-0.., every catalog Task, StepAction and Pipeline in each team
    namespace, `pods_per_node` running pods on every node (allowed team pods on pool nodes), and the
    request mix's TaskRuns as admitted (the informer has a run before Tekton makes its pod: admission
    places a pod only when its owner resolves to one, by uid)."""
    objects: list[tuple[str, dict[str, Any]]] = []
    taint = {"key": TAINT_KEY, "effect": "NoSchedule"}
    pool = [node(f"egress-{i}", {POOL_LABEL: "overseas"}, [{**taint, "value": "overseas"}]) for i in range(1, pool_nodes + 1)]
    lab = [node(f"lab-{i}", {}, [{**taint, "value": "lab"}]) for i in (1, 2)]
    ordinary = [node(f"node-{i}") for i in range(1, ordinary_nodes + 1)]
    objects += [("Node", n) for n in pool + lab + ordinary]
    team = [f"team-{i}" for i in range(namespaces)]
    for name in [*team, "default", "kube-system", "tekton-pipelines"]:
        objects.append(("Namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
    for namespace in team:
        for kind in ("Task", "StepAction", "Pipeline"):
            docs = catalog_tasks() if kind == "Task" else catalog_docs(kind)
            objects += [(kind, in_namespace(d, namespace)) for d in docs]
    for n in pool + lab + ordinary:
        name = n["metadata"]["name"]
        on_pool = not name.startswith("node-")
        for i in range(pods_per_node):
            namespace = team[i % len(team)] if on_pool else "default"
            pool_name = "overseas" if name.startswith("egress-") else "lab"
            objects.append(("Pod", running_pod(namespace, f"app-{name}-{i}", name, tolerate=pool_name if on_pool else None)))
    for i in range(MIX_RUNS):
        namespace, name, uid = mix_run(i, namespaces)
        objects.append(("TaskRun", {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "metadata": {
            "namespace": namespace, "name": name, "uid": uid, "annotations": {DECISION_ANNOTATION: "{}"}}}))
    return Inventory(tuple(objects))


def fill(apply: Callable[[str, str, dict[str, Any]], None], inv: Inventory) -> None:
    """Feed `inv` to a ClusterState-like `apply(kind, event, obj)` as ADDED events."""
    for kind, obj in inv.objects:
        apply(kind, "ADDED", obj)


def admission_policy() -> PlacementPolicy:
    return load_policy(ADMISSION_POLICY, "bench admission policy")


# --- runs and pods ------------------------------------------------------------------------------


def _param_value(spec: Mapping[str, Any]) -> Any:
    name = str(spec.get("name", "")).lower()
    kind = spec.get("type", "string")
    if kind == "array":
        return ["--verbose"]
    if kind == "object":
        return {k: "x" for k in (spec.get("properties") or {"key": {}})}
    if "url" in name:
        return "https://github.com/tektoncd/pipeline"
    if "image" in name:
        return "registry.example.com/team/app:1.4.2"
    return "main"


def taskrun(task: Mapping[str, Any], namespace: str, name: str, *, annotations: Mapping[str, str] | None = None,
            pod_template: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A v1 TaskRun of catalog Task `task`: required params given, required workspaces on emptyDir."""
    spec = task.get("spec") or {}
    params = [{"name": p["name"], "value": _param_value(p)} for p in spec.get("params") or [] if "default" not in p]
    workspaces = [{"name": w["name"], "emptyDir": {}} for w in spec.get("workspaces") or [] if not w.get("optional")]
    body: dict[str, Any] = {
        "apiVersion": "tekton.dev/v1",
        "kind": "TaskRun",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "ci", "tekton.dev/task": task["metadata"]["name"]},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "taskRef": {"name": task["metadata"]["name"], "kind": "Task"},
            "params": params,
            "workspaces": workspaces,
            "serviceAccountName": "default",
            "timeout": "1h0m0s",
        },
    }
    if pod_template:
        body["spec"]["podTemplate"] = copy.deepcopy(dict(pod_template))
    return body


def _volume_mounts(step: int) -> list[dict[str, Any]]:
    mounts = [("/tekton/scripts", "tekton-internal-scripts"), ("/tekton/bin", "tekton-internal-bin"),
              ("/workspace", "tekton-internal-workspace"), ("/tekton/home", "tekton-internal-home"),
              ("/tekton/results", "tekton-internal-results"), ("/tekton/steps", "tekton-internal-steps"),
              (f"/tekton/run/{step}", f"tekton-internal-run-{step}"), ("/tekton/downward", "tekton-internal-downward")]
    return [{"mountPath": path, "name": name} for path, name in mounts]


def tekton_pod(run: Mapping[str, Any], run_uid: str, images: Iterable[str], task: Mapping[str, Any]) -> dict[str, Any]:
    """The pod Tekton makes for the admitted `run`: one step-* container per Task step (images in
    step order, as resolved), Tekton's init containers and volumes, the run's podTemplate placement."""
    meta = run["metadata"]
    steps = (task.get("spec") or {}).get("steps") or [{"name": "main"}]
    resolved = sorted(images) or ["registry.example.com/unknown:latest"]
    containers = []
    for i, step in enumerate(steps):
        containers.append({
            "name": f"step-{step.get('name') or f'unnamed-{i}'}",
            "image": resolved[i % len(resolved)],
            "command": ["/tekton/bin/entrypoint"],
            "args": ["-wait_file", f"/tekton/run/{i - 1}/out" if i else "/tekton/downward/ready", "-post_file",
                     f"/tekton/run/{i}/out", "-termination_path", "/tekton/termination", "-step_metadata_dir",
                     f"/tekton/run/{i}/status", "-entrypoint", f"/tekton/scripts/script-{i}-x7k2p", "--"],
            "env": [{"name": e["name"], "value": str(e.get("value", ""))} for e in step.get("env") or [] if "name" in e],
            "volumeMounts": _volume_mounts(i),
            "terminationMessagePath": "/tekton/termination",
            "terminationMessagePolicy": "File",
            "resources": {},
        })
    volumes = [{"name": n, "emptyDir": {}} for n in (
        "tekton-internal-workspace", "tekton-internal-home", "tekton-internal-results", "tekton-internal-steps",
        "tekton-internal-scripts", "tekton-internal-bin")]
    volumes += [{"name": f"tekton-internal-run-{i}", "emptyDir": {}} for i in range(len(steps))]
    volumes.append({"name": "tekton-internal-downward", "downwardAPI": {"items": [
        {"path": "ready", "fieldRef": {"fieldPath": "metadata.annotations['tekton.dev/ready']"}}]}})
    spec: dict[str, Any] = {
        "initContainers": [
            {"name": "prepare", "image": ENTRYPOINT_IMAGE, "command": ["/ko-app/entrypoint", "init", "/ko-app/entrypoint",
             "/tekton/bin/entrypoint", *(c["name"] for c in containers)], "workingDir": "/",
             "volumeMounts": [{"mountPath": "/tekton/bin", "name": "tekton-internal-bin"}]},
            {"name": "place-scripts", "image": SHELL_IMAGE, "command": ["sh"], "args": ["-c", "scriptfile=..."],
             "volumeMounts": [{"mountPath": "/tekton/scripts", "name": "tekton-internal-scripts"}]},
        ],
        "containers": containers,
        "volumes": volumes,
        "restartPolicy": "Never",
        "serviceAccountName": (run.get("spec") or {}).get("serviceAccountName", "default"),
        "activeDeadlineSeconds": 5400,
        "enableServiceLinks": False,
        "schedulerName": "default-scheduler",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "securityContext": {},
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        ],
    }
    template = (run.get("spec") or {}).get("podTemplate") or {}
    for key, value in template.items():
        spec[key] = (spec.get(key) or []) + list(value) if key == "tolerations" else copy.deepcopy(value)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-pod",
            "namespace": meta["namespace"],
            "labels": {**meta.get("labels", {}), "app.kubernetes.io/managed-by": "tekton-pipelines",
                       "tekton.dev/taskRun": meta["name"], "tekton.dev/taskRunUID": run_uid},
            "annotations": {**meta.get("annotations", {}), "pipeline.tekton.dev/release": TEKTON_RELEASE, "tekton.dev/ready": ""},
            "ownerReferences": [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": meta["name"], "uid": run_uid,
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec,
    }


def review(obj: Mapping[str, Any], uid: str, *, dry_run: bool = False) -> dict[str, Any]:
    """The AdmissionReview v1 request the API server sends for a CREATE of `obj`."""
    group, _, version = str(obj.get("apiVersion", "v1")).rpartition("/")
    kind = str(obj["kind"])
    resource = {"group": group, "version": version, "resource": kind.lower() + "s"}
    user = (
        {"username": TEKTON_CONTROLLER_USER, "uid": "9a1f", "groups": ["system:serviceaccounts", "system:authenticated"]}
        if kind == "Pod" else {"username": "ci-bot@example.com", "groups": ["ci", "system:authenticated"]}
    )
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": resource,
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": resource,
            "name": obj["metadata"].get("name", ""),
            "namespace": obj["metadata"].get("namespace", "default"),
            "operation": "CREATE",
            "userInfo": user,
            "object": obj,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "bench"},
        },
    }


def response_patch(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch of an AdmissionReview response ([] when it has none)."""
    raw = (answer.get("response") or {}).get("patch")
    return json.loads(base64.b64decode(raw)) if raw else []


def decision_of(patch: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The `egress-placer.io/decision` annotation written by `patch`, parsed (None if absent)."""
    for op in patch:
        if op.get("path") == "/metadata/annotations/egress-placer.io~1decision":
            return json.loads(op["value"])
        if op.get("path") == "/metadata/annotations" and isinstance(op.get("value"), dict):
            value = op["value"].get("egress-placer.io/decision")
            if value:
                return json.loads(value)
    return None


@dataclass(frozen=True)
class RequestMix:
    """Serialized AdmissionReview bodies, TaskRun then its pod, and what they are."""

    bodies: tuple[bytes, ...]
    taskruns: int
    pods: int
    placed: int  # bodies whose object the policy sends to a pool

    def summary(self) -> dict[str, Any]:
        return {
            "bodies": len(self.bodies),
            "taskruns": self.taskruns,
            "pods": self.pods,
            "placed_fraction": round(self.placed / max(len(self.bodies), 1), 3),
            "mean_body_bytes": round(sum(map(len, self.bodies)) / max(len(self.bodies), 1)),
        }


def request_mix(admit: Callable[[dict[str, Any]], dict[str, Any]], runs: int, namespaces: int = 10, seed: int = 7) -> RequestMix:
    """`runs` TaskRuns of catalog Tasks (half whose images the admission policy places, half not)
    and the pod of each, as AdmissionReview bodies. `admit(review)` is an Admission's `review`:
    each run is admitted once to learn its decision and the podTemplate its pod inherits."""
    rng = random.Random(seed)
    objects = TektonObjects()
    for task in catalog_tasks():
        objects.put(in_namespace(task, "team-0"))
    placed_tasks, other_tasks = [], []
    for task in catalog_tasks():
        run = taskrun(task, "team-0", "probe")
        images = taskrun_images(run, objects)
        if not images.complete:
            continue
        decision = _decision(admit(review(run, "probe")))
        (placed_tasks if decision and decision.get("pool") else other_tasks).append(task)
    if not placed_tasks or not other_tasks:
        raise RuntimeError("the catalog gives no placed or no unplaced TaskRun under the admission policy")
    if runs > MIX_RUNS:
        raise ValueError(f"a request mix has at most {MIX_RUNS} runs (the inventory's TaskRuns)")
    bodies: list[bytes] = []
    placed = 0
    for i in range(runs):
        task = rng.choice(placed_tasks if i % 2 == 0 else other_tasks)
        namespace, name, uid = mix_run(i, namespaces)
        run = taskrun(task, namespace, name)
        run_review = review(run, f"tr-{uid}")
        answer = admit(copy.deepcopy(run_review))
        admitted = jsonpatch.apply_patch(run, response_patch(answer))
        images = taskrun_images(admitted, objects_for(objects, namespace))
        pod = tekton_pod(admitted, uid, images.images, task)
        bodies.append(json.dumps(run_review, separators=(",", ":")).encode())
        bodies.append(json.dumps(review(pod, f"pod-{uid}"), separators=(",", ":")).encode())
        placed += 2 if (_decision(answer) or {}).get("pool") else 0
    return RequestMix(tuple(bodies), taskruns=runs, pods=runs, placed=placed)


def objects_for(objects: TektonObjects, namespace: str) -> TektonObjects:
    """`objects` (filled for team-0) extended with the same Tasks in `namespace`."""
    if objects.task(namespace, catalog_tasks()[0]["metadata"]["name"]) is None:
        for task in catalog_tasks():
            objects.put(in_namespace(task, namespace))
    return objects


def _decision(answer: Mapping[str, Any]) -> dict[str, Any] | None:
    return decision_of(response_patch(answer))
