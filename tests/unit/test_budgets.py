"""Egress budgets, the pure rule (controller/budgets/core.py, docs/budgets.md): what a run touches, the
counts, the nodes with room, the verdict and its reason; then a tenant's moves at the core."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.budgets.core import (
    PER_ADDRESS,
    PER_POOL,
    PER_WINDOW,
    Destination,
    EgressAddress,
    PoolBudgets,
    RunFacts,
    Start,
    Use,
    address_of,
    admit,
    figures,
    match,
    nodes_with_room,
    read_record,
    record_annotation,
    release,
    span,
    taskrun_facts,
    trusted_use,
    url_host,
    verdict,
)

NOW = 1_800_000_000.0


def dest(**kw: object) -> Destination:
    data = {"name": "dockerhub-pulls", "match": {"images": ["docker.io/*"]}, "maxConcurrentPerAddress": 2}
    data.update(kw)
    return Destination.model_validate(data)


# Two nodes behind one NAT address, a third on its own (the issue's cluster test, at the core).
ADDRESSES = {"egress-1": "203.0.113.7", "egress-2": "203.0.113.7", "egress-3": "egress-3"}


def pool(*destinations: Destination, uses: tuple[Use, ...] = (), starts: tuple[Start, ...] = ()) -> PoolBudgets:
    return PoolBudgets("overseas", destinations, ADDRESSES, uses, starts)


# -- matching ---------------------------------------------------------------------------------------


MATCH_TABLE = [
    # (match, facts, expected why or "")
    ({"images": ["docker.io/*"]}, RunFacts(images=("docker.io/library/alpine:3",)), "image docker.io/library/alpine:3"),
    ({"images": ["docker.io/*"]}, RunFacts(images=("ghcr.io/x/y",)), ""),
    ({"tasks": ["kaniko-*"]}, RunFacts(tasks=("kaniko-build",)), "task kaniko-build"),
    ({"tasks": ["kaniko-*"]}, RunFacts(tasks=("buildah",)), ""),
    ({"urlParams": [{"param": "url", "hosts": ["*.docker.io"]}]}, RunFacts(params={"url": "https://registry-1.docker.io/v2/"}),
     "param url (host registry-1.docker.io)"),
    ({"urlParams": [{"param": "url", "hosts": ["*.docker.io"]}]}, RunFacts(params={"url": "registry-1.DOCKER.io:443/library"}),
     "param url (host registry-1.docker.io)"),
    ({"urlParams": [{"param": "url", "hosts": ["*.docker.io"]}]}, RunFacts(params={"url": "https://evil.example/?x=a.docker.io"}), ""),
    ({"urlParams": [{"param": "url", "hosts": ["*.docker.io"]}]}, RunFacts(params={"other": "https://a.docker.io"}), ""),
    ({"urlParams": [{"param": "url", "hosts": ["cdn.example.com"]}]}, RunFacts(params={"url": "https://user@cdn.example.com/up"}),
     "param url (host cdn.example.com)"),
]


@pytest.mark.parametrize("spec,facts,why", MATCH_TABLE)
def test_a_run_touches_a_destination_by_image_task_or_url_param(spec: dict, facts: RunFacts, why: str) -> None:
    touched = match([dest(match=spec)], facts)
    assert [t.why for t in touched] == ([why] if why else [])


def test_every_destination_a_run_matches_applies_in_policy_order() -> None:
    a, b, c = dest(name="a"), dest(name="b", match={"tasks": ["t"]}), dest(name="c", match={"tasks": ["nope"]})
    assert [t.destination for t in match([a, b, c], RunFacts(images=("docker.io/x",), tasks=("t",)))] == ["a", "b"]


@pytest.mark.parametrize("value,host", [("https://a.b/c", "a.b"), ("a.b/c", "a.b"), ("A.B:5000", "a.b"), ("", None), ("http://[::1", None)])
def test_url_host(value: str, host: str | None) -> None:
    assert url_host(value) == host


def test_taskrun_facts_read_the_task_name_and_string_params() -> None:
    run = {"spec": {"taskRef": {"name": "kaniko"}, "params": [{"name": "url", "value": "https://x"}, {"name": "list", "value": ["a"]}]}}
    assert taskrun_facts(run, ["img"]) == RunFacts(("img",), ("kaniko",), {"url": "https://x"})
    assert taskrun_facts({"spec": {"taskSpec": {}}}, []) == RunFacts()


@pytest.mark.parametrize(
    "labels,annotations,setting,expected",
    [
        ({}, {}, None, "egress-1"),
        ({"nat": "203.0.113.7"}, {}, EgressAddress(label="nat"), "203.0.113.7"),
        ({}, {"nat": "203.0.113.8"}, EgressAddress(annotation="nat"), "203.0.113.8"),
        ({}, {}, EgressAddress(label="nat"), "egress-1"),  # a node without it is its own address
        ({"nat": "  "}, {}, EgressAddress(label="nat"), "egress-1"),
    ],
)
def test_a_nodes_egress_address(labels: dict, annotations: dict, setting: EgressAddress | None, expected: str) -> None:
    assert address_of("egress-1", labels, annotations, setting) == expected


# -- counting and room --------------------------------------------------------------------------------


def test_two_nodes_behind_one_address_share_its_budget() -> None:
    d = dest()
    budgets = pool(d, uses=(Use("p1", "egress-1", frozenset({d.name})), Use("p2", "egress-2", frozenset({d.name}))))
    assert nodes_with_room(budgets, [d.name], NOW) == ("egress-3",)
    assert nodes_with_room(budgets, [], NOW) == ("egress-1", "egress-2", "egress-3")  # a run touching none
    assert nodes_with_room(budgets, ["gone-from-policy"], NOW) == ("egress-1", "egress-2", "egress-3")


def test_the_pool_budget_counts_every_node() -> None:
    d = dest(maxConcurrentPerAddress=None, maxConcurrentPerPool=2)
    budgets = pool(d, uses=(Use("p1", "egress-1", frozenset({d.name})), Use("p2", "egress-3", frozenset({d.name}))))
    v = verdict(budgets, [d.name], NOW)
    assert v.hold and v.nodes == ()
    assert v.reason == "waiting for budget dockerhub-pulls on pool overseas: 2 of 2 at once"


def test_the_window_reason_names_the_address_and_the_next_slot() -> None:
    d = dest(maxConcurrentPerAddress=None, maxStartsPerWindowPerAddress=10, windowSeconds=3600)
    starts = tuple(Start(d.name, "203.0.113.7", NOW - 3600 + 7 * 60 + i) for i in range(10))
    starts += tuple(Start(d.name, "egress-3", NOW - 60) for _ in range(10))
    budgets = pool(d, starts=starts)
    v = verdict(budgets, [d.name], NOW)
    assert v.hold
    assert v.reason == "waiting for budget dockerhub-pulls on 203.0.113.7: 10 of 10 in the last hour, next slot in 7 min"
    assert verdict(budgets, [d.name], NOW + 7 * 60 + 1).nodes == ("egress-1", "egress-2")
    [f] = figures(budgets, d, "203.0.113.7", NOW)
    assert (f.budget, f.used, f.limit) == (PER_WINDOW, 10, 10)


def test_starts_outside_the_window_do_not_count() -> None:
    d = dest(maxConcurrentPerAddress=None, maxStartsPerWindowPerAddress=1, windowSeconds=60)
    budgets = pool(d, starts=(Start(d.name, "egress-3", NOW - 60), Start(d.name, "203.0.113.7", NOW - 59)))
    assert nodes_with_room(budgets, [d.name], NOW) == ("egress-3",)


def test_report_only_counts_and_reports_but_never_holds() -> None:
    d = dest(mode="ReportOnly", maxConcurrentPerAddress=1)
    uses = tuple(Use(f"p{i}", n, frozenset({d.name})) for i, n in enumerate(ADDRESSES))
    v = verdict(pool(d, uses=uses), [d.name], NOW)
    assert not v.hold and v.nodes == tuple(sorted(ADDRESSES))
    assert v.reported == ("would have waited for budget dockerhub-pulls on 203.0.113.7: 2 of 1 at once",)


@pytest.mark.parametrize("seconds,text", [(0, "0 s"), (59.2, "1 min"), (12.1, "13 s"), (61, "2 min"), (3600, "1 h"), (3660, "1 h 1 min"), (90000, "1 d 1 h")])
def test_span(seconds: float, text: str) -> None:
    assert span(seconds) == text


def test_every_budget_figure_of_a_destination() -> None:
    d = dest(maxConcurrentPerPool=5, maxStartsPerWindowPerAddress=3, windowSeconds=60)
    budgets = admit(pool(d), "p1", "egress-1", [d.name], NOW)
    assert [(f.budget, f.address, f.used) for f in figures(budgets, d, "203.0.113.7", NOW)] == [
        (PER_POOL, "", 1), (PER_ADDRESS, "203.0.113.7", 1), (PER_WINDOW, "203.0.113.7", 1)]


# -- properties ----------------------------------------------------------------------------------------

STEPS = st.lists(st.tuples(st.sampled_from(["admit", "release", "tick"]), st.integers(0, 30), st.integers(0, 90)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(STEPS, st.integers(1, 3))
def test_never_more_than_n_at_once_behind_an_address(steps: list, n: int) -> None:
    """Admitting only on nodes_with_room, no address ever has more than N at once, whatever the order of
    admits and releases."""
    d = dest(maxConcurrentPerAddress=n)
    budgets, now = pool(d), NOW
    for what, i, dt in steps:
        if what == "admit":
            nodes = nodes_with_room(budgets, [d.name], now)
            if nodes:
                budgets = admit(budgets, f"p{i}-{now}", nodes[i % len(nodes)], [d.name], now)
        elif what == "release" and budgets.uses:
            budgets = release(budgets, budgets.uses[i % len(budgets.uses)].key)
        else:
            now += dt
        for address in set(ADDRESSES.values()):
            assert sum(1 for u in budgets.uses if ADDRESSES[u.node] == address) <= n


@settings(max_examples=300, deadline=None)
@given(STEPS, st.integers(1, 4), st.integers(10, 120))
def test_never_more_than_n_starts_in_any_window_behind_an_address(steps: list, n: int, window: int) -> None:
    d = dest(maxConcurrentPerAddress=None, maxStartsPerWindowPerAddress=n, windowSeconds=window)
    budgets, now = pool(d), NOW
    for what, i, dt in steps:
        if what == "admit":
            nodes = nodes_with_room(budgets, [d.name], now)
            if nodes:
                budgets = admit(budgets, f"p{i}-{now}", nodes[i % len(nodes)], [d.name], now)
        elif what == "release" and budgets.uses:
            budgets = release(budgets, budgets.uses[i % len(budgets.uses)].key)  # a release frees no start
        else:
            now += dt
    times = sorted((s.address, s.time) for s in budgets.starts)
    for address, t in times:
        assert sum(1 for a, u in times if a == address and t - window < u <= t) <= n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(sorted(ADDRESSES)), max_size=12), st.integers(1, 3))
def test_report_only_never_holds(nodes: list, n: int) -> None:
    d = dest(mode="ReportOnly", maxConcurrentPerAddress=n, maxConcurrentPerPool=n, maxStartsPerWindowPerAddress=n, windowSeconds=60)
    budgets = pool(d)
    for i, node in enumerate(nodes):
        budgets = admit(budgets, f"p{i}", node, [d.name], NOW)
        v = verdict(budgets, [d.name], NOW)
        assert not v.hold and v.nodes == tuple(sorted(ADDRESSES))


# -- a tenant's moves (docs/budgets.md), written before the rule ----------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=4), st.dictionaries(st.text(max_size=8), st.text(max_size=30), max_size=4))
def test_a_tenant_chooses_what_its_run_touches_never_another_runs_count(tasks: list, params: dict) -> None:
    """Whatever a run's Task names and params say, the figures of the runs already counted stay as they
    were: matching only says which budgets the new run meets."""
    d = dest(match={"tasks": ["kaniko*"], "urlParams": [{"param": "url", "hosts": ["*.docker.io"]}]})
    budgets = pool(d, uses=(Use("p1", "egress-1", frozenset({d.name})),))
    before = figures(budgets, d, "203.0.113.7", NOW)
    match([d], RunFacts(tasks=tuple(tasks), params=params))
    assert figures(budgets, d, "203.0.113.7", NOW) == before


def test_a_forged_record_on_a_pod_that_is_no_runs_pod_counts_for_nothing() -> None:
    record = read_record(record_annotation("overseas", ["dockerhub-pulls"], "egress-3", NOW))
    assert trusted_use("uid-1", record, run_pod=False, pool="overseas", bound_node="egress-3", known=["dockerhub-pulls"]) is None


def test_the_bound_node_counts_not_the_node_a_record_names() -> None:
    record = read_record(record_annotation("overseas", ["dockerhub-pulls"], "egress-3", NOW))
    use = trusted_use("uid-1", record, run_pod=True, pool="overseas", bound_node="egress-1", known=["dockerhub-pulls"])
    assert use is not None and use.node == "egress-1"


def test_made_up_destination_names_in_a_record_are_dropped() -> None:
    record = read_record(record_annotation("overseas", ["dockerhub-pulls", "made-up"], "egress-3", NOW))
    use = trusted_use("uid-1", record, run_pod=True, pool="overseas", bound_node=None, known=["dockerhub-pulls"])
    assert use is not None and use.destinations == frozenset({"dockerhub-pulls"})
    assert trusted_use("uid-2", read_record(record_annotation("overseas", ["made-up"], "n", NOW)), True, "overseas", None, ["x"]) is None


def test_a_record_of_another_pool_is_not_this_pools_use() -> None:
    record = read_record(record_annotation("elsewhere", ["dockerhub-pulls"], "egress-3", NOW))
    assert trusted_use("uid-1", record, True, "overseas", "egress-3", ["dockerhub-pulls"]) is None


@pytest.mark.parametrize("value", [None, "", "x", "[]", '{"pool":1}', '{"pool":"p","destinations":"d","node":"n","time":1}',
                                   '{"pool":"p","destinations":[],"node":"n","time":true}', '{"pool":"p","destinations":[],"node":"n","time":NaN}',
                                   "[" * 100_000])
def test_a_record_that_is_not_ours_reads_as_none(value: object) -> None:
    assert read_record(value) is None


def test_a_run_cannot_touch_a_budget_of_another_pool_or_invent_one() -> None:
    """Verdicts read only the pool's own destinations: a name the run brings is no budget."""
    d = dest(maxConcurrentPerAddress=1)
    full = pool(d, uses=tuple(Use(f"p{i}", n, frozenset({d.name})) for i, n in enumerate(ADDRESSES)))
    assert not verdict(full, ["invented"], NOW).hold
    assert verdict(full, [d.name], NOW).hold


