"""A pool's opt-in `history` rule (docs/suggest.md, "The same signal in the controller"): the pure core
(suggest.core.measured_set, run_key, measured_matches; decide's measured-history step) as tables and
properties, admission with a REAL ClusterState (tests/unit/test_admission_handlers.py's Env), and the
background reader (suggest.reconcile) with a fake Prometheus.

Abuse first: a tenant writes its Task names, its runs' labels (tekton.dev/task, tekton.dev/pipeline...),
and what its runs send. The measured set is keyed by namespace, the namespace of a series is Prometheus'
own (the kubelet's and kube-state-metrics' scrape), and a run is looked up in the admission request's
namespace only; the pool's namespace allow-list is checked at every decision."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.cli.explain import run_explain
from controller.core.decide import decide
from controller.core.model import PLACEMENT_ANNOTATION, ImageSet, MeasuredMatch, NamespaceState, Reason
from controller.core.policy import PlacementPolicy, load_policy
from controller.metrics import Metrics
from controller.prometheus.egress_source import PrometheusUnavailable, Sample
from controller.runner import Runner
from controller.suggest.core import (
    GIB,
    MIB,
    GroupKey,
    GroupKind,
    MeasuredSet,
    PodHistory,
    measured_matches,
    measured_set,
    run_key,
    set_change,
)
from controller.suggest.reconcile import HistoryReader, HistoryReaders
from controller.suggest.view import MeasuredView
from tests.unit.test_admission_handlers import Env, taskrun, tekton_pod

HISTORY_POOL = """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: egress
    nodeSelector: {egress-placer.io/egress: "fast"}
    images: ["gcr.io/kaniko-project/*"]
    namespaces: ["team-ci", "team-web"]
    history:
      p90BytesAtLeast: 1073741824
      window: 7d
      minRuns: 3
      prometheus: {url: "http://prometheus.monitoring:9090"}
  - name: lab
    nodes: [lab-1, lab-2]
    images: ["docker.io/library/golang:*"]
    namespaces: ["team-ci"]
