"""Helpers of the end-to-end and reliability tests: Tekton run bodies, and `Runs`, which creates runs (and
other objects) for one test, reads back where their pods went, and deletes everything it made. Its
`create_retrying` retries a creation as a CI system's client would: a refused connection, a 429, a 5xx or
a timeout is tried again (tenacity, jittered backoff) until `deadline` seconds have passed; a 409
AlreadyExists on a retry means an earlier attempt got through."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Mapping

import pytest
import tenacity
import urllib3
from kubernetes.client.exceptions import ApiException

from controller.core.model import DECISION_ANNOTATION, TAINT_KEY
from tests.kube import TEKTON, Api, namespaced, pods
from tests.waiting import wait_for

POOL = "overseas"
POOL_NODES = frozenset({"egress-1", "egress-2", "egress-3"})
ORDINARY_NODES = frozenset({"node-1", "node-2", "node-3"})
TEAM_CDN, TEAM_OTHER = "team-cdn", "team-other"  # may use the pool / may not
MATCHING_IMAGE = "registry.example.com/cdn-uploader:1.4"  # matches both "*/cdn-*" and "*uploader*"
OTHER_IMAGE = "docker.io/library/golang:1.22"
POOL_TOLERATION = {"key": TAINT_KEY, "operator": "Equal", "value": POOL, "effect": "NoSchedule"}
POOL_TAINT = {"key": TAINT_KEY, "value": POOL, "effect": "NoSchedule"}  # as `pool_taints` reads it back
POOL_LABEL = {TAINT_KEY: POOL}  # the devcluster's pool nodes carry it; the policy selects on it
TEST_LABEL = "e2e.egress-placer.io/test"
EVENTS = "/apis/events.k8s.io/v1"
CREATE_TIMEOUT = 15.0  # seconds per attempt of `create_retrying`: with etcd down, the API server would hold a request ~60 s

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
    return {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "metadata": metadata, "spec": body_spec}


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


def events(api: Api, namespace: str, reason: str) -> list[dict[str, Any]]:
    """events.k8s.io Events with `reason` in `namespace`."""
    return [e for e in api.items(namespaced(namespace, "events", group=EVENTS)) if e.get("reason") == reason]


def node_of(pod: Mapping[str, Any] | None) -> str | None:
    """The node a pod is bound to (None: no pod, or not scheduled)."""
    return ((pod or {}).get("spec") or {}).get("nodeName")


def transient(error: BaseException) -> bool:
    """Worth another try: the API server is away, overloaded or failing (not: the request is wrong)."""
    if isinstance(error, ApiException):
        return not error.status or error.status == 429 or error.status >= 500
    return isinstance(error, (urllib3.exceptions.HTTPError, OSError))


class Runs:
    """Everything one test creates carries the label `TEST_LABEL=<id>`; `cleanup` deletes it all."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.id = uuid.uuid4().hex[:8]
        self._made: set[tuple[str, str]] = set()  # (namespace, plural)

    def name(self, prefix: str) -> str:
        return f"{prefix}-{self.id}"

    def _labelled(self, body: Mapping[str, Any]) -> dict[str, Any]:
        body = json.loads(json.dumps(body))
        body["metadata"].setdefault("labels", {})[TEST_LABEL] = self.id
        return body

    # -- create -------------------------------------------------------------------------------------
    def create(
        self, namespace: str, plural: str, body: Mapping[str, Any], dry_run: bool = False, version: str = "v1",
        api: Api | None = None,
    ) -> dict[str, Any]:
        """Create a tekton.dev object, v1 unless `version` says otherwise (`dry_run`: server-side dry
        run, the admitted object comes back), as `api`'s identity if given, else as admin."""
        if not dry_run:
            self._made.add((namespace, plural))
        extra = {"dryRun": "All"} if dry_run else {}
        group = f"/apis/tekton.dev/{version}"
        return (api or self.api).create(namespaced(namespace, plural, group=group), self._labelled(body), **extra)

    def create_retrying(self, namespace: str, plural: str, body: Mapping[str, Any], deadline: float = 120.0) -> int:
        """Create a tekton.dev/v1 object, retrying transient failures for up to `deadline` s (it outlasts an
        API server restart); the attempts it took."""
        self._made.add((namespace, plural))
        labelled = self._labelled(body)
        attempts = 0

        def once() -> None:
            nonlocal attempts
            attempts += 1
            try:
                self.api.call("POST", namespaced(namespace, plural, group=TEKTON), body=labelled, timeout=CREATE_TIMEOUT)
            except ApiException as e:
                if e.status == 409 and attempts > 1:
                    return  # an earlier attempt was stored although its answer was lost
                raise

        tenacity.Retrying(
            retry=tenacity.retry_if_exception(transient),
            wait=tenacity.wait_exponential_jitter(multiplier=0.2, max=2.0, jitter=0.3),
            stop=tenacity.stop_after_delay(deadline),
            reraise=True,
        )(once)
        return attempts

    def create_all(self, items: Iterable[tuple[str, str, Mapping[str, Any]]]) -> None:
        """Create (namespace, plural, body) items together, from one thread per item."""
        items = list(items)
        with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
            for future in [pool.submit(self.create, ns, plural, body) for ns, plural, body in items]:
                future.result()

    def create_pod(self, namespace: str, body: Mapping[str, Any], api: Api | None = None) -> dict[str, Any]:
        """Create a pod (as `api`'s identity if given, else as admin); deleted in `cleanup`."""
        as_api = api
        self._made.add((namespace, "pods"))
        return (as_api or self.api).create(pods(namespace), self._labelled(body))

    # -- read ---------------------------------------------------------------------------------------
    def get(self, namespace: str, plural: str, name: str) -> dict[str, Any]:
        return self.api.call("GET", namespaced(namespace, plural, name, group=TEKTON))

    def listed(self, namespace: str, plural: str) -> dict[str, dict[str, Any]]:
        """This test's objects of `plural` in `namespace`, by name."""
        items = self.api.items(namespaced(namespace, plural, group=TEKTON), labelSelector=f"{TEST_LABEL}={self.id}")
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

    def pods_by_taskrun(self, namespace: str) -> dict[str, dict[str, Any]]:
        """This test's Tekton pods in `namespace`, by the name of their TaskRun."""
        listed = self.api.items(pods(namespace), labelSelector=f"{TEST_LABEL}={self.id},tekton.dev/taskRun")
        return {p["metadata"]["labels"]["tekton.dev/taskRun"]: p for p in listed}

    def nodes_of(self, namespace: str, taskruns: Iterable[str]) -> dict[str, str | None]:
        """The node each TaskRun's pod was bound to (None: no pod, or not scheduled)."""
        by_run = self.pods_by_taskrun(namespace)
        return {name: node_of(by_run.get(name)) for name in taskruns}

    def events(self, namespace: str, reason: str) -> list[dict[str, Any]]:
        """events.k8s.io Events with `reason` in `namespace` (see `events`)."""
        return events(self.api, namespace, reason)

    # -- clean up -----------------------------------------------------------------------------------
    def cleanup(self) -> None:
        selector = f"{TEST_LABEL}={self.id}"
        for namespace, plural in sorted(self._made):
            if plural == "pods":
                self.api.delete(pods(namespace), labelSelector=selector, gracePeriodSeconds=0)
            else:
                self.api.delete(namespaced(namespace, plural, group=TEKTON), labelSelector=selector)
