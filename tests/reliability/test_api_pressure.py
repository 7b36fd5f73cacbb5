"""Reliability, API server pressure: the kube-apiserver is restarted with tiny in-flight limits
(--max-requests-inflight=1 --max-mutating-requests-inflight=1; priority-and-fairness stays off, as in
the devcluster, so the classic max-in-flight filter answers 429 with Retry-After: 1) and an audit log
of egress-placer's ServiceAccount. A "hog" then keeps the one mutating slot busy (admin ConfigMap
creations held 2 s each by a webhook that never answers; system:masters is never throttled itself),
so every write of the controller gets 429 while it lasts. Meanwhile all pool taints are removed by
hand, intruder pods are put on pool nodes and a burst of matching TaskRuns is created. Checks that the
controller got 429s and did not hot-loop on them (its request rate under pressure, from the audit log,
stays bounded; each write retried no sooner than Retry-After), and that once the pressure ends nothing
was dropped (taints back, intruders evicted, runs placed). The normal API server is restored afterwards."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from devcluster.cluster import Cluster
from devplacer.local_placer import service_account_user
from devplacer.faults import Component, kill_component, start_component
from tests.e2e.harness import Placer, parse_samples, pool_taints, quietly, remove_pool_taint
from tests.e2e.tekton_runs import POOL_NODES, POOL_TAINT, Runs
from tests.kube import Api, namespace, namespaced
from tests.reliability.burst import Burst, all_finished, pool_outcome
from tests.reliability.cluster_view import apiserver_metrics, pod_gone, sneak_onto
from tests.reliability.suite import TEAM_CDN, TEAM_OTHER, Figures
from tests.waiting import holds_for, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.reliability]

LIMITS = ["--max-requests-inflight=1", "--max-mutating-requests-inflight=1", "--enable-priority-and-fairness=false"]
INTRUDERS = 6
BURST = 30
PRESSURE_SECONDS = 12.0  # how long the hog keeps the mutating slot busy
CONVERGE_SECONDS = 30.0  # stated bound: pressure over -> taints back and intruders evicted
MAX_PRESSURE_RATE = 15.0  # the controller's requests/s under sustained 429s: backoff, not a hot loop
HOG_NAMESPACE = "rel-hog"
HOG_WEBHOOK = "rel-hog"
VALIDATING_WEBHOOK_CONFIGS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
HOG_HOLD_SECONDS = 2  # the hog webhook's timeoutSeconds: how long each hog creation holds the slot
RETRY_AFTER = 1.0  # what the max-in-flight filter sends
CONTROLLER_USER = service_account_user()


def audit_policy() -> dict[str, Any]:
    """Metadata of every request egress-placer's ServiceAccount makes, nothing else."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": [CONTROLLER_USER]}, {"level": "None"}],
    }


