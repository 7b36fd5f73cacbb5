"""Checks the AdmissionReview handlers (controller/admission/handlers.py) with the REAL core and a REAL
ClusterState filled from plain objects (tests/data/admission, Tasks from the Tekton catalog):
TaskRun placement, stripping and opt-in/out; Pod CREATE node choice, spreading and the TaskRun
assumption handover; DaemonSet, affinity-assistant, exempt and bare pods; coscheduled PipelineRuns
(whole run, mixed pools, setting off, not coscheduled); malformed reviews; fail-open on internal
errors; metrics. Every returned JSON patch is applied with `jsonpatch` to the admitted object.
Property: any JSON body gives a well-formed AdmissionReview response (whose patch applies) or
MalformedReview, never another exception."""

from __future__ import annotations

import base64
import copy
import gc
import json
from collections import Counter
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.admission.events import CreationEvents
from controller.admission.handlers import Admission, MalformedReview, Reviewed
from controller.load.core import ledger_key
from controller.core.model import DECISION_ANNOTATION, HOSTNAME_LABEL, PLACEMENT_ANNOTATION, REVIEW_ANNOTATION
from controller.core.policy import load_policy
from controller.metrics import Metrics
from controller.settings import Settings
from controller.state import ClusterState

DATA = Path(__file__).resolve().parents[1] / "data" / "admission"
TEKTON = Path(__file__).resolve().parents[1] / "data" / "tekton"  # catalog Tasks copied into the repository
TASKS = ["kaniko/0.7/kaniko.yaml", "git-clone/0.10/git-clone.yaml", "golang-build/0.3/golang-build.yaml", "curl/0.1/curl.yaml"]
POOL_KEY = "egress-placer.io/pool"
EGRESS_TOLERATION = {"key": POOL_KEY, "operator": "Equal", "value": "egress", "effect": "NoSchedule"}
LAB_TOLERATION = {"key": POOL_KEY, "operator": "Equal", "value": "lab", "effect": "NoSchedule"}
EGRESS_NODES = {"egress-1", "egress-2", "egress-3"}
KANIKO_IMAGE = "gcr.io/kaniko-project/executor:v1.5.1"


class RecordingEvents:
    """An in-memory EventsOnCreation: records what would be sent once the object exists."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def hold(self, token: str, regarding: dict, type: str, reason: str, note: str, action: str = "", *,
             generate_name: str = "") -> None:
        self.sent.append({"regarding": regarding, "type": type, "reason": reason, "note": note, "action": action,
                          "token": token, "generate_name": generate_name})


class RecordingSink:
    """An in-memory EventSink."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict, str, str]] = []

    def emit(self, regarding: dict, type: str, reason: str, note: str, action: str = "") -> None:
        self.sent.append((regarding, type, reason))


class Env:
    """An Admission wired to a real ClusterState, with a fixed clock."""

    def __init__(self, **settings_kw: Any) -> None:
        self.now = 1000.0
        policy = load_policy((DATA / "policy.yaml").read_text(), "policy.yaml")
        self.state = ClusterState(policy, clock=lambda: self.now, assumption_ttl=120.0)
        for doc in yaml.safe_load_all((DATA / "cluster.yaml").read_text()):
            self.state.apply(doc["kind"], "ADDED", doc)
        for namespace in ("team-ci", "team-other"):
            for path in TASKS:
                self._tekton(yaml.safe_load((TEKTON / "tasks" / path).read_text()), namespace)
            self._tekton(_catalog_docs("tasks/kaniko/0.7/tests/run.yaml", "Pipeline")[0], namespace)
            for doc in yaml.safe_load_all((DATA / "pipelines.yaml").read_text()):
                self._tekton(doc, namespace)
        self.metrics = Metrics()
        self.events = RecordingEvents()
        self.admission = Admission(self.state, self.metrics, self.events, Settings(**settings_kw))

    def _tekton(self, obj: dict, namespace: str) -> None:
        obj = copy.deepcopy(obj)
        obj["metadata"]["namespace"] = namespace
        self.state.apply(obj["kind"], "ADDED", obj)

    def add_pod(self, namespace: str, name: str, node: str) -> None:
        self.state.apply("Pod", "ADDED", {
            "metadata": {"namespace": namespace, "name": name},
            "spec": {"nodeName": node},
            "status": {"phase": "Running"},
        })

    def add_taskrun(self, namespace: str, name: str, uid: str, *, decided: bool = True, pod_name: str = "",
                    owner: dict | None = None) -> None:
        """A TaskRun in the cache (admitted with our decision, unless `decided` is False; `pod_name`: the
        status.podName Tekton wrote, "" for none yet; `owner`: its controller ownerReference, a PipelineRun)."""
        annotations = {DECISION_ANNOTATION: "{}"} if decided else {}
        status = {"status": {"podName": pod_name}} if pod_name else {}
        owners = {"ownerReferences": [owner]} if owner else {}
        self.state.apply("TaskRun", "ADDED", {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "metadata": {
            "namespace": namespace, "name": name, "uid": uid, "annotations": annotations, **owners}, **status})

    def review(self, obj: dict, *, operation: str = "CREATE", dry_run: bool = False, owner_cached: bool = True,
               user: str = "", uid: str = "uid-1") -> tuple[dict, dict, list[dict]]:
        """(response, patched object, patch) for admitting `obj`, requested by `user` (the API server's
        userInfo.username; "" none). A Tekton pod's TaskRun owner is put in the cache first (as the
        informer has it, usually), unless `owner_cached` is False."""
        if obj.get("kind") == "Pod" and owner_cached:
            for ref in obj["metadata"].get("ownerReferences") or ():
                if ref.get("kind") == "TaskRun" and ref.get("controller") and not self.state.queue.taskrun(obj["metadata"]["namespace"], ref["name"]):
                    self.add_taskrun(obj["metadata"]["namespace"], ref["name"], ref["uid"])
        answer = self.admission.review(self.body(obj, operation=operation, dry_run=dry_run, user=user, uid=uid))
        response = answer["response"]
        assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
        assert response["uid"] == uid and response["allowed"] is True
        patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        if patch:
            assert response["patchType"] == "JSONPatch"
        patched = jsonpatch.apply_patch(obj, patch)
        json.dumps(patched)  # still plain JSON
        return response, patched, patch

    @staticmethod
    def body(obj: dict, *, operation: str = "CREATE", dry_run: bool = False, user: str = "", uid: str = "uid-1") -> dict:
        """The AdmissionReview the API server sends for `obj` (decoded from its JSON, as the server does)."""
        group, _, version = obj.get("apiVersion", "v1").rpartition("/")
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": group, "version": version, "kind": obj["kind"]},
                "resource": {"group": group, "version": version, "resource": obj["kind"].lower() + "s"},
                "operation": operation,
                "namespace": obj["metadata"].get("namespace", "default"),
                "object": obj,
                "dryRun": dry_run,
                **({"userInfo": {"username": user}} if user else {}),
            },
        }
        return json.loads(json.dumps(body))


def _catalog_docs(path: str, kind: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((TEKTON / path).read_text()) if d and d.get("kind") == kind]