"""
POLICY = load_policy(HISTORY_POOL, "policy.yaml")


def pods(namespace: str, task: str | None, sent: list[float], *, pipeline: str | None = None, pipeline_task: str | None = None) -> list[PodHistory]:
    return [
        PodHistory(namespace, f"{task}-{i}-pod", f"{task}-{i}", b, task=task, pipeline=pipeline, pipeline_task=pipeline_task)
        for i, b in enumerate(sent)
    ]


# -- the pure core: tables ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sent, min_runs, taken",
    [
        ([2 * GIB] * 10, 3, True),  # a heavy sender
        ([1 * MIB] * 10, 3, False),  # quiet
        ([1 * MIB] * 8 + [2 * GIB] * 2, 3, True),  # heavy at p90 only: p90 is the rule
        ([1 * MIB] * 9 + [2 * GIB], 3, False),  # one heavy run in 10: below p90
        ([2 * GIB] * 2, 3, False),  # too few runs
        ([1 * GIB] * 3, 3, True),  # exactly the threshold: "at least"
        ([1 * GIB - 1] * 3, 3, False),
        ([float("nan"), 2 * GIB, 2 * GIB], 3, True),  # a NaN counts as nothing sent, not as heavy
        ([float("inf")] * 3, 3, False),
    ],
)
def test_measured_set_table(sent: list[float], min_runs: int, taken: bool) -> None:
    found = measured_set(pods("team-ci", "upload", sent), 1 * GIB, min_runs)
    assert (GroupKey("team-ci", GroupKind.TASK, "upload") in found.groups) is taken


@pytest.mark.parametrize(
    "task, pipeline, pipeline_task, key",
    [
        ("upload", None, None, GroupKey("team-ci", GroupKind.TASK, "upload")),
        ("upload", "release", "push", GroupKey("team-ci", GroupKind.TASK, "upload")),  # as group_key: the Task first
        (None, "release", "push", GroupKey("team-ci", GroupKind.PIPELINE_TASK, "release/push")),
        ("", "release", "", None),  # neither: an image set, which the rule never takes
        (None, None, None, None),
    ],
)
def test_run_key_groups_a_run_as_its_pod_is_grouped_in_the_history(task: Any, pipeline: Any, pipeline_task: Any, key: Any) -> None:
    assert run_key("team-ci", task, pipeline, pipeline_task) == key


def test_image_set_groups_are_never_taken() -> None:
    inline = [PodHistory("team-ci", f"p{i}", f"r{i}", 5 * GIB, images=("registry.example/x:1",)) for i in range(5)]
    assert measured_set(inline, 1 * GIB, 3).groups == {}


def test_the_set_is_capped_largest_p90_first() -> None:
    history = [p for i in range(5) for p in pods("team-ci", f"t{i}", [(i + 1) * GIB] * 3)]
    found = measured_set(history, 1 * GIB, 3, cap=2)
    assert sorted(k.name for k in found.groups) == ["t3", "t4"] and found.dropped == 3 and found.runs_read == 15


def test_set_change_names_what_a_new_read_adds_and_removes() -> None:
    old = measured_set(pods("team-ci", "a", [2 * GIB] * 3) + pods("team-ci", "b", [2 * GIB] * 3), GIB, 3)
    new = measured_set(pods("team-ci", "b", [2 * GIB] * 3) + pods("team-ci", "c", [2 * GIB] * 3), GIB, 3)
    assert set_change(old, new) == (("team-ci/Task:c",), ("team-ci/Task:a",))
    assert set_change(None, new) == (("team-ci/Task:b", "team-ci/Task:c"), ())


# -- decide: the rule's place among the others ------------------------------------------------------------

TEAM_CI = NamespaceState("team-ci")
UPLOAD = MeasuredMatch("egress", "team-ci", "team-ci/Task:upload", "team-ci/Task:upload sent 2.0 GiB at p90")


@pytest.mark.parametrize(
    "namespace, annotations, images, measured, pool, reason",
    [
        (TEAM_CI, {}, ImageSet(("docker.io/curlimages/curl:7",)), (UPLOAD,), "egress", Reason.MEASURED),
        (TEAM_CI, {}, ImageSet(("docker.io/curlimages/curl:7",)), (), None, Reason.NO_MATCH),  # off without a match
        (TEAM_CI, {}, ImageSet(("docker.io/library/golang:1",)), (UPLOAD,), "lab", Reason.IMAGE_MATCH),  # globs first
        (TEAM_CI, {PLACEMENT_ANNOTATION: "none"}, ImageSet(), (UPLOAD,), None, Reason.OPT_OUT),  # opt-out wins
        (TEAM_CI, {PLACEMENT_ANNOTATION: "lab"}, ImageSet(), (UPLOAD,), "lab", Reason.OPT_IN),
        (TEAM_CI, {}, ImageSet((), ("a param",)), (UPLOAD,), "egress", Reason.MEASURED),  # needs no image
        # a match of another namespace (a caller's bug, or a forged one) places nothing
        (NamespaceState("team-web"), {}, ImageSet(), (UPLOAD,), None, Reason.NO_MATCH),
        # a namespace the pool does not allow: its own heavy history places nothing
        (NamespaceState("team-other"), {}, ImageSet(), (MeasuredMatch("egress", "team-other", "team-other/Task:x", ""),), None, Reason.NO_MATCH),
        # a match for a pool without the rule (a set left from an old policy) places nothing
        (TEAM_CI, {}, ImageSet(), (MeasuredMatch("lab", "team-ci", "team-ci/Task:upload", ""),), None, Reason.NO_MATCH),
        (TEAM_CI, {}, ImageSet(), (MeasuredMatch("gone", "team-ci", "team-ci/Task:upload", ""),), None, Reason.NO_MATCH),
    ],
)
def test_decide_with_measured_history(namespace, annotations, images, measured, pool, reason) -> None:  # type: ignore[no-untyped-def]
    decision = decide(POLICY, namespace, annotations, images, measured)
    assert (decision.pool, decision.reason) == (pool, reason)
    if reason is Reason.MEASURED:
        assert "measured history" in decision.message and "2.0 GiB at p90" in decision.message


# -- properties ----------------------------------------------------------------------------------------------

NAMESPACES = st.sampled_from(["team-ci", "team-web", "team-other"])
HISTORY = st.lists(
    st.builds(
        lambda ns, task, sent: PodHistory(ns, "p", "r", sent, task=task),
        NAMESPACES,
        st.sampled_from(["upload", "mirror", "lint"]),
        st.one_of(st.floats(0, 4 * GIB), st.sampled_from([0.0, float(GIB), 3.0 * GIB])),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(HISTORY, HISTORY, st.integers(1, 4))
def test_a_namespace_s_runs_never_change_another_namespace_s_set(ours: list[PodHistory], theirs: list[PodHistory], min_runs: int) -> None:
    """Whatever another namespace's runs send or are named, a namespace's groups in the set are the same:
    a tenant can neither steer its runs into another's group nor push another's out by diluting it."""
    mine = [p for p in ours if p.namespace == "team-ci"]
    others = [p for p in theirs if p.namespace != "team-ci"]
    alone = measured_set(mine, GIB, min_runs).groups
    mixed = {k: v for k, v in measured_set(mine + others, GIB, min_runs).groups.items() if k.namespace == "team-ci"}
    assert mixed == alone
    for key, measured in alone.items():
        sent = sorted(p.bytes_sent for p in mine if p.task == key.name)
        assert measured.runs == len(sent) >= min_runs and measured.bytes_p90 >= GIB


@settings(max_examples=200, deadline=None)
@given(HISTORY, NAMESPACES, st.sampled_from(["upload", "mirror", "lint"]))
def test_a_run_is_placed_by_history_only_in_its_own_namespace_and_where_the_pool_allows_it(history: list[PodHistory], namespace: str, task: str) -> None:
    found = measured_set(history, GIB, 1)
    matches = measured_matches(POLICY, run_key(namespace, task, None, None), {"egress": found})
    decision = decide(POLICY, NamespaceState(namespace), {}, ImageSet(("docker.io/curlimages/curl:7",)), matches)
    own = GroupKey(namespace, GroupKind.TASK, task) in found.groups
    assert (decision.reason is Reason.MEASURED) == (own and namespace in ("team-ci", "team-web"))


# -- admission, on a real ClusterState ------------------------------------------------------------------------


@pytest.fixture
def env() -> Env:
    env = Env()
    env.state.set_policy(POLICY)
    history = pods("team-ci", "curl", [3 * GIB] * 5) + pods("team-other", "curl", [3 * GIB] * 5) + pods("team-web", "lint", [1 * MIB] * 5)
    env.state.history.publish("egress", measured_set(history, GIB, 3))
    return env


def placed(patched: dict[str, Any]) -> str | None:
    for t in (patched["spec"].get("podTemplate") or patched["spec"]).get("tolerations") or ():
        if t.get("key") == "egress-placer.io/pool":
            return t["value"]
    return None


def test_a_taskrun_of_a_measured_task_is_placed_with_the_evidence_in_its_event(env: Env) -> None:
    _, patched, _ = env.review(taskrun("curl", "team-ci"))
    assert placed(patched) == "egress"
    event = env.events.sent[-1]
    assert event["reason"] == "Placed" and "by measured history: team-ci/Task:curl sent 3.0 GiB at p90 over its 5 runs of the last 7d" in event["note"]
    assert '"reason":"measured-history"' in patched["metadata"]["annotations"]["egress-placer.io/decision"]
    assert env.metrics.decisions.labels("TaskRun", "measured-history", "egress")._value.get() == 1  # noqa: SLF001


def test_a_tekton_pod_of_a_measured_task_is_placed_by_its_labels(env: Env) -> None:
    pod = tekton_pod("docker.io/curlimages/curl:7.72.0", "team-ci")
    pod["metadata"]["labels"]["tekton.dev/task"] = "curl"
    _, patched, _ = env.review(pod)
    assert placed(patched) == "egress"


def test_abuse_a_tenant_naming_its_task_like_another_namespace_s_heavy_task_stays_off(env: Env) -> None:
    """team-web may use the pool, and names its Task (and labels its run) like team-ci's heavy one."""
    _, patched, _ = env.review(taskrun("curl", "team-web"))
    assert placed(patched) is None
    run = taskrun("whatever", "team-web")
    run["metadata"]["labels"] = {"tekton.dev/task": "curl", "tekton.dev/pipeline": "x", "tekton.dev/pipelineTask": "y"}
    run["spec"]["taskRef"] = {"resolver": "cluster", "params": [{"name": "name", "value": "curl"}, {"name": "namespace", "value": "team-ci"}]}
    _, patched, _ = env.review(run)
    assert placed(patched) is None
    pod = tekton_pod("docker.io/curlimages/curl:7.72.0", "team-web", taskrun_name="web-1")
    pod["metadata"]["labels"]["tekton.dev/task"] = "curl"
    _, patched, _ = env.review(pod)
    assert placed(patched) is None


