"""Feature detection: Tekton's version and the API server's discovery in; what is supported, and for what
is not, the reason, out. Pure (no client, no clock).

Adapt or refuse clearly, never misplace (issue #29): a feature this cluster cannot carry is turned off on
its own, the controller stays ready ("degraded" in /readyz's body, a Warning Event at start), and
everything else works as before.

| feature | needs | when it is missing |
|---|---|---|
| `taskrun-queue` | Tekton v1.11.0 or later: `spec.status: TaskRunPending` (tektoncd/pipeline#9464). Older Tekton's webhook refuses the value, its controller without the webhook starts the run at once | TaskRuns of a queued pool are created as they are, placed on the pool; their pods wait for a slot behind the pool's scheduling gate (as a run another queue holds). PipelineRuns are queued as before (`PipelineRunPending` is older) |
| `pool-guard` | the API server serves `admissionregistration.k8s.io/v1` ValidatingAdmissionPolicies (Kubernetes 1.30+) | reported: the guard's policy cannot be installed; the controller's own reconcilers (taints, intruders) still keep others off the pools |

Tekton's version unknown (`pipelines-info` absent, unreadable or "devel"): `taskrun-queue` is off, saying
why, since holding a TaskRun Tekton cannot hold would refuse it or run it at once. Before the ConfigMap is
first read (`UNREAD`) nothing is turned off.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

TASKRUN_QUEUE = "taskrun-queue"
POOL_GUARD = "pool-guard"
TASKRUN_PENDING_SINCE = (1, 11, 0)  # tektoncd/pipeline#9464 (v1.11.0, 2026-03-30); v1.9.x and v1.10.x lack it
VALIDATING_ADMISSION_POLICIES = "validatingadmissionpolicies"  # in admissionregistration.k8s.io/v1
PIPELINES_INFO = "pipelines-info"  # Tekton's ConfigMap; `data.version`: the release, "devel" in its source tree

_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?")


@dataclass(frozen=True)
class Limitation:
    """A feature turned off here, and why (what users read in the Event and in /readyz)."""

    feature: str
    reason: str

    def __str__(self) -> str:
        return f"{self.feature} off: {self.reason}"


@dataclass(frozen=True)
class Support:
    """What the cluster supports: every feature but those with a limitation."""

    limitations: tuple[Limitation, ...] = ()
    tekton_version: str | None = None

    def supports(self, feature: str) -> bool:
        return all(limit.feature != feature for limit in self.limitations)

    @property
    def taskrun_pending(self) -> bool:
        return self.supports(TASKRUN_QUEUE)

    def problem(self) -> str | None:
        """One line for /readyz's body ("degraded"), None when everything is supported."""
        return "; ".join(str(limit) for limit in self.limitations) or None


UNREAD = Support()


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """`v1.9.2` -> (1, 9, 2); None for anything else ("devel", empty, None)."""
    match = _VERSION.fullmatch((text or "").strip())
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


def _dotted(version: tuple[int, int, int]) -> str:
    return "v" + ".".join(map(str, version))


def tekton_limitations(version: str | None, unreadable: str | None = None) -> list[Limitation]:
    """What Tekton at `version` (pipelines-info's `data.version`) cannot carry. `unreadable`: why it was not read."""
    parsed = parse_version(version)
    if parsed is None:
        why = unreadable or (f"its version is {version!r}" if version else f"ConfigMap {PIPELINES_INFO} absent or without a version")
        return [Limitation(
            TASKRUN_QUEUE,
            f"Tekton's version is unknown ({why}): TaskRuns are not held pending (TaskRunPending needs "
            f"Tekton {_dotted(TASKRUN_PENDING_SINCE)}+); queued pools' TaskRun pods wait behind the pool's slot gate",
        )]
    if parsed < TASKRUN_PENDING_SINCE:
        return [Limitation(
            TASKRUN_QUEUE,
            f"Tekton {version} has no TaskRunPending (since {_dotted(TASKRUN_PENDING_SINCE)}, tektoncd/pipeline#9464): "
            "TaskRuns are not held pending; queued pools' TaskRun pods wait behind the pool's slot gate",
        )]
    return []


def kubernetes_limitations(admission_resources: Iterable[str] | None) -> list[Limitation]:
    """What the API server cannot carry, from the resource names it serves in `admissionregistration.k8s.io/v1`
    (None: the group version is not served)."""
    served = set(admission_resources or ())
    if VALIDATING_ADMISSION_POLICIES not in served:
        return [Limitation(
            POOL_GUARD,
            "the API server serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes 1.30+): "
            "the pool guard's policy cannot be installed; taints and the intruder reconciler still keep pools",
        )]
    return []


def served_resources(discovery: Mapping[str, object] | None) -> list[str] | None:
    """The resource names of an APIResourceList (`GET /apis/GROUP/VERSION`), None when it is absent."""
    if discovery is None:
        return None
    resources = discovery.get("resources")
    return [r["name"] for r in resources if isinstance(r, dict) and isinstance(r.get("name"), str)] if isinstance(resources, list) else []


def assess(tekton_version: str | None, tekton_unreadable: str | None, kubernetes: Iterable[Limitation] = ()) -> Support:
    """The cluster's support: Tekton's limitations (from its version) and the API server's (`kubernetes_limitations`)."""
    return Support((*tekton_limitations(tekton_version, tekton_unreadable), *kubernetes), tekton_version)


def version_of(pipelines_info: Mapping[str, object] | None) -> str | None:
    """`data.version` of Tekton's pipelines-info ConfigMap (None when absent)."""
    if not pipelines_info:
        return None
    data = pipelines_info.get("data")
    value = data.get("version") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None
