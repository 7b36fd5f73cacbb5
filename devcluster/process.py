"""Starting, checking and stopping the cluster's processes by pid.

A pid alone can be reused by the kernel, so each record also keeps the process's start time
(field 22 of /proc/PID/stat); a record whose pid now belongs to another process counts as gone
and is never signalled.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessRecord:
    """One process the cluster started: what `down` stops and `status` reports."""

    name: str
    pid: int
    start_time: int
    argv: list[str]
    log: str
    port: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def alive(self) -> bool:
        return is_alive(self.pid, self.start_time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProcessRecord":
        return cls(**data)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # "pid (comm) state ..." where comm may hold spaces or parentheses.
    return raw[raw.rindex(")") + 2 :].split()


def start_time_of(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when no such process exists."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_alive(pid: int, start_time: int) -> bool:
    """True when `pid` is the process that started at `start_time` and is not a zombie."""
    fields = _stat_fields(pid)
    if fields is None or int(fields[19]) != start_time:
        return False
    if fields[0] in ("Z", "X"):
        _reap(pid)
        return False
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: init reaps it


def _die_with_parent() -> None:
    """Run in the child before exec: SIGKILL it when the process that started it dies.

    SIGKILL, not SIGTERM: all processes get the signal at once, and a kube-apiserver whose etcd
    is already gone hangs in its graceful shutdown."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    *,
    port: int | None = None,
    die_with_parent: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> ProcessRecord:
    """Start `argv` in its own session with output appended to `log`; return its record."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )
    start = start_time_of(proc.pid)
    if start is None:  # exited at once: keep a record anyway so the caller sees it dead
        start = -1
    return ProcessRecord(name, proc.pid, start, list(argv), str(log), port, dict(extra or {}))


def stop(records: Iterable[ProcessRecord], timeout: float = 10.0) -> list[ProcessRecord]:
    """SIGTERM every live record, SIGKILL what is left after `timeout`; return those still alive."""
    live = [r for r in records if r.alive()]
    for record in live:
        _signal(record, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [r for r in live if r.alive()]
    for record in live:
        _signal(record, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [r for r in live if r.alive()]
    return live


def _signal(record: ProcessRecord, sig: signal.Signals) -> None:
    if not record.alive():
        return
    try:
        os.kill(record.pid, sig)
    except ProcessLookupError:
        pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listens(port: int) -> bool:
    """Does something accept TCP connections on 127.0.0.1:`port` now?"""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0