def test_abuse_a_namespace_the_pool_does_not_allow_is_not_placed_by_its_own_heavy_history(env: Env) -> None:
    assert GroupKey("team-other", GroupKind.TASK, "curl") in env.state.history.get("egress").groups  # type: ignore[union-attr]
    _, patched, _ = env.review(taskrun("curl", "team-other"))
    assert placed(patched) is None


def test_abuse_quiet_runs_named_like_a_heavy_task_do_not_push_it_out(env: Env) -> None:
    """team-web floods the window with quiet runs of a Task named curl: team-ci's curl keeps its place."""
    history = pods("team-ci", "curl", [3 * GIB] * 5) + pods("team-web", "curl", [0.0] * 500)
    env.state.history.publish("egress", measured_set(history, GIB, 3))
    _, patched, _ = env.review(taskrun("curl", "team-ci"))
    assert placed(patched) == "egress"


def test_a_set_of_a_pool_whose_rule_is_gone_places_nothing(env: Env) -> None:
    env.state.set_policy(load_policy(HISTORY_POOL.replace("    history:", "    old:").split("    old:")[0] + """  - name: lab
    nodes: [lab-1, lab-2]
    images: ["docker.io/library/golang:*"]
    namespaces: ["team-ci"]
""", "p.yaml"))
    _, patched, _ = env.review(taskrun("curl", "team-ci"))
    assert placed(patched) is None


