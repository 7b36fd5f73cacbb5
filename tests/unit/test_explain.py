"""`egress-placer explain` through the real console script: the exact JSON line format, input order,
context read before runs, every reason, and exit status 2 with nothing on stdout for unreadable YAML
or an invalid policy (the message names the file, the document and the line)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controller.cli import explain
from controller.core import decide, images

SCRIPT = Path(sys.executable).parent / "egress-placer"

POLICY = """\
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress-placer.io/pool: overseas}
    images: ["*/cdn-*", "ghcr.io/acme/uploader:*"]
    namespaces: ["team-cdn"]
    namespaceSelector:
      matchLabels: {egress: allowed}
  - name: lab
    nodes: [lab-1]
    namespaces: [research]
"""

CONTEXT = """\
apiVersion: v1
kind: Namespace
metadata:
  name: team-web
  labels: {egress: allowed}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored, namespace: team-cdn}
data: {a: b}
"""

RUNS = """\
apiVersion: tekton.dev/v1
kind: TaskRun
metadata: {name: upload-1, namespace: team-cdn}
spec:
  taskRef: {name: upload}
---
apiVersion: tekton.dev/v1
kind: PipelineRun
metadata: {name: release-7, namespace: team-web}
spec:
  params: [{name: uploader, value: "ghcr.io/acme/uploader:2"}]
  pipelineSpec:
    params: [{name: uploader}]
    tasks:
      - name: build
        taskSpec: {steps: [{name: b, image: "docker.io/library/golang:1.22"}]}
      - name: publish
        taskSpec: {steps: [{name: p, image: "$(params.uploader)"}]}
    finally:
      - name: report
        taskRef: {name: missing}
---
apiVersion: v1
kind: Pod
metadata:
  name: upload-1-pod
  namespace: team-cdn
  labels: {tekton.dev/taskRun: upload-1}
  annotations: {egress-placer.io/placement: none}
spec:
  initContainers: [{name: prepare, image: "ghcr.io/tektoncd/entrypoint:1"}]
  containers:
    - {name: step-upload, image: "registry.example.com/cdn-uploader:1.2"}
    - {name: sidecar-proxy, image: "envoy:1"}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: team-cdn}
spec:
  containers: [{name: nginx, image: "registry.example.com/cdn-nginx:1"}]
---
apiVersion: tekton.dev/v1
kind: Task
metadata: {name: upload, namespace: team-cdn}
spec:
  params: [{name: image, default: "registry.example.com/cdn-uploader:1.2"}]
  steps:
    - {name: upload, image: "$(params.image)"}
    - {name: check, image: "alpine:3.20"}
    - {name: check-again, image: "alpine:3.20"}
"""

MORE = """\
apiVersion: v1
kind: List
items:
  - apiVersion: tekton.dev/v1beta1
    kind: TaskRun
    metadata:
      generateName: lab-run-
      annotations: {egress-placer.io/placement: lab}
    spec:
      taskSpec: {steps: [{name: a, image: "alpine:3.20"}]}
  - apiVersion: tekton.dev/v1
    kind: TaskRun
    metadata: {name: typo, namespace: research, annotations: {egress-placer.io/placement: labs}}
    spec:
      taskSpec: {steps: [{name: a, image: "alpine:3.20"}]}
  - apiVersion: tekton.dev/v1
    kind: TaskRun
    metadata: {name: denied, namespace: research}
    spec:
      taskSpec: {steps: [{name: a, image: "registry.example.com/cdn-x:1"}]}
