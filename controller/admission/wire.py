"""The webhook's HTTP/1.1 on the wire: one `asyncio.Protocol` per connection, requests parsed by
httptools (llhttp, the parser of Node.js), so a review costs the server little beyond its TLS and
its handler (bench/README.md, admission).

What a connection guarantees, whatever the client sends:
- A request line and headers of at most HEAD_LIMIT bytes (431), a body of at most `Limits.max_body`
  bytes (413: before it is read when `Content-Length` says so, else as soon as a chunked body passes
  it), HTTP that llhttp parses (400 otherwise). Each refusal closes the connection.
- Deadlines: `Limits.idle_seconds` without a complete request head (an idle keep-alive connection, or
  stalled headers): closed. A body not all there `seconds` after the handler called `Exchange.read`:
  408. An answer written with `Connection: close` while the client is still sending its body: what
  comes is read and dropped for `Limits.linger_seconds`, so the client reads the answer, then the
  connection is cut.
- Answers in the order the requests came (pipelining), each with its `Content-Length`. While a
  request is being answered, or the client does not read its answers, nothing more is read.
- Keep-alive (HTTP/1.1, and HTTP/1.0 that asks for it), recycled: the answer to the
  `Limits.max_requests`-th request of a connection, or the first one after `Limits.max_seconds`
  (measured with the injected clock), says `Connection: close`, and the connection is closed once it
  is written. The API server keeps a few connections open for a long time, and a Kubernetes Service
  picks a replica once per connection: closing them makes the API server connect again, and so pick
  again (docs/architecture.md, "Replicas behind the Service"). Only an answer closes a connection
  that way, never an idle connection early: the client knows before it sends its next request.

The handler (`Handler`) decides what a request costs: at its head it reads the body within a
deadline, answers at once, or neither until a slot frees (reading pauses meanwhile); with the body
it answers at once or later (`Exchange.respond`). `Exchange.release`, set by the handler, is called
once when the exchange ends: answered, or its connection lost.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Callable, Protocol

import httptools
from loguru import logger

HEAD_LIMIT = 64 * 1024  # the request line and headers, at most (the API server sends a few hundred bytes)
TEXT = b"text/plain; charset=utf-8"
JSON = b"application/json; charset=utf-8"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {reason}\r\n".encode()
    return line


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer: status, body, its type; `close`: the connection closes after it (a request refused
    before its body was read); `headers`: more header lines (`Allow: POST`); `after`: the work the answer
    does not wait for (a review's metrics and Events), called once: right after the answer is written, or
    when it never will be (its exchange answered already, or its connection gone)."""

    status: int
    body: bytes
    content_type: bytes = TEXT
    close: bool = False
    headers: bytes = b""
    after: Callable[[], None] | None = field(default=None, compare=False)


def text(status: int, message: str, *, close: bool = False, headers: bytes = b"") -> Reply:
    return Reply(status, (message + "\n").encode(), TEXT, close, headers)


OPENED, RECYCLED = "opened", "recycled"  # Listener.count's events (webhook_connections_total{event})


@dataclass(frozen=True)
class Limits:
    """A connection's bounds (module docstring). `max_requests`, `max_seconds`: recycling, 0 for never."""

    max_body: int
    idle_seconds: float
    linger_seconds: float
    max_requests: int = 0
    max_seconds: float = 0.0


def recycle_due(served: int, opened_at: float, now: float, limits: Limits) -> bool:
    """Whether the answer to a connection's `served`-th request closes it (recycling)."""
    if limits.max_requests and served >= limits.max_requests:
        return True
    return bool(limits.max_seconds) and now - opened_at >= limits.max_seconds


class Handler(Protocol):
    """What answers the requests of a connection (controller/admission/server.py: AdmissionServer)."""

    def begin(self, exchange: Exchange) -> None:
        """A request's head is in: call `exchange.read(seconds)`, `exchange.respond(...)` (a refusal:
        `close=True` unless the body is read), or neither yet (reading pauses until one is called)."""

    def answer(self, exchange: Exchange, body: bytes | bytearray) -> None:
        """Its body is in: call `exchange.respond(...)`, now or later."""

    def malformed(self, status: int) -> None:
        """The wire refused a request itself: 400 (not HTTP), 408 (too slow), 413, 431 (too large)."""