# -- the background reader ----------------------------------------------------------------------------------


class FakePrometheus:
    """Answers the two queries of read_sent: bytes per pod and Tekton's labels per pod."""

    def __init__(self, pods: list[PodHistory]) -> None:
        self.pods = pods
        self.down = False
        self.asked: list[str] = []

    def query(self, promql: str) -> list[Sample]:
        self.asked.append(promql)
        if self.down:
            raise PrometheusUnavailable("connection refused")
        if promql.startswith("sum by (namespace, pod)"):
            return [Sample({"namespace": p.namespace, "pod": p.pod}, p.bytes_sent, 0.0) for p in self.pods]
        return [Sample({"namespace": p.namespace, "pod": p.pod, "label_tekton_dev_task_run": p.task_run,
                        "label_tekton_dev_task": p.task or ""}, 1.0, 0.0) for p in self.pods]


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[dict, str, str, str]] = []

    def emit(self, regarding: dict, type: str, reason: str, note: str, action: str = "") -> None:
        self.sent.append((regarding, type, reason, note))


def reader_env(leader: bool = True) -> tuple[HistoryReaders, FakePrometheus, MeasuredView, Metrics, Sink]:
    prometheus = FakePrometheus(pods("team-ci", "curl", [3 * GIB] * 4) + pods("team-ci", "lint", [MIB] * 4))
    view, metrics, sink = MeasuredView(), Metrics(), Sink()
    readers = HistoryReaders(view, Runner(), metrics, sink, lambda: leader, lambda: 5000.0,
                             lambda pool: {"kind": "EgressPool", "name": pool}, client=lambda rule: prometheus)
    return readers, prometheus, view, metrics, sink


def sample(metrics: Metrics, attr: str, *labels: str) -> float:
    return getattr(metrics, attr).labels(*labels)._value.get()  # noqa: SLF001


def test_the_reader_puts_the_set_in_force_counts_it_and_the_leader_tells_the_pool() -> None:
    _, prometheus, view, metrics, sink = reader_env()
    reader = HistoryReader("egress", POLICY.pools[0].history, prometheus, lambda r, m: (True, view.publish("egress", m)),  # type: ignore[arg-type]
                           lambda r, e: view.failed("egress", e), metrics, sink, lambda: True, lambda: 5000.0, lambda pool: {"kind": "EgressPool", "name": pool})
    found = reader.read_once()
    assert found is not None and list(map(str, found.groups)) == ["team-ci/Task:curl"] and view.get("egress") is found
    assert len(prometheus.asked) == 2 and all("[7d]" in q for q in prometheus.asked)
    assert sample(metrics, "history_groups", "egress") == 1 and sample(metrics, "history_reads", "egress", "success") == 1
    assert sample(metrics, "history_read_timestamp", "egress") == 5000.0
    assert [(r["name"], reason) for r, _, reason, _ in sink.sent] == [("egress", "MeasuredSetChanged")]
    assert "now takes team-ci/Task:curl" in sink.sent[0][3]
    reader.read_once()
    assert len(sink.sent) == 1  # the same set: no new Event
    prometheus.down = True
    assert reader.read_once() is None and view.get("egress") == found  # a failed read keeps the set in force
    assert sample(metrics, "history_reads", "egress", "unavailable") == 1 and reader.last_error