def taskrun(task: str = "kaniko", namespace: str = "team-ci", name: str | None = "build-1", *,
            annotations: dict | None = None, pod_template: dict | None = None, api: str = "tekton.dev/v1",
            params: list | None = None) -> dict:
    meta: dict[str, Any] = {"namespace": namespace}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = "build-"
    if annotations is not None:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"taskRef": {"name": task}, "params": params or [{"name": "IMAGE", "value": "r.example.com/app"}]}
    if pod_template is not None:
        spec["podTemplate"] = pod_template
    return {"apiVersion": api, "kind": "TaskRun", "metadata": meta, "spec": spec}


def tekton_pod(image: str = KANIKO_IMAGE, namespace: str = "team-ci", name: str = "build-1-pod", *,
               taskrun_name: str = "build-1", annotations: dict | None = None, spec_extra: dict | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "tekton-pipelines", "tekton.dev/taskRun": taskrun_name},
            "annotations": annotations or {},
            "ownerReferences": [{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": taskrun_name,
                                 "uid": f"uid-{taskrun_name}", "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "initContainers": [{"name": "prepare", "image": "ghcr.io/tektoncd/pipeline/entrypoint:v1"}],
            "containers": [{"name": "step-build", "image": image}],
            **(spec_extra or {}),
        },
    }


def plain_pod(namespace: str = "team-other", *, tolerations: list | None = None, owner: str | dict | None = None,
              labels: dict | None = None, annotations: dict | None = None, affinity: dict | None = None,
              node_name: str | None = None) -> dict:
    meta: dict[str, Any] = {"namespace": namespace, "generateName": "web-", "labels": labels or {}}
    if annotations:
        meta["annotations"] = annotations
    if isinstance(owner, str):
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "x", "uid": "u", "controller": True}]
    elif owner is not None:
        meta["ownerReferences"] = [{"controller": True, **owner}]
    spec: dict[str, Any] = {"containers": [{"name": "web", "image": "nginx:1.27"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if affinity is not None:
        spec["affinity"] = affinity
    if node_name is not None:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


AGENT = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent", "uid": "ds-uid-node-agent"}
TENANT_DS = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "miner", "uid": "ds-uid-miner"}
FAKE_DS = {"apiVersion": "extensions/v1beta1", "kind": "DaemonSet", "name": "node-agent", "uid": "0000-made-up"}
KUBELET = {"apiVersion": "v1", "kind": "Node", "name": "egress-1", "uid": "node-uid-egress-1"}
MIRROR = {"kubernetes.io/config.mirror": "x"}
POOL_EXISTS = {"key": POOL_KEY, "operator": "Exists", "effect": "NoSchedule"}


def decision_of(obj: dict) -> dict:
    return json.loads(obj["metadata"]["annotations"][DECISION_ANNOTATION])


def required_terms(template: dict) -> list[dict]:
    return template["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def preferred_node(template: dict) -> str | None:
    for entry in template.get("affinity", {}).get("nodeAffinity", {}).get("preferredDuringSchedulingIgnoredDuringExecution", []):
        fields = entry["preference"].get("matchFields") or []
        if entry["weight"] == 100 and len(fields) == 1 and fields[0]["key"] == "metadata.name":
            return fields[0]["values"][0]
    return None


def assert_valid_pod_template(template: dict) -> None:
    """The shapes the API server accepts for the fields egress-placer writes."""
    for t in template.get("tolerations", []):
        assert set(t) <= {"key", "operator", "value", "effect", "tolerationSeconds"}
        assert t.get("operator", "Equal") in ("Equal", "Exists")
    node_affinity = template.get("affinity", {}).get("nodeAffinity", {})
    for term in node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []):
        assert term.get("matchExpressions") or term.get("matchFields")
        for f in term.get("matchFields", []):
            assert f["key"] == "metadata.name" and len(f["values"]) == 1


# --- TaskRun CREATE ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run, pool, reason, event",
    [
        pytest.param(taskrun("kaniko"), "egress", "image-match", ("Normal", "Placed"), id="matching-image"),
        pytest.param(taskrun("kaniko", api="tekton.dev/v1beta1"), "egress", "image-match", ("Normal", "Placed"), id="v1beta1"),
        pytest.param(taskrun("golang-build", params=[{"name": "package", "value": "x"}]), "lab", "image-match",
                     ("Normal", "Placed"), id="pool-by-node-names"),
        pytest.param(taskrun("curl", params=[{"name": "url", "value": "https://example.com"}]), None, "no-match",
                     ("Normal", "NotPlaced"), id="no-match"),
        pytest.param(taskrun("kaniko", annotations={PLACEMENT_ANNOTATION: "none"}), None, "opt-out",
                     ("Normal", "NotPlaced"), id="opt-out"),
        pytest.param(taskrun("curl", annotations={PLACEMENT_ANNOTATION: "egress"}, params=[{"name": "url", "value": "u"}]),
                     "egress", "opt-in", ("Normal", "Placed"), id="opt-in"),
        pytest.param(taskrun("kaniko", namespace="team-other"), None, "namespace-not-allowed",
                     ("Normal", "NotPlaced"), id="namespace-not-allowed"),
        pytest.param(taskrun("no-such-task"), None, "unresolved", ("Warning", "Unresolved"), id="unresolved"),
        pytest.param(taskrun("kaniko", annotations={PLACEMENT_ANNOTATION: "moon"}), None, "unknown-pool",
                     ("Warning", "UnknownPool"), id="unknown-pool"),
    ],
)
def test_taskrun_decision_table(run: dict, pool: str | None, reason: str, event: tuple[str, str]) -> None:
    env = Env()
    response, patched, _ = env.review(run)
    record = decision_of(patched)
    assert (record["pool"], record["reason"]) == (pool, reason)
    template = patched["spec"].get("podTemplate", {})
    assert_valid_pod_template(template)
    if pool:
        toleration = EGRESS_TOLERATION if pool == "egress" else LAB_TOLERATION
        assert template["tolerations"] == [toleration]
        assert required_terms(template)
        assert preferred_node(template) == record["node"]
        assert record["node"] in (EGRESS_NODES if pool == "egress" else {"lab-1", "lab-2"})
        assert record["loads"] and all("/" in v for v in record["loads"].values())
        assert ledger_key("taskrun", run["metadata"]["namespace"], run["metadata"]["name"]) in env.state.load.ledger
    else:
        assert "podTemplate" not in patched["spec"]  # only the annotation was written
        assert len(env.state.load.ledger) == 0
    [sent] = env.events.sent
    assert (sent["type"], sent["reason"]) == event
    assert sent["regarding"] == {"apiVersion": run["apiVersion"], "kind": "TaskRun", "namespace": run["metadata"]["namespace"],
                                 "name": "build-1"}
    assert ("warnings" in response) == (reason == "unknown-pool")
    assert env.metrics.decisions.labels(kind="TaskRun", reason=reason, pool=pool or "")._value.get() == 1
    # Every run gets at least its decision annotation: a patch.
    assert env.metrics.admission_reviews.labels(kind="TaskRun", outcome="mutated")._value.get() == 1


def _required_terms(template: dict) -> list[dict]:
    return template["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def test_a_pool_of_listed_nodes_is_placed_by_hostname_while_every_hostname_is_the_nodes_name() -> None:
    """The lab pool lists its nodes. While a node lacks the kubelet's hostname label (or it differs from its
    name), each listed node is a `metadata.name` term; once every node's hostname label is its name, the
    list is one `kubernetes.io/hostname In` requirement; one node whose hostname differs: names again. The
    pod of a run placed in one shape and admitted in the other is written in the other only."""
    env = Env()
    golang = lambda name: taskrun("golang-build", name=name, params=[{"name": "package", "value": "x"}])  # noqa: E731
    by_name = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]} for n in ("lab-1", "lab-2")]
    by_hostname = [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["lab-1", "lab-2"]}]}]
    assert not env.state.hostnames_are_names
    _, first, _ = env.review(golang("go-1"))
    assert _required_terms(first["spec"]["podTemplate"]) == by_name

    nodes = {name: {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {**node.labels, HOSTNAME_LABEL: name}},
                    "spec": {"taints": [t.to_dict() for t in node.taints]},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"pods": "110"}}}
             for name, node in env.state.nodes.items()}
    for node in nodes.values():
        env.state.apply("Node", "MODIFIED", node)
    assert env.state.hostnames_are_names
    _, second, _ = env.review(golang("go-2"), uid="uid-2")
    assert _required_terms(second["spec"]["podTemplate"]) == by_hostname

    template = first["spec"]["podTemplate"]  # Tekton copies it to the pod
    _, pod, _ = env.review(tekton_pod("docker.io/library/golang:1.22", name="go-1-pod", taskrun_name="go-1",
                                      spec_extra={"tolerations": template["tolerations"], "affinity": template["affinity"]}), uid="uid-4")
    assert _required_terms(pod["spec"]) == by_hostname  # placed by name, admitted by hostname: by hostname only

    other = nodes["lab-2"]
    other["metadata"]["labels"][HOSTNAME_LABEL] = "lab-2.example.com"
    env.state.apply("Node", "MODIFIED", other)
    assert not env.state.hostnames_are_names
    _, third, _ = env.review(golang("go-3"), uid="uid-5")
    assert _required_terms(third["spec"]["podTemplate"]) == by_name
    # A run placed by hostname whose pod comes now: by name only (lab-2's hostname is not lab-2 any more:
    # by hostname AND by name would match no node there).
    template = second["spec"]["podTemplate"]
    _, pod, _ = env.review(tekton_pod("docker.io/library/golang:1.22", name="go-2-pod", taskrun_name="go-2",
                                      spec_extra={"tolerations": template["tolerations"], "affinity": template["affinity"]}), uid="uid-6")
    assert _required_terms(pod["spec"]) == by_name


