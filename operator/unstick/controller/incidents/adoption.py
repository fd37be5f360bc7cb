"""A started controller adopts the node incidents a dead one left unresolved.

A controller may be SIGKILLed at any line (OOM kill, node loss, `kubectl delete pod
--force`). What it had done is on record (record before act, controller/incidents/registry.py): its
incidents list each pod with an intent (`result: deleting`) or a result. On start-up,
once this replica is the active one and the pod list is in, the new controller:

- takes every incident record in `Remediating` (or never written past its creation) as
  its own: the pods listed there stay in that record — never a second record beside it —
  and pods of the same node that get stuck later join it;
- settles each listed pod by looking: gone → `goneAt` (an intent whose answer was not
  recorded becomes `gone`); still there → decided again by its next pass, which records a
  new intent before any DELETE;
- resolves records whose pods are all gone (`Resolved`, with the IncidentResolved Event),
  and records a killed controller created but never wrote a pod into (`Resolved`, 0 pods:
  no DELETE was sent for a pod not on record).
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.controller.incidents.record import Incident, IncidentPod
from unstick.controller.records import writer as records
from unstick.core.remediation import (
    API_VERSION,
    INCIDENT,
    NODE_NAME,
    OUT_OF_SERVICE_INCIDENT,
    POD_LABEL_PREFIX,
    Phase,
    parse_time,
    rfc3339,
)
from unstick.kube.client import JSON, Kube

log = logging.getLogger("unstick.decisions")

SUMMARY_KEYS = ("cause", "evidence", "plan", "refused", "optedIn", "policy")


def _time(value: Any) -> float | None:
    try:
        return parse_time(value) if isinstance(value, str) and value else None
    except ValueError:
        return None


def unresolved(items: list[JSON]) -> tuple[list[Incident], list[JSON]]:
    """(the unresolved node incidents among `items` with pods on record, as Incidents;
    the incident records with no pod on record)."""
    found: list[Incident] = []
    empty: list[JSON] = []
    for rem in items:
        spec, status = rem.get("spec") or {}, rem.get("status") or {}
        if not spec.get(INCIDENT) or status.get("phase") == Phase.Resolved:
            continue
        if spec.get(INCIDENT) == OUT_OF_SERVICE_INCIDENT:  # a taint's record: no pods
            continue
        inc = _incident(rem)
        if inc is None:
            empty.append(rem)
        else:
            found.append(inc)
    return found, empty


def _incident(rem: JSON) -> Incident | None:
    meta, spec, status = rem.get("metadata") or {}, rem.get("spec") or {}, rem.get("status") or {}
    stuck = _time(status.get("stuckSince")) or 0.0
    pods: dict[str, IncidentPod] = {}
    for entry in status.get("pods") or []:
        if not isinstance(entry, dict):
            continue
        name, uid = entry.get("name"), entry.get("uid")
        if not isinstance(name, str) or not isinstance(uid, str) or not uid:
            continue
        pods[uid] = IncidentPod(
            name,
            uid,
            stuck,
            action=str(entry.get("action") or ""),
            result=str(entry.get("result") or ""),
            message=str(entry.get("message") or ""),
            at=_time(entry.get("time")),
            gone_at=_time(entry.get("goneAt")),
        )
    if not pods:
        return None
    created = _time(meta.get("creationTimestamp")) or stuck
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    return Incident(
        namespace,
        str(spec.get(NODE_NAME) or ""),
        str(spec.get(INCIDENT)),
        str(status.get("policy") or ""),
        name,
        {"cause": str(spec.get(INCIDENT)), **{k: status[k] for k in SUMMARY_KEYS if k in status}},
        opened=created,
        last_join=created,
        pods=pods,
        ref={
            "apiVersion": API_VERSION,
            "kind": "Remediation",
            "namespace": namespace,
            "name": name,
            "uid": meta.get("uid"),
        },
        labelled={k for k in meta.get("labels") or {} if k.startswith(POD_LABEL_PREFIX)},
        dirty=False,
    )


def resolve_empty(kube: Kube, rem: JSON, now: float) -> None:
    """A record created by a controller killed before it wrote a pod into it: no DELETE
    was sent for a pod not on record, so it is closed with 0 pods."""
    meta = rem.get("metadata") or {}
    status = {"phase": Phase.Resolved, "podCount": 0, "podsGone": 0, "resolvedAt": rfc3339(now)}
    try:
        records.patch_status(kube, rem, status)
    except ApiException as exc:
        log.warning(
            "incident=%s/%s (no pods on record) could not be resolved: (%s) %s",
            meta.get("namespace"),
            meta.get("name"),
            exc.status,
            exc.reason,
        )
        return
    log.info(
        "incident=%s/%s result=resolved: created by a controller that stopped before "
        "putting a pod on it",
        meta.get("namespace"),
        meta.get("name"),
    )
