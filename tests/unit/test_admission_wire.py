"""Checks the webhook's HTTP/1.1 (controller/admission/wire.py) over plain TCP on 127.0.0.1, with a
small handler that echoes bodies: keep-alive with a correct Content-Length, answers in order when
requests are pipelined, recycling (the Nth answer, or the first after the connection's age with an
injected clock, says `Connection: close` and the connection closes; never an idle one early), HTTP/1.0,
`Expect: 100-continue`, and what a hostile client gets: malformed HTTP 400, a head too large 431, a
chunked body over the limit 413 (the rest drained, then closed), a protocol upgrade 400, a body too slow
408, stalled headers closed, a handler that raises 500: each a clear answer, never a stall. The TLS side
(the same protocol behind the serving certificate) is checked in test_admission_server.py."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any, Awaitable, Callable

import pytest
import uvloop

from controller.admission import wire

TIMEOUT = 10.0


class Echo:
    """A wire.Handler: reads every body within `read_seconds` and answers it back (200); a body `raise`
    raises; `hold` answers nothing until `release_held()`."""

    def __init__(self, read_seconds: float = 5.0) -> None:
        self.read_seconds = read_seconds
        self.malformed_statuses: list[int] = []
        self.held: list[tuple[wire.Exchange, bytes]] = []
        self.holding = asyncio.Event()  # set once a body is held
        self.released = 0

    def begin(self, exchange: wire.Exchange) -> None:
        exchange.release = self._release
        exchange.read(self.read_seconds)

    def _release(self) -> None:
        self.released += 1

    def answer(self, exchange: wire.Exchange, body: bytes) -> None:
        if body == b"raise":
            raise RuntimeError("a bug")
        if body.startswith(b"hold"):
            self.held.append((exchange, body))
            self.holding.set()
            return
        exchange.respond(wire.Reply(200, body, wire.JSON))

    def release_held(self) -> None:
        for exchange, body in self.held:
            exchange.respond(wire.Reply(200, body, wire.JSON))
        self.held.clear()

    def malformed(self, status: int) -> None:
        self.malformed_statuses.append(status)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limits(**changes: Any) -> wire.Limits:
    return wire.Limits(**{"max_body": 1000, "idle_seconds": 5.0, "linger_seconds": 0.3, **changes})


def serving(handler: Echo, lim: wire.Limits, clock: Callable[[], float] = Clock(),
            test: Callable[[int], Awaitable[None]] | None = None, loop: str = "asyncio",
            count: Callable[[str], None] = lambda event: None) -> None:
    """Run `test(port)` against a listener, on a fresh event loop: asyncio's, or uvloop's (the controller's)."""

    async def main() -> None:
        listener = await wire.serve(handler, "127.0.0.1", 0, None, lim, clock=clock, count=count)
        try:
            assert test is not None
            await asyncio.wait_for(test(listener.port), TIMEOUT)
        finally:
            await listener.close(1.0)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None) as runner:
        runner.run(main())


def post(body: bytes, path: str = "/mutate", extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer: status, headers (lower-case names), body (by its Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    """The server closed the connection (EOF or reset) with nothing more sent."""
    try:
        return await reader.read() == b""
    except ConnectionError:
        return True


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_keep_alive_answers_in_order_with_their_length_even_pipelined(loop: str) -> None:
    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(b'{"a":1}'))
        assert await read_answer(reader) == (200, {"content-type": "application/json; charset=utf-8", "content-length": "7"}, b'{"a":1}')
        writer.write(post(b"first") + post(b"hold-second") + post(b"third"))  # pipelined; the second is answered late
        await handler.holding.wait()
        handler.release_held()
        assert [(await read_answer(reader))[2] for _ in range(3)] == [b"first", b"hold-second", b"third"]
        writer.close()

    handler = Echo()
    serving(handler, limits(), test=test, loop=loop)
    assert handler.released == 4 and handler.malformed_statuses == []


@pytest.mark.parametrize(
    ("served", "opened_at", "now", "max_requests", "max_seconds", "due"),
    [
        (1, 0.0, 0.0, 0, 0.0, False),  # never recycled
        (199, 0.0, 1.0, 200, 3.0, False),
        (200, 0.0, 1.0, 200, 3.0, True),  # the Nth answer
        (5, 10.0, 12.9, 200, 3.0, False),
        (5, 10.0, 13.0, 200, 3.0, True),  # the first answer after max_seconds
        (10_000, 0.0, 1e9, 0, 0.0, False),
    ],
)
def test_recycle_due(served: int, opened_at: float, now: float, max_requests: int, max_seconds: float, due: bool) -> None:
    assert wire.recycle_due(served, opened_at, now, limits(max_requests=max_requests, max_seconds=max_seconds)) is due


def test_the_nth_answer_closes_the_connection() -> None:
    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for i in range(1, 4):
            writer.write(post(b"x"))
            status, headers, _ = await read_answer(reader)
            assert (status, headers.get("connection")) == (200, "close" if i == 3 else None), i
        assert await closed(reader)
        writer.close()

    serving(Echo(), limits(max_requests=3), test=test)


def test_the_first_answer_after_the_age_closes_the_connection_never_an_idle_one() -> None:
    clock = Clock()

    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(b"x"))
        assert (await read_answer(reader))[1].get("connection") is None
        clock.now += 2.9
        writer.write(post(b"x"))
        assert (await read_answer(reader))[1].get("connection") is None
        clock.now += 0.1  # 3 s old: still open while idle; the next answer closes it
        assert not reader.at_eof()
        writer.write(post(b"x"))
        assert (await read_answer(reader))[1].get("connection") == "close"
        assert await closed(reader)
        writer.close()

    serving(Echo(), limits(max_seconds=3.0), clock, test=test)