def test_taskrun_keeps_the_users_own_template() -> None:
    env = Env()
    mine = {
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {"runAsNonRoot": True},
    }
    _, patched, _ = env.review(taskrun("kaniko", pod_template=copy.deepcopy(mine)))
    template = patched["spec"]["podTemplate"]
    assert template["nodeSelector"] == mine["nodeSelector"]
    assert template["securityContext"] == mine["securityContext"]
    assert template["tolerations"] == mine["tolerations"] + [EGRESS_TOLERATION]


GPU_TOLERATION = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
ANTI_AFFINITY = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}
TEKTON_DEFAULT = {"tolerations": [GPU_TOLERATION], "affinity": ANTI_AFFINITY, "nodeSelector": {"disk": "ssd"}}


def test_taskrun_placement_keeps_what_tektons_default_pod_template_gives() -> None:
    """Tekton keeps a run's own tolerations and affinity and then drops the default's: they are written
    with the pool's. The nodeSelector, left as the default has it, is left to Tekton."""
    env = Env()
    env.state.tekton.set_default_pod_template(copy.deepcopy(TEKTON_DEFAULT))
    _, patched, _ = env.review(taskrun("kaniko"))
    template = patched["spec"]["podTemplate"]
    assert template["tolerations"] == [GPU_TOLERATION, EGRESS_TOLERATION]
    assert template["affinity"]["podAntiAffinity"] == ANTI_AFFINITY["podAntiAffinity"]
    assert preferred_node(template) == decision_of(patched)["node"] and required_terms(template)
    assert "nodeSelector" not in template
    # the run's own template is kept as before: the default's tolerations are not added to it
    _, patched, _ = env.review(taskrun("kaniko", name="build-2", pod_template={"tolerations": [{"key": "spot", "operator": "Exists"}]}))
    assert patched["spec"]["podTemplate"]["tolerations"] == [{"key": "spot", "operator": "Exists"}, EGRESS_TOLERATION]


def test_unplaced_taskrun_leaves_tektons_default_to_tekton() -> None:
    env = Env()
    env.state.tekton.set_default_pod_template(copy.deepcopy(TEKTON_DEFAULT))
    _, patched, _ = env.review(taskrun("kaniko", namespace="team-other"))
    assert decision_of(patched)["pool"] is None and "podTemplate" not in patched["spec"]


def test_coscheduled_pipelinerun_moved_whole_keeps_tektons_default() -> None:
    env = Env()
    env.state.tekton.set_default_pod_template(copy.deepcopy(TEKTON_DEFAULT))
    _, patched, _ = env.review(kaniko_pipelinerun())
    template = patched["spec"]["taskRunTemplate"]["podTemplate"]
    assert template["tolerations"] == [GPU_TOLERATION, EGRESS_TOLERATION]
    assert template["affinity"]["podAntiAffinity"] == ANTI_AFFINITY["podAntiAffinity"]


@pytest.mark.parametrize(
    "namespace, copied, kept",
    [
        pytest.param("team-other", [EGRESS_TOLERATION], [], id="foreign-namespace-stripped"),
        pytest.param("team-other", [{"operator": "Exists"}], [], id="tolerate-all-stripped"),
        pytest.param("team-ci", [LAB_TOLERATION, {"key": "gpu", "operator": "Exists"}], [{"key": "gpu", "operator": "Exists"}],
                     id="no-match-stripped-other-kept"),
    ],
)
def test_taskrun_copied_pool_placement_is_stripped(namespace: str, copied: list, kept: list) -> None:
    env = Env()
    template = {
        "tolerations": copied,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "egress-placer.io/egress", "operator": "In", "values": ["fast"]}]}]}}},
    }
    run = taskrun("curl", namespace=namespace, pod_template=template, params=[{"name": "url", "value": "u"}])
    _, patched, _ = env.review(run)
    stripped = patched["spec"]["podTemplate"]
    assert stripped.get("tolerations", []) == kept
    assert "affinity" not in stripped
    assert decision_of(patched)["pool"] is None


def test_taskrun_with_only_generate_name_is_placed_and_its_event_waits_for_a_name() -> None:
    env = Env()
    _, patched, _ = env.review(taskrun("kaniko", name=None))
    assert decision_of(patched)["pool"] == "egress"
    [sent] = env.events.sent
    assert (sent["reason"], sent["token"], sent["generate_name"]) == ("Placed", "uid-1", "build-")
    assert sent["regarding"]["name"] == ""  # the API server has not named it yet
    assert patched["metadata"]["annotations"][REVIEW_ANNOTATION] == "uid-1"
    assert ledger_key("taskrun", "team-ci", "build-uid-1") in env.state.load.ledger  # generateName + uid: runs counted apart


