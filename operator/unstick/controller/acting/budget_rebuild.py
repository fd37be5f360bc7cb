"""The action budget survives a restart or failover (design.md §3 invariant 6): on start-up
the controller puts back the grants of the last minute, read from the Remediations.

A grant is what took a slot of the budget and is on record, in keys only the controller
writes (the admission policy keeps the agent and everyone else out of them, docs/admission.md):
- an API action of the controller in `status.actions` (`force-delete`,
  `remove-finalizer`, `by: controller`), or in `status.pods` of a node incident, with
  result `succeeded` or `failed` — it was carried out — or `deleting`/`removing` (an
  intent, written before the act: a controller killed before its answer was recorded may
  have carried it out) or `gone` (an intent settled by looking: its answer was lost or
  not recorded, and the pod was gone, kube/actions.py); and
- a hand-over of node steps to the agent, `spec.nodeStepsRequestedAt` (one grant per
  batch, as the controller takes it),
each on the pod's node (`spec.nodeName`). An act follows its grant within ACT_WITHIN_S
(a DELETE whose intent took longer to be put on record is not sent), so a grant made at
T counts as made at T + ACT_WITHIN_S, until T + ACT_WITHIN_S + 60 s: no 60 s window holds
more acts than the limit, across any number of restarts.

When was a grant made? The time on record is the clock of the replica that wrote it, and
that clock may be off (issue #31): 20 s behind, its grants look 20 s older than they are
and a takeover would free their slots 20 s early (4 DELETEs in 60 s where 2 were
allowed, measured); 20 s ahead, they look made in the future. So a grant counts as made
at the LATEST of:
- its time on record, but no later than now (a writer ahead of this clock: counted as
  made now, and the skew is logged);
- when the API server stored the record's latest write (`managedFields[].time`: the API
  server's own clock, whole seconds, so + 1 s), turned into this replica's clock by its
  measured offset from the API server (kube/server_clock.py, rounded so that it is never
  earlier). The write that carried the grant was that one or an earlier one, so the act
  came no later than then + ACT_WITHIN_S, whatever the writer's clock said.
Why the record's last write and not a per-grant sighting by this replica's warm
Remediation watch: it needs no memory, is the same for a cold start and a takeover, and
is the API server's word rather than a guess from when an event arrived. Its price: a
grant in a record written again since (a node incident's later entries, its Resolved)
counts as made at that later write — never longer than one window after the rebuild.
Grants keep the limits of the policy named in `status.policy` when the controller knows
it already, else the built-in defaults (30 per minute, 5 per node per minute): the
stricter guess, and it lasts one minute at most.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from unstick.core.policy.ratelimit import WINDOW_S
from unstick.core.remediation import (
    ALL_REMEDIATIONS,
    NODE_NAME,
    NODE_STEPS_REQUESTED_AT,
    parse_time,
)
from unstick.core.vocabulary import API_ACTIONS
from unstick.kube.client import JSON, Kube, remediation_path

log = logging.getLogger(__name__)

RETRY_S = 5.0
GATE_POLL_S = 0.1  # a bool read: a replica that just took the Lease starts at once
_API_ACTIONS = frozenset(str(a) for a in API_ACTIONS)
_CARRIED_OUT = frozenset({"succeeded", "failed", "deleting", "removing", "gone"})
ACT_WITHIN_S = 5.0  # an act follows the grant (its recorded time) within this long, or never


@dataclass(frozen=True, slots=True)
class RecordedGrant:
    node: str
    at: float  # when it counts from: max(min(recorded, now), stored) + ACT_WITHIN_S
    policy: str  # status.policy of the Remediation ("" when absent)
    recorded: float  # the time on record (ahead of `now` when its writer's clock ran ahead)


def stored_at(rem: JSON) -> float | None:
    """When the API server stored the latest write of `rem`, on its clock, rounded up:
    the latest `metadata.managedFields[].time` + 1 s (whole seconds); None when absent."""
    times = [
        _time(entry.get("time"))
        for entry in (rem.get("metadata") or {}).get("managedFields") or []
        if isinstance(entry, dict)
    ]
    known = [t for t in times if t is not None]
    return max(known) + 1.0 if known else None


def _time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


def recent_grants(
    remediations: Iterable[JSON],
    now: float,
    local_at: Callable[[float], float] = lambda server: server,
) -> Iterator[RecordedGrant]:
    """The grants in `remediations` made within the 60 s before `now` (+ ACT_WITHIN_S), each
    counted as made at the latest of its time on record (no later than now) and the
    record's last write as the API server stored it (`stored_at`), turned into this
    replica's clock by `local_at` (kube/server_clock.ServerClock.local_at: never earlier)."""
    for rem in remediations:
        stored = stored_at(rem)
        written = -float("inf") if stored is None else min(local_at(stored), now)
        spec = rem.get("spec") or {}
        status = rem.get("status") or {}
        node = str(spec.get(NODE_NAME) or "") or "(none)"
        policy = str(status.get("policy") or "")
        times = [_time(spec.get(NODE_STEPS_REQUESTED_AT))]
        # per-pod records: status.actions; node incidents: status.pods (incidents/registry.py)
        for entry in [*(status.get("actions") or []), *(status.get("pods") or [])]:
            if (
                isinstance(entry, dict)
                and entry.get("action") in _API_ACTIONS
                and entry.get("result") in _CARRIED_OUT
                and entry.get("by", "controller") == "controller"
            ):
                times.append(_time(entry.get("time")))
        for at in times:
            if at is None:
                continue
            made = max(min(at, now), written)
            if now - WINDOW_S < made + ACT_WITHIN_S:
                yield RecordedGrant(node, made + ACT_WITHIN_S, policy, at)


class Rebuildable(Protocol):
    def rebuild_budget(
        self, remediations: list[JSON], now: float, local_at: Callable[[float], float]
    ) -> int: ...


def _list(kube: Kube, namespaces: tuple[str, ...]) -> list[JSON]:
    if not namespaces:
        return kube.list_all(ALL_REMEDIATIONS)
    items: list[JSON] = []
    for ns in namespaces:
        items += kube.list_all(remediation_path(ns))
    return items


async def rebuild_from_remediations(
    kube: Kube,
    reconciler: Rebuildable,
    namespaces: tuple[str, ...],
    clock: Callable[[], float],
    gate: Callable[[], bool] = lambda: True,
) -> list[JSON]:
    """Once this replica holds the leader Lease (controller/leader.py: a standby that takes
    over must see what the previous one did), LIST the Remediations and rebuild the budget; retried
    until the LIST answers. The caller takes no action before this returns: acting on an
    empty budget could exceed the limits. Returns the Remediations read (the node
    incidents among them are adopted: controller/incidents/adoption.py)."""
    while not gate():  # noqa: ASYNC110 (a plain callable: leader.Elector.leading)
        await asyncio.sleep(GATE_POLL_S)
    while True:
        try:
            items = await asyncio.to_thread(_list, kube, namespaces)
        except Exception as exc:
            log.warning("cannot list Remediations to rebuild the action budget (%s); retrying", exc)
            await asyncio.sleep(RETRY_S)
            continue
        count = reconciler.rebuild_budget(items, clock(), kube.server_clock.local_at)
        log.info(
            "action budget rebuilt: %d actions of the last minute from %d Remediations",
            count,
            len(items),
        )
        return items
