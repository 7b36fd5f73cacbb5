"""Tekton's cluster resolver rules (controller/core/cluster_resolver.py), as Tekton v1.15.0's
pkg/resolution/resolver/cluster decides them, and image discovery following only what they allow."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from controller.core.cluster_resolver import (
    TEKTON_DEFAULTS,
    ResolverConfig,
    Target,
    config_map_data,
    namespace_refusal,
    target,
)
from controller.core.images import pipelinerun_images, taskrun_images
from controller.state import ClusterState
from controller.tekton.core import TektonObjects
from controller.core.model import ImageSet
from controller.tekton.view import TektonView


def config(flags: dict[str, str] | None = None, **settings: str) -> ResolverConfig:
    data = {"default-kind": "task", "default-namespace": "", "allowed-namespaces": "", "blocked-namespaces": ""}
    data.update({k.replace("_", "-"): v for k, v in settings.items()})
    return ResolverConfig(settings=data, flags=flags if flags is not None else {"enable-cluster-resolver": "true"})


@pytest.mark.parametrize(
    ("namespace", "allowed", "blocked", "refused"),
    [
        # nothing set: every namespace
        ("shared", "", "", ""),
        # blocked
        ("shared", "", "shared", "access to namespace shared is blocked (cluster-resolver-config blocked-namespaces)"),
        ("shared", "", " other , shared ", "access to namespace shared is blocked (cluster-resolver-config blocked-namespaces)"),
        ("shared", "", "other", ""),
        # blocked wins over allowed
        ("shared", "shared", "shared", "access to namespace shared is blocked (cluster-resolver-config blocked-namespaces)"),
        # allowed
        ("shared", "shared,tools", "", ""),
        ("other", "shared,tools", "",
         "access to namespace other is not allowed (cluster-resolver-config allowed-namespaces)"),
        # "*" blocked: only what is allowed explicitly
        ("shared", "", "*",
         "only namespaces in allowed-namespaces may be read (cluster-resolver-config blocked-namespaces holds '*'), not shared"),
        ("shared", "shared", "*", ""),
        ("other", "shared", "*",
         "only namespaces in allowed-namespaces may be read (cluster-resolver-config blocked-namespaces holds '*'), not other"),
        # "*" allowed means nothing more than a namespace called "*": with it, the list is set and names no real one
        ("shared", "*", "", "access to namespace shared is not allowed (cluster-resolver-config allowed-namespaces)"),
        # a list of only commas and spaces is still set (Tekton tests the raw string)
        ("shared", " , ", "", "access to namespace shared is not allowed (cluster-resolver-config allowed-namespaces)"),
        ("shared", "", " , ", ""),
        # entries are trimmed, the namespace is not
        (" shared", "shared", "", "access to namespace  shared is not allowed (cluster-resolver-config allowed-namespaces)"),
    ],
)
def test_namespace_rules(namespace: str, allowed: str, blocked: str, refused: str) -> None:
    assert namespace_refusal(namespace, {"allowed-namespaces": allowed, "blocked-namespaces": blocked}) == refused


@pytest.mark.parametrize(
    ("params", "conf", "expected"),
    [
        ({"kind": "task", "name": "t", "namespace": "ns"}, config(), Target("task", "t", "ns")),
        # defaults: an absent or empty param takes the configured default
        ({"name": "t", "namespace": "ns"}, config(), Target("task", "t", "ns")),
        ({"kind": "", "name": "t", "namespace": "ns"}, config(default_kind="pipeline"), Target("pipeline", "t", "ns")),
        ({"name": "t"}, config(default_namespace="shared"), Target("task", "t", "shared")),
        ({"name": "t", "namespace": ""}, config(default_namespace="shared"), Target("task", "t", "shared")),
        # ... and the default namespace obeys the rules too
        ({"name": "t"}, config(default_namespace="shared", blocked_namespaces="shared"),
         "Tekton's cluster resolver refuses it: access to namespace shared is blocked (cluster-resolver-config blocked-namespaces)"),
        # missing
        ({"name": "t"}, config(), "missing required cluster resolver params: namespace"),
        ({"name": "t", "namespace": "  "}, config(), "missing required cluster resolver params: namespace"),
        ({}, ResolverConfig(settings={}, flags={}), "missing required cluster resolver params: kind, name, namespace"),
        # kinds are Tekton's, lower case (an empty default-kind is a kind Tekton does not know)
        ({"kind": "Task", "name": "t", "namespace": "ns"}, config(), "unknown or unsupported resource kind 'Task'"),
        ({"name": "t", "namespace": "ns"}, config(default_kind=""), "unknown or unsupported resource kind ''"),
        # the feature flag
        ({"name": "t", "namespace": "ns"}, config(flags={"enable-cluster-resolver": "false"}),
         "Tekton's cluster resolver is disabled (resolvers-feature-flags enable-cluster-resolver)"),
        ({"name": "t", "namespace": "ns"}, config(flags={"enable-cluster-resolver": "T"}), Target("task", "t", "ns")),
        ({"name": "t", "namespace": "ns"}, config(flags={}), Target("task", "t", "ns")),
        # unknown configuration: nothing is followed
        ({"name": "t", "namespace": "ns"}, ResolverConfig(),
         "Tekton's cluster resolver configuration is not known (ConfigMap cluster-resolver-config not read yet): "
         "the reference is not followed"),
        ({"name": "t", "namespace": "ns"}, ResolverConfig(settings={}),
         "Tekton's cluster resolver configuration is not known (ConfigMap resolvers-feature-flags not read yet): "
         "the reference is not followed"),
        ({"name": "t", "namespace": "ns"}, config().with_settings(config_map_data(None)),
         "Tekton's cluster resolver configuration is not known (ConfigMap cluster-resolver-config not found in "
         "Tekton's resolvers namespace): the reference is not followed"),
        ({"name": "t", "namespace": "ns"}, config(flags={"enable-cluster-resolver": "yes"}),
         "Tekton's cluster resolver configuration is not known (resolvers-feature-flags enable-cluster-resolver='yes' "
         "is not a boolean Tekton reads): the reference is not followed"),
    ],
)
def test_target(params: dict[str, str], conf: ResolverConfig, expected: Target | str) -> None:
    assert target(params, conf) == expected


SHARED_TASK = {"apiVersion": "tekton.dev/v1", "kind": "Task", "metadata": {"name": "upload", "namespace": "shared"},
               "spec": {"steps": [{"name": "s", "image": "secret.example.com/upload:1"}]}}
SHARED_PIPELINE = {"apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": "release", "namespace": "shared"},
                   "spec": {"tasks": [{"name": "up", "taskRef": {"resolver": "cluster", "params": [
                       {"name": "name", "value": "upload"}, {"name": "namespace", "value": "shared"}]}}]}}


def run(kind: str, ref: dict[str, Any]) -> dict[str, Any]:
    field = "taskRef" if kind == "TaskRun" else "pipelineRef"
    return {"apiVersion": "tekton.dev/v1", "kind": kind, "metadata": {"name": "r", "namespace": "team"}, "spec": {field: ref}}


def cluster_ref(name: str, kind: str = "task") -> dict[str, Any]:
    return {"resolver": "cluster", "params": [{"name": "kind", "value": kind}, {"name": "name", "value": name},
                                              {"name": "namespace", "value": "shared"}]}


def objects(conf: ResolverConfig) -> TektonObjects:
    out = TektonObjects(conf)
    out.put(SHARED_TASK)
    out.put(SHARED_PIPELINE)
    return out


def test_a_task_from_a_blocked_namespace_is_not_followed() -> None:
    found = taskrun_images(run("TaskRun", cluster_ref("upload")), objects(config(blocked_namespaces="shared")))
    assert found == ImageSet(unresolved=(
        "cluster resolver reference to Task upload: Tekton's cluster resolver refuses it: access to namespace shared "
        "is blocked (cluster-resolver-config blocked-namespaces)",))
    assert taskrun_images(run("TaskRun", cluster_ref("upload")), objects(config(allowed_namespaces="shared"))) == ImageSet(
        images=("secret.example.com/upload:1",))


def test_nothing_is_followed_while_the_configuration_is_unknown() -> None:
    found = taskrun_images(run("TaskRun", cluster_ref("upload")), objects(ResolverConfig()))
    assert not found.images and "not known" in found.unresolved[0]
    assert TektonObjects().cluster_resolver == ResolverConfig()  # unknown until read


def test_a_pipeline_and_its_tasks_each_obey_the_rules() -> None:
    followed = pipelinerun_images(run("PipelineRun", cluster_ref("release", "pipeline")), objects(config()))
    assert followed == [("up", ImageSet(images=("secret.example.com/upload:1",)))]
    refused = pipelinerun_images(run("PipelineRun", cluster_ref("release", "pipeline")), objects(config(blocked_namespaces="*")))
    assert [(name, images.images) for name, images in refused] == [("", ())]


NAMESPACE = st.sampled_from(["shared", "team", "tools", "*", "ci"])
LIST = st.lists(NAMESPACE, max_size=3).map(",".join) | st.sampled_from(["", " , ", " shared ,tools"])


@given(namespace=NAMESPACE.filter(lambda n: n != "*"), allowed=LIST, blocked=LIST)
def test_what_is_followed_is_what_tekton_allows(namespace: str, allowed: str, blocked: str) -> None:
    """Written from Tekton's documentation rather than its code: blocked always wins; with '*' blocked
    only the allowed list counts; with an allowed list set only it counts; else everything."""
    def entries(text: str) -> set[str]:
        return {e.strip() for e in text.split(",") if e.strip()}

    if namespace in entries(blocked):
        expect = False
    elif allowed or "*" in entries(blocked):
        expect = namespace in entries(allowed)
    else:
        expect = True
    conf = config(allowed_namespaces=allowed, blocked_namespaces=blocked)
    assert (namespace_refusal(namespace, conf.settings) == "") is expect  # type: ignore[arg-type]
    task = dict(SHARED_TASK, metadata={"name": "upload", "namespace": namespace})
    index = TektonObjects(conf)
    index.put(task)
    ref = {"resolver": "cluster", "params": [{"name": "name", "value": "upload"}, {"name": "namespace", "value": namespace}]}
    found = taskrun_images(run("TaskRun", ref), index)
    assert bool(found.images) is expect  # no image from a namespace Tekton would not let the run read


def test_explain_uses_tekton_s_defaults() -> None:
    assert target({"name": "t", "namespace": "ns"}, TEKTON_DEFAULTS) == Target("task", "t", "ns")


# -- the informers that read the rules ----------------------------------------------------------------


class Sink:
    """What cluster_informers feeds (ClusterState's part of it that these informers touch)."""

    def __init__(self) -> None:
        self.tekton = TektonView()
        self.budgets = ClusterState(None, clock=lambda: 0.0).budgets

    def replace(self, kind: str, objs: list[dict[str, Any]]) -> None: ...

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None: ...


def test_the_informers_keep_the_rules_and_do_not_hold_readiness() -> None:
    from kubernetes.client.exceptions import ApiException

    from controller.kube.informer import cluster_informers
    from controller.metrics import Metrics
    from controller.settings import Settings

    sink = Sink()
    informers = cluster_informers(None, sink, Settings(tekton_resolvers_namespace="resolvers"), Metrics())  # type: ignore[arg-type]
    by_name = {i.resource.name: i for i in informers}
    rules = by_name["configmap resolvers/cluster-resolver-config"]
    flags = by_name["configmap resolvers/resolvers-feature-flags"]
    info = by_name["configmap tekton-pipelines/pipelines-info"]  # Tekton's version (controller.compat): not required either
    starts = by_name["configmap egress-placer/egress-placer-budget-starts"]  # the budgets' starts: not required either
    assert not rules.required and not flags.required and not info.required and not starts.required
    assert all(i.required for i in informers if i not in (rules, flags, info, starts))
    assert "not read yet" in sink.tekton.cluster_resolver.unknown()

    rules.on_error(ApiException(status=403, reason="Forbidden"))
    assert "cluster-resolver-config unreadable: HTTP 403 Forbidden" in sink.tekton.cluster_resolver.unknown()
    rules.on_replace([{"data": {"blocked-namespaces": "shared"}}])
    flags.on_replace([])
    assert "resolvers-feature-flags not found" in sink.tekton.cluster_resolver.unknown()
    flags.on_event("ADDED", {"data": {"enable-cluster-resolver": "true"}})
    assert sink.tekton.cluster_resolver == ResolverConfig({"blocked-namespaces": "shared"}, {"enable-cluster-resolver": "true"})
    assert target({"kind": "task", "name": "t", "namespace": "shared"}, sink.tekton.cluster_resolver) == (
        "Tekton's cluster resolver refuses it: access to namespace shared is blocked (cluster-resolver-config blocked-namespaces)")
    rules.on_event("DELETED", {"data": {}})
    assert "cluster-resolver-config not found" in sink.tekton.cluster_resolver.unknown()


def test_explain_follows_tekton_s_shipped_rules_or_those_in_its_input() -> None:
    from controller.cli.explain import explain_documents, read_documents
    from controller.core.policy import load_policy

    policy = load_policy("apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\n"
                         "pools: [{name: overseas, nodes: [e1], images: ['secret.example.com/*']}]\n")
    manifests = yaml.safe_dump_all([SHARED_TASK, run("TaskRun", cluster_ref("upload"))])
    shipped = explain_documents(policy, read_documents(manifests, "m.yaml"))
    assert [line["images"] for line in shipped] == [["secret.example.com/upload:1"]]
    blocking = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cluster-resolver-config"},
                "data": {"blocked-namespaces": "shared"}}
    blocked = explain_documents(policy, read_documents(manifests + "---\n" + yaml.safe_dump(blocking), "m.yaml"))
    assert [line["images"] for line in blocked] == [[]]


def test_a_tenant_s_long_namespace_is_cut_short_in_the_reason() -> None:
    refused = namespace_refusal("n" * 100_000, {"allowed-namespaces": "shared"})
    assert refused.startswith("access to namespace " + "n" * 80 + "...") and len(refused) < 200
