"""`egress-placer uninstall`: remove what `kubectl apply -k k8s/` installed and what the controller
made since, in an order that leaves nothing half-done (docs/uninstall.md).

1. the controller's Deployment, then wait until no replica holds the leader Lease (a leader still
   running would put the taints back; a controller run outside the cluster counts too);
2. the pools API's ValidatingWebhookConfiguration (fail-closed: with no controller it refuses every
   EgressPool write), then the MutatingWebhookConfiguration (runs are admitted unchanged from then
   on, as when it fails open);
3. the pool guard and the run guard (each a ValidatingAdmissionPolicyBinding and ValidatingAdmissionPolicy),
   then the two policies bounding the controller's own writes (k8s/controller-rights.yaml) and their bindings;
4. the pool taints (key `egress-placer.io/pool`) on every node, nothing else of the node;
5. the ClusterRole, ClusterRoleBinding, and the Roles and RoleBindings in Tekton's namespace and in
   kube-system; the CRDs of the pools API, and with them every EgressPool and the EgressPlacerConfig;
6. the controller's namespace, and with it the TLS Secret, the policy ConfigMap, its last good copy,
   the pool guard's params, the Lease, the Service, the PodDisruptionBudget and the ServiceAccount.

It leaves: the pool labels on nodes (yours), the pool tolerations it added to node agents' DaemonSet
templates (annotated `egress-placer.io/pool-tolerations-added`: counted in the output; harmless
without the taint), the decisions written into runs and pods, and Events until they expire.

`--dry-run` prints the plan and what exists now, and changes nothing; `--yes` does it. Exit status:
0 done (or planned), 1 a controller still leads after `--timeout` seconds (nothing but the
Deployment was removed), 2 neither --dry-run nor --yes, 3 the cluster cannot be reached or read
(one request first, no retry: an unreachable cluster is said at once, in one line).

`-o json|yaml`: the same, as one object: `--dry-run` gives each object and whether it is present, the
tainted nodes, the node agents and the leader; `--yes` gives its steps, in order.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, TextIO

import yaml

from controller.cli.errors import ClusterUnreachable, CommandError, Exit
from controller.agents.core import TOLERATIONS_ADDED_ANNOTATION
from controller.pool_guard.core import GUARD_NAME
from controller.core.model import TAINT_KEY, Taint
from controller.core.pools import custom_resource_definitions
from controller.core.rights import POD_DELETES_NAME, RIGHTS_NAME
from controller.core.run_guard import RUN_GUARD_NAME
from controller.cli.status import reach
from controller.kube.client import KubeApi
from controller.kube.writer import ApiError, KubeClient, Outcome
from controller.metrics import Metrics
from controller.settings import Settings

NAME = "egress-placer"  # the Deployment, the ClusterRole and the Roles (k8s/)
AGENTS_ROLE = "egress-placer-agents"  # in each agent namespace that lets the leader patch node agents (k8s/rbac-agents.yaml)
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@dataclass(frozen=True)
class Thing:
    """One object the uninstall deletes: what to call it, and its API path."""

    what: str
    path: str


def deployment(settings: Settings) -> Thing:
    return Thing(f"deployment {settings.namespace}/{NAME}", f"/apis/apps/v1/namespaces/{settings.namespace}/deployments/{NAME}")


def admission_things(settings: Settings) -> list[Thing]:
    pools = settings.pools_webhook_config_name
    return [
        # First: fail-closed, it refuses EgressPool writes now that no controller answers.
        Thing(f"validatingwebhookconfiguration {pools}", f"{ADMISSION}/validatingwebhookconfigurations/{pools}"),
        Thing(f"mutatingwebhookconfiguration {settings.webhook_config_name}", f"{ADMISSION}/mutatingwebhookconfigurations/{settings.webhook_config_name}"),
        # The pool guard, the run guard (with it gone, the owners of runs still held in a queue may release
        # them themselves), then the bounds on the controller's own writes.
        *(
            Thing(f"{kind} {name}", f"{ADMISSION}/{plural}/{name}")
            for name in (GUARD_NAME, RUN_GUARD_NAME, RIGHTS_NAME, POD_DELETES_NAME)
            for kind, plural in (
                ("validatingadmissionpolicybinding", "validatingadmissionpolicybindings"),
                ("validatingadmissionpolicy", "validatingadmissionpolicies"),
            )
        ),
    ]


def access_things(settings: Settings) -> list[Thing]:
    """Cluster-wide RBAC and the Roles outside the controller's namespace."""
    things = [Thing(f"clusterrolebinding {NAME}", f"{RBAC}/clusterrolebindings/{NAME}"), Thing(f"clusterrole {NAME}", f"{RBAC}/clusterroles/{NAME}")]
    for namespace, name in ((settings.tekton_namespace, NAME), (settings.tekton_resolvers_namespace, NAME), ("kube-system", AGENTS_ROLE)):
        for kind in ("rolebindings", "roles"):
            things.append(Thing(f"{kind[:-1]} {namespace}/{name}", f"{RBAC}/namespaces/{namespace}/{kind}/{name}"))
    return things


