"""Reliability, a flood of large reviews at the webhook port: FLOOD_CLIENTS clients, each on its own
HTTPS connection, post AdmissionReviews of about 2.9 MiB (just under the 3 MiB limit) straight at the
replica's webhook port, one after the other, for FLOOD_SECONDS: what any in-cluster client can do when no
NetworkPolicy keeps it out (the local cluster has no network plugin). Meanwhile matching TaskRuns are
created in rel-team-cdn through the API server, one every RUN_EVERY_SECONDS, and /healthz and /readyz are
probed.

Checks that the controller stays up and its peak RSS (sampled every 20 ms) stays under the Deployment's
memory limit (k8s/deployment.yaml); that every run created meanwhile was answered by our webhook (its
decision annotation: failurePolicy Ignore would admit it without one) and placed on the pool, its pod
bound to a pool node; that /healthz and /readyz answered 200 to every probe within the probes' 2 s timeout;
that the flood was turned away past the admission slots (503s counted); and that the
controller still answers a review afterwards. The flood's answers (200, 503 turned away, ...) and the
controller's `admission_turned_away_total` are recorded beside the figures.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from devcluster.process import rss_bytes
from tests.e2e.harness import Placer
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL, POOL_NODES, Runs, decision_of, taskrun
from tests.reliability.suite import TEAM_CDN, Figures
from tests.reliability.test_hostile_input import Webhook, review, taskrun_object, webhook  # noqa: F401 - the fixture
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

FLOOD_CLIENTS = 50
FLOOD_SECONDS = 15.0
FLOOD_BODY_BYTES = 3 * 1024 * 1024 - 64 * 1024  # multi-MiB, under the webhook's 3 MiB limit
RUN_EVERY_SECONDS = 1.5  # runs created through the API server during the flood: about 10
PROBE_TIMEOUT_SECONDS = 2.0  # the probes' timeoutSeconds (k8s/deployment.yaml)
# The probes' failureThreshold (k8s/deployment.yaml): the kubelet acts (restart, unready) only on this many failed
# probes in a row. The sampler probes far more often than the kubelet (every 0.5 s, not every 5 or 10 s).
FAILURE_THRESHOLD = {"/healthz": 3, "/readyz": 2}
RSS_SAMPLE_SECONDS = 0.02
PLACED_SECONDS = 120.0
DEPLOYMENT = Path(__file__).resolve().parents[2] / "k8s" / "deployment.yaml"
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def memory_limit_bytes() -> int:
    """The controller container's `limits.memory` in k8s/deployment.yaml."""
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    limit = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    return int(limit[:-2]) * UNITS[limit[-2:]]


def flood_body() -> bytes:
    """A dry-run TaskRun review of FLOOD_BODY_BYTES (a filler annotation), as any client may post it."""
    base = json.dumps(review(taskrun_object("flood", MATCHING_IMAGE, annotations={"filler": ""}), dry_run=True)).encode()
    return base.replace(b'"filler": ""', b'"filler": "' + b"x" * (FLOOD_BODY_BYTES - len(base)) + b'"')


class Flood:
    """FLOOD_CLIENTS threads posting `body` until `stop` is set; the answers' statuses (or error names)."""

    def __init__(self, webhook: Webhook, body: bytes) -> None:
        self.webhook, self.body = webhook, body
        self.stop = threading.Event()
        self.answers: dict[str, int] = {}
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True, name=f"flood-{i}") for i in range(FLOOD_CLIENTS)]

    def _client(self) -> None:
        with requests.Session() as session:
            session.trust_env = False
            session.verify = str(self.webhook.ca_file)
            while not self.stop.is_set():
                try:
                    outcome = str(session.post(self.webhook.url, data=self.body, timeout=30,
                                               headers={"Content-Type": "application/json"}).status_code)
                except requests.RequestException as error:
                    outcome = type(error).__name__
                with self._lock:
                    self.answers[outcome] = self.answers.get(outcome, 0) + 1

    def __enter__(self) -> Flood:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


class Sampler(threading.Thread):
    """Samples the controller's RSS every RSS_SAMPLE_SECONDS and probes /healthz and /readyz every 0.5 s, until
    `stop` is set."""

    def __init__(self, pid: int, health_url: str) -> None:
        super().__init__(daemon=True, name="rss-and-health")
        self.pid, self.health_url = pid, health_url
        self.stop = threading.Event()
        self.peak = 0
        self.health: list[float] = []
        self.health_failures: list[str] = []  # anything but 200 or a probe timeout
        self.timed_out: dict[str, list[bool]] = {path: [] for path in FAILURE_THRESHOLD}  # each probe, in order

    def run(self) -> None:
        next_probe = 0.0
        with requests.Session() as session:
            while not self.stop.wait(RSS_SAMPLE_SECONDS):
                self.peak = max(self.peak, rss_bytes(self.pid))
                if time.monotonic() >= next_probe:
                    next_probe = time.monotonic() + 0.5
                    for path in FAILURE_THRESHOLD:
                        started = time.monotonic()
                        try:  # as the kubelet probes: an answer later than timeoutSeconds is a failed probe
                            status = session.get(self.health_url + path, timeout=PROBE_TIMEOUT_SECONDS).status_code
                            if status != 200:
                                self.health_failures.append(f"{path} {status}")
                            self.timed_out[path].append(False)
                        except requests.Timeout:
                            self.timed_out[path].append(True)
                        except requests.RequestException as error:
                            self.health_failures.append(f"{path} {type(error).__name__}")
                        self.health.append(time.monotonic() - started)

    def most_timed_out_in_a_row(self, path: str) -> int:
        most = run = 0
        for timed_out in self.timed_out[path]:
            run = run + 1 if timed_out else 0
            most = max(most, run)
        return most