@pytest.fixture
def throttled_apiserver(devcluster: Cluster, egress_placer: Placer) -> Iterator[Path]:
    """The API server restarted with LIMITS and an audit log (its path is yielded); restored afterwards."""
    policy = devcluster.dir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(audit_policy()))
    log = devcluster.dir / "logs" / "audit-pressure.log"
    log.unlink(missing_ok=True)
    normal: Component = kill_component(devcluster, "kube-apiserver")
    try:
        start_component(devcluster, normal, [*LIMITS, f"--audit-policy-file={policy}", f"--audit-log-path={log}"])
        yield log
    finally:
        kill_component(devcluster, "kube-apiserver")
        start_component(devcluster, normal)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def read_audit(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def early_retries(entries: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """Writes to one object (a node's taints, a pod's eviction) sent again sooner than Retry-After after a 429."""
    by_target: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in entries:
        ref = e.get("objectRef") or {}
        if e["verb"] in ("patch", "create") and (ref.get("resource"), ref.get("subresource")) in (("nodes", None), ("pods", "eviction")):
            by_target[f'{e["verb"]} {e["requestURI"]}'].append((_ts(e["requestReceivedTimestamp"]), e["responseStatus"]["code"]))
    early = []
    for target, requests in by_target.items():
        requests.sort()
        for (at, code), (next_at, _) in zip(requests, requests[1:]):
            if code == 429 and next_at - at < RETRY_AFTER * 0.95:
                early.append((target, round(next_at - at, 3)))
    return early


class Blackhole:
    """A TCP port that accepts connections and never answers: a webhook that hangs until its timeout."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, name="blackhole", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.server.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # stops listening now (wakes the blocked accept)
        except OSError:
            pass
        self.server.close()
        for conn in self.held:
            conn.close()


class Hog:
    """Keeps the API server's one mutating in-flight slot busy: two admin threads creating ConfigMaps in
    HOG_NAMESPACE, each held HOG_HOLD_SECONDS by a validating webhook that never answers (failurePolicy
    Ignore, so each creation then succeeds)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.blackhole = Blackhole()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.created = 0

    def install(self) -> None:
        self.api.create(namespace(), {"metadata": {"name": HOG_NAMESPACE}})
        self.api.create(VALIDATING_WEBHOOK_CONFIGS, {
            "metadata": {"name": HOG_WEBHOOK},
            "webhooks": [{
                "name": "hog.reliability.egress-placer.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                "timeoutSeconds": HOG_HOLD_SECONDS,
                "clientConfig": {"url": f"https://127.0.0.1:{self.blackhole.port}/hang"},
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": HOG_NAMESPACE}},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"], "scope": "Namespaced"}],
            }],
        })

    def _create(self) -> None:
        while not self.stop.is_set():
            try:
                self.api.call("POST", namespaced(HOG_NAMESPACE, "configmaps"), body={"metadata": {"generateName": "hog-"}}, timeout=30)
                self.created += 1
            except Exception:  # noqa: BLE001 - the hog only has to keep the slot busy
                # Part of the scenario: the hog's own pace after a refusal (it is load, not a check).
                time.sleep(0.1)

    def start(self) -> None:
        self.threads = [threading.Thread(target=self._create, name=f"hog {i}", daemon=True) for i in range(2)]
        for thread in self.threads:
            thread.start()

    def running(self) -> bool:
        """Its threads are all still creating (they stop only when told)."""
        return bool(self.threads) and all(thread.is_alive() for thread in self.threads)

    def end(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(HOG_HOLD_SECONDS + 30)

    def remove(self) -> None:
        self.end()
        self.api.delete(f"{VALIDATING_WEBHOOK_CONFIGS}/{HOG_WEBHOOK}")
        self.api.delete(namespace(HOG_NAMESPACE))
        self.blackhole.close()


@pytest.fixture
def hog(api: Api, throttled_apiserver: Path) -> Iterator[Hog]:
    made = Hog(api)
    try:
        made.install()
        yield made
    finally:
        made.remove()


def test_under_sustained_429s_the_controller_backs_off_and_drops_nothing(
    devcluster: Cluster, api: Api, egress_placer: Placer, runs: Runs, throttled_apiserver: Path, hog: Hog,
    figures: Figures,
) -> None:
    figures.fault(
        "API server with --max-requests-inflight=1 --max-mutating-requests-inflight=1 (P&F off), its mutating "
        f"slot kept busy for {PRESSURE_SECONDS:.0f} s",
        f"all {len(POOL_NODES)} pool taints removed by hand, {INTRUDERS} intruder pods on pool nodes, {BURST} matching TaskRuns",
        f"the controller gets 429s, retries no sooner than Retry-After, stays under {MAX_PRESSURE_RATE:.0f} req/s (no "
        f"hot loop); after the pressure, taints back and intruders evicted within {CONVERGE_SECONDS:.0f} s; runs placed",
    )
    replica = egress_placer.replicas[0]
    log_offset = egress_placer.log.stat().st_size
    hog.start()
    wait_for("a hog request held by the black-hole webhook (the mutating slot busy)", lambda: hog.blackhole.held, timeout=30, interval=0.05)
    pressure_from = time.time()
    for node in sorted(POOL_NODES):
        remove_pool_taint(api, node)
    intruders = [runs.name(f"intruder-{i}") for i in range(INTRUDERS)]
    for i, name in enumerate(intruders):
        sneak_onto(api, runs, TEAM_OTHER, name, sorted(POOL_NODES)[i % len(POOL_NODES)])
    burst = Burst(runs, TEAM_CDN, BURST, prefix="pressure").start()
    # Part of the scenario: the pressure lasts PRESSURE_SECONDS, whatever happens meanwhile.
    holds_for("the hog to keep the mutating slot busy", hog.running, seconds=max(0.0, PRESSURE_SECONDS - (time.time() - pressure_from)), interval=0.5)
    hog.end()
    pressure_to = time.time()

    converged_from = time.monotonic()
    wait_for(
        "the pool taints back and the intruders evicted",
        quietly(lambda: all(pool_taints(api, n) == [POOL_TAINT] for n in POOL_NODES)
        and all(pod_gone(api, TEAM_OTHER, name) for name in intruders)),
        timeout=CONVERGE_SECONDS + 60,
        interval=0.5,
    )
    converged = time.monotonic() - converged_from
    burst.join()
    wait_for(
        f"the {BURST} runs to finish",
        quietly(lambda: all_finished(runs, TEAM_CDN, burst.names)),
        timeout=240,
        interval=1.0,
    )
    outcome = pool_outcome(runs, TEAM_CDN, burst.names)

    entries = [e for e in read_audit(throttled_apiserver) if e["user"]["username"] == CONTROLLER_USER]
    under_pressure = [e for e in entries if pressure_from <= _ts(e["requestReceivedTimestamp"]) < pressure_to]
    codes = Counter(e["responseStatus"]["code"] for e in under_pressure)
    rate = len(under_pressure) / (pressure_to - pressure_from)
    busiest = max(Counter(int(_ts(e["requestReceivedTimestamp"])) for e in under_pressure).values(), default=0)
    retries = egress_placer.metric("egress_placer_api_write_retries_total", {"cause": "throttled"}, replica=replica)
    throttled_total = parse_samples(apiserver_metrics(api), "apiserver_request_total", {"code": "429"})
    early = early_retries(entries)
    with open(egress_placer.cluster.dir / "logs" / f"{replica.name}.log", "rb") as log:
        log.seek(log_offset)
        lines = log.read().decode(errors="replace").splitlines()
    step_downs = sum(1 for line in lines if '"stopped leading"' in line)
    events_lost = sum(1 for line in lines if '"event not written' in line)
    figures.set("requests_under_pressure", len(under_pressure))
    figures.set("throttled_under_pressure", codes[429])
    figures.set("rate", round(rate, 1))
    figures.set("busiest_second", busiest)
    figures.set("converged_s", round(converged, 1))
    figures.measured(
        f"under pressure {codes[429]} of the controller's {len(under_pressure)} requests got 429 ({rate:.1f} req/s, "
        f"API server's apiserver_request_total{{code=429}} {throttled_total:.0f}, "
        f"busiest second {busiest}); {retries:.0f} throttled writes retried, {len(early)} sooner than Retry-After; "
        f"leader stepped down {step_downs}x, {events_lost} Event(s) given up; {hog.created} hog creations; after the "
        f"pressure, taints back and {INTRUDERS} intruders evicted in {converged:.1f} s; {outcome.summary()}",
        len(outcome.lost) + len(outcome.misplaced),
    )

    assert codes[429] > 0 and retries > 0, f"no pressure: {codes}"
    assert early == [], early
    assert rate <= MAX_PRESSURE_RATE, sorted(Counter(int(_ts(e["requestReceivedTimestamp"])) for e in under_pressure).items())
    assert converged <= CONVERGE_SECONDS
    assert outcome.lost == () and outcome.misplaced == () and outcome.no_pod == (), outcome
