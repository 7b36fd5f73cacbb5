"""Wiring: settings in, a running controller out (`egress-placer run`).

Start order: logging, API client, state, policy, informers (ready after their first list), leader
election, reconcilers (leader only), the serving certificate, then the HTTPS webhook and the
health/metrics server; one runner (controller.runner) owns the background tasks. SIGTERM or SIGINT
stops it in reverse order: stop accepting, finish in-flight reviews, release the lease, write the Events.

A policy problem is never fatal. An invalid or missing policy at start: the last good policy the
leader stored (controller/last_good_policy/reconcile.py) is validated and kept in force; with none
stored, no policy is in force: the webhook places nothing and strips pool tolerations as for a run
without a pool, the intruder reconciler sees no pool, and the taint reconciler leaves the taints as
they are (they keep everyone off the pools). Later, an invalid policy leaves the one in force.

/readyz stays 200 through a policy problem or a dead background task (its body says what is wrong):
an unready replica leaves the Service's endpoints, and with failurePolicy Ignore pods would then be
admitted unchanged, pool tolerations included, where a ready one strips them.
"""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable

from loguru import logger

from controller.admission.certs import CertificateKeeper, MountedCertificate
from controller.admission.events import CreationEvents, QuietEvents
from controller.admission.handlers import Admission
from controller.admission.pools import PoolValidation
from controller.admission.server import AdmissionServer, run_event_loop
from controller.compat import core as compat
from controller.core.policy import PlacementPolicy, PolicyError, load_policy
from controller.core.pools import GROUP, POOL_KIND, VERSION
from controller.prometheus.auth import PrometheusAuth
from controller.prometheus.egress_source import EgressPollers
from controller.kube.client import ClusterConfigError, KubeApi, make_api_client
from controller.kube.informer import Informer, cluster_informers, keep_node_annotations, start_informers
from controller.kube.leader import LeaderElector
from controller.kube.storage_migration import StorageMigration
from controller.kube.policy_source import PolicySource
from controller.kube.reader import KubeReader
from controller.kube.writer import EventRecorder, KubeClient
from controller.metrics import Metrics
from controller.retry import OWNER_READS
from controller.agents.reconcile import AgentReconciler
from controller.intruders.reconcile import IntruderReconciler
from controller.last_good_policy.reconcile import POLICY_KEY, LastGoodPolicyKeeper, store_name
from controller.reconcile_loop import ReconcileLoop
from controller.missed_runs.reconcile import report_missed_runs
from controller.pool_guard.reconcile import PoolGuardReconciler
from controller.pool_status.metrics import PoolMetrics
from controller.queue.reconcile import QueueReconciler
from controller.budgets.reconcile import BudgetMetrics, BudgetStartsKeeper
from controller.placement_log.view import PlacementLog
from controller.pool_status.reconcile import PoolErrors, PoolStatusWriter
from controller.taints.reconcile import TaintReconciler
from controller.runner import GiveWay, Runner
from controller.suggest.reconcile import HistoryReaders
from controller.settings import Settings, env_name
from controller.state import ClusterState

if TYPE_CHECKING:
    import loguru

STARTUP_TIMEOUT = 120.0
CERT_CHECK_SECONDS = 60.0
CERT_TICK_SECONDS = 1.0


class StartupError(RuntimeError):
    """The controller cannot start; the message says why. `unreachable`: because the cluster could not
    be read (a cache that never syncs), not because of its configuration."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def _json_line(record: "loguru.Record") -> str:
    """One compact JSON object per line: time, level, message, the object's identity and other context."""
    line = {
        "time": record["time"].isoformat(),
        "level": record["level"].name,
        "message": record["message"],
        "logger": record["name"],
        **{k: v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v) for k, v in record["extra"].items()},
    }
    if record["exception"] is not None:
        line["exception"] = "".join(traceback.format_exception(record["exception"].value))[-4000:]
    record["extra"]["_json"] = json.dumps(line, default=str)
    return "{extra[_json]}\n"


