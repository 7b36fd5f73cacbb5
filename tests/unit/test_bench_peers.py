"""The floor and the peer of the benchmarks (bench/floor.py, bench/kyverno.py, bench/e2e.py): the order of
the mode blocks, the floor ratio, the floor's copy of egress-placer's webhook configuration, and Kyverno's
ClusterPolicy for a pool of the bench policy."""

from __future__ import annotations

import base64
import re
from collections import Counter
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from bench.cluster import TASK_IMAGE_GLOB, policy_text
from bench.e2e import KYVERNO, MODES, Run, block_order, run_name, summarize
from bench.floor import PATCH_FLOOR, SUFFIX, floor_configuration
from bench.kyverno import SWITCH_LABEL, bench_pool, cluster_policy, config_map
from controller.core.patches import pool_terms
from devplacer.local_placer import K8S_DIR


@pytest.mark.parametrize(
    ("blocks", "modes", "expected"),
    [
        (2, ("with", "without"), ["with", "without", "without", "with"]),  # the ABBA of two modes
        (2, MODES, ["with", "without", "floor", "floor_patch", "floor_patch", "floor", "without", "with"]),
        (1, ("with", "without", "floor", "kyverno"), ["with", "without", "floor", "kyverno"]),
    ],
)
def test_block_order_mirrors_each_round(blocks: int, modes: tuple[str, ...], expected: list[str]) -> None:
    assert block_order(blocks, modes) == expected


@given(st.integers(min_value=1, max_value=8), st.permutations(["with", "without", "floor", "kyverno"]))
def test_every_mode_gets_the_same_blocks_and_the_same_mean_position(blocks: int, modes: list[str]) -> None:
    order = block_order(blocks, tuple(modes))
    assert Counter(order) == {m: blocks for m in modes}
    if blocks % 2 == 0:  # whole mirrored pairs: drift over the run weighs on every mode alike
        positions = {m: sum(i for i, x in enumerate(order) if x == m) for m in modes}
        assert len(set(positions.values())) == 1


def test_every_modes_run_names_are_dns_subdomains() -> None:
    for mode in (*MODES, KYVERNO):
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", run_name(mode, 7, 12)), mode
    assert run_name("floor_patch", 3, 0) == "floor-patch-3-000"


def _runs(p50s: dict[str, float]) -> dict[str, Run]:
    """One run per mode whose latency (sent to bound) is the given seconds."""
    return {mode: Run(mode, sent=0.0, created=0.01, webhook_answered=mode == "with", pod_seen=0.02, bound=s)
            for mode, s in p50s.items()}


@pytest.mark.parametrize(
    ("p50s", "added", "floor_added", "floor_ratio"),
    [
        ({"with": 0.060, "without": 0.040, "floor": 0.050}, 20.0, 10.0, 2.0),
        ({"with": 0.052, "without": 0.040, "floor": 0.050}, 12.0, 10.0, 1.2),
        ({"with": 0.060, "without": 0.040, "floor": 0.040}, 20.0, 0.0, None),  # the floor added nothing measurable
        ({"with": 0.060, "without": 0.040, "floor": 0.038}, 20.0, -2.0, None),  # noise: below the baseline
    ],
)
def test_floor_ratio_is_added_p50_over_the_floors(p50s: dict[str, float], added: float, floor_added: float,
                                                  floor_ratio: float | None) -> None:
    calls = {"taskruns": [0.012, 2.0], "pods": [0.008, 2.0]}  # egress-placer's: 6 and 4 ms a call
    handled = {"taskruns": [0.0, 0.0], "pods": [0.0, 0.0]}
    out = summarize(_runs(p50s), calls, handled, None, {"taskruns": [0.004, 2.0], "pods": [0.006, 2.0]}, None,
                    {"taskruns": [0.005, 2.0], "pods": [0.010, 2.0]})
    assert (out["added_p50_ms"], out["floor_added_p50_ms"], out["floor_ratio"]) == (added, floor_added, floor_ratio)
    assert out["floor_webhook_call_ms"] == {"taskruns": 2.0, "pods": 3.0}
    assert out["patch_floor_webhook_call_ms"] == {"taskruns": 2.5, "pods": 5.0}
    assert out["floor_call_ratio"] == 2.0  # (6 + 4) / (2 + 3)
    assert out["floor"]["runs"] == 1 and out["floor"]["webhook_answered"] == 0


