"""What an EgressPool's `status` says: computed from data given (the objects, the policy in force, the
nodes, the loads, the runs placed, the errors seen, the time), with no I/O and no clock of its own.
The leader writes it (controller/pool_status/reconcile.py); docs/pools-api.md, "Status".

- `Ready` (a condition, with `observedGeneration`): the pool's spec is in force, it has members, every
  member carries the pool's taint, and at least one member takes runs. Otherwise False, and the
  reason says which of these fails first, in that order: `SpecRefused` (the loader refused this
  object), `PolicyRefused` (it refused another: the objects are taken as a whole), `NotInForce`,
  `NoMembers`, `TaintsPending`, `NoReadyNodes`. True: `NodesTainted`.
- `PolicyAccepted` (True: `InForce`; False: the first three reasons) and `NodesReady` (True: `NodesTainted`;
  False: the last three; a pool not in force: `NoMembers`), whose first False is Ready's.
- Counts, not lists: member nodes, ready ones, tainted ones; the load over the ready nodes as totals,
  busy and full node counts, and only the `MOST_LOADED_NODES` most loaded nodes. At 10,000 members a
  status stays about 1 KiB (etcd refuses objects above 1.5 MiB).
- `runsPlacedLastHour`: the runs' pods (`queue.core.is_run_pod`, never a label: placement_log.view) bound
  to a member node, created within the placement log's window (`placement_log.core`).
- `lastError`: the newest of a refusal naming the object, an error the leader saw about the pool
  (a taint it could not write), and the one the status holds already (a new leader keeps it).

Same inputs, same status; a condition's `lastTransitionTime` moves only when its status changes, so
a status computed again with nothing changed equals the one written (the writer compares them).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.core.model import NodeLoad, NodeState
from controller.core.policy import PlacementPolicy, Pool
from controller.core.pools import (
    CONFIG_KIND,
    MOST_LOADED_NODES,
    POOL_KIND,
    Condition,
    LastError,
    NodeLoadStatus,
    PoolLoadStatus,
    PoolStatus,
    HistoryStatus,
    QueueStatus,
)
from controller.placement_log.core import Placed, parse_rfc3339, placed_within, rfc3339

READY = "Ready"
POLICY_ACCEPTED = "PolicyAccepted"  # v1beta1's conditions beside Ready (docs/pools-api.md, "v1beta1")
NODES_READY = "NodesReady"
MAX_MESSAGE = 4096  # a condition's or an error's message is cut here (the schema allows 32768)


@dataclass(frozen=True)
class PoolObject:
    """An EgressPool as stored: its name, its metadata.generation and the status it has now."""

    name: str
    generation: int | None
    status: Mapping[str, Any]


@dataclass(frozen=True)
class SeenError:
    """An error about a pool the controller saw (epoch seconds)."""

    message: str
    at: float


def members_by_pool(policy: PlacementPolicy, nodes: Iterable[NodeState]) -> dict[str, list[NodeState]]:
    """Each pool's member nodes (a node belongs to the first pool, in policy order, that claims it)."""
    out: dict[str, list[NodeState]] = {p.name: [] for p in policy.pools}
    for node in nodes:
        pool = policy.pool_of(node)
        if pool is not None:
            out[pool.name].append(node)
    return out


def refusal_about(refusal: str, name: str, kind: str = POOL_KIND) -> str:
    """The lines of a refusal that name the object `kind` `name` ("" when none does)."""
    prefix = f"{kind} {name}:"
    return "\n".join(line for line in refusal.splitlines() if line.startswith(prefix))


def load_status(loads: Mapping[str, NodeLoad]) -> PoolLoadStatus:
    """Totals over the ready nodes, and the most loaded of them (by share of capacity, then runs, then name)."""
    ranked = heapq.nsmallest(MOST_LOADED_NODES, (n for n in loads.values() if n.total > 0), key=_busiest_first)
    return PoolLoadStatus(
        placed=sum(n.placed for n in loads.values()),
        assumed=sum(n.assumed for n in loads.values()),
        capacity=sum(max(n.capacity, 0) for n in loads.values()),
        busy_nodes=sum(1 for n in loads.values() if n.total > 0),
        full_nodes=sum(1 for n in loads.values() if n.total >= n.capacity),
        most_loaded=tuple(
            NodeLoadStatus(node=n.name, placed=n.placed, assumed=n.assumed, capacity=max(n.capacity, 0))
            for n in ranked
        ),
    )


def _busiest_first(load: NodeLoad) -> tuple[float, int, str]:
    # A float share is exact enough to order a display (equal fractions of integers give equal floats).
    share = load.total / load.capacity if load.capacity > 0 else float("inf")
    return (-share, -load.total, load.name)


