"""`egress-placer suggest`'s pure core (controller/suggest/core.py): grouping, figures, proposals."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.decide import decide
from controller.core.model import ImageSet, NamespaceState
from controller.core.pools import load_any_policy
from controller.suggest.core import (
    GIB,
    MIB,
    Action,
    GroupKind,
    PodHistory,
    Thresholds,
    Verdict,
    group_key,
    image_glob,
    proposed_objects,
    proposed_policy,
    quantile,
    suggest,
)

POOLS = """
apiVersion: egress-placer.io/v1alpha1
kind: EgressPool
metadata: {name: overseas}
spec:
  priority: 10
  nodeSelector: {egress-placer.io/pool: overseas}
  images: ["registry.example/lint:*", "ghcr.io/acme/never-ran:*"]
  namespaces: ["team-*"]
"""
POLICY = load_any_policy(POOLS)
POOL_OF_NODE = {"egress-1": "overseas", "egress-2": "overseas"}
ALPINE = "docker.io/library/alpine:3.20"

# The "Mixed history" profiles: (task, images, bytes of run i)
PROFILES = {
    "upload": (("registry.example/upload:1.4", ALPINE), lambda i: 3 * GIB + i * MIB),
    "mirror": (("registry.example/mirror:2",), lambda i: 2 * GIB),
    "fetch": (("registry.example/fetch:1",), lambda i: 2 * GIB if i == 3 else 10 * MIB),
    "lint": (("registry.example/lint:1", ALPINE), lambda i: 1 * MIB),
    "test": (("registry.example/test:1", ALPINE), lambda i: 2 * MIB),
    "build": (("registry.example/build:1",), lambda i: 5 * MIB),
}


def mixed_history(runs: int = 10) -> list[PodHistory]:
    out = []
    for task, (images, sent) in PROFILES.items():
        for i in range(runs):
            on_pool = i % 2 == 0
            heavy = sent(i) >= GIB
            out.append(
                PodHistory(
                    namespace="team-a", pod=f"{task}-{i}-pod", task_run=f"{task}-{i}", task=task,
                    bytes_sent=sent(i), images=images, node="egress-1" if on_pool else "node-1",
                    duration=(60.0 if on_pool else 180.0) if heavy else 30.0,
                )
            )
    return out


def test_mixed_history_proposes_the_two_heavy_flags_the_occasional_and_removes_the_quiet_glob():
    report = suggest(mixed_history(), POLICY, POOL_OF_NODE, queries=("q1", "q2"))
    assert report.enough_history
    by_action = {(p.action, p.glob) for p in report.proposals}
    assert by_action == {
        (Action.ADD_IMAGE, "registry.example/mirror[:@]*"),
        (Action.ADD_IMAGE, "registry.example/upload[:@]*"),
        (Action.FLAG, None),
        (Action.REMOVE_IMAGE, "registry.example/lint:*"),
    }
    flag = next(p for p in report.proposals if p.action is Action.FLAG)
    assert flag.evidence.groups == ("team-a/Task:fetch",) and flag.evidence.heavy_runs == 1
    upload = next(p for p in report.proposals if p.glob == "registry.example/upload[:@]*")
    assert upload.pool == "overseas"
    assert upload.evidence.runs == 10 and upload.evidence.queries == ("q1", "q2")
    assert upload.evidence.pool_duration_median == 60.0 and upload.evidence.ordinary_duration_median == 180.0
    assert upload.evidence.time_saved_seconds == pytest.approx(5 * 120.0)
    stats = {s.key.name: s for s in report.groups}
    assert {k: s.verdict for k, s in stats.items()} == {
        "build": Verdict.QUIET, "fetch": Verdict.OCCASIONAL, "lint": Verdict.QUIET,
        "mirror": Verdict.HEAVY, "test": Verdict.QUIET, "upload": Verdict.HEAVY,
    }


def test_the_proposal_moves_exactly_the_heavy_runs():
    report = suggest(mixed_history(), POLICY, POOL_OF_NODE)
    after = proposed_policy(POLICY, report.proposals)
    ns = NamespaceState(name="team-a")
    moved = {
        task for task, (images, _) in PROFILES.items()
        if decide(POLICY, ns, {}, ImageSet(tuple(sorted(images)))).pool != decide(after, ns, {}, ImageSet(tuple(sorted(images)))).pool
    }
    assert moved == {"upload", "mirror", "lint"}  # two onto the pool, the quiet lint off it
    assert after.pool("overseas").images == ("ghcr.io/acme/never-ran:*", "registry.example/mirror[:@]*", "registry.example/upload[:@]*")


def test_yaml_objects_are_complete_pools_with_the_whole_new_list():
    report = suggest(mixed_history(), POLICY, POOL_OF_NODE)
    live = {
        "apiVersion": "egress-placer.io/v1alpha1", "kind": "EgressPool",
        "metadata": {"name": "overseas", "resourceVersion": "7", "uid": "u", "managedFields": [{}],
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "net"}},
        "spec": {"priority": 10, "nodeSelector": {"egress-placer.io/pool": "overseas"}, "namespaces": ["team-*"],
                 "images": ["registry.example/lint:*", "ghcr.io/acme/never-ran:*"]},
        "status": {"nodes": 2},
    }
    (obj,) = proposed_objects([live], report.proposals)
    assert obj == {
        "apiVersion": "egress-placer.io/v1alpha1", "kind": "EgressPool",
        "metadata": {"name": "overseas", "annotations": {"team": "net"}},
        "spec": {"priority": 10, "nodeSelector": {"egress-placer.io/pool": "overseas"}, "namespaces": ["team-*"],
                 "images": ["ghcr.io/acme/never-ran:*", "registry.example/mirror[:@]*", "registry.example/upload[:@]*"]},
    }
    assert list(load_any_policy(yaml.safe_dump(obj)).pool("overseas").images) == obj["spec"]["images"]


@pytest.mark.parametrize(
    "pod, kind, name",
    [
        (PodHistory("ns", "p", "r", 0, task="upload", pipeline="rel", pipeline_task="up"), GroupKind.TASK, "upload"),
        (PodHistory("ns", "p", "r", 0, pipeline="rel", pipeline_task="up"), GroupKind.PIPELINE_TASK, "rel/up"),
        (PodHistory("ns", "p", "r", 0, images=("b:1", "a:1", "b:1")), GroupKind.IMAGES, "a:1,b:1"),
        (PodHistory("ns", "p", "r", 0, pipeline="rel"), GroupKind.IMAGES, "(no image known)"),
    ],
)
def test_group_keys(pod, kind, name):
    key = group_key(pod)
    assert (key.namespace, key.kind, key.name) == ("ns", kind, name)


@pytest.mark.parametrize(
    "image, glob",
    [
        ("ghcr.io/acme/up:1.2", "ghcr.io/acme/up[:@]*"),
        ("localhost:5000/up:1", "localhost:5000/up[:@]*"),
        ("localhost:5000/up", "localhost:5000/up"),
        ("up@sha256:ab", "up[:@]*"),
        ("up:1@sha256:ab", "up[:@]*"),
        ("we?ird", "we[?]ird"),
    ],
)
def test_image_glob(image, glob):
    assert image_glob(image) == glob
    assert fnmatchcase(image, glob)


def test_a_tenant_that_names_its_task_like_a_heavy_one_stays_in_its_own_group():
    history = mixed_history()
    quiet_twins = [
        PodHistory("team-b", f"upload-{i}-pod", f"upload-{i}", 1 * MIB, task="upload", images=("registry.example/upload:1.4",), node="node-1")
        for i in range(10)
    ]
    report = suggest(history + quiet_twins, POLICY, POOL_OF_NODE)
    keys = {str(s.key): s.verdict for s in report.groups}
    assert keys["team-a/Task:upload"] is Verdict.HEAVY and keys["team-b/Task:upload"] is Verdict.QUIET
    # Its quiet runs share the heavy Task's image: that image is no longer the heavy group's own, so it
    # is not proposed (it would bring the quiet twin to the pool); the heavy Task is named for an opt-in.
    assert not any(p.glob == "registry.example/upload[:@]*" for p in report.proposals)
    assert any(p.action is Action.OPT_IN and p.evidence.groups == ("team-a/Task:upload",) for p in report.proposals)


def test_a_tenant_that_inflates_its_bytes_gets_no_pool_its_namespace_may_not_use():
    greedy = [
        PodHistory("outsider", f"x-{i}-pod", f"x-{i}", 5 * GIB, task="x", images=("evil.example/x:1",), node="node-1")
        for i in range(10)
    ]
    report = suggest(mixed_history() + greedy, POLICY, POOL_OF_NODE)
    mine = [p for p in report.proposals if "outsider" in p.evidence.namespaces]
    assert [(p.action, p.pool, p.glob) for p in mine] == [(Action.OPT_IN, None, None)]


def test_a_quiet_glob_with_one_heavy_run_of_another_namespace_stays():
    history = mixed_history() + [
        PodHistory("team-c", "l-pod", "l", 2 * GIB, task="lint", images=("registry.example/lint:2",), node="egress-1")
    ]
    report = suggest(history, POLICY, POOL_OF_NODE)
    assert not any(p.action is Action.REMOVE_IMAGE for p in report.proposals)


def test_no_history_is_not_enough_and_proposes_nothing():
    report = suggest([], POLICY, POOL_OF_NODE)
    assert not report.enough_history and report.proposals == ()
    assert report.missing == ("no Tekton pod sent anything in the window",)
    few = suggest(mixed_history(runs=2), POLICY, POOL_OF_NODE)
    assert not few.enough_history and "3 runs" in few.missing[0]
    told = suggest(mixed_history(), POLICY, POOL_OF_NODE, missing=("no kube_pod_labels",))
    assert not told.enough_history and told.missing == ("no kube_pod_labels",)


def test_a_heavy_task_much_slower_on_the_pool_is_not_proposed():
    history = [
        PodHistory("team-a", f"s-{i}", f"s-{i}", 3 * GIB, task="slow", images=("r/slow:1",),
                   node="egress-1" if i % 2 else "node-1", duration=600.0 if i % 2 else 60.0)
        for i in range(10)
    ]
    assert suggest(history, POLICY, POOL_OF_NODE).proposals == ()


@pytest.mark.parametrize("bad", [dict(quiet_bytes=2 * GIB), dict(min_runs=0), dict(quiet_bytes=-1)])
def test_thresholds_refuse_nonsense(bad):
    with pytest.raises(ValueError):
        Thresholds(**bad)


# -- properties -----------------------------------------------------------------------------------

IMAGES = st.sampled_from(["r/a:1", "r/b:1", "r/c:2", ALPINE, "registry.example/lint:1"])
PODS = st.builds(
    PodHistory,
    namespace=st.sampled_from(["team-a", "team-b", "outsider"]),
    pod=st.text("abc", min_size=1, max_size=3),
    task_run=st.text("abc", min_size=1, max_size=3),
    bytes_sent=st.sampled_from([0.0, 1 * MIB, 100 * MIB, 2 * GIB, 5 * GIB]),
    task=st.none() | st.sampled_from(["t1", "t2", "t3"]),
    pipeline=st.none() | st.just("p"),
    pipeline_task=st.none() | st.sampled_from(["x", "y"]),
    images=st.lists(IMAGES, max_size=3).map(tuple),
    node=st.none() | st.sampled_from(["egress-1", "node-1"]),
    duration=st.none() | st.floats(1, 1000),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(PODS, max_size=40), st.randoms())
def test_properties(pods, random):
    report = suggest(pods, POLICY, POOL_OF_NODE)
    assert sum(s.runs for s in report.groups) == len(pods)
    for s in report.groups:
        assert 0 <= s.bytes_median <= s.bytes_p90 <= s.bytes_max
        assert s.pool_runs + s.ordinary_runs <= s.runs
    if not report.enough_history:
        assert report.proposals == () and report.missing
    not_heavy_images = {i for s in report.groups if s.verdict is not Verdict.HEAVY for i in s.images}
    for p in report.proposals:
        assert p.evidence.runs >= 1 and p.reason
        if p.action is Action.ADD_IMAGE:
            assert not any(fnmatchcase(i, p.glob) for i in not_heavy_images)
            assert "outsider" not in p.evidence.namespaces  # the pool does not let it in
        if p.action is Action.REMOVE_IMAGE:
            matched = [q for q in pods if any(fnmatchcase(i, p.glob) for i in q.images)]
            assert len(matched) >= 3 and all(q.bytes_sent < Thresholds().quiet_bytes for q in matched)
    shuffled = list(pods)
    random.shuffle(shuffled)
    assert suggest(shuffled, POLICY, POOL_OF_NODE).proposals == report.proposals


@given(st.lists(st.floats(0, 1e12), min_size=1, max_size=30), st.floats(0, 1))
def test_quantile_lies_between_the_closest_values(values, q):
    v = quantile(values, q)
    assert min(values) <= v <= max(values)