def pools_api_things() -> list[Thing]:
    """The CRDs of the pools API (k8s/crds/): deleting them deletes every EgressPool and the EgressPlacerConfig."""
    return [
        Thing(f"customresourcedefinition {crd['metadata']['name']} (and its objects)", f"{CRDS}/{crd['metadata']['name']}")
        for crd in custom_resource_definitions()
    ]


def namespace_thing(settings: Settings) -> Thing:
    return Thing(f"namespace {settings.namespace} (its Secret, ConfigMaps, Lease, Service, ...)", f"/api/v1/namespaces/{settings.namespace}")


def every_thing(settings: Settings) -> list[Thing]:
    return [deployment(settings), *admission_things(settings), *access_things(settings), *pools_api_things(), namespace_thing(settings)]


class Uninstall:
    def __init__(self, settings: Settings, api: KubeApi, out: TextIO, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.api = api
        self.client = KubeClient(api, Metrics())
        self.out = out
        self.clock = clock

    steps: list[str] | None = None  # -o json|yaml: what `say` would print, kept for the one object at the end

    def say(self, text: str) -> None:
        if self.steps is not None:
            self.steps.append(text)
        else:
            print(text, file=self.out, flush=True)

    def report(self) -> dict[str, Any]:
        """--dry-run as one object: what is there now, in the order it would be deleted."""
        things = every_thing(self.settings)
        return {
            "dryRun": True,
            "objects": [{"what": t.what, "path": t.path, "present": self.exists(t)} for t in things],
            "taintedNodes": sorted(n["metadata"]["name"] for n in self.tainted_nodes()),
            "agentsWithAddedTolerations": self.agents_with_added_tolerations(),
            "leader": self.leader(),
        }

    # -- reading ------------------------------------------------------------------------------------
    def exists(self, thing: Thing) -> bool:
        try:
            self.client.call("read", lambda: self.api.call("GET", thing.path))
            return True
        except ApiError as e:
            if e.outcome is Outcome.NOT_FOUND:
                return False
            raise

    def tainted_nodes(self) -> list[dict[str, Any]]:
        nodes = self.client.call("list-nodes", lambda: self.api.call("GET", "/api/v1/nodes")).get("items") or []
        return [n for n in nodes if any(t.get("key") == TAINT_KEY for t in (n.get("spec") or {}).get("taints") or [])]

    def agents_with_added_tolerations(self) -> list[str]:
        listed = self.client.call("list-daemonsets", lambda: self.api.call("GET", "/apis/apps/v1/daemonsets")).get("items") or []
        return sorted(
            f"{d['metadata']['namespace']}/{d['metadata']['name']}"
            for d in listed
            if TOLERATIONS_ADDED_ANNOTATION in ((d.get("metadata") or {}).get("annotations") or {})
        )

    def leader(self) -> str | None:
        """The replica that holds the leader Lease now (its holder, renewed within its duration), or None."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.settings.namespace}/leases/{self.settings.lease_name}"
        try:
            spec = self.client.call("read-lease", lambda: self.api.call("GET", path)).get("spec") or {}
        except ApiError as e:
            if e.outcome is Outcome.NOT_FOUND:
                return None
            raise
        holder, renewed = spec.get("holderIdentity"), spec.get("renewTime")
        if not holder or not renewed:
            return None
        renewed_at = datetime.fromisoformat(str(renewed).replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()
        fresh = self.clock() - renewed_at <= float(spec.get("leaseDurationSeconds") or self.settings.lease_duration_seconds) + 2
        return str(holder) if fresh else None

    # -- the two modes ------------------------------------------------------------------------------
    def plan(self) -> int:
        self.say("egress-placer uninstall --dry-run: nothing is changed. It would delete, in this order:")
        things = every_thing(self.settings)
        for thing in things[:-1]:
            self.say(f"  {thing.what}: {'present' if self.exists(thing) else 'absent'}")
        tainted = self.tainted_nodes()
        self.say(f"  the pool taint {TAINT_KEY} on {len(tainted)} nodes: {', '.join(sorted(n['metadata']['name'] for n in tainted)) or '-'}")
        self.say(f"  {things[-1].what}: {'present' if self.exists(things[-1]) else 'absent'}")
        self._left()
        holder = self.leader()
        if holder:
            self.say(f"Now {holder} leads: --yes waits for it to stop (up to --timeout) before removing the taints.")
        return Exit.OK

    def run(self, timeout: float) -> int:
        self._delete(deployment(self.settings))
        deadline = self.clock() + timeout
        while (holder := self.leader()) is not None:
            if self.clock() >= deadline:
                self.say(
                    f"{holder} still leads after {timeout:.0f}s: it would put the taints back. Stop that controller "
                    "(a Deployment elsewhere, a process outside the cluster) and run this again. Nothing else was removed."
                )
                return Exit.FINDINGS
            time.sleep(1.0)
        for thing in admission_things(self.settings):
            self._delete(thing)
        for node in self.tainted_nodes():
            name = node["metadata"]["name"]
            kept = [Taint.from_dict(t) for t in node["spec"]["taints"] if t.get("key") != TAINT_KEY]
            self.client.set_node_taints(
                name, kept, node["metadata"]["resourceVersion"], rebase=lambda current: [t for t in current if t.key != TAINT_KEY]
            )
            self.say(f"removed the pool taint from node {name}")
        for thing in [*access_things(self.settings), *pools_api_things()]:
            self._delete(thing)
        self._delete(namespace_thing(self.settings))
        self._left()
        return Exit.OK

    def _delete(self, thing: Thing) -> None:
        try:
            self.client.call("delete", lambda: self.api.call("DELETE", thing.path))
            self.say(f"deleted {thing.what}")
        except ApiError as e:
            if e.outcome is not Outcome.NOT_FOUND:
                raise
            self.say(f"{thing.what}: already gone")

    def _left(self) -> None:
        agents = self.agents_with_added_tolerations()
        self.say(
            "Left in place: node labels, decisions written into runs and pods, Events until they expire, and the pool "
            f"tolerations added to {len(agents)} node agents' DaemonSet templates{': ' + ', '.join(agents) if agents else ''} "
            "(harmless without the taint; docs/uninstall.md says how to remove them)."
        )


def run_uninstall(
    settings: Settings, api: KubeApi, out: TextIO, *, dry_run: bool, yes: bool, timeout: float, output: str | None = None
) -> int:
    if dry_run == yes:
        raise CommandError("say --dry-run (show what would be removed) or --yes (remove it)")
    reach(api)  # at once, in one line, before the retries of the client
    uninstall = Uninstall(settings, api, out)
    try:
        if output not in ("json", "yaml"):
            return uninstall.plan() if dry_run else uninstall.run(timeout)
        uninstall.steps = []
        if dry_run:
            report, status = uninstall.report(), int(Exit.OK)
        else:
            status = uninstall.run(timeout)
            report = {"dryRun": False, "steps": uninstall.steps, "done": status == Exit.OK}
    except ApiError as e:
        raise ClusterUnreachable(str(e)) from None
    out.write(json.dumps(report, indent=2) + "\n" if output == "json" else yaml.safe_dump(report, sort_keys=False))
    return status
