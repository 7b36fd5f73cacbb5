"""The one harness of the tests that run egress-placer on the local cluster: the e2e tests (tests/e2e) and
the reliability suite (tests/reliability) both use it. tests/conftest.py loads it as a pytest plugin.

Fixtures:
- `egress_placer` (per module): egress-placer started as the module's `CONTROLLER = ControllerSpec(...)`
  says (by default one replica with the suite's policy, the `suite_policy` fixture of the suite's
  conftest), its pool taints awaited; the cluster made plain afterwards (`make_plain`). A module that
  starts it another way overrides the fixture with `running_placer(...)`.
- `runs` (per test): the test's runs and pods (tests/e2e/tekton_runs.py), deleted afterwards.
The suites' tenant namespaces are theirs (the `tenants` fixture of each conftest, through
`tenant_namespaces`): they differ on purpose, so the two never wait on each other.

Helpers: `Placer`, the running replicas (log, metrics, readiness); the pool taints (`pool_taints`,
`taints_right`, `remove_pool_taint(s)`); the leader Lease; a tenant with `edit` (`editor`); `quietly` for a probe that must outlast an
API server that is away; the `egress-placer` command as an administrator runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

import pytest
import requests
import urllib3
from kubernetes.client.exceptions import ApiException

from controller.compat import core as compat
from controller.pool_guard.core import GUARD_NAME
from controller.core.model import TAINT_KEY
from controller.core.rights import POD_DELETES_NAME, RIGHTS_NAME
from controller.core.run_guard import RUN_GUARD_NAME
from devcluster import build
from devcluster.cluster import Cluster
from devplacer.local_placer import (
    NAMESPACE,
    POOLS_WEBHOOK_CONFIG,
    WEBHOOK_CONFIG,
    ControllerReplica,
    replicas_of,
    start_controller,
    stop_controller,
)
from tests.e2e.tekton_runs import ORDINARY_NODES, POOL_NODES, POOL_TAINT, Runs
from tests.kube import Api, api_for, namespace, namespaced, namespaces_left, node
from tests.waiting import wait_for, wait_gone

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "e2e"
POLICY_FILE = DATA / "policy.yaml"  # the e2e tests' policy (tenants team-cdn, team-other)
INVALID_POLICY_FILE = DATA / "policy-invalid.yaml"  # `placment` (line 10) is not a field
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
WEBHOOK_CONFIGS = f"{ADMISSION}/mutatingwebhookconfigurations"
VALIDATING_WEBHOOK_CONFIGS = f"{ADMISSION}/validatingwebhookconfigurations"
LEASE = "egress-placer-leader"
LEASE_PATH = namespaced(NAMESPACE, "leases", LEASE, group="/apis/coordination.k8s.io/v1")
RBAC = "/apis/rbac.authorization.k8s.io/v1"
TAINTS_SECONDS = 30.0  # a started controller's leader taints the pool nodes within this


# -- probes ------------------------------------------------------------------------------------------


def quietly(probe: Callable[[], T]) -> Callable[[], T | bool]:
    """`probe` for `wait_for` while the API server may be restarting: False while it cannot be reached
    (connection errors, 5xx, 404, 429), the probe's answer otherwise; other 4xx errors still fail."""

    def answer() -> T | bool:
        try:
            return probe()
        except (ApiException, requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
            if isinstance(error, ApiException) and 400 <= (error.status or 0) < 500 and error.status not in (404, 429):
                raise
            return False

    return answer


# -- the running controller --------------------------------------------------------------------------


def parse_samples(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The sum of every sample of metric `name` whose labels include `labels` (Prometheus text)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        present = dict(part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part)
        if all(present.get(k) == f'"{v}"' for k, v in (labels or {}).items()):
            total += float(value)
    return total


@dataclass(frozen=True)
class Placer:
    """The egress-placer replicas running on the cluster (looked up again after each restart).
    `replica` is the first; methods that take a `replica` default to it."""

    cluster: Cluster

    @property
    def replicas(self) -> list[ControllerReplica]:
        return replicas_of(self.cluster)

    @property
    def replica(self) -> ControllerReplica:
        return self.replicas[0]

    def named(self, identity: str) -> ControllerReplica:
        """The replica with this identity (the leader Lease's holderIdentity)."""
        return next(r for r in self.replicas if r.identity == identity)

    def log_of(self, replica: ControllerReplica | None = None) -> Path:
        return self.cluster.dir / "logs" / f"{(replica or self.replica).name}.log"

    @property
    def log(self) -> Path:
        return self.log_of()

    def log_records(self, offset: int = 0, replica: ControllerReplica | None = None) -> list[dict[str, object]]:
        """The JSON log lines written from byte `offset` on (other lines are skipped)."""
        with open(self.log_of(replica), "rb") as f:
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def metrics_text(self, replica: ControllerReplica | None = None) -> str:
        """The replica's /metrics page (Prometheus text)."""
        return requests.get((replica or self.replica).health_url + "/metrics", timeout=5).text

    def metric(self, name: str, labels: Mapping[str, str] | None = None, replica: ControllerReplica | None = None) -> float:
        """The sum of the samples of `name` whose labels include `labels` (0 when there is none yet)."""
        return parse_samples(self.metrics_text(replica), name, labels)

    def ready(self, replica: ControllerReplica | None = None) -> bool:
        try:
            return requests.get((replica or self.replica).health_url + "/readyz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def pid(self, replica: ControllerReplica | None = None) -> int:
        name = (replica or self.replica).name
        record = self.cluster.process(name)
        assert record is not None and record.alive(), f"{name} is not running"
        return record.pid


def tekton_version(cluster: Cluster) -> str:
    """The Tekton version the cluster runs (cluster.json `versions`; a cluster brought up before it was recorded: the pin)."""
    return (cluster.state().get("versions") or {}).get("tekton") or build.pinned_version(build.COMPONENTS[3])


def tekton_holds_taskruns(cluster: Cluster) -> bool:
    """Has the cluster's Tekton `TaskRunPending` (controller.compat.core.TASKRUN_PENDING_SINCE)?"""
    return compat.assess(tekton_version(cluster), None).taskrun_pending


@dataclass(frozen=True)
class ControllerSpec:
    """How the `egress_placer` fixture starts egress-placer for a module (`CONTROLLER = ControllerSpec(...)`);
    the fields are `devplacer.local_placer.start_controller`'s. `policy` None: the suite's."""

    policy: Path | None = None
    replicas: int = 1
    proxy: bool = False
    env: tuple[tuple[str, str], ...] = ()  # settings for this module's controller (EGRESS_PLACER_*)
    pool_guard: bool = False
    controller_rights: bool = False  # also the policies bounding the controller's own writes
    run_guard: bool = False  # also install the run guard (k8s/run-guard.yaml)
    taints: bool = True  # wait until the leader has tainted the pool nodes (and only them)


# -- the cluster's state -----------------------------------------------------------------------------


def pool_taints(api: Api, name: str) -> list[dict[str, Any]]:
    """The taints with egress-placer's key on node `name` (key, value, effect)."""
    taints = api.call("GET", node(name))["spec"].get("taints") or []
    return [{"key": t["key"], "value": t.get("value"), "effect": t["effect"]} for t in taints if t["key"] == TAINT_KEY]


def taints_right(api: Api) -> bool:
    """Every pool node carries exactly the pool taint, no ordinary node carries one."""
    owned = {
        n["metadata"]["name"]: [
            {"key": t["key"], "value": t.get("value"), "effect": t["effect"]}
            for t in n["spec"].get("taints") or []
            if t["key"] == TAINT_KEY
        ]
        for n in api.items(node())
    }
    return all(owned.get(n) == [POOL_TAINT] for n in POOL_NODES) and all(not owned.get(n) for n in ORDINARY_NODES)


def _without_pool_taint(api: Api, listed: Mapping[str, Any]) -> None:
    taints = listed["spec"].get("taints") or []
    kept = [t for t in taints if t["key"] != TAINT_KEY]
    if len(kept) != len(taints):
        api.json_patch(node(listed["metadata"]["name"]), [
            {"op": "test", "path": "/metadata/resourceVersion", "value": listed["metadata"]["resourceVersion"]},
            {"op": "replace", "path": "/spec/taints", "value": kept},
        ])


def remove_pool_taint(api: Api, name: str) -> None:
    """Delete egress-placer's taint from node `name` by hand (admin), as an operator might by mistake."""
    _without_pool_taint(api, api.call("GET", node(name)))


def remove_pool_taints(api: Api) -> None:
    """Delete every taint with egress-placer's key from every node."""
    for listed in api.items(node()):
        _without_pool_taint(api, listed)


def remove_pool_guard(api: Api) -> None:
    """Delete the pool guard's binding, policy and params, and the run guard's binding and policy (each may
    be missing)."""
    for name in (GUARD_NAME, RUN_GUARD_NAME):
        api.delete(f"{ADMISSION}/validatingadmissionpolicybindings/{name}")
        api.delete(f"{ADMISSION}/validatingadmissionpolicies/{name}")
    api.delete(namespaced(NAMESPACE, "configmaps", GUARD_NAME))


def remove_controller_rights(api: Api) -> None:
    """Delete the policies bounding the controller's own writes, and their bindings (each may be missing)."""
    for name in (RIGHTS_NAME, POD_DELETES_NAME):
        api.delete(f"{ADMISSION}/validatingadmissionpolicybindings/{name}")
        api.delete(f"{ADMISSION}/validatingadmissionpolicies/{name}")


def lease_holder(api: Api) -> str | None:
    lease = api.get(LEASE_PATH)
    return ((lease or {}).get("spec") or {}).get("holderIdentity") or None


def delete_lease(api: Api) -> None:
    api.delete(LEASE_PATH)


def make_plain(api: Api, cluster: Cluster) -> None:
    """No controller, no webhook configuration (the pools API's, fail-closed, neither), no pool guard, no
    pool taints, no leader Lease: what later test modules expect."""
    stop_controller(cluster)
    api.delete(f"{WEBHOOK_CONFIGS}/{WEBHOOK_CONFIG}")
    api.delete(f"{VALIDATING_WEBHOOK_CONFIGS}/{POOLS_WEBHOOK_CONFIG}")
    remove_pool_guard(api)
    remove_controller_rights(api)
    remove_pool_taints(api)
    delete_lease(api)


@contextmanager
def running_placer(
    cluster: Cluster,
    api: Api,
    policy: Path = POLICY_FILE,
    *,
    taints: bool = False,
    undo: Callable[[], None] = lambda: None,
    **start: Any,
) -> Iterator[Placer]:
    """egress-placer started with `policy` (`start`: start_controller's other options), under its k8s/
    identity; with `taints`, once its leader has tainted the pool nodes (and only them). Afterwards
    `undo()` (what the module added), then the cluster made plain."""
    try:
        start_controller(cluster, policy, **start)
        if taints:
            wait_for("the pool taints", quietly(lambda: taints_right(api)), timeout=TAINTS_SECONDS, interval=0.1)
        yield Placer(cluster)
    finally:
        try:
            undo()
        finally:
            make_plain(api, cluster)


@contextmanager
def tenant_namespaces(api: Api, make_namespace: Callable[[str], str], names: Sequence[str], timeout: float) -> Iterator[tuple[str, ...]]:
    """The namespaces `names`, each with its `default` ServiceAccount (one left by an earlier run awaited
    gone first); deleted, and awaited gone, afterwards."""
    for name in names:
        wait_gone(f"namespace {name} from an earlier module or run to be gone", lambda: namespaces_left(api, name), timeout=timeout)
        make_namespace(name)
    yield tuple(names)
    for name in names:
        api.delete(namespace(name))
    for name in names:
        wait_gone(f"namespace {name} to be deleted", lambda: namespaces_left(api, name), timeout=timeout)


def service_account_user(namespace_name: str, name: str) -> str:
    return f"system:serviceaccount:{namespace_name}:{name}"


@contextmanager
def editor(cluster: Cluster, api: Api, namespace_name: str, user: str, *, service_account: bool = False) -> Iterator[Api]:
    """An API client for `user` (a client certificate, no group) bound to the built-in ClusterRole `edit`
    in `namespace_name` only: a tenant as most clusters make one. With `service_account`, `user` is the name
    of a ServiceAccount of `namespace_name`, made here, and the client is that ServiceAccount (its username
    and groups, as a token would give them; `service_account_user`). The devcluster installs Tekton's
    aggregated ClusterRoles as a release does, so `edit` may write runs. Binding (and account) deleted
    afterwards."""
    bindings = namespaced(namespace_name, "rolebindings", group=RBAC)
    name = f"tenant-edit-{user}" if service_account else "tenant-edit"
    if service_account:
        api.create(namespaced(namespace_name, "serviceaccounts"), {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": user}})
        subject = {"kind": "ServiceAccount", "name": user, "namespace": namespace_name}
    else:
        subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
    api.create(bindings, {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [subject],
    })
    if service_account:
        client = api_for(cluster.mint_kubeconfig(service_account_user(namespace_name, user)))
    else:
        client = api_for(cluster.mint_kubeconfig(user, groups=()))
    try:
        yield client
    finally:
        client.api_client.close()
        api.delete(f"{bindings}/{name}")
        if service_account:
            api.delete(namespaced(namespace_name, "serviceaccounts", user))


# -- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def egress_placer(request: pytest.FixtureRequest, devcluster: Cluster, api: Api, tenants: tuple[str, ...], suite_policy: Path) -> Iterator[Placer]:
    """egress-placer as the module's `CONTROLLER` spec says (default: one replica, the suite's policy)."""
    spec: ControllerSpec = getattr(request.module, "CONTROLLER", ControllerSpec())
    with running_placer(
        devcluster, api, spec.policy or suite_policy,
        taints=spec.taints, replicas=spec.replicas, proxy=spec.proxy, env=dict(spec.env), pool_guard=spec.pool_guard,
        controller_rights=spec.controller_rights,
        run_guard=spec.run_guard,
    ) as placer:
        yield placer


@pytest.fixture
def runs(api: Api, egress_placer: Placer) -> Iterator[Runs]:
    """Creates this test's runs and pods (labelled with the test's id) and deletes them afterwards."""
    made = Runs(api)
    yield made
    made.cleanup()


# -- commands ----------------------------------------------------------------------------------------


def as_an_administrator(cluster: Cluster, *argv: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` with KUBECONFIG set as for kubectl (the cluster's admin, or `kubeconfig`) and no
    EGRESS_PLACER_* variable; this venv's scripts (egress-placer, kubectl-egress_placer) on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGRESS_PLACER_")}
    env.update(
        KUBECONFIG=str(kubeconfig or cluster.kubeconfig),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
    )
    return subprocess.run(list(argv), env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


def egress_placer_command(cluster: Cluster, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`egress-placer ARGS` (this checkout's) as an administrator runs it."""
    return as_an_administrator(cluster, sys.executable, "-m", "controller", *args, kubeconfig=kubeconfig)