# -- the policy's part ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"match": {}}, "needs images, tasks or urlParams"),
        ({"maxConcurrentPerAddress": None}, "needs a budget"),
        ({"maxStartsPerWindowPerAddress": 5}, "go together"),
        ({"windowSeconds": 60}, "go together"),
        ({"name": "Docker_Hub"}, "DNS-1123"),
        ({"maxConcurrentPerAddress": 0}, "greater than 0"),
        ({"mode": "Sometimes"}, "Enforce"),
    ],
)
def test_a_bad_destination_is_refused_with_a_clear_error(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dest(**spec)


def test_egress_address_needs_one_of_label_and_annotation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        EgressAddress()
    with pytest.raises(ValueError, match="exactly one"):
        EgressAddress(label="a", annotation="b")


def test_a_policy_with_destinations_loads_and_its_errors_name_the_line_and_field() -> None:
    from controller.core.policy import PolicyError, load_policy

    text = """\
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodes: [egress-1]
    egressAddress: {label: egress-placer.io/egress-address}
    destinations:
      - name: dockerhub-pulls
        match: {images: ["docker.io/*"]}
        maxStartsPerWindowPerAddress: 100
        windowSeconds: 21600
      - name: cdn-uploads
        match: {images: ["*/cdn-*"]}
        maxConcurrentPerAddress: 2
        mode: ReportOnly
"""
    policy = load_policy(text, "p.yaml")
    pool_ = policy.pools[0]
    assert [d.name for d in pool_.destinations] == ["dockerhub-pulls", "cdn-uploads"]
    assert pool_.egress_address == EgressAddress(label="egress-placer.io/egress-address")
    with pytest.raises(PolicyError, match=r"p.yaml:8: pools\[0\].destinations\[0\]: .*go together"):
        load_policy(text.replace("        windowSeconds: 21600\n", ""), "p.yaml")
    with pytest.raises(PolicyError, match=r"pools\[0\].destinations: .*already used by destinations\[0\]"):
        load_policy(text.replace("cdn-uploads", "dockerhub-pulls"), "p.yaml")


def test_narrow_keeps_every_required_term_off_the_full_nodes_once() -> None:
    from controller.budgets.core import full_nodes, narrow

    d = dest(maxConcurrentPerAddress=1)
    budgets = pool(d, uses=(Use("p1", "egress-1", frozenset({d.name})),))
    full = full_nodes(budgets, [d.name], NOW)
    assert full == ("egress-1", "egress-2")
    term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["overseas"]}]}
    template = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term, dict(term)]}}}}
    narrowed = narrow(template, full)
    terms = narrowed["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    not_in = [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in full]
    assert terms == [{**term, "matchFields": not_in}] * 2
    assert narrow(narrowed, full) == narrowed  # idempotent (the webhook may be called again)
    assert narrow({}, ["n"])["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n"]}]}]}
    assert narrow(template, []) == template


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["dockerhub-pulls", "cdn"]), max_size=12), st.integers(0, 4), st.integers(1, 3))
def test_releases_never_overfill_a_budget_counting_the_runs_in_flight(touching: list, flying: int, n: int) -> None:
    """Releasing `release_within` then placing each on a node with room never puts more than N behind
    an address, the runs released before (in flight) counted."""
    from controller.budgets.core import release_within

    a, b = dest(maxConcurrentPerAddress=n), dest(name="cdn", match={"tasks": ["t"]}, maxConcurrentPerPool=n)
    budgets = pool(a, b)
    in_flight = [("dockerhub-pulls",)] * flying
    keys = release_within(budgets, list(enumerate((t,) for t in touching)), in_flight, NOW)
    picture = budgets
    for i, touched in enumerate([*in_flight, *[(touching[k],) for k in keys]]):
        nodes = nodes_with_room(picture, touched, NOW)
        if i >= flying:
            assert nodes  # every run released finds room
        if nodes:
            picture = admit(picture, f"p{i}", nodes[0], touched, NOW)
    counts = {}
    for u in picture.uses:
        if "dockerhub-pulls" in u.destinations:
            counts[ADDRESSES[u.node]] = counts.get(ADDRESSES[u.node], 0) + 1
    assert all(c <= n for c in counts.values()) or flying > 2 * n  # the runs in flight alone may already overfill
    assert sum(1 for k in keys if touching[k] == "cdn") <= n


