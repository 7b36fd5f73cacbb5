"""Helpers of the end-to-end tests: Tekton run bodies, and `Runs`, which creates runs (and other
objects) for one test, reads back where their pods went, and deletes everything it made."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Mapping

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller.core.model import DECISION_ANNOTATION, TAINT_KEY
from tests.waiting import wait_for

POOL = "overseas"
POOL_NODES = frozenset({"egress-1", "egress-2", "egress-3"})
ORDINARY_NODES = frozenset({"node-1", "node-2", "node-3"})
TEAM_CDN, TEAM_OTHER = "team-cdn", "team-other"  # may use the pool / may not
MATCHING_IMAGE = "registry.example.com/cdn-uploader:1.4"  # matches both "*/cdn-*" and "*uploader*"
OTHER_IMAGE = "docker.io/library/golang:1.22"
POOL_TOLERATION = {"key": TAINT_KEY, "operator": "Equal", "value": POOL, "effect": "NoSchedule"}
TEST_LABEL = "e2e.egress-placer.io/test"
GROUP, VERSION = "tekton.dev", "v1"

def step(image: str, name: str = "main") -> dict[str, Any]:
    """A step with a `script`, so Tekton never looks the image up in a registry."""
    return {"name": name, "image": image, "script": "echo done"}


def taskrun(
    name: str,
    image: str | None = None,
    *,
    annotations: Mapping[str, str] | None = None,
    pod_template: Mapping[str, Any] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A TaskRun with one inline step of `image` (or the given `spec`)."""
    body_spec = dict(spec) if spec is not None else {"taskSpec": {"steps": [step(image or OTHER_IMAGE)]}}
    if pod_template is not None:
        body_spec["podTemplate"] = dict(pod_template)
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TaskRun", "metadata": metadata, "spec": body_spec}


def decision_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parsed `egress-placer.io/decision` annotation ({} when absent)."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(DECISION_ANNOTATION)
    return json.loads(text) if text else {}


def succeeded(obj: Mapping[str, Any]) -> str | None:
    """'True', 'False' or None: the run's Succeeded condition."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Succeeded" and condition.get("status") in ("True", "False"):
            return str(condition["status"])
    return None


def events(kube: client.ApiClient, namespace: str, reason: str) -> list[dict[str, Any]]:
    """events.k8s.io Events with `reason` in `namespace`, as plain dicts (the client's typed model
    refuses the Events other components write without an eventTime)."""
    response = client.EventsV1Api(kube).list_namespaced_event(namespace, _preload_content=False)
    return [e for e in json.loads(response.data)["items"] if e.get("reason") == reason]


class Runs:
    """Everything one test creates carries the label `TEST_LABEL=<id>`; `cleanup` deletes it all."""

    def __init__(self, kube: client.ApiClient) -> None:
        self.kube = kube
        self.wait_for = wait_for
        self.id = uuid.uuid4().hex[:8]
        self.custom = client.CustomObjectsApi(kube)
        self.core = client.CoreV1Api(kube)
        self._made: set[tuple[str, str]] = set()  # (namespace, plural)

    def name(self, prefix: str) -> str:
        return f"{prefix}-{self.id}"

    def _labelled(self, body: Mapping[str, Any]) -> dict[str, Any]:
        body = json.loads(json.dumps(body))
        body["metadata"].setdefault("labels", {})[TEST_LABEL] = self.id
        return body

    # -- create -------------------------------------------------------------------------------------
    def create(self, namespace: str, plural: str, body: Mapping[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Create a tekton.dev/v1 object (`dry_run`: server-side dry run, the admitted object comes back)."""
        if not dry_run:
            self._made.add((namespace, plural))
        extra = {"dry_run": "All"} if dry_run else {}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, self._labelled(body), **extra)

    def create_all(self, items: Iterable[tuple[str, str, Mapping[str, Any]]]) -> None:
        """Create (namespace, plural, body) items together, from one thread per item."""
        items = list(items)
        with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
            for future in [pool.submit(self.create, ns, plural, body) for ns, plural, body in items]:
                future.result()

    def create_pod(self, namespace: str, body: Mapping[str, Any], api: client.ApiClient | None = None) -> dict[str, Any]:
        """Create a pod (as `api`'s identity if given, else as admin); deleted in `cleanup`."""
        self._made.add((namespace, "pods"))
        core = client.CoreV1Api(api) if api is not None else self.core
        return core.create_namespaced_pod(namespace, self._labelled(body)).to_dict()

    # -- read ---------------------------------------------------------------------------------------
    def get(self, namespace: str, plural: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)

    def listed(self, namespace: str, plural: str) -> dict[str, dict[str, Any]]:
        """This test's objects of `plural` in `namespace`, by name."""
        items = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, label_selector=f"{TEST_LABEL}={self.id}"
        )["items"]
        return {o["metadata"]["name"]: o for o in items}

    def wait_succeeded(
        self, namespace: str, plural: str, names: Iterable[str], timeout: float = 120.0
    ) -> dict[str, dict[str, Any]]:
        """Wait until every named run Succeeded (fail at once if one failed); the runs by name."""
        wanted = set(names)

        def done() -> dict[str, dict[str, Any]] | None:
            runs = self.listed(namespace, plural)
            failed = [n for n in wanted if n in runs and succeeded(runs[n]) == "False"]
            if failed:
                conditions = runs[failed[0]]["status"]["conditions"]
                pytest.fail(f"{plural} {namespace}/{failed[0]} failed: {conditions}")
            if all(n in runs and succeeded(runs[n]) == "True" for n in wanted):
                return {n: runs[n] for n in wanted}
            return None

        return wait_for(f"{len(wanted)} {plural} in {namespace} to succeed", done, timeout=timeout, interval=0.5)

    def pods_by_taskrun(self, namespace: str) -> dict[str, client.V1Pod]:
        """This test's Tekton pods in `namespace`, by the name of their TaskRun."""
        pods = self.core.list_namespaced_pod(namespace, label_selector=f"{TEST_LABEL}={self.id},tekton.dev/taskRun").items
        return {p.metadata.labels["tekton.dev/taskRun"]: p for p in pods}

    def nodes_of(self, namespace: str, taskruns: Iterable[str]) -> dict[str, str | None]:
        """The node each TaskRun's pod was bound to (None: no pod, or not scheduled)."""
        pods = self.pods_by_taskrun(namespace)
        return {name: (pods[name].spec.node_name if name in pods else None) for name in taskruns}

    def events(self, namespace: str, reason: str) -> list[dict[str, Any]]:
        """events.k8s.io Events with `reason` in `namespace` (see `events`)."""
        return events(self.kube, namespace, reason)

    # -- clean up -----------------------------------------------------------------------------------
    def cleanup(self) -> None:
        selector = f"{TEST_LABEL}={self.id}"
        for namespace, plural in sorted(self._made):
            try:
                if plural == "pods":
                    self.core.delete_collection_namespaced_pod(namespace, label_selector=selector, grace_period_seconds=0)
                else:
                    self.custom.delete_collection_namespaced_custom_object(
                        GROUP, VERSION, namespace, plural, label_selector=selector
                    )
            except ApiException as e:
                if e.status != 404:
                    raise
