"""Finished Remediations removed after a retention the admin sets (docs/controller.md,
"Retention"): `--remediation-retention` (default 168h; 0 keeps them for ever).

A record is removed only when all of these hold (`removable`, pure):
- its phase is final (`Resolved` or `Refused`): an open record, a node incident's
  included, is never touched;
- nothing was written to it for the retention: its newest time (creation, the server's
  managedFields times, and every `...At` or `time` the controller and the agent wrote)
  is older than `now - retention`; a record with no readable time stays;
- the action budget does not count it: no grant of it falls in the window a restarted
  controller rebuilds from (acting/budget_rebuild.recent_grants, which also keeps a
  grant recorded ahead of this replica's clock);
- no open node incident is on its node (adoption settles an incident against the
  records of its node's pods);
- no pod it names is Terminating: neither its own pod (spec.podUID) nor a pod of a node
  incident's `status.pods`, as the pod watch holds them; and a fresh GET of its pod, right
  before the DELETE, does not show that pod (same UID) with a deletionTimestamp.

The DELETE carries the listed copy's uid and resourceVersion as preconditions: a record
written meanwhile (409) or replaced by another of the same name stays, for the next sweep
to judge. Only the active replica sweeps (`gate`), and every DELETE goes through the
client's write guard (the leader Lease, controller/leader.py) like every other write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.controller.acting.budget_rebuild import recent_grants
from unstick.core.remediation import (
    ALL_REMEDIATIONS,
    FINAL_PHASES,
    INCIDENT,
    NODE_NAME,
    POD_NAME,
    POD_UID,
    parse_time,
)
from unstick.kube.client import JSON, Kube, pod_path, remediation_path

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 3600.0  # how often the records are looked through (at most)
SWEEP_AT_LEAST_S = 60.0  # ... and at least this long apart, however short the retention
MAX_PER_SWEEP = 500  # deletions per sweep (the first after an upgrade may find thousands):
# the rest wait for the next sweep, so the API server never gets a burst of them


def _times(value: Any, key: str = "") -> Iterator[float]:
    """Every time written in the record: values of keys named `time`, `...At` or
    `creationTimestamp` (managedFields' `time` included), at any depth."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _times(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _times(v, key)
    elif isinstance(value, str) and (
        key == "time" or key.endswith("At") or key == "creationTimestamp"
    ):
        try:
            yield parse_time(value)
        except ValueError:
            return


def last_written(rem: JSON) -> float | None:
    """The newest time on the record (None: none readable)."""
    return max(_times(rem), default=None)


def pod_uids(rem: JSON) -> set[str]:
    """The pods the record names: its own pod, or a node incident's pods."""
    spec, status = rem.get("spec") or {}, rem.get("status") or {}
    uids = {str(spec.get(POD_UID) or "")}
    for entry in status.get("pods") or []:
        if isinstance(entry, dict):
            uids.add(str(entry.get("uid") or entry.get(POD_UID) or ""))
    uids.discard("")
    return uids


def open_incident_nodes(remediations: Iterable[JSON]) -> set[str]:
    """Nodes with a node incident that is not finished."""
    nodes: set[str] = set()
    for rem in remediations:
        spec, status = rem.get("spec") or {}, rem.get("status") or {}
        if spec.get(INCIDENT) and status.get("phase") not in FINAL_PHASES:
            nodes.add(str(spec.get(NODE_NAME) or ""))
    return nodes


def removable(
    rem: JSON,
    now: float,
    retention_s: float,
    *,
    terminating: Callable[[str], bool],
    incident_nodes: set[str],
) -> bool:
    """May the record go now? (the rules of the module's docstring; no I/O)"""
    if retention_s <= 0:
        return False
    spec, status = rem.get("spec") or {}, rem.get("status") or {}
    if status.get("phase") not in FINAL_PHASES:
        return False
    written = last_written(rem)
    if written is None or now - written < retention_s:
        return False
    if next(recent_grants([rem], now), None) is not None:
        return False
    if str(spec.get(NODE_NAME) or "") in incident_nodes:
        return False
    return not any(terminating(uid) for uid in pod_uids(rem))


def sweep_interval(retention_s: float) -> float:
    return min(SWEEP_EVERY_S, max(SWEEP_AT_LEAST_S, retention_s / 24))


# -- the adapter ---------------------------------------------------------------------------


def _list(kube: Kube, namespaces: tuple[str, ...]) -> list[JSON]:
    if not namespaces:
        return kube.list_all(ALL_REMEDIATIONS)
    items: list[JSON] = []
    for ns in namespaces:
        items += kube.list_all(remediation_path(ns))
    return items


def pod_terminating(kube: Kube, rem: JSON) -> bool:
    """A fresh look: is the record's own pod (same UID) there with a deletionTimestamp?"""
    meta, spec = rem.get("metadata") or {}, rem.get("spec") or {}
    name, uid = spec.get(POD_NAME), spec.get(POD_UID)
    if not isinstance(name, str) or not name:
        return False
    pod = kube.get(pod_path(str(meta.get("namespace") or ""), name))
    pod_meta = (pod or {}).get("metadata") or {}
    return bool(pod_meta.get("deletionTimestamp")) and (not uid or pod_meta.get("uid") == uid)


def delete(kube: Kube, rem: JSON) -> bool:
    """DELETE the record only as listed (uid and resourceVersion preconditions). True when
    it is gone (a 404: someone else removed it)."""
    meta = rem.get("metadata") or {}
    body = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
    }
    try:
        kube.request(
            "DELETE",
            remediation_path(str(meta.get("namespace")), str(meta.get("name"))),
            body=body,
            retry=False,
        )
    except ApiException as exc:
        if exc.status == 404:
            return True
        if exc.status == 409:  # written (or replaced) since the list: judged next time
            return False
        raise
    return True


def sweep(
    kube: Kube,
    namespaces: tuple[str, ...],
    retention_s: float,
    now: float,
    *,
    terminating: Callable[[str], bool],
    gate: Callable[[], bool],
    limit: int = MAX_PER_SWEEP,
) -> int:
    """One pass over the records: remove those past retention, at most `limit`. Returns
    how many went."""
    if retention_s <= 0 or not gate():
        return 0
    items = _list(kube, namespaces)
    nodes = open_incident_nodes(items)
    removed = 0
    for rem in items:
        if removed >= limit:
            break
        if not removable(rem, now, retention_s, terminating=terminating, incident_nodes=nodes):
            continue
        if not gate() or pod_terminating(kube, rem):  # checked again right before the act
            continue
        if delete(kube, rem):
            removed += 1
    return removed


async def keep_removing(
    kube: Kube,
    namespaces: tuple[str, ...],
    retention_s: float,
    *,
    clock: Callable[[], float],
    gate: Callable[[], bool],
    terminating: Callable[[], set[str]],
) -> None:
    """The runtime's task: a sweep now and then, for as long as the loop runs. `terminating`
    is read on the loop's thread (the runtime's pod uids), the sweep runs in a thread."""
    if retention_s <= 0:
        return
    every = sweep_interval(retention_s)
    while True:
        try:
            if gate():
                held = terminating()
                removed = await asyncio.to_thread(
                    sweep,
                    kube,
                    namespaces,
                    retention_s,
                    clock(),
                    terminating=held.__contains__,
                    gate=gate,
                )
                if removed:
                    log.info("removed %d finished Remediations past their retention", removed)
        except Exception as exc:  # the API, or the lease lost mid-sweep: next time
            log.warning("Remediation retention: sweep stopped (%s); again in %.0fs", exc, every)
        await asyncio.sleep(every)