@pytest.mark.parametrize("name", ["build-1", None], ids=["named", "generate-name"])
def test_the_decision_event_names_the_created_object_with_its_uid(name: str | None) -> None:
    """Admission and CreationEvents together: the Event is sent when the informer sees the object the
    API server made from the patched one (named, with a uid), and it names that object."""
    env = Env()
    sink = RecordingSink()
    env.admission.events = CreationEvents(sink)
    _, patched, _ = env.review(taskrun("kaniko", name=name))
    assert sink.sent == []
    created = copy.deepcopy(patched)
    created["metadata"].update({"name": name or "build-x7k2p", "uid": "5f0c"})
    env.admission.events.apply("TaskRun", "ADDED", created)
    [(regarding, type_, reason)] = sink.sent
    assert regarding == {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "namespace": "team-ci",
                         "name": created["metadata"]["name"], "uid": "5f0c"}
    assert (type_, reason) == ("Normal", "Placed")


def test_taskrun_dry_run_has_no_side_effects() -> None:
    env = Env()
    _, patched, _ = env.review(taskrun("kaniko"), dry_run=True)
    assert patched["spec"]["podTemplate"]["tolerations"] == [EGRESS_TOLERATION]
    assert env.events.sent == [] and len(env.state.load.ledger) == 0


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: taskrun("kaniko"), id="taskrun"),
        pytest.param(lambda: taskrun("kaniko", annotations={PLACEMENT_ANNOTATION: "moon"}), id="taskrun-warning"),
        pytest.param(lambda: kaniko_pipelinerun(), id="coscheduled-pipelinerun"),
        pytest.param(lambda: tekton_pod(), id="tekton-pod"),
    ],
)
def test_a_dry_run_is_decided_as_the_real_one_and_writes_nothing(make: Any) -> None:
    """The webhooks say sideEffects NoneOnDryRun (k8s/webhook.yaml): a review's side effects are its
    Event and its assumed placement; a dry run has the real one's answer and neither."""
    dry, real = Env(), Env()
    dry_response, dry_patched, _ = dry.review(make(), dry_run=True)
    real_response, real_patched, _ = real.review(make())
    assert dry_patched == real_patched and dry_response.get("warnings") == real_response.get("warnings")
    assert dry.events.sent == [] and len(dry.state.load.ledger) == 0
    assert real.events.sent or len(real.state.load.ledger)  # the real review has a side effect to skip


@pytest.mark.parametrize(
    "namespace, tolerations, kept",
    [
        pytest.param("team-ci", [EGRESS_TOLERATION], [EGRESS_TOLERATION], id="allowed-pool-kept"),
        pytest.param("team-other", [EGRESS_TOLERATION], None, id="foreign-pool-stripped"),
        pytest.param("team-ci", None, None, id="none-added"),
    ],
)
def test_coscheduled_taskrun_never_gets_a_placement_added(namespace: str, tolerations: list | None, kept: list | None) -> None:
    """Tekton's controller makes the TaskRun of a PipelineRun our admission moved whole to the pool."""
    env = Env()
    moved_whole(env, namespace)
    template = {"tolerations": tolerations} if tolerations else None
    run = taskrun("kaniko", namespace=namespace, pod_template=template,
                  annotations={"pipeline.tekton.dev/affinity-assistant": "affinity-assistant-abc"})
    run["metadata"]["ownerReferences"] = [WHOLE_OWNER]
    _, patched, _ = env.review(run, user=TEKTON_USER)
    assert patched["spec"].get("podTemplate", {}).get("tolerations") == kept
    assert len(env.state.load.ledger) == 0
    assert decision_of(patched)["reason"] == ("image-match" if namespace == "team-ci" else "namespace-not-allowed")


def test_pool_without_ready_node_places_nothing() -> None:
    env = Env()
    for name in EGRESS_NODES:
        env.state.apply("Node", "DELETED", {"metadata": {"name": name}})
    _, patched, _ = env.review(taskrun("kaniko"))
    assert "podTemplate" not in patched["spec"]
    record = decision_of(patched)
    assert record["pool"] is None and record["wanted"] == "egress" and "no ready node" in record["message"]
    assert env.events.sent[0]["type"] == "Warning"


# --- Pod CREATE ----------------------------------------------------------------------------------


def test_tekton_pod_goes_to_the_least_loaded_node() -> None:
    env = Env()
    for i in range(3):
        env.add_pod("team-ci", f"a{i}", "egress-1")
    env.add_pod("team-ci", "b0", "egress-2")
    for i in range(2):
        env.add_pod("team-ci", f"c{i}", "egress-3")
    _, patched, _ = env.review(tekton_pod())
    assert preferred_node(patched["spec"]) == "egress-2"
    assert patched["spec"]["tolerations"] == [EGRESS_TOLERATION]
    record = decision_of(patched)
    assert record["loads"] == {"egress-1": "3/110", "egress-2": "1/110", "egress-3": "2/110"}
    assert env.events.sent[0]["reason"] == "Placed" and "egress-2" in env.events.sent[0]["note"]


def test_a_big_pool_lists_the_least_loaded_nodes_and_counts_the_rest() -> None:
    # 3 + 12 pool nodes: the decision lists 10 loads (the chosen node's among them), not 15.
    env = Env()
    for i in range(4, 16):
        env.state.apply("Node", "ADDED", {
            "metadata": {"name": f"egress-{i}", "labels": {"egress-placer.io/egress": "fast"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"pods": "110"}},
        })
    for name in ("egress-1", "egress-2", "egress-3"):
        env.add_pod("team-ci", f"busy-{name}", name)
    for dry_run in (True, False):
        _, patched, _ = env.review(tekton_pod(), dry_run=dry_run)
        record = decision_of(patched)
        assert len(record["loads"]) == 10 and record["moreNodes"] == 5
        assert record["node"] in record["loads"] and record["loads"][record["node"]] == "0/110"
        assert not {"egress-1", "egress-2", "egress-3"} & set(record["loads"])  # busier than the 12 idle ones