def test_each_release_names_the_address_it_was_counted_behind_and_runs_in_flight_count_behind_theirs() -> None:
    """`release_to`: 1 at once per address; a run in flight released to egress-3 takes egress-3's room
    (not the shared address's, the first with room): the one waiting run goes behind 203.0.113.7, and
    says so. With no address, the run in flight takes the first room, and the waiting run egress-3."""
    from controller.budgets.core import release_to

    budgets = pool(dest(maxConcurrentPerAddress=1))
    assert release_to(budgets, [("w", ("dockerhub-pulls",))], [(("dockerhub-pulls",), "egress-3")], NOW) == {"w": "203.0.113.7"}
    assert release_to(budgets, [("w", ("dockerhub-pulls",))], [(("dockerhub-pulls",), "")], NOW) == {"w": "egress-3"}
    assert release_to(budgets, [("w", ("dockerhub-pulls",)), ("x", ("dockerhub-pulls",)), ("y", ("dockerhub-pulls",))], [], NOW) == {
        "w": "203.0.113.7", "x": "egress-3"}


@pytest.mark.parametrize("touched, in_flight, expected", [
    ((), [], ""),  # touches no destination: released, to no address
    (("gone-from-the-policy",), [], ""),  # only names no longer in the policy: no budget, no address
    ((), [(("dockerhub-pulls",), "egress-3"), ((), "")], ""),  # runs in flight change nothing for it
    (("dockerhub-pulls",), [((), ""), ((), "egress-3")], "203.0.113.7"),  # untouched runs in flight take no room
    (("dockerhub-pulls",), [(("dockerhub-pulls",), "")], "egress-3"),
])
def test_a_run_touching_no_destination_is_released_to_no_address(touched: tuple[str, ...], in_flight: list, expected: str) -> None:
    """Issue #26 ("runs that touch no destination are not slowed"): `release_to` gives such a run no
    address, so the release writes nothing on it beyond clearing its pending status, as on a pool without
    budgets; nor does it, waiting or in flight, take room from the runs that do touch one."""
    from controller.budgets.core import release_to

    budgets = pool(dest(maxConcurrentPerAddress=1))
    assert release_to(budgets, [("w", touched)], in_flight, NOW) == {"w": expected}