# How a replica shares the interpreter between the event loop and the informers' threads (bench
# admission.under_relist: a 20,000-pod relist beside reviews at 200 req/s). Young collections of 2,500
# objects: each holds the interpreter, so the loop, ~0.1 ms (10,000: 1-5 ms, 23 of them per relist; #22),
# with a middle collection every 500,000 objects as before (200 young ones; Python's own: 700, 10, 10):
# none during a relist, whose objects are frozen after it (controller.store.release). And a thread
# switch every 0.2 ms instead of every 5: a thread that wants the interpreter waits that long before it
# asks the holder to let go, and a review asks several times (each loop callback) while a relist or the
# leader's reconcile pass runs. At 1 ms a pass over 5,000 nodes made admission's p99 6-8x idle
# (admission.under_reconcile); the waits of a sleeping thread beside that pass: p99 2.4-3.2 ms at 1 ms,
# 0.9-1.0 ms at 0.2 ms. Switches are forced only while two threads want the interpreter.
COLLECTOR_THRESHOLDS = (2_500, 200, 10)
SWITCH_INTERVAL_SECONDS = 0.0002


def tune_interpreter() -> None:
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)


def prometheus_auth(settings: Settings) -> PrometheusAuth:
    """How the pools' history rules and egress sources reach Prometheus: the mounted files the settings name."""
    return PrometheusAuth(
        token_file=settings.prometheus_token_file,
        username=settings.prometheus_username,
        password_file=settings.prometheus_password_file,
        ca_file=settings.prometheus_ca_file,
        token_name=env_name("prometheus_token_file"),
        password_name=env_name("prometheus_password_file"),
        ca_name=env_name("prometheus_ca_file"),
    )


def configure_logging(settings: Settings) -> None:
    logger.remove()
    if settings.log_format == "json":
        logger.add(sys.stderr, level=settings.log_level.upper(), format=_json_line, backtrace=False, diagnose=False)
    else:
        logger.add(sys.stderr, level=settings.log_level.upper(), backtrace=False, diagnose=False)


class PolicyTracker:
    """Where the policy source's answers go: a loaded policy is handed to the state and to
    `on_policy` (the egress pollers); `loaded` says whether a policy is in force (from the source or,
    at start, the stored last good copy), `refusal` why the last policy offered was refused or
    missing (None once a valid one loads from the source), `problem()` both in one sentence."""

    def __init__(self, state: ClusterState, on_policy: Callable[[PlacementPolicy], None]) -> None:
        self.state = state
        self.on_policy = on_policy
        self.loaded = threading.Event()
        self.refusal: str | None = None
        self.stored_copy: str | None = None  # where the policy in force was read from, when it is the stored copy
        self._lock = threading.Lock()

    def set_policy(self, policy: PlacementPolicy) -> None:
        with self._lock:
            self.state.set_policy(policy)
            self.on_policy(policy)
            self.refusal = None
            self.stored_copy = None
            self.loaded.set()

    def refused(self, error: str) -> None:
        self.refusal = error

    def adopt_stored(self, policy: PlacementPolicy, where: str) -> bool:
        """Put the stored last good policy in force unless the source has given one meanwhile."""
        with self._lock:
            if self.loaded.is_set():
                return False
            self.state.set_policy(policy)
            self.on_policy(policy)
            self.stored_copy = where
            self.loaded.set()
            return True

    def problem(self) -> str | None:
        """None when the policy in force is the source's own; else what is wrong and what is in force."""
        refusal = self.refusal
        if not self.loaded.is_set():
            why = refusal or "no policy loaded yet"
            return f"{why}; no valid policy in force: nothing is placed on a pool, the pool taints stay"
        if self.stored_copy is not None:
            return f"{refusal or 'the policy source gave no valid policy'}; in force: the last good policy stored in {self.stored_copy}"
        if refusal is not None:
            return f"{refusal}; in force: the last good policy loaded before"
        return None