def test_a_follower_reads_too_but_writes_no_event() -> None:
    _, prometheus, view, metrics, sink = reader_env(leader=False)
    reader = HistoryReader("egress", POLICY.pools[0].history, prometheus, lambda r, m: (True, view.publish("egress", m)),  # type: ignore[arg-type]
                           lambda r, e: view.failed("egress", e), metrics, sink, lambda: False, lambda: 0.0, lambda pool: {})
    assert reader.read_once() is not None and view.get("egress") is not None and sink.sent == []


def test_readers_follow_the_policy_and_a_changed_rule_drops_its_set_at_once() -> None:
    readers, prometheus, view, metrics, _ = reader_env()
    readers.sync(POLICY)
    try:
        reader = readers.readers()["egress"]
        reader.read_once()  # the task may have read too: the same set
        assert view.get("egress") is not None
        stricter = load_policy(HISTORY_POOL.replace("1073741824", "5000000000"), "p.yaml")
        readers.sync(stricter)
        assert view.get("egress") is None or readers.readers()["egress"] is not reader
        assert reader.read_once() is None  # the replaced reader's late read is not put in force
        readers.sync(PlacementPolicy.empty())
        assert readers.readers() == {} and view.get("egress") is None
        assert [s for f in metrics.history_groups.collect() for s in f.samples] == []  # no series left for a pool without the rule
    finally:
        readers._runner.stop()  # noqa: SLF001


# -- what users see: status.history and explain -----------------------------------------------------------


def test_status_history_lists_the_set_largest_p90_first_and_the_last_error() -> None:
    view = MeasuredView()
    history = pods("team-ci", "curl", [3 * GIB] * 5) + pods("team-ci", "mirror", [2 * GIB] * 4)
    view.publish("egress", MeasuredSet(measured_set(history, GIB, 3).groups, 9, read_at=0.0))
    view.failed("egress", "connection refused")
    status = view.status("egress").model_dump(mode="json", by_alias=True, exclude_none=True)
    assert status == {
        "groups": 2, "readAt": "1970-01-01T00:00:00Z", "lastError": "connection refused",
        "measured": [
            {"namespace": "team-ci", "kind": "Task", "name": "curl", "runs": 5, "p90Bytes": 3 * GIB, "medianBytes": 3 * GIB},
            {"namespace": "team-ci", "kind": "Task", "name": "mirror", "runs": 4, "p90Bytes": 2 * GIB, "medianBytes": 2 * GIB},
        ],
    }
    assert view.status("lab").model_dump(by_alias=True, exclude_none=True) == {"groups": 0, "measured": ()}


def test_explain_decides_by_the_sets_the_egresspools_carry_in_their_status(tmp_path: Any) -> None:
    pool = {
        "apiVersion": "egress-placer.io/v1alpha1", "kind": "EgressPool", "metadata": {"name": "egress"},
        "spec": {"nodeSelector": {"egress-placer.io/egress": "fast"}, "namespaces": ["team-ci", "team-web"],
                 "history": {"p90BytesAtLeast": GIB, "prometheus": {"url": "http://prometheus:9090"}}},
        "status": {"history": {"groups": 1, "measured": [{"namespace": "team-ci", "kind": "Task", "name": "upload", "runs": 4,
                                                          "p90Bytes": 3 * GIB, "medianBytes": 3 * GIB}, {"bad": "entry"}]}},
    }
    (tmp_path / "pools.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [pool]}))
    runs = [
        {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "metadata": {"name": n, "namespace": ns},
         "spec": {"taskRef": {"name": "upload"}}}
        for n, ns in (("a", "team-ci"), ("b", "team-web"))
    ]
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump_all(runs))
    out, err = io.StringIO(), io.StringIO()
    assert run_explain(str(tmp_path / "pools.yaml"), [str(tmp_path / "runs.yaml")], out, err, output="json") == 0, err.getvalue()
    lines = {r["name"]: r for r in json.loads(out.getvalue())}
    assert lines["a"]["pool"] == "egress" and lines["a"]["reason"] == "measured-history"
    assert "team-ci/Task:upload sent 3.0 GiB at p90 over its 4 runs of the last 7d" in lines["a"]["message"]
    assert lines["b"]["pool"] is None and lines["b"]["reason"] == "unresolved"  # another namespace's Task name: no match