def test_connections_opened_and_recycled_are_counted() -> None:
    """webhook_connections_total: one "opened" per connection, one "recycled" per answer that closes it by
    recycling; a client that asks to close, or a refusal, is no recycling."""
    events: list[str] = []

    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            writer.write(post(b"x"))
            await read_answer(reader)
        assert await closed(reader)
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(b"x", extra="Connection: close\r\n"))
        assert (await read_answer(reader))[1].get("connection") == "close"
        assert await closed(reader)
        writer.close()

    serving(Echo(), limits(max_requests=2), test=test, count=events.append)
    assert events == [wire.OPENED, wire.RECYCLED, wire.OPENED]


def test_http10_and_a_client_that_asks_to_close() -> None:
    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /mutate HTTP/1.0\r\nContent-Length: 1\r\nConnection: keep-alive\r\n\r\na")
        assert (await read_answer(reader))[1].get("connection") == "keep-alive"
        writer.write(b"POST /mutate HTTP/1.0\r\nContent-Length: 1\r\n\r\nb")
        assert (await read_answer(reader))[1].get("connection") == "close"
        assert await closed(reader)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(b"c", extra="Connection: close\r\n"))
        assert (await read_answer(reader))[1].get("connection") == "close"
        assert await closed(reader)

    serving(Echo(), limits(), test=test)


def test_expect_100_continue() -> None:
    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"ok")
        assert (await read_answer(reader))[::2] == (200, b"ok")

    serving(Echo(), limits(), test=test)


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        pytest.param(b"BREW /mutate HTTP/1.1\r\n\r\n", 400, id="not-a-method"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400, id="two-lengths"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, id="bad-chunk"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", 431, id="head-too-large"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nX: " + b"a" * 70_000, 431, id="head-too-large-unfinished"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 413, id="announced-too-large"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n" + b"a" * 1001 + b"\r\n0\r\n\r\n", 413,
                     id="chunked-too-large"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nUpgrade: h2c\r\nConnection: Upgrade\r\nContent-Length: 0\r\n\r\n", 400, id="upgrade"),
    ],
)
def test_hostile_requests_get_a_clear_answer_and_a_closed_connection(sent: bytes, status: int) -> None:
    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        answer = await read_answer(reader)
        assert (answer[0], answer[1].get("connection")) == (status, "close"), answer
        assert await closed(reader)

    handler = Echo()
    serving(handler, limits(), test=test)
    assert handler.malformed_statuses == [status]


def test_a_handler_that_raises_is_answered_500() -> None:
    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(b"raise"))
        assert (await read_answer(reader))[0] == 500
        assert await closed(reader)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # and it still serves
        writer.write(post(b"fine"))
        assert (await read_answer(reader))[::2] == (200, b"fine")

    serving(Echo(), limits(), test=test)


def test_a_slow_body_gets_408_and_stalled_headers_are_closed() -> None:
    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /mutate HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
        answer = await read_answer(reader)
        assert (answer[0], answer[1].get("connection")) == (408, "close")
        assert await closed(reader)  # after the linger
        stalled_reader, stalled = await asyncio.open_connection("127.0.0.1", port)
        stalled.write(b"POST /mutate HTTP/1.1\r\nHost")
        assert await closed(stalled_reader)  # idle_seconds without a complete head

    handler = Echo(read_seconds=0.2)
    serving(handler, limits(idle_seconds=0.3), test=test)
    assert handler.malformed_statuses == [408] and handler.released == 1