"""

EXPECTED = [
    '{"kind": "TaskRun", "namespace": "team-cdn", "name": "upload-1", "task": null, "pool": "overseas", "reason": "image-match", "images": ["alpine:3.20", "registry.example.com/cdn-uploader:1.2"]}',
    '{"kind": "PipelineRun", "namespace": "team-web", "name": "release-7", "task": "build", "pool": null, "reason": "no-match", "images": ["docker.io/library/golang:1.22"]}',
    '{"kind": "PipelineRun", "namespace": "team-web", "name": "release-7", "task": "publish", "pool": "overseas", "reason": "image-match", "images": ["ghcr.io/acme/uploader:2"]}',
    '{"kind": "PipelineRun", "namespace": "team-web", "name": "release-7", "task": "report", "pool": null, "reason": "unresolved", "images": []}',
    '{"kind": "Pod", "namespace": "team-cdn", "name": "upload-1-pod", "task": null, "pool": null, "reason": "opt-out", "images": ["envoy:1", "registry.example.com/cdn-uploader:1.2"]}',
    '{"kind": "TaskRun", "namespace": "default", "name": "lab-run-", "task": null, "pool": null, "reason": "namespace-not-allowed", "images": ["alpine:3.20"]}',
    '{"kind": "TaskRun", "namespace": "research", "name": "typo", "task": null, "pool": null, "reason": "unknown-pool", "images": ["alpine:3.20"]}',
    '{"kind": "TaskRun", "namespace": "research", "name": "denied", "task": null, "pool": null, "reason": "namespace-not-allowed", "images": ["registry.example.com/cdn-x:1"]}',
]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def explain_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "explain", *args], capture_output=True, text=True, check=False)


def test_explain_prints_one_exact_line_per_run_task_and_pod_in_input_order(tmp_path: Path) -> None:
    policy = write(tmp_path, "policy.yaml", POLICY)
    files = [write(tmp_path, "context.yaml", CONTEXT), write(tmp_path, "runs.yaml", RUNS), write(tmp_path, "more.yaml", MORE)]
    done = explain_cli("--policy", policy, *files)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == EXPECTED
    assert [list(json.loads(line)) for line in EXPECTED] == [["kind", "namespace", "name", "task", "pool", "reason", "images"]] * 8


def test_the_order_of_files_is_the_order_of_lines_and_context_comes_from_any_file(tmp_path: Path) -> None:
    policy = write(tmp_path, "policy.yaml", POLICY)
    runs, more = write(tmp_path, "runs.yaml", RUNS), write(tmp_path, "more.yaml", MORE)
    done = explain_cli("--policy", policy, more, runs, write(tmp_path, "context.yaml", CONTEXT))
    assert done.returncode == 0
    assert done.stdout.splitlines() == EXPECTED[5:] + EXPECTED[:5]


def test_a_policy_pool_can_be_opted_into(tmp_path: Path) -> None:
    run = MORE.replace("metadata:\n      generateName: lab-run-\n", "metadata:\n      namespace: research\n      generateName: lab-run-\n")
    done = explain_cli("--policy", write(tmp_path, "p.yaml", POLICY), write(tmp_path, "r.yaml", run))
    assert json.loads(done.stdout.splitlines()[0])["reason"] == "opt-in"
    assert json.loads(done.stdout.splitlines()[0])["pool"] == "lab"


def test_input_with_no_run_is_an_error_naming_what_it_found(tmp_path: Path) -> None:
    """Issue 28: a Deployment (or only context) printed nothing and exited 0; now it says so, exit 2."""
    done = explain_cli("--policy", write(tmp_path, "p.yaml", POLICY), write(tmp_path, "c.yaml", CONTEXT))
    assert (done.returncode, done.stdout) == (2, "")
    assert "nothing to explain: found a Namespace" in done.stderr
    deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: team-web}\n"
    done = explain_cli("--policy", write(tmp_path, "p.yaml", POLICY), write(tmp_path, "d.yaml", deployment))
    assert (done.returncode, done.stdout) == (2, "")
    (line,) = done.stderr.splitlines()
    assert line.startswith("egress-placer explain: nothing to explain: found a Deployment (") and "d.yaml: document 1, line 1" in line


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (RUNS.replace("metadata: {name: release-7", "metadata: {name: [release-7", 1), "bad.yaml: document 2 (line 9): invalid YAML"),
        ("---\nkind: Pod\n---\n- a\n- b\n", "bad.yaml: document 2 (line 4): expected a Kubernetes object (a mapping), got list"),
        ("apiVersion: v1\nmetadata: {name: x}\n", "bad.yaml: document 1 (line 1): the object has no kind"),
        ("kind: List\nitems:\n  - kind: Pod\n  - just text\n", "bad.yaml: document 1 (line 4): items[1]: expected a Kubernetes object"),
        ("kind: TaskRun\nmetadata: [x]\n", "bad.yaml: document 1 (line 1): metadata must be a mapping"),
        ("kind: TaskRun\n\tspec: {}\n", "bad.yaml: document 1 (line 2): invalid YAML"),
    ],
)
def test_unreadable_yaml_exits_2_with_nothing_on_stdout(tmp_path: Path, manifest: str, message: str) -> None:
    good = write(tmp_path, "runs.yaml", RUNS)
    done = explain_cli("--policy", write(tmp_path, "policy.yaml", POLICY), good, write(tmp_path, "bad.yaml", manifest))
    assert (done.returncode, done.stdout) == (2, "")
    assert message in done.stderr


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (POLICY.replace('namespaces: ["team-cdn"]', 'namespaces: ["team-cdn"]\n    placement: always'),
         "policy.yaml:8: pools[0].placement: Input should be 'required' or 'preferred'"),
        (POLICY.replace("nodes: [lab-1]", "nodes: [lab-1]\n    images: [\n"), "policy.yaml:15: invalid YAML: while parsing a flow sequence (line 12) expected ',' or ']'"),
        (POLICY + "  - name: lab\n    nodes: [x]\n", "policy.yaml:13: pools[2].name: pool name 'lab' is already used by pools[1]"),
        ("", "policy.yaml: the policy is empty"),
    ],
)
def test_an_invalid_policy_exits_2_with_its_line(tmp_path: Path, policy: str, message: str) -> None:
    done = explain_cli("--policy", write(tmp_path, "policy.yaml", policy), write(tmp_path, "runs.yaml", RUNS))
    assert (done.returncode, done.stdout) == (2, "")
    assert message in done.stderr


def test_missing_files_and_arguments(tmp_path: Path) -> None:
    done = explain_cli("--policy", write(tmp_path, "policy.yaml", POLICY), str(tmp_path / "absent.yaml"))
    assert (done.returncode, done.stdout) == (2, "") and "absent.yaml: cannot read the file" in done.stderr
    done = explain_cli(write(tmp_path, "runs.yaml", RUNS))
    assert done.returncode == 2 and "--policy" in done.stderr


def test_explain_uses_the_admission_core_functions() -> None:
    assert explain.taskrun_images is images.taskrun_images
    assert explain.pipelinerun_images is images.pipelinerun_images
    assert explain.pod_images is images.pod_images
    assert explain.decide is decide.decide


# -- the policy as objects of the pools API (docs/pools-api.md) -------------------------------------


def migrate_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "migrate-policy", *args], capture_output=True, text=True, check=False)


def test_the_migrated_objects_explain_exactly_as_the_file(tmp_path: Path) -> None:
    migrated = migrate_cli(write(tmp_path, "policy.yaml", POLICY))
    assert (migrated.returncode, migrated.stderr) == (0, "")
    kinds = [doc["kind"] for doc in yaml.safe_load_all(migrated.stdout) if doc]
    assert kinds == ["EgressPool", "EgressPool"]
    files = [write(tmp_path, "context.yaml", CONTEXT), write(tmp_path, "runs.yaml", RUNS), write(tmp_path, "more.yaml", MORE)]
    done = explain_cli("--policy", write(tmp_path, "objects.yaml", migrated.stdout), *files)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == EXPECTED


def test_a_bad_object_exits_2_naming_its_line_and_field(tmp_path: Path) -> None:
    objects = migrate_cli(write(tmp_path, "policy.yaml", POLICY)).stdout.replace("name: lab", "name: none")
    done = explain_cli("--policy", write(tmp_path, "objects.yaml", objects), write(tmp_path, "runs.yaml", RUNS))
    assert (done.returncode, done.stdout) == (2, "")
    assert "objects.yaml:" in done.stderr and ": EgressPool none: metadata.name: 'none' is reserved" in done.stderr


def test_an_invalid_policy_is_not_migrated(tmp_path: Path) -> None:
    done = migrate_cli(write(tmp_path, "policy.yaml", POLICY.replace("nodes: [lab-1]", "nodes: [Lab-1]")))
    assert (done.returncode, done.stdout) == (2, "")
    assert "policy.yaml:11: pools[1].nodes[0]: 'Lab-1' is not a valid node name" in done.stderr


# -- egress budgets (docs/budgets.md): explain shows the budgets a run would touch ------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def test_explain_shows_the_budgets_of_the_worked_example() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = explain.run_explain(str(EXAMPLES / "budgets-policy.yaml"), [str(EXAMPLES / "budgets-runs.yaml")], out, err)
    assert (code, err.getvalue()) == (0, "")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["name"], r["task"], [(b["destination"], b["matched"], b["mode"]) for b in r["budgets"]]) for r in lines] == [
        ("build-image", None, [("dockerhub-pulls", "param base-registry (host registry-1.docker.io)", "Enforce")]),
        ("publish-assets", None, [("cdn-uploads", "image registry.example.com/cdn-uploader:1.2", "ReportOnly")]),
        ("release-7", "build", [("dockerhub-pulls", "param base-registry (host docker.io)", "Enforce")]),
        ("release-7", "publish", [("cdn-uploads", "image registry.example.com/cdn-uploader:1.2", "ReportOnly")]),
    ]
    assert lines[1]["budgets"][0] | {} == {"destination": "cdn-uploads", "matched": "image registry.example.com/cdn-uploader:1.2",
                                            "mode": "ReportOnly", "maxConcurrentPerAddress": 2, "maxConcurrentPerPool": 5}


def test_a_line_has_budgets_only_where_its_pool_has_destinations(tmp_path: Path) -> None:
    """The format of pools without destinations is unchanged (the exact lines above)."""
    out = io.StringIO()
    explain.run_explain(str(EXAMPLES / "budgets-policy.yaml"), [write(tmp_path, "r.yaml", RUNS)], out, io.StringIO())
    assert all(("budgets" in json.loads(line)) is (json.loads(line)["pool"] == "overseas") for line in out.getvalue().splitlines())