def test_tekton_pod_placement_keeps_what_the_pod_has() -> None:
    """The pod carries what Tekton merged (the default pod template's too) and what the API server
    added: all of it stays, the pool's is added."""
    not_ready = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    spec = {
        "tolerations": [GPU_TOLERATION, not_ready],
        "nodeSelector": {"disk": "ssd"},
        "affinity": {**ANTI_AFFINITY, "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [zone]}}},
        "securityContext": {"runAsNonRoot": True},
    }
    env = Env()
    pod = tekton_pod(spec_extra=copy.deepcopy(spec))
    _, patched, _ = env.review(pod)
    placed = patched["spec"]
    assert placed["tolerations"] == [GPU_TOLERATION, not_ready, EGRESS_TOLERATION]
    assert placed["nodeSelector"] == spec["nodeSelector"] and placed["securityContext"] == spec["securityContext"]
    assert placed["affinity"]["podAntiAffinity"] == ANTI_AFFINITY["podAntiAffinity"]
    assert all(r in term["matchExpressions"] for term in required_terms(placed) for r in zone["matchExpressions"])
    assert placed["containers"] == pod["spec"]["containers"] and placed["initContainers"] == pod["spec"]["initContainers"]


def test_tekton_pod_gets_its_own_review_uid_over_the_one_tekton_copied_from_its_taskrun() -> None:
    env = Env()
    _, patched, _ = env.review(tekton_pod(annotations={REVIEW_ANNOTATION: "the-taskruns-review"}))
    assert patched["metadata"]["annotations"][REVIEW_ANNOTATION] == "uid-1"
    assert env.events.sent[0]["token"] == "uid-1"


DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
TEKTON_USER = "system:serviceaccount:tekton-pipelines:tekton-pipelines-controller"


@pytest.mark.parametrize(
    ("image", "namespace", "annotations", "pool", "expected"),
    [
        # placed on a pool: protected from Karpenter's consolidation while it runs
        (KANIKO_IMAGE, "team-ci", {}, "egress", "true"),
        ("docker.io/library/golang:1.22", "team-ci", {}, "lab", "true"),
        # a tenant's own value on a placed pod is replaced by ours
        (KANIKO_IMAGE, "team-ci", {DO_NOT_DISRUPT: "false"}, "egress", "true"),
        # not placed: nothing added
        ("docker.io/library/alpine:3", "team-ci", {}, None, None),
        (KANIKO_IMAGE, "team-other", {}, None, None),
        (KANIKO_IMAGE, "team-ci", {PLACEMENT_ANNOTATION: "none"}, None, None),
        # a tenant's own annotation on a pod we do not place is theirs (it protects only their node) and
        # does not make us place it
        (KANIKO_IMAGE, "team-other", {DO_NOT_DISRUPT: "true"}, None, "true"),
        ("docker.io/library/alpine:3", "team-ci", {DO_NOT_DISRUPT: "true"}, None, "true"),
    ],
)
def test_a_placed_pod_is_protected_from_consolidation(image: str, namespace: str, annotations: dict, pool: str | None, expected: str | None) -> None:
    env = Env()
    _, patched, _ = env.review(tekton_pod(image, namespace, annotations=dict(annotations)))
    assert decision_of(patched)["pool"] == pool
    assert patched["metadata"]["annotations"].get(DO_NOT_DISRUPT) == expected
    assert ("tolerations" in patched["spec"]) == (pool is not None)


def test_a_burst_of_pods_spreads_evenly() -> None:
    env = Env()
    chosen = Counter()
    for i in range(30):
        _, patched, _ = env.review(tekton_pod(name=f"run-{i}-pod", taskrun_name=f"run-{i}"))
        chosen[preferred_node(patched["spec"])] += 1
    assert chosen == {"egress-1": 10, "egress-2": 10, "egress-3": 10}


def test_pod_takes_over_the_taskrun_assumption() -> None:
    env = Env()
    _, run, _ = env.review(taskrun("kaniko"))
    assert ledger_key("taskrun", "team-ci", "build-1") in env.state.load.ledger
    pod = tekton_pod(annotations=run["metadata"]["annotations"], spec_extra=copy.deepcopy(run["spec"]["podTemplate"]))
    _, patched, _ = env.review(pod)
    assert ledger_key("taskrun", "team-ci", "build-1") not in env.state.load.ledger
    assert ledger_key("pod", "team-ci", "build-1-pod") in env.state.load.ledger
    assert len(env.state.load.ledger) == 1  # counted once, not twice
    assert patched["spec"]["tolerations"] == [EGRESS_TOLERATION]  # the run's placement, not duplicated
    assert len(required_terms(patched["spec"])) == 1


def test_the_pod_does_not_count_its_own_taskrun_while_choosing() -> None:
    # A run's TaskRun assumption must be gone before its pod's node is chosen: otherwise the node
    # picked at TaskRun CREATE looks one run busier to its own pod, and bursts drift off even.
    env = Env()
    _, run, _ = env.review(taskrun("kaniko"))
    chosen_for_run = decision_of(run)["node"]
    pod = tekton_pod(annotations=run["metadata"]["annotations"], spec_extra=copy.deepcopy(run["spec"]["podTemplate"]))
    _, patched, _ = env.review(pod)
    assert decision_of(patched)["loads"][chosen_for_run] == "0/110"


def run_and_its_pod(env: Env, **pod_kw: Any) -> tuple[dict, dict]:
    """A TaskRun admitted (review "uid-run") and the pod Tekton makes for it: the run's annotations and pod
    template copied, as Tekton does."""
    _, run, _ = env.review(taskrun("kaniko"), uid="uid-run")
    pod = tekton_pod(annotations=dict(run["metadata"]["annotations"]), spec_extra=copy.deepcopy(run["spec"]["podTemplate"]), **pod_kw)
    return run, pod


def counted(metrics: Metrics, kind: str) -> float:
    return metrics.registry.get_sample_value("egress_placer_admission_reviews_total", {"kind": kind, "outcome": "mutated"}) or 0.0


def test_a_review_counts_and_holds_its_events_only_when_finished_after_its_answer() -> None:
    # The server writes the answer first (review_deferred), then the review's metrics and Events (finish):
    # the ledger counts at once all the same, for the next review to see.
    env = Env()
    reviewed = env.admission.review_deferred(Env.body(taskrun("kaniko"), uid="uid-run"))
    assert "patch" in reviewed.response["response"]
    assert env.events.sent == [] and counted(env.metrics, "TaskRun") == 0.0
    assert ledger_key("taskrun", "team-ci", "build-1") in env.state.load.ledger
    reviewed.finish()
    assert [e["reason"] for e in env.events.sent] == ["Placed"] and counted(env.metrics, "TaskRun") == 1.0
    reviewed.finish()  # once: a second call finds nothing left to do
    assert len(env.events.sent) == 1 and counted(env.metrics, "TaskRun") == 1.0


def test_a_failing_step_after_the_answer_is_logged_and_the_others_still_run() -> None:
    env = Env()
    reviewed = env.admission.review_deferred(Env.body(taskrun("kaniko"), uid="uid-run"))
    steps = list(reviewed.later)
    broken = Reviewed(reviewed.response, [lambda: 1 / 0, *steps])
    broken.finish()
    assert [e["reason"] for e in env.events.sent] == ["Placed"] and counted(env.metrics, "TaskRun") == 1.0


def test_a_review_leaves_no_garbage_for_the_collector() -> None:
    # A request holds the work it leaves for later, which holds the request: finished, the list is emptied,
    # so the request and its body are freed at once. Left to the collector, its pauses were the webhook's p99.
    env = Env()
    run, pod = run_and_its_pod(env)
    bodies = [Env.body(taskrun("kaniko", name=f"b-{i}"), uid=f"r-{i}") for i in range(20)]
    bodies.append(Env.body(pod, user=TEKTON_USER, uid="uid-pod"))
    gc.collect()
    gc.disable()
    try:
        for body in bodies:
            env.admission.review(body)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_pod_whose_node_stays_its_runs_gets_no_patch() -> None:
    # The run's node is still among the least loaded: the pod Tekton made carries all the run's admission
    # wrote (the record, the review token, the protection), so the answer has no patch for the API server
    # to apply; the ledger moves to the pod all the same, and the Event waits for the token the pod has.
    env = Env()
    for name in ("egress-1", "egress-2", "egress-3"):
        env.add_pod("team-ci", f"busy-{name}", name)  # all equal: the pod's own salt would pick another node
    run, pod = run_and_its_pod(env)
    assert run["metadata"]["annotations"][DO_NOT_DISRUPT] == "true"
    response, patched, patch = env.review(pod, user=TEKTON_USER, uid="uid-pod")
    assert patch == [] and "patch" not in response and patched == pod
    assert ledger_key("taskrun", "team-ci", "build-1") not in env.state.load.ledger
    assert ledger_key("pod", "team-ci", "build-1-pod") in env.state.load.ledger
    placed = env.events.sent[-1]
    assert placed["reason"] == "Placed" and placed["token"] == "uid-run" and placed["regarding"]["kind"] == "Pod"
    assert decision_of(run)["node"] in placed["note"]


@pytest.mark.parametrize(
    ("why", "user", "change"),
    [
        # a pod anyone else makes: its copied annotations are not admission's word, it gets this review's
        ("made by a tenant", "system:serviceaccount:team-ci:builder", None),
        ("made by no one named", "", None),
        # the record names another node than this review places it on
        ("another node recorded", TEKTON_USER, lambda pod, node: pod["metadata"]["annotations"].__setitem__(
            DECISION_ANNOTATION, json.dumps({**json.loads(pod["metadata"]["annotations"][DECISION_ANNOTATION]), "node": "egress-9"}))),
        ("no review token", TEKTON_USER, lambda pod, node: pod["metadata"]["annotations"].pop(REVIEW_ANNOTATION)),
        ("not protected", TEKTON_USER, lambda pod, node: pod["metadata"]["annotations"].pop(DO_NOT_DISRUPT)),
        # the run's node is busier now: the pod goes elsewhere, with its own record
        ("run's node busier now", TEKTON_USER, "busier"),
    ],
)
def test_a_pod_gets_its_own_record_unless_all_it_carries_is_already_true(why: str, user: str, change: Any) -> None:
    env = Env()
    run, pod = run_and_its_pod(env)
    node = decision_of(run)["node"]
    if change == "busier":
        env.add_pod("team-ci", "came-meanwhile", node)
    elif change is not None:
        change(pod, node)
    _, patched, patch = env.review(pod, user=user, uid="uid-pod")
    assert patch, why
    annotations = patched["metadata"]["annotations"]
    assert annotations[REVIEW_ANNOTATION] == "uid-pod" and annotations[DO_NOT_DISRUPT] == "true"
    assert decision_of(patched)["node"] == preferred_node(patched["spec"])
    assert (decision_of(patched)["node"] != node) == (change == "busier")
    assert env.events.sent[-1]["token"] == "uid-pod"


def test_a_pod_keeps_its_runs_node_among_equals_and_leaves_it_for_a_less_loaded_one() -> None:
    env = Env()
    run, pod = run_and_its_pod(env)
    node = decision_of(run)["node"]
    others = [n for n in ("egress-1", "egress-2", "egress-3") if n != node]
    env.add_pod("team-ci", "came-meanwhile", others[0])  # one other node busier: the run's still least loaded
    _, patched, _ = env.review(copy.deepcopy(pod), dry_run=True)
    assert preferred_node(patched["spec"]) == node
    env.add_pod("team-ci", "came-there", node)
    env.add_pod("team-ci", "came-there-too", node)  # now busier than the last one
    _, patched, _ = env.review(copy.deepcopy(pod), dry_run=True)
    assert preferred_node(patched["spec"]) == others[1]


def test_pod_of_an_unresolved_taskrun_is_placed_by_its_final_images() -> None:
    env = Env()
    _, run, _ = env.review(taskrun("no-such-task"))
    assert decision_of(run)["reason"] == "unresolved"
    _, patched, _ = env.review(tekton_pod(annotations=run["metadata"]["annotations"]))
    assert decision_of(patched)["pool"] == "egress"
    assert patched["spec"]["tolerations"] == [EGRESS_TOLERATION]


def test_opted_out_pod_loses_the_run_placement() -> None:
    env = Env()
    pod = tekton_pod(annotations={PLACEMENT_ANNOTATION: "none"}, spec_extra={"tolerations": [EGRESS_TOLERATION]})
    _, patched, _ = env.review(pod)
    assert "tolerations" not in patched["spec"]
    assert decision_of(patched)["reason"] == "opt-out"


@pytest.mark.parametrize(
    "pod, expected_tolerations",
    [
        pytest.param(plain_pod("kube-system", owner=AGENT), [POOL_EXISTS], id="node-agent-gets-toleration"),
        pytest.param(plain_pod("kube-system", owner=AGENT, tolerations=[{"operator": "Exists"}]), [{"operator": "Exists"}],
                     id="node-agent-tolerating-all-unchanged"),
        pytest.param(plain_pod("kube-system", owner={**AGENT, "uid": "not-cached-yet"}), None,
                     id="agent-namespace-unresolved-left-as-is"),
        pytest.param(plain_pod(owner=TENANT_DS, tolerations=[EGRESS_TOLERATION]), None, id="tenant-daemonset-stripped"),
        pytest.param(plain_pod(owner=TENANT_DS), None, id="tenant-daemonset-nothing-added"),
        pytest.param(plain_pod(owner=FAKE_DS), None, id="fake-daemonset-owner-nothing-added"),
        pytest.param(plain_pod(owner={**AGENT, "controller": False}), None, id="agent-uid-not-controller-nothing-added"),
        pytest.param(plain_pod(owner=AGENT), None, id="agent-uid-copied-to-a-tenant-namespace-nothing-added"),
        pytest.param(plain_pod(owner=KUBELET, annotations=MIRROR, node_name="egress-1", tolerations=[EGRESS_TOLERATION]),
                     [EGRESS_TOLERATION], id="mirror-pod-left-alone"),
        pytest.param(plain_pod(annotations=MIRROR, node_name="worker-1", tolerations=[EGRESS_TOLERATION]), None,
                     id="forged-mirror-annotation-stripped"),
        pytest.param(plain_pod(owner={**KUBELET, "uid": "guessed"}, annotations=MIRROR, node_name="egress-1",
                               tolerations=[EGRESS_TOLERATION]), None, id="forged-mirror-owner-stripped"),
        pytest.param(plain_pod(tolerations=[EGRESS_TOLERATION]), None, id="bare-pod-stripped"),
        pytest.param(plain_pod(owner="ReplicaSet", tolerations=[EGRESS_TOLERATION, {"key": "x", "operator": "Exists"}]),
                     [{"key": "x", "operator": "Exists"}], id="deployment-pod-stripped"),
        pytest.param(plain_pod(namespace="team-ci", tolerations=[{"operator": "Exists"}]), None,
                     id="tolerate-all-pod-stripped"),
        pytest.param(plain_pod(namespace="kube-system", tolerations=[EGRESS_TOLERATION]), [EGRESS_TOLERATION],
                     id="exempt-namespace-left-alone"),
        pytest.param(plain_pod(labels={"app.kubernetes.io/component": "affinity-assistant"}, namespace="team-ci",
                               tolerations=[EGRESS_TOLERATION]), None, id="assistant-label-alone-stripped"),
        pytest.param(plain_pod(labels={"app.kubernetes.io/component": "affinity-assistant"}, namespace="team-other",
                               tolerations=[EGRESS_TOLERATION]), None, id="assistant-foreign-stripped"),
        pytest.param(plain_pod(labels={"app.kubernetes.io/component": "affinity-assistant"}, namespace="team-ci"), None,
                     id="assistant-nothing-added"),
    ],
)
def test_other_pods(pod: dict, expected_tolerations: list | None) -> None:
    env = Env()
    _, patched, patch = env.review(pod)
    assert patched["spec"].get("tolerations") == expected_tolerations
    assert all(op["path"].startswith("/spec/") for op in patch)
    assert env.events.sent == [] and len(env.state.load.ledger) == 0


@pytest.mark.parametrize(
    ("pod", "node_name", "warned"),
    [
        pytest.param(plain_pod(node_name="egress-1"), None, True, id="pool-node-by-label-removed"),
        pytest.param(plain_pod(node_name="lab-1"), None, True, id="pool-node-by-name-removed"),
        pytest.param(plain_pod(node_name="egress-1", owner="StatefulSet"), None, True, id="statefulset-pod-removed"),
        pytest.param(plain_pod(node_name="egress-1", owner=FAKE_DS), None, True, id="fake-daemonset-pod-removed"),
        pytest.param(plain_pod(node_name="worker-1"), "worker-1", False, id="ordinary-node-kept"),
        pytest.param(plain_pod("team-ci", node_name="egress-1"), "egress-1", False, id="allowed-namespace-kept"),
        pytest.param(plain_pod("kube-system", node_name="egress-1"), "egress-1", False, id="exempt-namespace-kept"),
        pytest.param(plain_pod("kube-system", owner=AGENT, node_name="egress-1"), "egress-1", False, id="node-agent-kept"),
    ],
)
def test_a_node_name_of_a_pool_node_the_namespace_may_not_use_is_removed(pod: dict, node_name: str | None, warned: bool) -> None:
    # nodeName skips the scheduler and with it the pool taint (a StatefulSet template may set it).
    env = Env()
    response, patched, _ = env.review(pod)
    assert patched["spec"].get("nodeName") == node_name
    assert any("nodeName" in w for w in response.get("warnings", [])) is warned


def test_coscheduled_tekton_pod_is_not_moved() -> None:
    env = Env()
    pod = tekton_pod(annotations={"pipeline.tekton.dev/affinity-assistant": "aa-1"})
    _, patched, patch = env.review(pod, user=TEKTON_USER)
    assert patch == [] and "tolerations" not in patched["spec"]


WHOLE_OWNER = {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "name": "whole-1", "uid": "uid-whole-1", "controller": True}


def moved_whole(env: Env, namespace: str = "team-ci", pool: str | None = "egress", entry: str | None = None) -> None:
    """A coscheduled PipelineRun `whole-1` in the cache whose decision record (admission's, at CREATE) moved it
    whole to `pool`, with our queue entry `entry` when its pool queues."""
    annotations = {DECISION_ANNOTATION: json.dumps({"pool": pool}, separators=(",", ":"))}
    if entry is not None:
        annotations["egress-placer.io/queue"] = entry
    env.state.apply("PipelineRun", "ADDED", {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {
        "namespace": namespace, "name": WHOLE_OWNER["name"], "uid": WHOLE_OWNER["uid"], "annotations": annotations}, "spec": {}})


def test_bare_pod_loses_pool_affinity_too() -> None:
    env = Env()
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["lab-1"]}]}]}}}
    _, patched, _ = env.review(plain_pod(tolerations=[LAB_TOLERATION], affinity=affinity))
    assert "affinity" not in patched["spec"] and "tolerations" not in patched["spec"]