def test_a_refused_body_is_drained_so_the_client_reads_the_answer() -> None:
    """413 as soon as a chunked body passes the limit; the client sends the rest, then reads the answer."""

    async def test(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(30):
            writer.write(b"64\r\n" + b"a" * 100 + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        answer = await read_answer(reader)
        assert (answer[0], answer[1].get("connection")) == (413, "close")
        assert await closed(reader)

    serving(Echo(), limits(), test=test)


def test_stop_lets_answers_in_flight_finish_and_closes_every_connection() -> None:
    handler = Echo()

    async def main() -> None:
        listener = await wire.serve(handler, "127.0.0.1", 0, None, limits(), clock=Clock())
        port = listener.port
        idle_reader, _ = await asyncio.open_connection("127.0.0.1", port)
        busy_reader, busy = await asyncio.open_connection("127.0.0.1", port)
        busy.write(post(b"hold"))
        await asyncio.wait_for(handler.holding.wait(), TIMEOUT)  # the request is in
        closing = asyncio.ensure_future(listener.close(5.0))
        assert await asyncio.wait_for(closed(idle_reader), TIMEOUT)
        handler.release_held()
        answer = await asyncio.wait_for(read_answer(busy_reader), TIMEOUT)
        assert (answer[0], answer[1].get("connection")) == (200, "close")
        await asyncio.wait_for(closing, TIMEOUT)
        assert not listener.connections
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)

    asyncio.run(main())


class Transport:
    """A transport that records what is written (for the connection alone, without sockets)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    abort = close

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_a_lost_connection_and_its_half_read_body_are_freed_without_the_collector() -> None:
    """The parser holds its protocol: a lost connection breaks that cycle, so a large body read halfway is
    freed at once, not whenever the collector runs (the controller runs it rarely: controller/app.py)."""

    async def main() -> weakref.ref[wire.Connection]:
        connection = wire.Connection(Echo(), limits(max_body=10_000_000), Clock(), wire.Listener())
        connection.connection_made(Transport())  # type: ignore[arg-type]
        connection.data_received(b"POST /mutate HTTP/1.1\r\nContent-Length: 5000000\r\n\r\n" + b"a" * 1_000_000)
        connection.connection_lost(None)
        return weakref.ref(connection)

    gc.disable()
    try:
        ref = asyncio.run(main())
        assert ref() is None
    finally:
        gc.enable()


def test_the_listener_counts_the_connections_the_loop_is_working_on() -> None:
    """Background walks give way while the event loop works on a request (runner.GiveWay, #24): `working`
    is 1 while the handler answers, and back to 0 once each callback is done."""
    seen: list[int] = []

    class Counting(Echo):
        def answer(self, exchange: wire.Exchange, body: bytes) -> None:
            seen.append(listener.working)
            super().answer(exchange, body)

    async def main() -> None:
        nonlocal listener
        listener = await wire.serve(handler, "127.0.0.1", 0, None, limits())
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(post(b"one") + post(b"two"))
            assert [(await read_answer(reader))[2] for _ in range(2)] == [b"one", b"two"]
            writer.write(post(b"0123456789")[:-5])  # a body in two parts: two callbacks, one answer
            await writer.drain()
            writer.write(b"56789")
            assert (await read_answer(reader))[2] == b"0123456789"
            assert listener.working == 0  # each callback undid its count (none leaks)
            writer.close()
        finally:
            await listener.close(1.0)

    handler = Counting()
    listener: Any = None
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(main(), TIMEOUT))
    assert seen == [1, 1, 1]


class Afterwards(Echo):
    """Echo whose answers leave work for after them (`Reply.after`): each records what the transport had
    written when it ran."""

    def __init__(self, transport: Transport) -> None:
        super().__init__()
        self.transport = transport
        self.ran: list[tuple[bytes, int]] = []

    def reply(self, body: bytes) -> wire.Reply:
        return wire.Reply(200, body, wire.JSON, after=lambda: self.ran.append((body, len(self.transport.written))))

    def answer(self, exchange: wire.Exchange, body: bytes) -> None:
        if body.startswith(b"hold"):
            self.held.append((exchange, body))
            return
        exchange.respond(self.reply(body))

    def release_held(self) -> None:
        for exchange, body in self.held:
            exchange.respond(self.reply(body))
        self.held.clear()


def test_an_answers_later_work_runs_once_after_it_is_written_or_when_it_never_will_be() -> None:
    """A review's metrics and Events wait for its answer to be written (handlers.Admission.review_deferred);
    an answer that is never written (its connection gone) still does that work, once."""

    async def main() -> tuple[list[tuple[bytes, int]], list[tuple[bytes, int]]]:
        transport = Transport()
        handler = Afterwards(transport)
        connection = wire.Connection(handler, limits(), Clock(), wire.Listener())
        connection.connection_made(transport)  # type: ignore[arg-type]
        connection.data_received(post(b"first"))
        written_then = list(handler.ran)
        assert len(transport.written) == 1 and written_then == [(b"first", 1)]  # after its answer was written
        # Pipelined: the second is held, the third answered but waits behind it; the connection goes.
        connection.data_received(post(b"hold-second") + post(b"third"))
        connection.data_received(b"")
        connection.connection_lost(None)
        handler.release_held()  # answered after the connection went: never written, done all the same
        return written_then, handler.ran

    _, ran = asyncio.run(main())
    assert sorted(ran) == [(b"first", 1), (b"hold-second", 1), (b"third", 1)]  # each once, none written but the first