def ready_condition(
    name: str,
    pool: Pool | None,
    members: Sequence[NodeState],
    ready_nodes: int,
    refusal: str | None,
) -> tuple[str, str, str]:
    """(status, reason, message) of the Ready condition; see the module docstring for the order: the
    first False of PolicyAccepted and NodesReady, else NodesReady's True."""
    accepted = accepted_condition(name, pool, refusal)
    return accepted if accepted[0] == "False" else nodes_condition(pool, members, ready_nodes)


def accepted_condition(name: str, pool: Pool | None, refusal: str | None) -> tuple[str, str, str]:
    """(status, reason, message) of PolicyAccepted: the loader took this object's spec into the policy in force."""
    if refusal:
        about = refusal_about(refusal, name)
        if about:
            return "False", "SpecRefused", f"{about}\nThe policy in force stays the last good one."
        first = refusal.splitlines()[0]
        return "False", "PolicyRefused", (
            f"not in force: the pools are taken as a whole and another object is refused ({first}); "
            "the policy in force stays the last good one"
        )
    if pool is None:
        return "False", "NotInForce", "the pool is not in the policy in force yet"
    return "True", "InForce", "the pool's spec is in the policy in force"


def nodes_condition(pool: Pool | None, members: Sequence[NodeState], ready_nodes: int) -> tuple[str, str, str]:
    """(status, reason, message) of NodesReady: members, each with its taint, one at least taking runs."""
    if pool is None or not members:
        return "False", "NoMembers", (
            "no node is a member: none matches nodeSelector or nodes, or each is claimed by a pool that comes first by priority"
        )
    taint = pool.taint_for()
    tainted = sum(1 for n in members if taint in n.taints)
    shown = f"{taint.key}={taint.value}:{taint.effect}"
    if tainted < len(members):
        return "False", "TaintsPending", f"{tainted} of {len(members)} member nodes carry the taint {shown}"
    if ready_nodes == 0:
        where = "wait for one" if pool.placement == "required" else "go to ordinary nodes"
        return "False", "NoReadyNodes", (
            f"none of the {len(members)} member nodes is Ready and schedulable: runs sent to the pool {where}"
        )
    return "True", "NodesTainted", (
        f"{len(members)} member nodes carry the taint {shown}; {ready_nodes} take runs"
    )


def _condition(
    stored: Mapping[str, Any], status: str, reason: str, message: str, generation: int | None, now: float,
    kind: str = READY,
) -> Condition:
    before = next(
        (c for c in stored.get("conditions") or () if isinstance(c, Mapping) and c.get("type") == kind), None
    )
    since = before.get("lastTransitionTime") if before is not None and before.get("status") == status else None
    return Condition(
        type=kind,
        status=status,  # type: ignore[arg-type]  # one of True, False (see ready_condition)
        reason=reason,
        message=message[:MAX_MESSAGE],
        last_transition_time=since if parse_rfc3339(since) is not None else rfc3339(now),
        observed_generation=generation if generation is not None else 0,  # required in v1beta1
    )


def _last_error(stored: Mapping[str, Any], seen: Sequence[SeenError]) -> LastError | None:
    """The newest of the errors seen and the one stored (the stored one wins a tie: it is not rewritten;
    among errors seen at the same time the last listed wins, so a refusal appended last is the one kept
    and is not appended again on the next pass)."""
    kept = stored.get("lastError")
    kept_at = parse_rfc3339(kept.get("time")) if isinstance(kept, Mapping) else None
    newest = max(reversed(seen), key=lambda e: e.at, default=None)
    if newest is not None and (kept_at is None or int(newest.at) > kept_at):
        return LastError(message=newest.message[:MAX_MESSAGE], time=rfc3339(newest.at))
    if kept_at is not None and isinstance(kept, Mapping) and isinstance(kept.get("message"), str):
        return LastError(message=kept["message"][:MAX_MESSAGE], time=rfc3339(kept_at))
    return None


