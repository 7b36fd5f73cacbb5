"""The webhook proxy (devplacer/webhook_proxy.py) on its own, no cluster: run as a process in front of
two live backends and one dead port, every connection reaches a live backend, turn by turn; when a
backend dies the next connections go to the one left; with none left the connection is closed."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from devcluster.process import free_port, listens
from tests.waiting import wait_for

pytestmark = [pytest.mark.reliability]

REPO = Path(__file__).resolve().parents[2]


class Backend:
    """Answers each connection with its name, then closes it."""

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.recv(16)
                conn.sendall(self.name)

    def close(self) -> None:
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # stops listening now (wakes the blocked accept)
        except OSError:
            pass
        self.server.close()


def ask(port: int) -> bytes:
    """One connection through the proxy: what answered (b"" when the proxy closed it). A proxy that closes
    with our bytes unread makes the kernel reset the connection instead of ending it: closed too."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        try:
            conn.sendall(b"hello")
            return conn.recv(16)
        except ConnectionResetError:
            return b""


@pytest.fixture
def backends() -> Iterator[tuple[Backend, Backend]]:
    pair = Backend(b"A"), Backend(b"B")
    yield pair
    for backend in pair:
        backend.close()


@pytest.fixture
def proxy(backends: tuple[Backend, Backend]) -> Iterator[int]:
    port, dead = free_port(), free_port()
    argv = [sys.executable, "-m", "devplacer.webhook_proxy", "--listen", f"127.0.0.1:{port}",
            "--backend", f"127.0.0.1:{backends[0].port}", "--backend", f"127.0.0.1:{dead}", "--backend", f"127.0.0.1:{backends[1].port}"]
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for("the proxy to listen", lambda: listens(port), timeout=10, interval=0.05)
    yield port
    process.terminate()
    process.wait(10)


def test_connections_go_round_robin_to_live_backends_only(proxy: int, backends: tuple[Backend, Backend]) -> None:
    answers = Counter(ask(proxy) for _ in range(9))
    assert set(answers) == {b"A", b"B"} and sum(answers.values()) == 9  # the dead port is skipped, nothing lost
    assert min(answers.values()) >= 3  # turn by turn, not all to one

    backends[0].close()
    assert {ask(proxy) for _ in range(4)} == {b"B"}

    backends[1].close()
    assert ask(proxy) == b""
