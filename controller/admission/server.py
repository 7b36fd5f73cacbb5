"""The admission webhook's HTTPS server and the plain HTTP server for health and metrics (aiohttp).

- HTTPS on `settings.webhook_host:webhook_port`: `POST /mutate` (and `/mutate/<anything>`), one
  route for every kind placed, and `POST /validate` (and `/validate/<anything>`), the pools API's
  validating webhook (controller/admission/pools.py), served the same way. The TLS context is `ServingTLS.context`: certificate rotation swaps the
  certificate on that same context, so the server never restarts. Bodies above 3 MiB (the API
  server's own limit) get 413; bodies that are not JSON or not an AdmissionReview get 400; a body
  that has not arrived READ_TIMEOUT_SECONDS after its headers gets 408, and a connection that sends
  no complete request for IDLE_TIMEOUT_SECONDS is closed (slow or stalled clients hold nothing up
  for long). A review of up to INLINE_REVIEW_BYTES (every real run's) is answered inline: it is
  sub-millisecond and makes no I/O. A larger body is parsed and answered in the one worker thread for
  large reviews: image discovery bounds its work (controller/core/images.py), but a review near the
  3 MiB limit still costs up to a few hundred milliseconds of CPU, and in a thread the interpreter hands
  the event loop the GIL every few milliseconds, so /healthz and the other reviews keep being answered
  meanwhile; large reviews wait for each other, never ordinary ones. Admission slots bound the work
  and memory a flood costs (SMALL_SLOTS, LARGE_SLOTS): taken by Content-Length before a body is read,
  a request that gets none is answered 503 unread (docs/security.md, "The webhook under load").
  A pod that claims a TaskRun owner the cache does not have yet (the informer lags behind Tekton) is
  the one review that needs I/O: the TaskRun is read in one of OWNER_READERS threads, waited for at most
  OWNER_READ_SECONDS, and the review is answered again with what was read (nothing read in time: the
  pod is no run's pod, placed as any other; handlers.OwnerReadNeeded).
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Coroutine, Protocol, TypeVar

import uvloop
from aiohttp import web
from loguru import logger
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controller.admission.certs import ServingTLS
from controller.admission.handlers import Admission, MalformedReview, OwnerReadNeeded, ReadOwner
from controller.admission.review import decode, encode
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


_JSON = {"Content-Type": "application/json; charset=utf-8"}


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message + "\n")


class AdmissionServer:
    """Both servers. `start()` binds them; ports 0 pick free ports (see `webhook_port`, `health_port`)."""

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
    ) -> None:
        self.settings = settings
        self.admission = admission
        self.validation = validation
        self.metrics = metrics
        self.tls = tls
        self.readiness = readiness
        self.degraded = degraded
        self.shutdown_timeout = shutdown_timeout
        self._runners: list[web.AppRunner] = []
        self._webhook: web.AppRunner | None = None
        self._health: web.AppRunner | None = None
        self._large_reviews: ThreadPoolExecutor | None = None
        self._owner_reads: ThreadPoolExecutor | None = None
        self._small_in_use = self._large_waiting = 0
        self._large_slots = asyncio.Semaphore(LARGE_SLOTS)

    # -- applications -------------------------------------------------------------------------------

    def webhook_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REVIEW_BYTES)
        app.router.add_post("/mutate", self.mutate)
        app.router.add_post("/mutate/{rest:.*}", self.mutate)
        if self.validation is not None:
            app.router.add_post("/validate", self.validate)
            app.router.add_post("/validate/{rest:.*}", self.validate)
        return app

    def health_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_text)
        return app

    # -- handlers -----------------------------------------------------------------------------------

    async def mutate(self, request: web.Request) -> web.Response:
        return await self._review(request, self.admission)

    async def validate(self, request: web.Request) -> web.Response:
        assert self.validation is not None  # the route exists only with it
        return await self._review(request, self.validation)

    async def _review(self, request: web.Request, reviewer: Reviewer) -> web.Response:
        length = request.content_length
        if length is not None and length > MAX_REVIEW_BYTES:  # refused unread
            self._malformed()
            return _text(413, f"the body is over the limit of {MAX_REVIEW_BYTES} bytes")
        if length is not None and length <= INLINE_REVIEW_BYTES:
            if self._small_in_use >= SMALL_SLOTS:
                return self._turned_away(BUSY)
            self._small_in_use += 1
            try:
                return await self._read_and_answer(request, reviewer, READ_TIMEOUT_SECONDS)
            finally:
                self._small_in_use -= 1
        if self._large_slots.locked() and self._large_waiting >= LARGE_QUEUE:
            return self._turned_away(LARGE_BUSY)
        self._large_waiting += 1
        try:
            async with asyncio.timeout(LARGE_WAIT_SECONDS):
                await self._large_slots.acquire()
        except TimeoutError:
            return self._turned_away(LARGE_WAITED)
        finally:
            self._large_waiting -= 1
        try:  # the API server sends a body at once: a large one still arriving after its timeout is not its
            return await self._read_and_answer(request, reviewer, LARGE_WAIT_SECONDS)
        finally:
            self._large_slots.release()

    def _turned_away(self, reason: str) -> web.Response:
        self.metrics.admission_turned_away.labels(reason=reason).inc()
        return _text(503, f"the webhook is busy ({reason}): try again")

    async def _read_and_answer(self, request: web.Request, reviewer: Reviewer, read_timeout: float) -> web.Response:
        try:
            async with asyncio.timeout(read_timeout):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self._malformed()
            raise
        except TimeoutError:
            self._malformed()
            return _text(408, f"the request body did not arrive within {read_timeout:.0f} s")
        try:
            return await self._answer_where_it_fits(raw, request.path, reviewer)
        except OwnerReadNeeded as needed:
            owner = await self._read_owner(needed)
            return await self._answer_where_it_fits(raw, request.path, reviewer, owner)

    async def _answer_where_it_fits(self, raw: bytes, path: str, reviewer: Reviewer, owner: ReadOwner | None = None) -> web.Response:
        """Inline, or in the large-review thread for a large body."""
        if len(raw) <= INLINE_REVIEW_BYTES or self._large_reviews is None:
            return self._answer(raw, path, reviewer, owner)
        return await asyncio.get_running_loop().run_in_executor(self._large_reviews, self._answer, raw, path, reviewer, owner)

    async def _read_owner(self, needed: OwnerReadNeeded) -> ReadOwner:
        """The TaskRun a pod claims, read off the event loop within OWNER_READ_SECONDS (else: none)."""
        if self._owner_reads is None:
            return ReadOwner(needed.namespace, needed.name, None)
        read = asyncio.get_running_loop().run_in_executor(self._owner_reads, self.admission.read_owner, needed.namespace, needed.name)
        try:
            return await asyncio.wait_for(read, OWNER_READ_SECONDS)
        except TimeoutError:
            logger.bind(namespace=needed.namespace, name=needed.name).warning(
                "the TaskRun of a pod was not read within {} s: the pod is placed as no run's", OWNER_READ_SECONDS
            )
            return ReadOwner(needed.namespace, needed.name, None)

    def _answer(self, raw: bytes, path: str, reviewer: Reviewer, owner: ReadOwner | None = None) -> web.Response:
        """The response to one request body (in the loop, or in the large-review thread). `owner`: the
        TaskRun read for it (only Admission raises OwnerReadNeeded)."""
        try:
            body: Any = decode(raw)
        except (UnicodeDecodeError, ValueError):
            self._malformed()
            return _text(400, "the body is not JSON")
        except RecursionError:  # e.g. 100,000 nested arrays: the decoder gives up
            self._malformed()
            return _text(400, "the body is JSON nested too deeply")
        try:
            answer = self.admission.review(body, owner) if owner is not None else reviewer.review(body)
        except MalformedReview as error:
            logger.bind(path=path).warning("malformed AdmissionReview: {}", error)
            return _text(400, f"malformed AdmissionReview: {error}")
        return web.Response(body=encode(answer), headers=_JSON)

    def _malformed(self) -> None:
        self.metrics.count_malformed_review()

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
        self._health = await self._serve(self.health_app(), s.health_host, s.health_port, None)
        self._webhook = await self._serve(self.webhook_app(), s.webhook_host, s.webhook_port, self.tls)
        logger.info(
            "webhook on https://{}:{}/mutate and /validate, health on http://{}:{}",
            s.webhook_host, self.webhook_port, s.health_host, self.health_port,
        )

    async def _serve(self, app: web.Application, host: str, port: int, tls: ServingTLS | None) -> web.AppRunner:
        runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=self.shutdown_timeout, keepalive_timeout=IDLE_TIMEOUT_SECONDS,
            lingering_time=LINGER_SECONDS,
        )
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, host, port, ssl_context=tls.context if tls else None)
        await site.start()
        return runner

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests, close. Webhook first, health last."""
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        self._webhook = self._health = None
        if self._large_reviews is not None:
            self._large_reviews.shutdown(wait=False, cancel_futures=True)
            self._large_reviews = None
        if self._owner_reads is not None:
            self._owner_reads.shutdown(wait=False, cancel_futures=True)
            self._owner_reads = None

    @property
    def webhook_port(self) -> int:
        return _bound_port(self._webhook)

    @property
    def health_port(self) -> int:
        return _bound_port(self._health)


def _bound_port(runner: web.AppRunner | None) -> int:
    addresses = runner.addresses if runner is not None else []
    if not addresses:
        raise RuntimeError("the server is not running")
    return int(addresses[0][1])


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end on uvloop's event loop (libuv), the controller's loop: its transports and
    TLS cost less per request than asyncio's own (bench/README.md, admission)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