def pool_status(
    obj: PoolObject,
    policy: PlacementPolicy,
    members: Sequence[NodeState],
    loads: Mapping[str, NodeLoad],
    placed: Iterable[Placed],
    refusal: str | None,
    errors: Sequence[SeenError],
    now: float,
    queue: QueueStatus | None = None,
    history: HistoryStatus | None = None,
) -> dict[str, Any]:
    """The status of `obj` (JSON, as written), given:

    - `policy`: the policy in force; with no `refusal`, the one the objects make (its pool of this name
      is `obj`'s spec); with one, the last good policy, which may have a pool of this name or not;
    - `members`: the nodes of the pool in force of this name (`members_by_pool`); `loads`: its ready
      nodes' loads (empty when the pool is not in force);
    - `placed`: the runs' pods bound to pool nodes (any pool; only this one's members count);
    - `refusal`: why the loader refused the objects (None: they are in force);
    - `errors`: errors seen about this pool (`refusal`'s lines naming it count as one, at `now`, unless
      the status holds that message already);
    - `now`: epoch seconds;
    - `queue`: the pool's queue, when it has the setting;
    - `history`: the pool's measured set, when it has the history setting.
    """
    pool = policy.pool(obj.name)
    members = members if pool is not None else ()
    loads = loads if pool is not None else {}
    ready_nodes = sum(1 for n in members if n.ready and not n.unschedulable)
    status, reason, message = ready_condition(obj.name, pool, members, ready_nodes, refusal)
    others = (
        (POLICY_ACCEPTED, accepted_condition(obj.name, pool, refusal)),
        (NODES_READY, nodes_condition(pool, members, ready_nodes)),
    )
    names = {n.name for n in members}
    seen = list(errors)
    about = refusal_about(refusal, obj.name) if refusal else ""
    kept = obj.status.get("lastError")
    if about and not (isinstance(kept, Mapping) and kept.get("message") == about[:MAX_MESSAGE]):
        seen.append(SeenError(about, now))
    taint = pool.taint_for() if pool is not None else None
    out = PoolStatus(
        conditions=(
            _condition(obj.status, status, reason, message, obj.generation, now),
            *(_condition(obj.status, *c, obj.generation, now, kind=kind) for kind, c in others),
        ),
        nodes=len(members),
        ready_nodes=ready_nodes,
        tainted_nodes=sum(1 for n in members if taint in n.taints),
        load=load_status(loads),
        runs_placed_last_hour=placed_within(placed, names, now),
        last_error=_last_error(obj.status, seen),
        queue=queue if pool is not None and pool.queue is not None else None,
        history=history if pool is not None and pool.history is not None else None,
    )
    return out.model_dump(mode="json", by_alias=True, exclude_none=True)


def status_patch(stored: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """`desired` as the body of a JSON merge patch (RFC 7386) over `stored`: every key, at the top or in a
    nested object, that `desired` no longer has is null there (a merge patch that only leaves it out keeps
    it: a pool's `history.lastError` outlived the read that ended it, found by the cluster test against a
    Prometheus that requires auth). Lists are replaced whole."""
    out: dict[str, Any] = {key: None for key in stored if key not in desired}
    for key, value in desired.items():
        old = stored.get(key)
        out[key] = status_patch(old, value) if isinstance(value, Mapping) and isinstance(old, Mapping) else value
    return out


def config_status(obj: PoolObject, pools_in_force: int, refusal: str | None, now: float) -> dict[str, Any]:
    """The EgressPlacerConfig's status (v1beta1; docs/pools-api.md): `PolicyAccepted` (the loader took
    its settings: `InForce`; else `SpecRefused` naming the field, or `PolicyRefused`), `Ready` (the
    objects' policy is in force: `PolicyInForce`; else `LastGoodPolicy`), `poolsInForce`, `lastError`."""
    about = refusal_about(refusal, obj.name, CONFIG_KIND) if refusal else ""
    if about:
        accepted = ("False", "SpecRefused", f"{about}\nThe policy in force stays the last good one.")
    elif refusal:
        accepted = ("False", "PolicyRefused", f"another object is refused ({refusal.splitlines()[0]})")
    else:
        accepted = ("True", "InForce", "the settings are in the policy in force")
    ready = (
        ("False", "LastGoodPolicy", f"an object is refused ({refusal.splitlines()[0]}); the last good policy stays in force")
        if refusal
        else ("True", "PolicyInForce", f"the policy of the objects is in force: {pools_in_force} pools")
    )
    kept = obj.status.get("lastError")
    seen = [SeenError(about, now)] if about and not (isinstance(kept, Mapping) and kept.get("message") == about[:MAX_MESSAGE]) else []
    last_error = _last_error(obj.status, seen)
    out: dict[str, Any] = {
        "conditions": [
            _condition(obj.status, *ready, obj.generation, now).model_dump(mode="json", by_alias=True, exclude_none=True),
            _condition(obj.status, *accepted, obj.generation, now, kind=POLICY_ACCEPTED).model_dump(
                mode="json", by_alias=True, exclude_none=True
            ),
        ],
        "poolsInForce": pools_in_force,
    }
    if last_error is not None:
        out["lastError"] = last_error.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out