class Exchange:
    """One request on a connection, from its head to its answer."""

    __slots__ = ("connection", "method", "path", "length", "keep_alive", "says_keep_alive", "expects_continue", "route",
                 "release", "body", "size", "reading", "read_seconds", "read_by", "complete", "reply", "after")

    def __init__(self, connection: Connection, method: bytes, path: bytes, length: int | None, keep_alive: bool,
                 says_keep_alive: bool, expects_continue: bool) -> None:
        self.connection = connection
        self.method = method
        self.path = path  # without the query (the API server adds `?timeout=3s`)
        self.length = length  # Content-Length; None for a chunked body
        self.keep_alive = keep_alive
        self.says_keep_alive = says_keep_alive  # `Connection: keep-alive` (HTTP/1.0's way): echoed
        self.expects_continue = expects_continue
        self.route: Any = None  # the handler's, e.g. which reviewer answers
        self.release: Callable[[], None] | None = None  # the handler's, called once when the exchange ends
        self.body: bytes | bytearray = b""  # what has come of the body: its first chunk, then a bytearray (one copy)
        self.size = 0
        self.reading = False
        self.read_seconds = 0.0
        self.read_by: float | None = None
        self.complete = False  # the whole body is in
        self.reply: Reply | None = None
        self.after: Callable[[], None] | None = None  # its reply's `after`, until run

    def read(self, seconds: float) -> None:
        """Read the body, all of it within `seconds` (else 408); `Handler.answer` gets it."""
        self.connection.read(self, seconds)

    def respond(self, reply: Reply) -> None:
        """Answer (once; an exchange whose connection is gone, or answered, ignores it)."""
        self.connection.respond(self, reply)

    @property
    def open(self) -> bool:
        return self.reply is None and not self.connection.lost