def wait_for_first_sync(informers: list[Informer], timeout: float, freeze: Callable[[], None] = gc.freeze) -> None:
    """Wait until every required informer has listed once (StartupError after `timeout` seconds), then
    `freeze()` once: what the first sync built (the caches, the policy, the imported code) leaves the
    collector's generations, so no later collection scans it (a full pass over 5,000 nodes and 20,000
    pods held the interpreter 37-44 ms; frozen, it finds next to nothing). Frozen objects are still freed
    by reference counting; a relist freezes what it built too (controller.store.release)."""
    deadline = time.monotonic() + timeout
    for informer in filter(lambda i: i.required, informers):
        if not informer.synced.wait(max(0.0, deadline - time.monotonic())):
            raise StartupError(f"the {informer.resource.name} cache did not sync in {timeout:.0f}s", unreachable=True)
    freeze()


TEKTON_VERSION_WAIT = 10.0  # seconds after the first sync for Tekton's version, before leading reports what is off


class Controller:
    """All the parts of one replica, built from settings; `serve()` runs it until stopped. `freeze`:
    called once after the first sync (gc.freeze; injected in tests)."""

    def __init__(
        self, settings: Settings, clock: Callable[[], float] = time.time, freeze: Callable[[], None] = gc.freeze
    ) -> None:
        self.settings = settings
        self.freeze = freeze
        self.runner = Runner()
        self.give_way = GiveWay()  # the leader's passes give way to the reviews in flight (follows the server, below)
        self.metrics = Metrics()
        self.api = KubeApi(make_api_client(settings), timeout=settings.request_timeout_seconds)
        self.state = ClusterState(
            None,
            clock=clock,
            assumption_ttl=settings.assumption_ttl_seconds,
            balance=settings.balance,
        )
        self.client = KubeClient(self.api, self.metrics)
        self.events = EventRecorder(self.client, self.metrics, settings.identity)
        self.egress = EgressPollers(self.state.load, clock, self.runner, registry=self.metrics.registry,
                                    session=prometheus_auth(settings).session)
        # Pools with a `history` rule: their measured sets, read in the background (suggest.reconcile).
        self.history = HistoryReaders(self.state.history, self.runner, self.metrics, self.events, lambda: self.is_leader(), clock,
                                      self._pool_regarding, auth=prometheus_auth(settings))
        self.policy = PolicyTracker(self.state, on_policy=self._policy_changed)
        self.policy_source = PolicySource(
            settings, self.policy, self.metrics, self.events, api=self.api, on_refused=self._policy_refused
        )
        self.last_good = LastGoodPolicyKeeper(
            self.client, settings.namespace, store_name(settings.policy_configmap), lambda: self.policy_source.loaded_text
        )
        self.budget_starts = BudgetStartsKeeper(self.state, self.client, settings.namespace)
        # Admission's Events wait for their object to exist (CreationEvents: the informers tell it), then
        # until admission is quiet (QuietEvents: written at once, they slow the run they describe).
        self.admission_events = QuietEvents(self.events)
        self.creation_events = CreationEvents(self.admission_events)
        # Pools API: each EgressPool's status, written by the leader (the runs it counts are seen by every replica).
        self.pool_status = settings.policy_file is None and settings.policy_source == "pools"
        self.pool_errors = PoolErrors(clock)
        self.placements = PlacementLog(self.state, clock=clock)
        self.informers: list[Informer] = cluster_informers(
            self.api,
            self.state,
            settings,
            self.metrics,
            observers=[self.creation_events, *([self.placements] if self.pool_status else [])],
        )
        self._missed_runs_reported = threading.Event()
        self._support_reported = threading.Event()
        # Set when this replica starts leading: the webhook's caBundle is now its to keep, check it soon.
        self._certs_need_leader = False
        self.leader = self._leader_elector()
        self.reconcile_loop = self._reconcile_loop()
        self.certs: CertificateKeeper | MountedCertificate = (
            MountedCertificate(settings.tls_cert_file, settings.tls_key_file, clock)
            if settings.tls_cert_file and settings.tls_key_file
            else CertificateKeeper(settings, self.client, clock)
        )
        # At Pod CREATE, a pod's TaskRun the informer has not brought yet is read (admission.server: off
        # the event loop, bounded), with a short retry policy of its own.
        owner_reader = KubeReader(self.api, self.metrics, retry=OWNER_READS)
        self.admission = Admission(
            self.state, self.metrics, self.creation_events, settings,
            read_taskrun=lambda namespace, name: owner_reader.get(
                "read-taskrun", f"/apis/tekton.dev/v1/namespaces/{namespace}/taskruns/{name}"
            ),
        )
        self.pool_validation = PoolValidation(self.policy_source.cached_objects, self.metrics)
        self.server = AdmissionServer(
            settings,
            self.admission,
            self.metrics,
            self.certs.tls,
            self.not_ready_because,
            degraded=self.degraded_because,
            validation=self.pool_validation,
        )
        self.give_way.follow(self.server.reviews_in_flight)
        self.metrics.track_policy(ready=lambda: self.policy.problem() is None, in_force=self.policy.loaded.is_set)
        self.metrics.track_certificate(lambda: self.certs.tls.not_after)

    def _policy_refused(self, error: str) -> None:
        """A policy refused (or missing): the tracker keeps why, and the leader's next pass shows it in
        the pools' status (a refusal changes nothing in the state, so nothing else wakes the loop)."""
        self.policy.refused(error)
        self.reconcile_loop.wake()  # built before the policy source is started (start_watching)

    def _leader_elector(self) -> LeaderElector:
        s = self.settings
        return LeaderElector(
            self.api,
            namespace=s.namespace,
            name=s.lease_name,
            identity=s.identity,
            metrics=self.metrics,
            lease_duration=s.lease_duration_seconds,
            renew_deadline=s.renew_deadline_seconds,
            retry_period=s.retry_period_seconds,
            on_started_leading=self._started_leading,
            on_stopped_leading=self.metrics.clear_leader_series,
        )

    def _reconcile_loop(self) -> ReconcileLoop:
        """The leader's reconcilers: pool taints, then intruders, then the API server's pool guard, then node
        agents kept off pools, then the stored last good policy, then the pool's load in metrics, then
        the queued pools' releases, then (pools API) each EgressPool's status."""
        s = self.settings
        intruders = IntruderReconciler(
            self.state,
            self.client,
            self.events,
            self.metrics,
            s.intruder_mode,
            budget_grace=s.intruder_budget_grace_seconds,
            eviction_grace=s.intruder_eviction_grace_seconds,
            paced=self.give_way.paced,
            changes=self.state.changes.cursor(),
        )
        statuses = (
            [PoolStatusWriter(self.state, self.policy_source, self.client, self.placements, self.pool_errors)]
            if self.pool_status
            else []
        )
        queue = QueueReconciler(self.state, self.client, self.events, self.metrics, kueue_wait=s.kueue_workload_wait_seconds)
        self.metrics.track_queue_overdue(lambda: {pool: len(p.overdue) for pool, p in queue.plans.items()}, self.is_leader)
        return ReconcileLoop(
            self.state,
            [
                TaintReconciler(self.state, self.client, self.metrics, errors=self.pool_errors, paced=self.give_way.paced,
                                changes=self.state.changes.cursor()),
                intruders,
                PoolGuardReconciler(self.state, self.client, s.namespace, verify_seconds=s.resync_seconds),
                AgentReconciler(self.state, self.client, self.events, self.metrics, paced=self.give_way.paced,
                                changes=self.state.changes.cursor()),
                self.last_good,
                PoolMetrics(self.state, self.metrics, paced=self.give_way.paced),
                queue,
                BudgetMetrics(self.state, self.metrics),
                self.budget_starts,
                *statuses,
                *([StorageMigration(self.api, self.events, self.metrics)] if self.pool_status else []),
            ],
            is_leader=self.is_leader,
            resync_seconds=s.resync_seconds,
        )

    def is_leader(self) -> bool:
        return self.leader.is_leader if self.settings.leader_election else True

    def _started_leading(self) -> None:
        logger.info("leading: taints, evictions and the webhook certificate are this replica's now")
        self.reconcile_loop.wake()
        self._certs_need_leader = True
        self.budget_starts.leading()
        self._report_missed_runs()
        self._report_support()

    def _report_missed_runs(self) -> None:
        """Once per process, as leader, caches synced: the runs created while no webhook answered."""
        if not self._missed_runs_reported.is_set():
            self._missed_runs_reported.set()
            report_missed_runs(self.state.missed_runs, self.events)

    def degraded_because(self) -> str | None:
        """A policy problem, a background task that died, a feature this Tekton or API server cannot carry
        (controller.compat): each in /readyz's body, none unready."""
        problems = (self.policy.problem(), self.runner.problem(), self.state.tekton.support.problem())
        return "; ".join(p for p in problems if p) or None

    def _discover_kubernetes(self) -> None:
        """What the API server serves that a feature needs (controller.compat.core.kubernetes_limitations)."""
        try:
            served = compat.served_resources(KubeReader(self.api, self.metrics).get("discovery", "/apis/admissionregistration.k8s.io/v1"))
        except Exception as e:  # noqa: BLE001 - discovery unreadable: nothing assumed missing, said in the log
            logger.bind(error=str(e)).warning("API discovery unreadable: no feature turned off for the API server")
            return
        self.state.tekton.set_kubernetes_limitations(compat.kubernetes_limitations(served))

    def _report_support(self) -> None:
        """Once per process, as leader, caches synced: a Warning Event and a log line per feature turned off."""
        if self._support_reported.is_set():
            return
        self._support_reported.set()
        support = self.state.tekton.support
        regarding = {"apiVersion": "v1", "kind": "ConfigMap", "namespace": self.settings.tekton_namespace, "name": compat.PIPELINES_INFO}
        for limitation in support.limitations:
            logger.bind(feature=limitation.feature, tekton=support.tekton_version).warning("feature off: {}", limitation.reason)
            self.events.emit(regarding, "Warning", "FeatureUnsupported", str(limitation), action="Degrade")

    def not_ready_because(self) -> str | None:
        """Caches not synced. A policy problem does not count (see the module docstring)."""
        waiting = [i.resource.name for i in self.informers if i.required and not i.synced.is_set()]
        if waiting:
            return "caches not synced: " + ", ".join(waiting)
        return None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start_watching(self) -> None:
        """Policy first (the stored last good one when the source has none valid), then the caches,
        then leadership."""
        self.runner.start("event recorder", self.events.run, on_stop=self.events.wake)
        self.runner.start("admission events", self.admission_events.run, on_stop=self.admission_events.wake)
        self.runner.start("creation events", self.creation_events.run)
        self.policy_source.start(self.runner)
        if not self.policy_source.synced.wait(STARTUP_TIMEOUT):
            self.policy.refused(f"no answer from the policy source ({self.policy_source.source}) in {STARTUP_TIMEOUT:.0f}s")
        if not self.policy.loaded.is_set():
            self._adopt_stored_policy()
        self._discover_kubernetes()
        start_informers(self.runner, self.informers)
        wait_for_first_sync(self.informers, STARTUP_TIMEOUT, self.freeze)
        if not self.state.tekton.version_read.wait(TEKTON_VERSION_WAIT):  # not required: bounded, said in the log
            logger.warning("Tekton's version (ConfigMap {}) not read yet: nothing turned off until it is", compat.PIPELINES_INFO)
        logger.bind(nodes=len(self.state.nodes), pods=len(self.state.pods)).info("caches synced")
        if self.settings.leader_election:
            self.runner.start("leader election", self.leader.run)
        else:
            self._report_missed_runs()
            self._report_support()
        self.runner.start("reconcile loop", self.reconcile_loop.run, on_stop=self.reconcile_loop.wake)

    def _policy_changed(self, policy: PlacementPolicy) -> None:
        """A policy in force: the egress pollers follow it; the Node cache keeps the annotations its pools
        name as egress addresses (relisting the nodes when one is new)."""
        self.egress.sync(policy)
        self.history.sync(policy)
        keys = {p.egress_address.annotation for p in policy.pools if p.egress_address is not None and p.egress_address.annotation}
        if keep_node_annotations(keys):
            for informer in getattr(self, "informers", ()):
                if informer.resource.kind == "Node":
                    informer.relist()

    def _pool_regarding(self, pool: str) -> dict[str, Any]:
        """What a pool's Event is about: its EgressPool (pools API), else the policy's ConfigMap."""
        if not self.pool_status:
            return {"apiVersion": "v1", "kind": "ConfigMap", "namespace": self.settings.namespace, "name": self.settings.policy_configmap}
        found = next((o for o in self.policy_source.cached_objects() or () if o.get("kind") == POOL_KIND and o["metadata"].get("name") == pool), None)
        uid = found["metadata"].get("uid", "") if found is not None else ""
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": POOL_KIND, "name": pool, **({"uid": uid} if uid else {})}

    def _adopt_stored_policy(self) -> None:
        """At start, when the source gave no valid policy: the stored last good one, validated again."""
        name = store_name(self.settings.policy_configmap)
        where = f"configmap {self.settings.namespace}/{name}"
        log = logger.bind(source=self.policy_source.source, stored=where, error=self.policy.refusal)
        try:
            text = self.last_good.read()
            policy = None if text is None else load_policy(text, source=f"{where}:{POLICY_KEY}")
        except PolicyError as e:
            log.bind(stored_error=str(e)).error("no valid policy at start, and the stored last good one is refused too")
            policy = None
        except Exception as e:  # noqa: BLE001 - the copy cannot be read: as if there were none
            log.bind(stored_error=str(e)).error("no valid policy at start, and the stored last good one cannot be read")
            policy = None
        if policy is not None and self.policy.adopt_stored(policy, where):
            log.warning("no valid policy at start: the last good policy stored in {} is in force", where)
        elif policy is None:
            log.error("no valid policy at start and none stored: nothing is placed on a pool, the pool taints stay")

    async def serve(self, stop: asyncio.Event) -> None:
        # The HTTPS server first: the informers list the pools API as v1beta1, which objects stored as
        # v1alpha1 need this replica's own /convert for when every replica was down (docs/pools-api.md,
        # "Serving, storing, converting"). Admission waits for the caches (server.admitting).
        self.server.admitting = False
        await self._ensure_certs()
        await self.server.start()
        try:
            await asyncio.to_thread(self.start_watching)
        except StartupError:
            await self.shutdown()  # the threads it started: the informers still retrying
            raise
        self.server.admitting = True
        await self._ensure_certs()  # leading may have begun meanwhile: the caBundles are its to keep
        logger.info("egress-placer running as {}", self.settings.identity)
        # A tick, not one long wait: leadership can arrive (on the leader thread) just after a wait of
        # CERT_CHECK_SECONDS began, and a new leader must write the webhook's caBundle at once.
        next_check = time.monotonic() + self._cert_check_interval()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=CERT_TICK_SECONDS)
            except asyncio.TimeoutError:
                if self._certs_need_leader or time.monotonic() >= next_check:
                    await self._ensure_certs()
                    next_check = time.monotonic() + self._cert_check_interval()
        await self.shutdown()

    async def _ensure_certs(self) -> None:
        leader = self.is_leader()
        await self.certs.ensure_async(leader)
        if leader:
            self._certs_need_leader = False

    def _cert_check_interval(self) -> float:
        # Until a certificate is loaded (a follower waits for the leader to write it), and right after
        # this replica starts leading (the webhook's caBundle may be missing), check often.
        return CERT_CHECK_SECONDS if self.certs.ready and not self._certs_need_leader else 1.0

    async def shutdown(self) -> None:
        logger.info("shutting down")
        await self.server.stop()
        await asyncio.to_thread(self.runner.stop)


def run(settings: Settings) -> int:
    """Build the controller and serve until SIGTERM or SIGINT, then 0; StartupError (logged, and its
    message says why) when it cannot start."""
    configure_logging(settings)
    tune_interpreter()
    try:
        try:
            controller = Controller(settings)
        except ClusterConfigError as error:
            raise StartupError(str(error)) from error
        except Exception as error:  # timings that cannot work...
            logger.opt(exception=True).debug("the controller could not be built")
            raise StartupError(f"{type(error).__name__}: {error}") from error
        run_event_loop(_serve_until_signalled(controller))
    except StartupError as error:
        logger.error("egress-placer cannot start: {}", error)
        raise
    return 0


async def _serve_until_signalled(controller: Controller) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await controller.serve(stop)
