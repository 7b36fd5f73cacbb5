"""The placement decision: each rule in its order (opt-out, opt-in, image match, namespace access,
unresolved, no match), its message, and properties that must hold for any input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.decide import decide
from controller.core.model import PLACEMENT_ANNOTATION, Decision, ImageSet, NamespaceState, Reason
from controller.core.policy import PlacementPolicy

POLICY = PlacementPolicy.model_validate(
    {
        "apiVersion": "egress-placer.io/v1alpha1",
        "kind": "PlacementPolicy",
        "pools": [
            {"name": "overseas", "nodes": ["n1"], "images": ["*/cdn-*"], "namespaces": ["team-cdn"]},
            {"name": "wide", "nodes": ["n2"], "images": ["*/cdn-*", "ghcr.io/acme/*"], "namespaces": ["team-*"]},
            {"name": "quiet", "nodes": ["n3"], "namespaces": ["research"]},
        ],
    }
)
CDN = ImageSet(images=("alpine:3", "registry.example.com/cdn-uploader:1.2"))
ACME = ImageSet(images=("ghcr.io/acme/tool:1",))
PLAIN = ImageSet(images=("alpine:3",))
PARTIAL = ImageSet(images=("alpine:3",), unresolved=("step build: param IMAGE has no value",))


def opt(value: str) -> dict[str, str]:
    return {PLACEMENT_ANNOTATION: value}


@pytest.mark.parametrize(
    ("namespace", "annotations", "images", "pool", "reason"),
    [
        # 1. opt-out wins over everything
        ("team-cdn", opt("none"), CDN, None, Reason.OPT_OUT),
        ("team-cdn", opt("  none "), CDN, None, Reason.OPT_OUT),
        # 2. opt-in
        ("research", opt("quiet"), PLAIN, "quiet", Reason.OPT_IN),
        ("research", opt(" quiet\n"), PARTIAL, "quiet", Reason.OPT_IN),
        ("team-cdn", opt("quiet"), CDN, None, Reason.NAMESPACE_NOT_ALLOWED),
        ("team-cdn", opt("mars"), CDN, None, Reason.UNKNOWN_POOL),
        ("team-cdn", opt("None"), CDN, None, Reason.UNKNOWN_POOL),  # case-sensitive
        ("team-cdn", opt("Overseas"), CDN, None, Reason.UNKNOWN_POOL),
        ("team-cdn", opt("wide"), PLAIN, "wide", Reason.OPT_IN),  # opt-in needs no matching image
        # 3. images, first pool in file order that matches and allows the namespace
        ("team-cdn", {}, CDN, "overseas", Reason.IMAGE_MATCH),
        ("team-cdn", opt("auto"), CDN, "overseas", Reason.IMAGE_MATCH),
        ("team-cdn", opt(" auto "), CDN, "overseas", Reason.IMAGE_MATCH),
        ("team-cdn", opt(""), CDN, "overseas", Reason.IMAGE_MATCH),
        ("team-web", {}, CDN, "wide", Reason.IMAGE_MATCH),  # overseas refuses team-web, wide takes it
        ("team-web", {}, ACME, "wide", Reason.IMAGE_MATCH),
        ("team-cdn", {}, ImageSet(images=CDN.images, unresolved=PARTIAL.unresolved), "overseas", Reason.IMAGE_MATCH),
        ("research", {}, CDN, None, Reason.NAMESPACE_NOT_ALLOWED),
        ("research", {}, ImageSet(images=CDN.images, unresolved=PARTIAL.unresolved), None, Reason.NAMESPACE_NOT_ALLOWED),
        ("team-cdn", {}, PARTIAL, None, Reason.UNRESOLVED),
        ("team-cdn", {}, ImageSet(unresolved=("Task ci/x not found",)), None, Reason.UNRESOLVED),
        ("team-cdn", {}, PLAIN, None, Reason.NO_MATCH),
        ("team-cdn", {}, ImageSet(), None, Reason.NO_MATCH),
        ("team-cdn", {"other": "x"}, PLAIN, None, Reason.NO_MATCH),
    ],
)
def test_decision_rules(namespace: str, annotations: dict[str, str], images: ImageSet, pool: str | None, reason: Reason) -> None:
    decision = decide(POLICY, NamespaceState(namespace), annotations, images)
    assert (decision.pool, decision.reason) == (pool, reason)
    assert decision.placed is (pool is not None)
    assert decision.images == images.images and decision.unresolved == images.unresolved


def test_namespace_access_by_label_and_annotation() -> None:
    policy = PlacementPolicy.model_validate(
        {"apiVersion": "egress-placer.io/v1alpha1", "kind": "PlacementPolicy",
         "pools": [{"name": "p", "nodes": ["n"], "images": ["x*"], "namespaceSelector": {"matchLabels": {"egress": "yes"}}}]}
    )
    x = ImageSet(images=("x:1",))
    assert decide(policy, NamespaceState("a", labels={"egress": "yes"}), {}, x).pool == "p"
    assert decide(policy, NamespaceState("a", annotations={"egress-placer.io/pools": "q, p"}), {}, x).pool == "p"
    assert decide(policy, NamespaceState("a"), {}, x).reason is Reason.NAMESPACE_NOT_ALLOWED


@pytest.mark.parametrize(
    ("namespace", "annotations", "images", "message"),
    [
        ("team-cdn", opt("none"), CDN, "Not placed: the run opts out with egress-placer.io/placement=none."),
        ("team-cdn", opt("mars"), CDN, "Not placed: egress-placer.io/placement names pool 'mars', which the policy does not define."),
        ("team-cdn", opt("quiet"), CDN,
         "Not placed: namespace 'team-cdn' may not use pool 'quiet' named by egress-placer.io/placement."),
        ("research", opt("quiet"), CDN, "Placed in pool 'quiet': the run asks for it with egress-placer.io/placement."),
        ("team-cdn", {}, CDN, "Placed in pool 'overseas': image 'registry.example.com/cdn-uploader:1.2' matches its image globs."),
        ("research", {}, CDN, "Not placed: images match pools 'overseas', 'wide', but namespace 'research' may not use them."),
        ("research", {}, ACME, "Not placed: images match pool 'wide', but namespace 'research' may not use it."),
        ("team-cdn", {}, PARTIAL,
         "Not placed: no known image matches a pool and 1 image(s) cannot be known yet (step build: param IMAGE has no value)."),
        ("team-cdn", {}, PLAIN, "Not placed: no image of the run matches a pool."),
    ],
)
def test_messages_are_one_sentence(namespace: str, annotations: dict[str, str], images: ImageSet, message: str) -> None:
    assert decide(POLICY, NamespaceState(namespace), annotations, images).message == message


@pytest.mark.parametrize("annotations", [None, {PLACEMENT_ANNOTATION: 3}, {PLACEMENT_ANNOTATION: None}, {PLACEMENT_ANNOTATION: ["x"]}])
def test_odd_annotations_are_ignored_not_fatal(annotations: Any) -> None:
    assert decide(POLICY, NamespaceState("team-cdn"), annotations, CDN).reason is Reason.IMAGE_MATCH


def test_an_empty_policy_places_nothing() -> None:
    empty = PlacementPolicy.model_validate({"apiVersion": "egress-placer.io/v1alpha1", "kind": "PlacementPolicy"})
    assert decide(empty, NamespaceState("a"), {}, CDN).reason is Reason.NO_MATCH
    assert decide(empty, NamespaceState("a"), opt("overseas"), CDN).reason is Reason.UNKNOWN_POOL


# -- properties -----------------------------------------------------------------------------------

label_text = st.sampled_from(["team-cdn", "team-web", "research", "other", "egress", "yes", ""])
image_text = st.sampled_from(
    ["alpine:3", "registry.example.com/cdn-uploader:1.2", "ghcr.io/acme/tool:1", "ghcr.io/other:1", "x/cdn-y", ""]
)
annotation_values = st.sampled_from(["none", "auto", "overseas", "wide", "quiet", "mars", " none ", "", "Auto"])
namespaces = st.builds(
    NamespaceState,
    name=st.sampled_from(["team-cdn", "team-web", "research", "other"]),
    labels=st.dictionaries(label_text, label_text, max_size=3),
    annotations=st.dictionaries(st.sampled_from(["egress-placer.io/pools", "a", "b"]), st.sampled_from(["wide", "quiet, overseas", ""]), max_size=2),
)
image_sets = st.builds(
    lambda images, unresolved: ImageSet(images=tuple(sorted(set(images))), unresolved=tuple(unresolved)),
    st.lists(image_text, max_size=4),
    st.lists(st.sampled_from(["step a: param X has no value", "Task ci/x not found"]), max_size=2),
)
run_annotations = st.dictionaries(st.sampled_from([PLACEMENT_ANNOTATION, "a", "b", "c"]), annotation_values, max_size=4)


def reordered(mapping: dict[str, str]) -> dict[str, str]:
    return dict(reversed(list(mapping.items())))


@settings(deadline=None)
@given(namespaces, run_annotations, image_sets)
def test_same_inputs_same_decision_whatever_the_order_of_labels_and_annotations(
    namespace: NamespaceState, annotations: dict[str, str], images: ImageSet
) -> None:
    first: Decision = decide(POLICY, namespace, annotations, images)
    again = decide(
        POLICY,
        NamespaceState(namespace.name, labels=reordered(dict(namespace.labels)), annotations=reordered(dict(namespace.annotations))),
        reordered(annotations),
        images,
    )
    assert first == again == decide(POLICY, namespace, annotations, images)


@settings(deadline=None)
@given(namespaces, run_annotations, image_sets)
def test_opt_out_always_wins(namespace: NamespaceState, annotations: dict[str, str], images: ImageSet) -> None:
    decision = decide(POLICY, namespace, {**annotations, PLACEMENT_ANNOTATION: "none"}, images)
    assert decision.reason is Reason.OPT_OUT and decision.pool is None


@settings(deadline=None)
@given(namespaces, st.sampled_from([{}, opt("auto"), opt(""), {"a": "overseas"}]), st.lists(st.sampled_from(["alpine:3", "ghcr.io/other:1", "busybox"]), max_size=4))
def test_complete_images_that_match_no_pool_are_never_placed(namespace: NamespaceState, annotations: dict[str, str], images: list[str]) -> None:
    decision = decide(POLICY, namespace, annotations, ImageSet(images=tuple(sorted(set(images)))))
    assert decision.pool is None and decision.reason is Reason.NO_MATCH


@settings(deadline=None)
@given(namespaces, run_annotations, image_sets)
def test_a_placed_run_is_always_in_a_pool_its_namespace_may_use(
    namespace: NamespaceState, annotations: dict[str, str], images: ImageSet
) -> None:
    decision = decide(POLICY, namespace, annotations, images)
    if decision.pool is not None:
        pool = POLICY.pool(decision.pool)
        assert pool is not None and pool.allows(namespace)
        if decision.reason is Reason.IMAGE_MATCH:
            assert any(pool.matches_image(i) for i in images.images)
    assert decision.message.endswith(".") and "\n" not in decision.message