def create_paced(runs: Runs, seconds: float) -> dict[str, float]:
    """A matching TaskRun in TEAM_CDN every RUN_EVERY_SECONDS for `seconds`; the seconds each create took, by name."""
    created: dict[str, float] = {}
    deadline = time.monotonic() + seconds
    while (now := time.monotonic()) < deadline:
        name = runs.name(f"flood-{len(created)}")
        runs.create(TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE))
        created[name] = time.monotonic() - now
        pace(now)
    return created


def pace(since: float) -> None:
    """Part of the scenario: runs arrive at a steady pace, one RUN_EVERY_SECONDS after the other."""
    time.sleep(max(0.0, RUN_EVERY_SECONDS - (time.monotonic() - since)))


def test_a_flood_of_large_reviews_leaves_the_controller_up_and_placing(
    webhook: Webhook, egress_placer: Placer, runs: Runs, figures: Figures
) -> None:
    limit = memory_limit_bytes()
    figures.fault(
        "a flood of large reviews at the webhook port",
        f"{FLOOD_CLIENTS} clients posting {FLOOD_BODY_BYTES / 2**20:.1f} MiB AdmissionReviews straight at the webhook for "
        f"{FLOOD_SECONDS:.0f} s; a TaskRun created through the API server every {RUN_EVERY_SECONDS} s meanwhile",
        f"the controller up, peak RSS under its {limit >> 20} MiB limit; every run created meanwhile placed on the pool; "
        f"/healthz and /readyz 200, never as many probes in a row past their {PROBE_TIMEOUT_SECONDS:.0f} s timeout as the "
        f"kubelet acts on ({FAILURE_THRESHOLD['/healthz']} and {FAILURE_THRESHOLD['/readyz']})",
    )
    replica = egress_placer.replica
    pid = egress_placer.pid()
    rss_before = rss_bytes(pid)
    turned_away_before = egress_placer.metric("egress_placer_admission_turned_away_total")
    sampler = Sampler(pid, replica.health_url)
    sampler.start()
    try:
        with Flood(webhook, flood_body()) as flood:
            created = create_paced(runs, FLOOD_SECONDS)
    finally:
        sampler.stop.set()
        sampler.join(30)
    alive = egress_placer.cluster.process(replica.name)
    turned_away = egress_placer.metric("egress_placer_admission_turned_away_total") - turned_away_before
    create_ms = sorted(seconds * 1000 for seconds in created.values())
    figures.set("flood_answers", flood.answers)
    figures.set("turned_away", turned_away)
    figures.set("rss_mib", {"before": rss_before >> 20, "peak": sampler.peak >> 20, "limit": limit >> 20})
    figures.set("create_ms", {"median": round(statistics.median(create_ms)), "max": round(create_ms[-1])})
    figures.set("health_probe_max_ms", round(max(sampler.health) * 1000))

    listed = runs.listed(TEAM_CDN, "taskruns")
    decisions = {name: decision_of(listed[name]) for name in created}
    decided_on_pool = [name for name, d in decisions.items() if d.get("pool") == POOL]

    def all_bound() -> dict[str, str | None] | None:
        bound = runs.nodes_of(TEAM_CDN, created)
        return bound if all(bound.values()) else None

    nodes = wait_for("the pods of the runs created during the flood bound to nodes", all_bound, timeout=PLACED_SECONDS, interval=1.0)
    on_pool = [name for name in created if nodes[name] in POOL_NODES]
    figures.set("placed", f"{len(on_pool)}/{len(created)}")
    figures.measured(
        f"{sum(flood.answers.values())} flood requests: " + ", ".join(f"{n}x {s}" for s, n in sorted(flood.answers.items()))
        + f" ({turned_away:.0f} turned away); RSS {rss_before >> 20} -> peak {sampler.peak >> 20} MiB (limit {limit >> 20}); "
        f"{len(on_pool)}/{len(created)} runs created meanwhile placed, create median {statistics.median(create_ms):.0f} ms, "
        f"max {create_ms[-1]:.0f} ms; slowest /healthz or /readyz {max(sampler.health) * 1000:.0f} ms",
        len(created) - len(on_pool),
    )

    assert alive is not None and alive.alive(), "the controller died under the flood"
    assert sampler.peak < limit, f"peak RSS {sampler.peak >> 20} MiB, limit {limit >> 20} MiB"
    # Not a speed figure (the slowest probe is the report's): whether the kubelet would have restarted the replica
    # or taken it out of the Service. A loop stalled by large reviews would time out every probe of the flood.
    in_a_row = {path: sampler.most_timed_out_in_a_row(path) for path in FAILURE_THRESHOLD}
    assert sampler.health_failures == [] and all(in_a_row[path] < FAILURE_THRESHOLD[path] for path in FAILURE_THRESHOLD), (
        sampler.health_failures, in_a_row)
    assert all(len(probes) >= 5 for probes in sampler.timed_out.values()), "the flood was hardly probed"
    assert len(created) >= FLOOD_SECONDS / RUN_EVERY_SECONDS - 1
    assert turned_away > 0, "the flood was read and queued whole instead of turned away past the slots"
    assert decided_on_pool == list(created), {n: d.get("reason") for n, d in decisions.items()}
    assert on_pool == list(created), nodes
    assert webhook.answers()