# --- PipelineRun CREATE --------------------------------------------------------------------------


def kaniko_pipelinerun(**overrides: Any) -> dict:
    run = copy.deepcopy(_catalog_docs("tasks/kaniko/0.7/tests/run.yaml", "PipelineRun")[0])
    run["metadata"]["namespace"] = "team-ci"
    run["spec"].update(overrides)
    return run


def mixed_pipelinerun() -> dict:
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": "mixed-1", "namespace": "team-ci"},
        "spec": {
            "pipelineRef": {"name": "build-and-compile"},
            "workspaces": [{"name": "source", "volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}],
        },
    }


def test_coscheduled_pipelinerun_moves_whole_to_the_pool() -> None:
    env = Env()
    _, patched, _ = env.review(kaniko_pipelinerun())
    template = patched["spec"]["taskRunTemplate"]["podTemplate"]
    assert template["tolerations"] == [EGRESS_TOLERATION]
    assert preferred_node(template) in EGRESS_NODES
    assert_valid_pod_template(template)
    record = decision_of(patched)
    assert record["pool"] == "egress"
    assert record["tasks"]["kaniko"] == {"pool": "egress", "reason": "image-match"}
    assert record["tasks"]["fetch-repository"]["pool"] is None
    assert env.events.sent[0]["reason"] == "Placed"
    assert env.metrics.decisions.labels(kind="PipelineRun", reason="image-match", pool="egress")._value.get() == 1


def test_coscheduled_v1beta1_pipelinerun_uses_spec_pod_template() -> None:
    env = Env()
    run = kaniko_pipelinerun()
    run["apiVersion"] = "tekton.dev/v1beta1"
    _, patched, _ = env.review(run)
    assert patched["spec"]["podTemplate"]["tolerations"] == [EGRESS_TOLERATION]
    assert "taskRunTemplate" not in patched["spec"]


@pytest.mark.parametrize(
    "run, settings_kw, words",
    [
        pytest.param(mixed_pipelinerun(), {}, "different pools", id="mixed-pools"),
        pytest.param(kaniko_pipelinerun(), {"coscheduled": "off"}, "coscheduled=off", id="setting-off"),
    ],
)
def test_coscheduled_pipelinerun_left_alone(run: dict, settings_kw: dict, words: str) -> None:
    env = Env(**settings_kw)
    _, patched, _ = env.review(run)
    assert "taskRunTemplate" not in patched["spec"]
    record = decision_of(patched)
    assert record["pool"] is None and words in record["message"]
    [sent] = env.events.sent
    assert (sent["type"], sent["reason"]) == ("Warning", "NotPlaced") and words in sent["note"]
    assert len(env.state.load.ledger) == 0


@pytest.mark.parametrize(
    "mode, workspaces, coscheduled",
    [
        ("workspaces", [{"name": "shared-workspace", "emptyDir": {}}], False),
        ("workspaces", [{"name": "shared-workspace", "persistentVolumeClaim": {"claimName": "c"}}], True),
        ("disabled", [{"name": "shared-workspace", "persistentVolumeClaim": {"claimName": "c"}}], False),
        ("pipelineruns", [{"name": "shared-workspace", "emptyDir": {}}], True),
        ("isolate-pipelinerun", [{"name": "shared-workspace", "emptyDir": {}}], True),
    ],
)
def test_coschedule_mode(mode: str, workspaces: list, coscheduled: bool) -> None:
    env = Env()
    env.state.tekton.set_coschedule(mode)
    _, patched, _ = env.review(kaniko_pipelinerun(workspaces=workspaces))
    assert ("taskRunTemplate" in patched["spec"]) == coscheduled
    reason = env.events.sent[0]["reason"]
    assert reason == ("Placed" if coscheduled else "TasksDecided")
    if not coscheduled:
        assert "kaniko -> egress" in env.events.sent[0]["note"]


def test_pipelinerun_naming_an_unknown_pool_warns() -> None:
    env = Env()
    run = kaniko_pipelinerun(workspaces=[{"name": "shared-workspace", "emptyDir": {}}])
    run["metadata"]["annotations"] = {PLACEMENT_ANNOTATION: "moon"}
    response, patched, _ = env.review(run)
    assert "moon" in response["warnings"][0]
    assert (env.events.sent[0]["type"], env.events.sent[0]["reason"]) == ("Warning", "UnknownPool")
    assert all(t["reason"] == "unknown-pool" for t in decision_of(patched)["tasks"].values())


def test_not_coscheduled_pipelinerun_template_is_left_to_its_taskruns() -> None:
    env = Env()
    run = kaniko_pipelinerun(workspaces=[{"name": "shared-workspace", "emptyDir": {}}],
                             taskRunTemplate={"podTemplate": {"tolerations": [LAB_TOLERATION]}})
    _, patched, patch = env.review(run)
    assert patched["spec"]["taskRunTemplate"] == {"podTemplate": {"tolerations": [LAB_TOLERATION]}}
    assert [op["path"] for op in patch] == ["/metadata/annotations"]


# --- malformed, other operations, fail-open ------------------------------------------------------


GOOD_REQUEST = {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE", "object": {}}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param([], id="list"),
        pytest.param("x", id="string"),
        pytest.param({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": GOOD_REQUEST}, id="v1beta1"),
        pytest.param({"apiVersion": "admission.k8s.io/v1", "kind": "Pod", "request": GOOD_REQUEST}, id="wrong-kind"),
        pytest.param({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, id="no-request"),
        pytest.param({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {**GOOD_REQUEST, "uid": 5}},
                     id="uid-not-string"),
        pytest.param({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {**GOOD_REQUEST, "kind": "Pod"}},
                     id="kind-not-object"),
        pytest.param({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "request": {**GOOD_REQUEST, "object": None}}, id="create-without-object"),
        pytest.param({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "request": {**GOOD_REQUEST, "object": {"metadata": []}}}, id="metadata-not-object"),
    ],
)
def test_malformed_reviews_are_refused(body: Any) -> None:
    env = Env()
    with pytest.raises(MalformedReview):
        env.admission.review(body)
    assert env.metrics.admission_reviews.labels(kind="unknown", outcome="malformed")._value.get() == 1


@pytest.mark.parametrize(
    "obj, operation",
    [
        (taskrun("kaniko"), "UPDATE"),
        (taskrun("kaniko"), "DELETE"),
        ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "team-ci"}}, "CREATE"),
        ({"apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": "p", "namespace": "team-ci"}}, "CREATE"),
    ],
)
def test_other_operations_and_kinds_pass_unchanged(obj: dict, operation: str) -> None:
    env = Env()
    response, _, patch = env.review(obj, operation=operation)
    assert patch == [] and "warnings" not in response and env.events.sent == []
    kind = obj["kind"] if obj["kind"] == "TaskRun" else "other"
    assert [(s.labels, s.value) for f in env.metrics.admission_reviews.collect() for s in f.samples] == [
        ({"kind": kind, "outcome": "unchanged"}, 1.0)
    ]


