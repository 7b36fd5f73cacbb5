"""Faults for the local cluster: kill a recorded component and start it again the way it was started.

A component is a process the cluster recorded (`etcd`, `kube-apiserver`, `egress-placer-0`, ...).
`kill_component` takes a `Component` snapshot first (argv from the record, environment from
/proc/PID/environ, port and health URL), sends the signal (SIGKILL by default) and waits until the
process is gone. `start_component` starts a snapshot again, optionally with flags appended (a Go
component takes the last value of a repeated flag, so `--max-requests-inflight=1` appended overrides
the devcluster's `=0`), and waits until its health URL answers 200. `restart_component` does both.

Processes are signalled by recorded pid (with its start time), never by name.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import requests

from devcluster.cluster import Cluster, ClusterError
from devcluster.process import ProcessRecord, start_time_of

DEFAULT_READY_TIMEOUT = 90.0


@dataclass(frozen=True)
class Component:
    """What it takes to start a recorded component again."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    port: int | None
    health_url: str | None

    def with_args(self, extra_args: Sequence[str]) -> "Component":
        return replace(self, argv=(*self.argv, *extra_args))


def _record(cluster: Cluster, name: str) -> ProcessRecord:
    record = cluster.process(name)
    if record is None:
        raise ClusterError(f"no recorded process named {name} in {cluster.dir}")
    return record


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def snapshot(cluster: Cluster, name: str) -> Component:
    """The running component `name` as it was started (its process must be alive)."""
    record = _record(cluster, name)
    if not record.alive():
        raise ClusterError(f"{name} (pid {record.pid}) is not running: its environment cannot be read")
    return Component(name, tuple(record.argv), _environ(record.pid), record.port, record.extra.get("health_url"))


def _exited(record: ProcessRecord) -> bool:
    """Every thread of the process has exited. A killed Go program's main thread shows Z while its
    other threads still run their exit (and still hold its listening sockets)."""
    try:
        os.waitpid(record.pid, os.WNOHANG)  # our child: reaped once the whole thread group is dead
    except ChildProcessError:
        pass
    if start_time_of(record.pid) != record.start_time:
        return True  # gone (or the pid now belongs to another process)
    try:
        states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in Path(f"/proc/{record.pid}/task").iterdir()]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return all(state in ("Z", "X") for state in states)


def _port_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:`port` (bound as a Go server binds: SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def kill_component(cluster: Cluster, name: str, sig: signal.Signals = signal.SIGKILL, timeout: float = 15.0) -> Component:
    """Signal the recorded process `name` and wait until all its threads are gone and its port is free;
    return how to start it again."""
    component = snapshot(cluster, name)
    record = _record(cluster, name)
    os.kill(record.pid, sig)
    deadline = time.monotonic() + timeout
    while not _exited(record) or (component.port is not None and not _port_free(component.port)):
        if time.monotonic() > deadline:
            raise ClusterError(f"{name} (pid {record.pid}) still runs or holds its port {timeout:.0f}s after {sig.name}")
        time.sleep(0.02)
    return component


def is_healthy(cluster: Cluster, component: Component) -> bool:
    """Its health URL answers 200 (HTTPS URLs with the cluster CA and the admin client certificate)."""
    if component.health_url is None:
        record = cluster.process(component.name)
        return record is not None and record.alive()
    session = requests.Session()
    session.trust_env = False  # else REQUESTS_CA_BUNDLE overrides `verify` (psf/requests#3829)
    session.verify = str(cluster.ca_file)
    admin = cluster.pki.dir / "admin"
    session.cert = (str(admin / "admin.crt"), str(admin / "admin.key"))
    try:
        return session.get(component.health_url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
    finally:
        session.close()


def wait_healthy(cluster: Cluster, component: Component, timeout: float = DEFAULT_READY_TIMEOUT) -> float:
    """Wait until the component answers its health URL; the seconds it took. Fails if it exits."""
    started = time.monotonic()
    while not is_healthy(cluster, component):
        record = cluster.process(component.name)
        if record is None or not record.alive():
            log = Path(record.log).read_text(errors="replace")[-3000:] if record else "(not recorded)"
            raise ClusterError(f"{component.name} exited while starting; log tail:\n{log}")
        if time.monotonic() - started > timeout:
            raise ClusterError(f"{component.name} not healthy within {timeout:.0f}s")
        time.sleep(0.1)
    return time.monotonic() - started


def start_component(
    cluster: Cluster,
    component: Component,
    extra_args: Sequence[str] = (),
    *,
    wait: bool = True,
    timeout: float = DEFAULT_READY_TIMEOUT,
) -> Component:
    """Start `component` again (with `extra_args` appended) under its recorded name; wait until healthy."""
    started = component.with_args(extra_args)
    cluster.start_process(
        started.name, list(started.argv), started.env, port=started.port, health_url=started.health_url
    )
    if wait:
        wait_healthy(cluster, started, timeout)
    return started


def restart_component(
    cluster: Cluster,
    name: str,
    extra_args: Sequence[str] = (),
    *,
    sig: signal.Signals = signal.SIGKILL,
    timeout: float = DEFAULT_READY_TIMEOUT,
) -> Component:
    """Kill `name` (SIGKILL by default) and start it again with the same argv (plus `extra_args`) and
    environment; return the component as it was BEFORE (start it again to undo changed flags)."""
    before = kill_component(cluster, name, sig)
    start_component(cluster, before, extra_args, timeout=timeout)
    return before