class Connection(asyncio.Protocol):
    """One client connection (module docstring)."""

    def __init__(self, handler: Handler, limits: Limits, clock: Callable[[], float], listener: Listener) -> None:
        self.handler = handler
        self.limits = limits
        self.clock = clock
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.loop = asyncio.get_running_loop()
        self.lost = False
        self.opened_at = 0.0
        self.served = 0
        self._pending: deque[Exchange] = deque()  # begun, not yet written, in order
        self._current: Exchange | None = None  # the request whose body is being received
        self._head_bytes = 0
        self._in_head = False
        self._header_bytes = 0
        self._url = b""
        self._length: int | None = 0
        self._continue = False
        self._says_keep_alive = False
        self._closing = False  # a closing answer is written: nothing more is begun
        self._broken = False  # the parser failed: nothing more is parsed
        self._reading_paused = self._writing_paused = False
        self._idle_since: float | None = None
        self._linger_until = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    # -- the transport ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] # uvloop's transports are not asyncio.Transport subclasses
        self.opened_at = self.clock()
        self.listener.connections.add(self)
        self.listener.count(OPENED)
        self._idle_since = self.loop.time()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._broken = True
        self.parser = None  # it holds this protocol: no cycle keeps a connection (and a body) for the collector
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, deque()
        self._current = None
        for exchange in pending:
            _finish(exchange)
        self.listener.gone(self)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        listener = self.listener
        listener.working += 1
        try:
            self._received(data)
        finally:
            listener.working -= 1

    def _received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None or self._broken or (self._closing and self._current is None):
            return  # dropped: the connection closes
        if self._current is None:  # a head (or idle), counted until the head is complete
            self._head_bytes += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken = True  # answered 400 at its head; what follows is not HTTP
        except httptools.HttpParserError as error:
            cause = error.__context__ if isinstance(error, httptools.HttpParserCallbackError) else None
            if cause is not None:  # a bug of ours, not the client's
                logger.opt(exception=cause).error("the webhook failed on a request")
                self._refuse_wire(500, "the webhook failed on this request", count=False)
            else:
                self._refuse_wire(400, f"malformed HTTP request: {error}")
            return
        if self._in_head and self._head_bytes > HEAD_LIMIT:
            self._refuse_wire(431, f"the request head is over {HEAD_LIMIT} bytes")
            return
        current = self._current
        if current is not None and current.reading and current.read_by is None and not self.lost:
            current.read_by = self.loop.time() + current.read_seconds
            self._watch()

    # -- the parser's callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._header_bytes = 0
        self._url = b""
        self._length = 0
        self._continue = False
        self._says_keep_alive = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        size = len(name)  # the length first: most headers are none of these
        if size == 14 and name.lower() == b"content-length":
            self._length = int(value)  # llhttp checked it: digits, not twice
        elif size == 17 and name.lower() == b"transfer-encoding":
            self._length = None
        elif size == 6 and name.lower() == b"expect":
            self._continue = value.lower() == b"100-continue"
        elif size == 10 and name.lower() == b"connection":
            self._says_keep_alive = b"keep-alive" in value.lower()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        if self._closing:
            return
        self._idle_since = None
        parser = self.parser
        assert parser is not None
        keep_alive = parser.should_keep_alive()
        exchange = Exchange(self, parser.get_method(), self._url.split(b"?", 1)[0], self._length, keep_alive,
                            self._says_keep_alive, self._continue)
        self._current = exchange
        self._pending.append(exchange)
        if self._header_bytes + len(self._url) > HEAD_LIMIT:  # a head that came whole in one read
            self._refuse(exchange, 431, f"the request head is over {HEAD_LIMIT} bytes")
        elif parser.should_upgrade():
            self._refuse(exchange, 400, "protocol upgrades are not supported")
        elif exchange.length is not None and exchange.length > self.limits.max_body:
            self._refuse(exchange, 413, f"the body is over the limit of {self.limits.max_body} bytes")
        else:
            try:
                self.handler.begin(exchange)
            except Exception:  # noqa: BLE001 - a bug of ours: answered 500, never a stalled connection
                logger.exception("the webhook failed on a request's head")
                exchange.respond(text(500, "the webhook failed on this request", close=True))
        if exchange.reply is None and not exchange.reading:
            self._update_reading()  # waits for a slot: read nothing meanwhile

    def on_body(self, body: bytes) -> None:
        exchange = self._current
        if exchange is None or exchange.reply is not None:
            return  # refused: dropped
        exchange.size += len(body)
        if exchange.size > self.limits.max_body:
            exchange.body = b""
            self._refuse(exchange, 413, f"the body is over the limit of {self.limits.max_body} bytes")
            return
        held = exchange.body
        if not held:
            exchange.body = body
        else:
            if not isinstance(held, bytearray):  # the second chunk: from now on extended in place
                held = exchange.body = bytearray(held)
            held += body

    def on_message_complete(self) -> None:
        exchange, self._current = self._current, None
        if exchange is None:
            return
        exchange.complete = True
        if exchange.reply is not None:  # refused: the body is drained, the connection can close now
            if self._closing and not self._pending and self.transport is not None:
                self._close()
            return
        if exchange.reading:
            self._answer(exchange)
        else:
            self._update_reading()  # complete, waiting for its slot

    # -- exchanges ----------------------------------------------------------------------------------

    def read(self, exchange: Exchange, seconds: float) -> None:
        if not exchange.open or exchange.reading:
            return
        exchange.reading = True
        exchange.read_seconds = seconds
        if exchange.complete:
            self._answer(exchange)
            return
        if exchange.expects_continue and self._pending and self._pending[0] is exchange and self.transport is not None:
            self.transport.write(CONTINUE)
        if exchange is not self._current or self._reading_paused:  # granted later (a slot freed): reading resumes
            exchange.read_by = self.loop.time() + seconds
            self._watch()
            self._update_reading()

    def _answer(self, exchange: Exchange) -> None:
        body, exchange.body = exchange.body, b""
        try:
            self.handler.answer(exchange, body)
        except Exception:  # noqa: BLE001 - a bug of ours: answered 500, never a stalled connection
            logger.exception("the webhook failed on a request")
            exchange.respond(text(500, "the webhook failed on this request", close=True))

    def respond(self, exchange: Exchange, reply: Reply) -> None:
        if exchange.reply is not None or self.lost:
            _run_after(reply.after)  # never written: done all the same
            return
        exchange.reply, exchange.after = reply, reply.after
        if self._pending and self._pending[0] is exchange:
            self._flush()

    def _refuse(self, exchange: Exchange, status: int, message: str) -> None:
        self.handler.malformed(status)
        exchange.respond(text(status, message, close=True))

    def _refuse_wire(self, status: int, message: str, count: bool = True) -> None:
        """Not HTTP, or a head too large: the request in progress (or a new one) gets `status`, and
        nothing more is parsed."""
        self._broken = True
        if count:
            self.handler.malformed(status)
        exchange = self._current
        if exchange is None or exchange.reply is not None:
            exchange = Exchange(self, b"", b"", 0, False, False, False)
            self._pending.append(exchange)
        self._current = None
        exchange.respond(text(status, message, close=True))

    def _flush(self) -> None:
        """Write the answers that are next in order; close after a closing one."""
        transport = self.transport
        assert transport is not None
        pending = self._pending
        while pending and pending[0].reply is not None:
            exchange = pending.popleft()
            reply = exchange.reply
            assert reply is not None
            self.served += 1
            closing = reply.close or not exchange.keep_alive or self.listener.stopping
            recycled = not closing and recycle_due(self.served, self.opened_at, self.clock(), self.limits)
            close = closing or recycled
            if recycled:
                self.listener.count(RECYCLED)
            body = reply.body
            head = b"%bContent-Type: %b\r\nContent-Length: %d\r\n%b%b\r\n" % (
                _status_line(reply.status), reply.content_type, len(body), reply.headers,
                b"Connection: close\r\n" if close else b"Connection: keep-alive\r\n" if exchange.says_keep_alive else b"",
            )
            transport.write(head + body)
            _finish(exchange)
            if close:
                self._closing = True
                for later in pending:  # pipelined after it: never answered (the client may send them again)
                    _finish(later)
                pending.clear()
                if self._current is None or self._current.reply is None or self._broken:
                    self._close()
                else:  # a refused body still coming: drop it for a while, so the client reads the answer
                    self._linger_until = self.loop.time() + self.limits.linger_seconds
                    self._watch()
                    self._update_reading()
                return
        if not pending and self._current is None:
            self._idle_since = self.loop.time()
            if self._timer is None:  # else it is due before this idle deadline, and re-arms itself
                self._watch()
            if self.listener.stopping:
                self._close()
                return
        self._update_reading()

    def close_if_idle(self) -> None:
        if not self._pending and self._current is None:
            self._close()

    def _close(self) -> None:
        """Close (the answers written are sent first); cut it off if that has not happened within the linger time."""
        self._closing = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self._linger_until = self.loop.time() + self.limits.linger_seconds
        self._watch()

    def _update_reading(self) -> None:
        """Read while a body is awaited (or dropped); pause while a request waits for its slot or its answer,
        or while the client does not read its answers."""
        if self.transport is None or self.lost:
            return
        pause = not self._closing and (self._writing_paused or any(
            e.reply is None and (e.complete or not e.reading) for e in self._pending))
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # -- deadlines: one timer per connection, at the earliest ------------------------------------------

    def _deadline(self) -> float | None:
        if self._closing:
            return self._linger_until
        deadlines = []
        if self._idle_since is not None:
            deadlines.append(self._idle_since + self.limits.idle_seconds)
        for exchange in self._pending:
            if exchange.read_by is not None and exchange.reply is None and not exchange.complete:
                deadlines.append(exchange.read_by)
        return min(deadlines) if deadlines else None

    def _watch(self) -> None:
        """Arm the timer for the earliest deadline (it re-arms itself for later ones)."""
        if self.lost:
            return
        deadline = self._deadline()
        if deadline is None or (self._timer is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(deadline, self._expire)
        self._timer_at = deadline

    def _expire(self) -> None:
        self._timer = None
        if self.lost or self.transport is None:
            return
        now = self.loop.time()
        if self._closing:
            if now >= self._linger_until:
                self.transport.abort()
                return
        else:
            for exchange in list(self._pending):
                if exchange.read_by is not None and exchange.reply is None and not exchange.complete and now >= exchange.read_by:
                    self._refuse(exchange, 408, f"the request body did not arrive within {exchange.read_seconds:.0f} s")
            if self._idle_since is not None and now >= self._idle_since + self.limits.idle_seconds and not self._closing:
                self._close()
        self._watch()


def _finish(exchange: Exchange) -> None:
    """The exchange ends (its reply written, or never to be): its slot is released, its reply's `after` run."""
    exchange.body = b""  # a body refused half-read is not kept
    release, exchange.release = exchange.release, None
    after, exchange.after = exchange.after, None
    if exchange.reply is None:
        exchange.reply = text(503, "the connection is gone")  # nothing is written for it any more
    if release is not None:
        release()
    _run_after(after)


def _run_after(after: Callable[[], None] | None) -> None:
    if after is None:
        return
    try:
        after()
    except Exception:  # noqa: BLE001 - a bug of ours in bookkeeping: logged, the connection goes on
        logger.exception("the work after an answer failed")


class Listener:
    """The listening socket and its connections. `close(timeout)`: stop accepting, let the requests in
    flight be answered (each answer then closes its connection) for up to `timeout` seconds, cut off the rest."""

    def __init__(self, count: Callable[[str], None] = lambda event: None) -> None:
        self.connections: set[Connection] = set()
        self.count = count  # called with OPENED for each connection accepted, RECYCLED for each closed by recycling
        self.stopping = False
        self.server: asyncio.AbstractServer | None = None
        self._all_gone: asyncio.Event | None = None
        # The connections' callbacks the event loop is inside now (a request's bytes parsed, its answer built
        # and written): read by background threads, which give way meanwhile (runner.GiveWay).
        self.working = 0

    def gone(self, connection: Connection) -> None:
        self.connections.discard(connection)
        if not self.connections and self._all_gone is not None:
            self._all_gone.set()

    @property
    def port(self) -> int:
        if self.server is None or not self.server.sockets:
            raise RuntimeError("the server is not running")
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self, timeout: float) -> None:
        if self.server is None:
            return
        self.stopping = True
        self.server.close()
        self._all_gone = asyncio.Event()
        for connection in list(self.connections):
            connection.close_if_idle()  # the others close after their answers
        if self.connections:
            try:
                await asyncio.wait_for(self._all_gone.wait(), timeout)
            except TimeoutError:
                for connection in list(self.connections):
                    if connection.transport is not None:
                        connection.transport.abort()
        try:
            await asyncio.wait_for(self.server.wait_closed(), 1.0)
        except TimeoutError:
            pass
        self.server = None


async def serve(handler: Handler, host: str, port: int, ssl: Any, limits: Limits,
                clock: Callable[[], float] = time.monotonic, handshake_seconds: float = 10.0,
                count: Callable[[str], None] = lambda event: None) -> Listener:
    """Listen on host:port (TLS with the context `ssl`: certificates loaded into it later are presented on
    the next handshake) and serve each connection with `handler`; `count`: see `Listener`."""
    listener = Listener(count)
    loop = asyncio.get_running_loop()
    listener.server = await loop.create_server(
        lambda: Connection(handler, limits, clock, listener), host, port, ssl=ssl,
        ssl_handshake_timeout=handshake_seconds if ssl is not None else None, reuse_address=True, backlog=1024,
    )
    return listener