def test_internal_error_fails_open() -> None:
    env = Env()

    def broken(name: str) -> Any:
        raise RuntimeError("cache exploded")

    env.state.namespace = broken  # type: ignore[method-assign]
    response, _, patch = env.review(taskrun("kaniko"))
    assert patch == []
    assert "internal error" in response["warnings"][0]
    assert env.metrics.admission_reviews.labels(kind="TaskRun", outcome="error")._value.get() == 1
    assert env.metrics.admission_reviews.labels(kind="TaskRun", outcome="unchanged")._value.get() == 0


def test_garbage_pod_template_fails_open() -> None:
    env = Env()
    response, _, patch = env.review(taskrun("kaniko", pod_template="not a template"))  # type: ignore[arg-type]
    assert patch == [] and response["warnings"]


def test_every_review_is_timed() -> None:
    env = Env()
    env.review(taskrun("kaniko"))
    env.review(tekton_pod())
    samples = {s.labels["kind"]: s.value for s in env.metrics.admission_seconds.collect()[0].samples if s.name.endswith("_count")}
    assert samples == {"TaskRun": 1.0, "Pod": 1.0}


# --- property: any JSON body ---------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=25,
)
KEYS = st.sampled_from(["metadata", "spec", "podTemplate", "template", "tolerations", "affinity", "annotations", "labels", "name",
                        "namespace", "containers", "taskRef", "pipelineRef", "workspaces", "ownerReferences", "kind",
                        "taskRunTemplate", "params", "image", "nodeAffinity"])
