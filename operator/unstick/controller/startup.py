"""What a controller does before its first pass (docs/controller.md, "What survives a
crash"): it reads the RemediationPolicies, rebuilds the action budget from the
Remediations once it is the active replica (acting/budget_rebuild.py), adopts the node
incidents a dead controller left unresolved (incidents/adoption.py), settled against the
pod list, and marks `Resolved` the pods' own records whose pods went while no controller
ran (records/pod_record.py)
— so no pod is taken for one without a policy, no grant is forgotten, no pod gets a
second record, and no record of a pod that is gone stays on display as unresolved."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from unstick.controller import failpoints
from unstick.controller.acting.budget_rebuild import rebuild_from_remediations
from unstick.controller.deciding.policies import PolicyBook
from unstick.controller.incidents import adoption
from unstick.controller.incidents.registry import Incidents
from unstick.controller.reconciler import Reconciler
from unstick.controller.records import pod_record as podrecord
from unstick.core.remediation import POLICIES
from unstick.kube.client import JSON, Kube
from unstick.kube.podwatch import TerminatingPod

log = logging.getLogger("unstick.controller.runtime")

SYNC_POLL_S = 0.05  # how often the pod watchers' first list is looked for


async def before_first_pass(
    kube: Kube,
    policies: PolicyBook,
    reconciler: Reconciler,
    incidents: Incidents,
    *,
    namespaces: tuple[str, ...],
    clock: Callable[[], float],
    gate: Callable[[], bool],
    synced: Callable[[], bool],
    pods: Mapping[str, TerminatingPod],
) -> None:
    """Policies, budget, adopted incidents, records of pods gone meanwhile — in that order,
    before any pod is dispatched. `synced`: every pod watcher has delivered its first list
    into `pods`."""
    await asyncio.to_thread(load_policies, kube, policies)
    # Invariant 6: the action budget survives a restart or failover (acting/budget_rebuild.py).
    found = await rebuild_from_remediations(kube, reconciler, namespaces, clock, gate)
    adopted, empty = adoption.unresolved(found)
    incidents.adopt(adopted)
    for rem in empty:
        await asyncio.to_thread(adoption.resolve_empty, kube, rem, clock())
    while not synced():  # noqa: ASYNC110 (threads)
        await asyncio.sleep(SYNC_POLL_S)
    await asyncio.sleep(0)  # the pods the list reported (queued before) are in
    gone, unacted = incidents.settle(
        pods.__contains__,
        lambda uid: pods[uid].deletion_grace_period_s == 0,
        clock(),
    )
    for node, at in unacted:  # intents whose DELETE never took effect: no act
        reconciler.release_recorded(node, at)
    if adopted or empty:
        log.info(
            "adopted %d unresolved node incidents (%d of their pods gone, %d intents not "
            "carried out), resolved %d with no pod on record",
            len(adopted),
            gone,
            len(unacted),
            len(empty),
        )
    failpoints.reached("incidents-adopted")
    # A pod's own record is resolved when the pod watch sees the pod go: not for a pod
    # that went while no controller ran. A fresh GET tells (pod_record.resolve_left_behind).
    left = podrecord.left_behind(found, pods.__contains__)
    if left:
        resolved = await asyncio.to_thread(podrecord.resolve_left_behind, kube, left, clock())
        log.info("resolved %d records whose pods went while no controller ran", resolved)


def load_policies(kube: Kube, policies: PolicyBook) -> None:
    """The RemediationPolicies as they are, before the first pass: a restarted
    controller must not take an overdue pod for one whose policy does not exist
    (Kopf's watch delivers them too, a moment later, and keeps them current)."""
    try:
        items: list[JSON] = kube.list_all(POLICIES)
    except Exception as exc:
        log.warning("cannot list RemediationPolicies before the first pass (%s)", exc)
        return
    for item in items:
        name = str((item.get("metadata") or {}).get("name") or "")
        if name and policies.lookup(name)[0] is None:
            spec = dict(item.get("spec") or {})
            version = (item.get("metadata") or {}).get("resourceVersion")  # a mandate's (§11)
            meta = {"name": name, "resourceVersion": version}
            policies.update(name, {"metadata": meta, "spec": spec})
