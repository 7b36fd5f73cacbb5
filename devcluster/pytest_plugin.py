"""pytest plugin: the session-scoped `devcluster` fixture.

Enable with `pytest_plugins = ["devcluster.pytest_plugin"]`; tests that use the fixture carry the
`cluster` marker. One cluster is brought up per session in a temporary directory, or, when
EGRESS_PLACER_DEVCLUSTER=DIR names a running cluster, that one is used and left up.

The session cluster runs Tekton's own webhook (defaulting, validation, conversion) and resolvers
controller, as a real Tekton installation does: `SESSION_OPTIONAL`. EGRESS_PLACER_DEVCLUSTER_WITH=NAME[,NAME] names the
optional components instead (empty: the core cluster only).

A cluster the fixture started is always brought down: at session end (also after failures and
Ctrl-C, which pytest turns into a session teardown), at interpreter exit (atexit), on SIGTERM or
SIGHUP, and if the pytest process is killed outright its processes get SIGTERM from the kernel
(PR_SET_PDEATHSIG) and the next `up` reaps whatever remains (the owner pid is recorded).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterator

import pytest

from devcluster import build, tekton_resolvers, tekton_webhook
from devcluster.cluster import Cluster, ClusterError

EXISTING_CLUSTER_ENV = "EGRESS_PLACER_DEVCLUSTER"
OPTIONAL_ENV = "EGRESS_PLACER_DEVCLUSTER_WITH"
SESSION_OPTIONAL = (tekton_webhook.NAME, tekton_resolvers.NAME)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _DownGuard:
    """Brings a cluster down exactly once, whichever of teardown, atexit or a signal comes first."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._lock = threading.Lock()
        self._done = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        atexit.register(self.run)
        if threading.current_thread() is threading.main_thread():
            for sig in _STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.run()
        previous = self._previous.get(signum)
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        else:
            os.kill(os.getpid(), signum)

    def run(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        try:
            self.cluster.down()
        finally:
            atexit.unregister(self.run)
            if threading.current_thread() is threading.main_thread():
                for sig, previous in self._previous.items():
                    if signal.getsignal(sig) == self._on_signal:
                        signal.signal(sig, previous)


def session_optional() -> tuple[str, ...]:
    """The optional components the session cluster runs: `SESSION_OPTIONAL`, or the env's list."""
    value = os.environ.get(OPTIONAL_ENV)
    if value is None:
        return SESSION_OPTIONAL
    return tuple(name for name in (part.strip() for part in value.split(",")) if name)


def reporter(config: pytest.Config) -> Callable[[str], None]:
    """Progress lines straight to the terminal, past output capture (a cold build takes minutes)."""
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def log(message: str) -> None:
        if terminal is None:
            return
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            terminal.write_line(message)

    return log


VERSION_OPTIONS = {"--tekton-version": build.TEKTON_VERSION_ENV, "--kubernetes-version": build.KUBERNETES_VERSION_ENV}


def pytest_addoption(parser: pytest.Parser) -> None:
    """`--tekton-version`/`--kubernetes-version`: the session cluster's versions (as `python -m devcluster up` takes
    them; default: the variables EGRESS_PLACER_TEKTON_VERSION/EGRESS_PLACER_KUBERNETES_VERSION, else the pinned pair)."""
    group = parser.getgroup("devcluster")
    for option, variable in VERSION_OPTIONS.items():
        group.addoption(option, metavar="vX.Y.Z", default=None, help=f"the session cluster's version (env {variable})")


def pytest_configure(config: pytest.Config) -> None:
    for option, variable in VERSION_OPTIONS.items():
        value = config.getoption(option.lstrip("-").replace("-", "_"), default=None)
        if value:
            os.environ[variable] = value


@pytest.fixture(scope="session")
def devcluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running local cluster (Kubernetes + Tekton + KWOK nodes) for the whole session."""
    existing = os.environ.get(EXISTING_CLUSTER_ENV)
    if existing:
        cluster = Cluster(Path(existing), log=reporter(request.config))
        if not cluster.is_running():
            raise ClusterError(f"{EXISTING_CLUSTER_ENV}={existing} does not name a running cluster")
        yield cluster
        return
    cluster = Cluster(tmp_path_factory.mktemp("devcluster"), log=reporter(request.config), optional=session_optional())
    with brought_up(cluster) as running:
        yield running


@contextlib.contextmanager
def brought_up(cluster: Cluster) -> Iterator[Cluster]:
    """`cluster` up, owned by this process, and brought down at the end whatever happens (also on
    SIGTERM/SIGHUP and at exit): what the session fixture does, for a test that needs a cluster of its own."""
    guard = _DownGuard(cluster)
    guard.install()
    try:
        cluster.up(owner_pid=os.getpid())
        yield cluster
    finally:
        guard.run()