SHAPED = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.sampled_from(["step-a", "DaemonSet", "kaniko", "egress"])
    | st.just("x" * 5000),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=30,
)
KINDS = st.sampled_from([("tekton.dev", "v1", "TaskRun"), ("tekton.dev", "v1beta1", "PipelineRun"), ("tekton.dev", "v1", "PipelineRun"),
                         ("", "v1", "Pod"), ("apps", "v1", "DaemonSet"), ("x", "v1", "Thing")])
ENV = Env()


def _envelope(request: Any) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


BODIES = (
    JSON
    | JSON.map(_envelope)
    | st.builds(
        lambda kind, op, obj, ns, uid, dry: _envelope(
            {"uid": uid, "kind": dict(zip(("group", "version", "kind"), kind)), "operation": op, "object": obj,
             "namespace": ns, "dryRun": dry}
        ),
        KINDS, st.sampled_from(["CREATE", "UPDATE"]), SHAPED, st.sampled_from(["team-ci", "team-other", "kube-system"]),
        st.text(min_size=1, max_size=8), st.booleans(),
    )
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BODIES)
def test_any_body_gives_a_response_or_malformed(body: Any) -> None:
    try:
        answer = ENV.admission.review(body)
    except MalformedReview:
        return
    response = answer["response"]
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert response["uid"] == body["request"]["uid"] and response["allowed"] is True
    assert all(isinstance(w, str) for w in response.get("warnings", []))
    if "patch" in response:
        patch = json.loads(base64.b64decode(response["patch"]))
        jsonpatch.apply_patch(body["request"]["object"], patch)  # applies to the admitted object