def test_call_latency_reads_each_floors_own_blocks() -> None:
    """`call_latency` against the floor, `call_latency_patch_floor` against the patching floor: the same
    "with" blocks over each floor's blocks of the same rounds."""
    ours = [{"taskruns": [0.006, 2.0], "pods": [0.012, 4.0]}] * 2  # 3 ms a call each
    floor = [{"taskruns": [0.002, 2.0], "pods": [0.004, 4.0]}] * 2  # 1 ms
    patching = [{"taskruns": [0.003, 2.0], "pods": [0.008, 4.0]}] * 2  # 1.5 and 2 ms
    blocks = {"with": ours, "floor": floor, "floor_patch": patching}
    runs = _runs({"with": 0.06, "without": 0.04, "floor": 0.05, "floor_patch": 0.05})
    out = summarize(runs, {"taskruns": [0.0, 0.0], "pods": [0.0, 0.0]}, {"taskruns": [0.0, 0.0], "pods": [0.0, 0.0]},
                    None, None, blocks)
    assert (out["call_latency"]["taskrun"]["ratio"], out["call_latency"]["pod"]["ratio"]) == (3.0, 3.0)
    latency = out["call_latency_patch_floor"]
    assert (latency["taskrun"]["ratio"], latency["pod"]["ratio"]) == (2.0, 1.5)
    assert latency["pod"]["floor_ms"] == 2.0 and latency["pod"]["blocks"] == latency["pod"]["floor_blocks"] == 2
    assert out["floor_patch"]["runs"] == 1


def _shipped_webhook_configuration() -> dict[str, Any]:
    return yaml.safe_load((K8S_DIR / "webhook.yaml").read_text())


def test_the_floor_is_registered_on_exactly_egress_placers_hooks() -> None:
    ours = _shipped_webhook_configuration()
    floor = floor_configuration(ours, "https://127.0.0.1:4443/mutate", b"CA PEM")
    assert floor["metadata"]["name"] != ours["metadata"]["name"]
    assert [h["name"] for h in floor["webhooks"]] == [h["name"] + SUFFIX for h in ours["webhooks"]]
    for mine, copy in zip(ours["webhooks"], floor["webhooks"]):
        assert copy["clientConfig"] == {"url": "https://127.0.0.1:4443/mutate", "caBundle": base64.b64encode(b"CA PEM").decode()}
        same = {k: v for k, v in mine.items() if k not in ("name", "clientConfig")}
        assert {k: v for k, v in copy.items() if k not in ("name", "clientConfig")} == same
        assert set(same) >= {"rules", "namespaceSelector", "failurePolicy", "timeoutSeconds", "sideEffects"}
    assert any("matchConditions" in h for h in floor["webhooks"])
    assert "url" not in str(ours)  # the copy changed nothing of the original
    patching = floor_configuration(ours, "https://127.0.0.1:4443/mutate", b"CA PEM", PATCH_FLOOR)
    assert patching["metadata"]["name"] not in (ours["metadata"]["name"], floor["metadata"]["name"])
    assert [h["name"] for h in patching["webhooks"]] == [h["name"] + ".floor-patch" for h in ours["webhooks"]]
    assert {h["clientConfig"]["url"] for h in patching["webhooks"]} == {"https://127.0.0.1:4443/mutate/patch"}
    assert [{k: v for k, v in h.items() if k not in ("name", "clientConfig")} for h in patching["webhooks"]] == [
        {k: v for k, v in h.items() if k not in ("name", "clientConfig")} for h in floor["webhooks"]]


def test_kyverno_policy_places_the_pools_images_in_its_namespaces() -> None:
    pool = bench_pool(policy_text({3: ["egress-1", "egress-2", "egress-3"]}), "pool-3")
    policy = cluster_policy(pool)
    rule = policy["spec"]["rules"][0]
    assert policy["spec"]["failurePolicy"] == "Ignore" and policy["spec"]["webhookTimeoutSeconds"] == 3
    assert rule["match"]["any"][0]["resources"] == {"kinds": ["Pod"], "operations": ["CREATE"], "namespaces": ["bench-*-k3"]}
    assert rule["preconditions"]["any"][0]["value"] == [TASK_IMAGE_GLOB]
    patch = yaml.safe_load(rule["mutate"]["patchesJson6902"])
    assert patch == [
        {"op": "add", "path": "/spec/tolerations/-", "value": pool.toleration()},
        {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": pool_terms(pool)}}}},
    ]
    assert [t["matchFields"][0]["values"] for t in pool_terms(pool)] == [["egress-1"], ["egress-2"], ["egress-3"]]


def test_kyverno_webhooks_only_in_namespaces_switched_on() -> None:
    webhooks = yaml.safe_load(config_map()["data"]["webhooks"])
    assert webhooks == {"namespaceSelector": {"matchLabels": {SWITCH_LABEL: "on"}}}
