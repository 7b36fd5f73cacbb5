"""The admission webhook's HTTPS server (asyncio.Protocol and httptools: controller/admission/wire.py)
and the plain HTTP server for health and metrics (aiohttp).

- HTTPS on `settings.webhook_host:webhook_port`: `POST /mutate` (and `/mutate/<anything>`), one
  route for every kind placed, and `POST /validate` (and `/validate/<anything>`), the pools API's
  validating webhook (controller/admission/pools.py), served the same way. The TLS context is
  `ServingTLS.context`: certificate rotation swaps the certificate on that same context, so the server
  never restarts. Bodies above 3 MiB (the API server's own limit) get 413; bodies that are not JSON or
  not an AdmissionReview get 400; a body that has not arrived READ_TIMEOUT_SECONDS after its headers gets
  408, and a connection that sends no complete request head for IDLE_TIMEOUT_SECONDS is closed (slow
  or stalled clients hold nothing up for long); a TLS handshake not done in READ_TIMEOUT_SECONDS is cut
  off. Connections are recycled: the answer to a connection's `webhook_connection_max_requests`-th
  request, or its first after `webhook_connection_max_seconds`, closes it, so that the API server
  connects again through the Service and the replicas share the reviews (docs/architecture.md,
  "Replicas behind the Service"). A review of up to INLINE_REVIEW_BYTES (every real run's) is answered
  inline: it is sub-millisecond and makes no I/O. A larger body is parsed and answered in the one
  worker thread for large reviews: image discovery bounds its work (controller/core/images.py), but a
  review near the 3 MiB limit still costs up to a few hundred milliseconds of CPU, and in a thread the
  interpreter hands the event loop the GIL every few milliseconds, so /healthz and the other reviews
  keep being answered meanwhile; large reviews wait for each other, never ordinary ones. Admission
  slots bound the work and memory a flood costs (SMALL_SLOTS, LARGE_SLOTS): taken by Content-Length
  before a body is read, a request that gets none is answered 503 unread (docs/security.md, "The
  webhook under load"). A pod that claims a TaskRun owner the cache does not have yet (the informer
  lags behind Tekton) is the one review that needs I/O: the TaskRun is read in one of OWNER_READERS
  threads, waited for at most OWNER_READ_SECONDS, and the review is answered again with what was read
  (nothing read in time: the pod is no run's pod, placed as any other; handlers.OwnerReadNeeded).
- While `admitting` is False (a replica starting: the server runs before the informers' first list so
  that `/convert` answers, controller/app.py), `/mutate` and `/validate` are answered 503 unread.
- HTTP on `settings.health_host:health_port`: `/healthz` (the process answers), `/readyz` (200 only
  when the readiness callable has no objection and a certificate is loaded, else 503 with the
  reason; a 200 names what `degraded` reports, e.g. a refused policy, which does not make the
  replica unready: see controller/app.py), `/metrics` (Prometheus text of `metrics.registry`, built
  in a thread).

`stop()` closes the listening sockets first, then lets in-flight requests finish (up to
`shutdown_timeout` seconds).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Coroutine, Protocol, TypeVar

import uvloop
from aiohttp import web
from loguru import logger
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controller.admission import wire
from controller.admission.certs import ServingTLS
from controller.admission.handlers import Admission, MalformedReview, OwnerReadNeeded, ReadOwner, Reviewed
from controller.admission.review import decode, encode
from controller.admission.conversion import PoolConversion
from controller.metrics import Metrics
from controller.settings import Settings

MAX_REVIEW_BYTES = 3 * 1024 * 1024  # the API server's request size limit
# Bodies above this go to the large-review thread. A catalog run's review is 2 to 30 KiB; one of 64 KiB
# costs about 5 ms of CPU at worst.
INLINE_REVIEW_BYTES = 64 * 1024
# The API server waits at most 30 s (the webhook's timeoutSeconds, 3 s here) for an answer: a client
# slower than this is not the API server, or the answer would come too late anyway.
READ_TIMEOUT_SECONDS = 10.0
IDLE_TIMEOUT_SECONDS = 30.0  # a connection without a complete request (idle keep-alive or stalled headers)
# Admission slots, taken before a body is read, by its Content-Length (a chunked body, with none, counts as
# large): however many clients post, at most LARGE_SLOTS large and SMALL_SLOTS ordinary bodies are read and
# held at once. A request that gets no slot is answered 503 at once, unread (the API server then applies the
# webhook's failurePolicy); large reviews may queue for a slot, LARGE_QUEUE of them for LARGE_WAIT_SECONDS.
SMALL_SLOTS = 256
LARGE_SLOTS = 4
LARGE_QUEUE = 16
LARGE_WAIT_SECONDS = 3.0  # the webhook's timeoutSeconds: the API server has given up by then
LINGER_SECONDS = 2.0  # an unread body (a 503, a 413) is drained this long, so the client reads the answer
# A pod's TaskRun not in the cache yet is read from the API server (handlers.OwnerReadNeeded) in one of
# OWNER_READERS threads, waited for at most OWNER_READ_SECONDS: the webhook's timeoutSeconds is 3 s.
OWNER_READERS = 2
OWNER_READ_SECONDS = 1.0
BUSY, LARGE_BUSY, LARGE_WAITED = "busy", "large-busy", "large-waited"  # admission_turned_away_total{reason}
# Returns None when the controller is ready (caches synced), else the reason it is not.
Readiness = Callable[[], str | None]
# Returns None when all is well, else what is wrong that does not stop it serving (a refused policy).
Degraded = Callable[[], str | None]
T = TypeVar("T")


class Reviewer(Protocol):
    """Answers one AdmissionReview body (Admission, PoolValidation); raises only MalformedReview."""

    def review(self, body: Any) -> dict[str, Any]: ...


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message + "\n")


class LargeSlots:
    """LARGE_SLOTS large reviews read and answered at once; up to LARGE_QUEUE more wait for a slot, first
    come first served, each at most LARGE_WAIT_SECONDS."""

    def __init__(self) -> None:
        self.in_use = 0
        self._queue: deque[tuple[wire.Exchange, asyncio.TimerHandle]] = deque()

    @property
    def full(self) -> bool:
        return self.in_use >= LARGE_SLOTS

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def take(self) -> bool:
        if self.full:
            return False
        self.in_use += 1
        return True

    def release(self) -> None:
        """Free a slot, or hand it to the first exchange waiting."""
        while self._queue:
            exchange, timer = self._queue.popleft()
            timer.cancel()
            if exchange.open:
                exchange.release = self.release
                exchange.read(LARGE_WAIT_SECONDS)
                return
        self.in_use -= 1

    def wait(self, exchange: wire.Exchange, turned_away: Callable[[wire.Exchange], None]) -> None:
        timer = asyncio.get_running_loop().call_later(LARGE_WAIT_SECONDS, self._waited, exchange, turned_away)
        self._queue.append((exchange, timer))
        exchange.release = lambda: self._leave(exchange)  # its connection lost while it waits

    def _leave(self, exchange: wire.Exchange) -> None:
        for entry in self._queue:
            if entry[0] is exchange:
                entry[1].cancel()
                self._queue.remove(entry)
                return

    def _waited(self, exchange: wire.Exchange, turned_away: Callable[[wire.Exchange], None]) -> None:
        self._leave(exchange)
        exchange.release = None
        turned_away(exchange)


class AdmissionServer:
    """Both servers. `start()` binds them; ports 0 pick free ports (see `webhook_port`, `health_port`).
    `clock` (monotonic seconds) times the connections' age for recycling."""

    def __init__(
        self,
        settings: Settings,
        admission: Admission,
        metrics: Metrics,
        tls: ServingTLS,
        readiness: Readiness,
        shutdown_timeout: float = 10.0,
        degraded: Degraded = lambda: None,
        validation: Reviewer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.admission = admission
        self.validation = validation
        self.conversion = PoolConversion(metrics)
        # False while the replica starts (the server answers /convert before the informers' first list):
        # /mutate and /validate are then answered 503, as an absent server was (app.Controller.serve).
        self.admitting = True
        self.metrics = metrics
        self.tls = tls
        self.readiness = readiness
        self.degraded = degraded
        self.shutdown_timeout = shutdown_timeout
        self.clock = clock
        self.limits = wire.Limits(
            max_body=MAX_REVIEW_BYTES, idle_seconds=IDLE_TIMEOUT_SECONDS, linger_seconds=LINGER_SECONDS,
            max_requests=settings.webhook_connection_max_requests, max_seconds=settings.webhook_connection_max_seconds,
        )
        self._webhook: wire.Listener | None = None
        self._health: web.AppRunner | None = None
        self._large_reviews: ThreadPoolExecutor | None = None
        self._owner_reads: ThreadPoolExecutor | None = None
        self._small_in_use = 0
        self._large = LargeSlots()
        self._off_loop = 0  # large reviews being answered in their thread now
        self._later: set[asyncio.Task[None]] = set()

    # -- the health application ------------------------------------------------------------------------

    def health_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_text)
        return app

    # -- reviews (wire.Handler) ----------------------------------------------------------------------

    def _reviewer(self, path: bytes) -> Reviewer | None:
        if path == b"/mutate" or path.startswith(b"/mutate/"):
            return self.admission
        if path == b"/convert":  # answered from the request alone, ready or not (admission.conversion)
            return self.conversion
        if self.validation is not None and (path == b"/validate" or path.startswith(b"/validate/")):
            return self.validation
        return None

    def begin(self, exchange: wire.Exchange) -> None:
        """A request's head: its route, then a slot by its Content-Length (the wire has refused one over
        MAX_REVIEW_BYTES), or a 503 unread."""
        reviewer = self._reviewer(exchange.path)
        if reviewer is None:
            exchange.respond(wire.text(404, "not found", close=True))
            return
        if exchange.method != b"POST":
            exchange.respond(wire.text(405, "only POST", close=True, headers=b"Allow: POST\r\n"))
            return
        if not self.admitting and reviewer is not self.conversion:
            exchange.respond(wire.text(503, "not ready: starting, the caches are not synced yet", close=True))
            return
        exchange.route = reviewer
        length = exchange.length
        if length is not None and length <= INLINE_REVIEW_BYTES:
            if self._small_in_use >= SMALL_SLOTS:
                self._turned_away(exchange, BUSY)
                return
            self._small_in_use += 1
            exchange.release = self._release_small
            exchange.read(READ_TIMEOUT_SECONDS)
            return
        if self._large.take():  # the API server sends a body at once: a large one still arriving after its timeout is not its
            exchange.release = self._large.release
            exchange.read(LARGE_WAIT_SECONDS)
        elif self._large.waiting >= LARGE_QUEUE:
            self._turned_away(exchange, LARGE_BUSY)
        else:
            self._large.wait(exchange, lambda waited: self._turned_away(waited, LARGE_WAITED))

    def reviews_in_flight(self) -> int:
        """Requests the event loop is working on now, and large reviews being answered in their thread
        (runner.GiveWay: background work gives way to them). Read from other threads."""
        webhook = self._webhook
        return (webhook.working if webhook is not None else 0) + self._off_loop

    def _count_connection(self, event: str) -> None:
        self.metrics.webhook_connections.labels(event=event).inc()

    def _release_small(self) -> None:
        self._small_in_use -= 1

    def _turned_away(self, exchange: wire.Exchange, reason: str) -> None:
        self.metrics.admission_turned_away.labels(reason=reason).inc()
        exchange.respond(wire.text(503, f"the webhook is busy ({reason}): try again", close=True))

    def malformed(self, status: int) -> None:
        self.metrics.count_malformed_review()

    def answer(self, exchange: wire.Exchange, body: bytes | bytearray) -> None:
        """Inline, or in the large-review thread for a large body; a pod whose TaskRun must be read first
        is answered once it is."""
        reviewer: Reviewer = exchange.route
        if len(body) > INLINE_REVIEW_BYTES and self._large_reviews is not None:
            self._answer_later(exchange, self._answer_off_loop(body, exchange.path, reviewer))
            return
        try:
            reply = self._answer(body, exchange.path, reviewer)
        except OwnerReadNeeded as needed:
            self._answer_later(exchange, self._answer_off_loop(body, exchange.path, reviewer, needed))
            return
        exchange.respond(reply)

    def _answer_later(self, exchange: wire.Exchange, work: Coroutine[Any, Any, wire.Reply]) -> None:
        """Answered by `work`; the exchange's slot is held until `work` ends, whatever becomes of its connection."""
        release, exchange.release = exchange.release, None

        async def answer() -> None:
            try:
                reply = await work
            except Exception:  # noqa: BLE001 - a bug of ours: answered 500, never a stalled connection
                logger.exception("the webhook failed on a request")
                reply = wire.text(500, "the webhook failed on this request", close=True)
            finally:
                if release is not None:
                    release()
            exchange.respond(reply)

        task = asyncio.ensure_future(answer())
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    async def _answer_off_loop(self, raw: bytes | bytearray, path: bytes, reviewer: Reviewer, needed: OwnerReadNeeded | None = None) -> wire.Reply:
        """`raw` answered where it fits; when the pod's TaskRun must be read first (`needed`, or the answer
        says so), answered again with what was read."""
        if needed is None:
            try:
                return await self._answer_where_it_fits(raw, path, reviewer)
            except OwnerReadNeeded as error:
                needed = error
        owner = await self._read_owner(needed)
        return await self._answer_where_it_fits(raw, path, reviewer, owner)

    async def _answer_where_it_fits(self, raw: bytes | bytearray, path: bytes, reviewer: Reviewer, owner: ReadOwner | None = None) -> wire.Reply:
        """Inline, or in the large-review thread for a large body."""
        if len(raw) <= INLINE_REVIEW_BYTES or self._large_reviews is None:
            return self._answer(raw, path, reviewer, owner)
        self._off_loop += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._large_reviews, self._answer, raw, path, reviewer, owner)
        finally:
            self._off_loop -= 1

    async def _read_owner(self, needed: OwnerReadNeeded) -> ReadOwner:
        """The TaskRun a pod claims, read off the event loop within OWNER_READ_SECONDS (else: none)."""
        if self._owner_reads is None:
            return ReadOwner(needed.namespace, needed.name, None)
        read = asyncio.get_running_loop().run_in_executor(self._owner_reads, self.admission.read_owner, needed.namespace, needed.name)
        try:
            owner = await asyncio.wait_for(read, OWNER_READ_SECONDS)
        except TimeoutError:
            self.metrics.owner_reads.labels(outcome="timeout").inc()
            logger.bind(namespace=needed.namespace, name=needed.name).warning(
                "the TaskRun of a pod was not read within {} s: the pod is placed as no run's", OWNER_READ_SECONDS
            )
            return ReadOwner(needed.namespace, needed.name, None)
        self.metrics.owner_reads.labels(outcome="found" if owner.record is not None else "absent").inc()
        return owner

    def _answer(self, raw: bytes | bytearray, path: bytes, reviewer: Reviewer, owner: ReadOwner | None = None) -> wire.Reply:
        """The answer to one request body (in the loop, or in the large-review thread). `owner`: the
        TaskRun read for it (only Admission raises OwnerReadNeeded)."""
        try:
            body: Any = decode(raw)
        except (UnicodeDecodeError, ValueError):
            self.metrics.count_malformed_review()
            return wire.text(400, "the body is not JSON")
        except RecursionError:  # e.g. 100,000 nested arrays: the decoder gives up
            self.metrics.count_malformed_review()
            return wire.text(400, "the body is JSON nested too deeply")
        try:
            # Admission's metrics and Events wait until the answer is written (`Admission.review_deferred`).
            if owner is not None or reviewer is self.admission:
                reviewed = self.admission.review_deferred(body, owner)
            else:
                reviewed = Reviewed(reviewer.review(body))
        except MalformedReview as error:
            logger.bind(path=path.decode("latin-1")).warning("malformed AdmissionReview: {}", error)
            return wire.text(400, f"malformed AdmissionReview: {error}")
        return wire.Reply(200, encode(reviewed.response), wire.JSON, after=reviewed.finish if reviewed.later else None)

    async def healthz(self, request: web.Request) -> web.Response:
        return _text(200, "ok")

    async def readyz(self, request: web.Request) -> web.Response:
        try:
            reason = self.readiness()
        except Exception as error:  # noqa: BLE001 - a failing check means not ready, not a crash
            reason = f"readiness check failed: {error}"
        if reason is None and not self.tls.loaded:
            reason = "no serving certificate loaded"
        if reason is not None:
            return _text(503, f"not ready: {reason}")
        try:
            problem = self.degraded()
        except Exception as error:  # noqa: BLE001 - a report that fails must not make the replica unready
            problem = f"degraded check failed: {error}"
        return _text(200, "ready" if problem is None else f"ready, degraded: {problem}")

    async def metrics_text(self, request: web.Request) -> web.Response:
        # In a thread: with a series per pool node the text takes tens of milliseconds to build (200 ms at
        # 5,000 pool nodes), which the event loop would otherwise not answer reviews during.
        body = await asyncio.to_thread(generate_latest, self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        self._large_reviews = ThreadPoolExecutor(max_workers=1, thread_name_prefix="large-review")
        self._owner_reads = ThreadPoolExecutor(max_workers=OWNER_READERS, thread_name_prefix="owner-read")
        self._health = web.AppRunner(
            self.health_app(), access_log=None, shutdown_timeout=self.shutdown_timeout,
            keepalive_timeout=IDLE_TIMEOUT_SECONDS, lingering_time=LINGER_SECONDS,
        )
        await self._health.setup()
        await web.TCPSite(self._health, s.health_host, s.health_port).start()
        self._webhook = await wire.serve(
            self, s.webhook_host, s.webhook_port, self.tls.context, self.limits, clock=self.clock,
            handshake_seconds=READ_TIMEOUT_SECONDS, count=self._count_connection,
        )
        logger.info(
            "webhook on https://{}:{}/mutate and /validate, health on http://{}:{}",
            s.webhook_host, self.webhook_port, s.health_host, self.health_port,
        )

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests, close. Webhook first, health last."""
        if self._webhook is not None:
            await self._webhook.close(self.shutdown_timeout)
            self._webhook = None
        if self._health is not None:
            await self._health.cleanup()
            self._health = None
        if self._large_reviews is not None:
            self._large_reviews.shutdown(wait=False, cancel_futures=True)
            self._large_reviews = None
        if self._owner_reads is not None:
            self._owner_reads.shutdown(wait=False, cancel_futures=True)
            self._owner_reads = None

    @property
    def webhook_port(self) -> int:
        if self._webhook is None:
            raise RuntimeError("the server is not running")
        return self._webhook.port

    @property
    def health_port(self) -> int:
        addresses = self._health.addresses if self._health is not None else []
        if not addresses:
            raise RuntimeError("the server is not running")
        return int(addresses[0][1])


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end on uvloop's event loop (libuv), the controller's loop: its transports and
    TLS cost less per request than asyncio's own (bench/README.md, admission)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
