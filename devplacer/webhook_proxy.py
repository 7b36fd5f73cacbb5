"""A tiny TCP round-robin proxy in front of several controller replicas: the API server's one webhook URL
reaches whichever replica is alive, as a Service does in a real cluster.

    python -m devplacer.webhook_proxy --listen 127.0.0.1:PORT --backend 127.0.0.1:P1 --backend 127.0.0.1:P2

Each client connection goes to the next backend in turn; a backend that refuses the connection (or
does not accept it within `--connect-timeout`) is skipped for the next one, and a connection no
backend accepts is closed. Bytes are copied both ways untouched (TLS ends at the replica), so the
replicas' serving certificate must be valid for the proxy's address. One log line per connection
that had to skip a backend, and one per connection nobody took.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from typing import Iterator, Sequence

Address = tuple[str, int]
CHUNK = 64 * 1024


def parse_address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass


def _close(writer: asyncio.StreamWriter) -> None:
    try:
        writer.close()
    except (ConnectionError, OSError, RuntimeError):
        pass


class RoundRobinProxy:
    def __init__(self, backends: Sequence[Address], connect_timeout: float = 1.0) -> None:
        if not backends:
            raise ValueError("at least one backend")
        self.backends = list(backends)
        self.connect_timeout = connect_timeout
        self._turn: Iterator[int] = itertools.cycle(range(len(self.backends)))

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        first = next(self._turn)
        skipped = []
        for i in range(len(self.backends)):
            host, port = self.backends[(first + i) % len(self.backends)]
            try:
                connection = await asyncio.wait_for(asyncio.open_connection(host, port), self.connect_timeout)
            except (OSError, asyncio.TimeoutError) as error:
                skipped.append(f"{host}:{port} ({type(error).__name__})")
                continue
            if skipped:
                print(f"webhook-proxy: skipped {', '.join(skipped)}; using {host}:{port}", flush=True)
            return connection
        print(f"webhook-proxy: no backend took the connection: {', '.join(skipped)}", flush=True)
        return None

    async def handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        backend = await self._connect()
        if backend is None:
            _close(client_writer)
            return
        backend_reader, backend_writer = backend
        pipes = [
            asyncio.ensure_future(_pipe(client_reader, backend_writer)),
            asyncio.ensure_future(_pipe(backend_reader, client_writer)),
        ]
        # When either side is done (EOF or error), the connection is over for both.
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        for pipe in pipes:
            pipe.cancel()
        _close(backend_writer)
        _close(client_writer)

    async def serve(self, listen: Address) -> None:
        server = await asyncio.start_server(self.handle, listen[0], listen[1])
        backends = ", ".join(f"{h}:{p}" for h, p in self.backends)
        print(f"webhook-proxy: listening on {listen[0]}:{listen[1]}, backends {backends}", flush=True)
        async with server:
            await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devplacer.webhook_proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=parse_address, required=True, help="HOST:PORT to listen on")
    parser.add_argument("--backend", type=parse_address, action="append", required=True, help="HOST:PORT (repeat)")
    parser.add_argument("--connect-timeout", type=float, default=1.0, help="seconds before a backend is skipped")
    args = parser.parse_args(argv)
    try:
        asyncio.run(RoundRobinProxy(args.backend, args.connect_timeout).serve(args.listen))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
