"""The record of unstick's out-of-service taint on one node (docs/fencing.md): a node
incident, `spec.incident: NodeOutOfService`, in the controller's own namespace (a node is
no tenant's). Created with the intent to taint (`status.actions`: `tainting`) before the
Node is written — record before act (design.md §3 invariant 10) — then the result; the
removal's intent (`untainting`) and result follow on the same record, which is Resolved
once the taint is gone (or was never applied).

The taint budget (core/policy/out_of_service.py) is rebuilt from these records: the taint
actions on record (intended or done) within the window, whoever wrote them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from unstick.controller.records import writer as records
from unstick.core.remediation import (
    API_VERSION,
    DRY_RUN,
    INCIDENT,
    INCIDENT_LABEL,
    NODE_LABEL,
    NODE_NAME,
    OUT_OF_SERVICE_INCIDENT,
    Phase,
    parse_time,
    rfc3339,
)
from unstick.core.vocabulary import Action, Cause
from unstick.kube.client import JSON, Kube, remediation_path

TAINT, UNTAINT = str(Action.TAINT_OUT_OF_SERVICE), str(Action.UNTAINT_OUT_OF_SERVICE)
TAINTING, UNTAINTING = "tainting", "untainting"  # an intent: the act may have happened
#: the results of a taint that was tried: they take a slot of the taint budget
BUDGETED = frozenset({TAINTING, "succeeded", "failed", "conflict"})
LABEL_VALUE = OUT_OF_SERVICE_INCIDENT.lower()
SELECTOR = f"{INCIDENT_LABEL}={LABEL_VALUE}"
MAX_MESSAGE = 2048


@dataclass(frozen=True, slots=True)
class TaintRecord:
    """One record as read: its node, phase, and actions (newest last)."""

    namespace: str
    name: str
    node: str
    phase: str
    actions: tuple[dict[str, Any], ...]
    body: JSON

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def open(self) -> bool:
        return self.phase != Phase.Resolved

    @property
    def last(self) -> dict[str, Any]:
        return self.actions[-1] if self.actions else {}

    def taint_times(self) -> list[float]:
        """When each taint on record was tried: the budget's slots. An intent, a taint done,
        and one the API server refused (failed: e.g. no RBAC to patch Nodes; conflict)
        count — so a taint that keeps failing is tried at most `maxFencedNodes` times per
        window; a taint not tried (the node changed before the act, or withdrawn after a
        crash) does not."""
        out = []
        for a in self.actions:
            if a.get("action") == TAINT and a.get("result") in BUDGETED:
                try:
                    out.append(parse_time(str(a.get("time"))))
                except ValueError:
                    continue
        return out


def _parse(rem: JSON) -> TaintRecord:
    meta, spec, status = rem.get("metadata") or {}, rem.get("spec") or {}, rem.get("status") or {}
    actions = tuple(a for a in status.get("actions") or [] if isinstance(a, dict))
    return TaintRecord(
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        str(spec.get(NODE_NAME) or ""),
        str(status.get("phase") or ""),
        actions,
        rem,
    )


def list_records(kube: Kube, namespace: str) -> list[TaintRecord]:
    """The taint records of the controller's namespace, read live (never a cache)."""
    items = kube.list_all(remediation_path(namespace), {"labelSelector": SELECTOR})
    return [
        _parse(r) for r in items if (r.get("spec") or {}).get(INCIDENT) == OUT_OF_SERVICE_INCIDENT
    ]


def entry(action: str, node: str, result: str, message: str, at: float) -> dict[str, Any]:
    return {
        "action": action,
        "target": f"node/{node}",
        "result": result,
        "message": message[:MAX_MESSAGE],
        "time": rfc3339(at),
    }


def create_intent(
    kube: Kube,
    namespace: str,
    node: str,
    *,
    evidence: list[dict[str, str]],
    reason: str,
    policy: str,
    at: float,
    action: str = TAINT,
) -> TaintRecord:
    """The record, with the intent to taint (or, for a taint whose record is gone, to
    untaint) on it, written (created, then its status) — only then may the Node be
    written."""
    name = f"{node[:200].rstrip('.-')}-{LABEL_VALUE}-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": API_VERSION,
        "kind": "Remediation",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {NODE_LABEL: node, INCIDENT_LABEL: LABEL_VALUE},
        },
        "spec": {NODE_NAME: node, INCIDENT: OUT_OF_SERVICE_INCIDENT, DRY_RUN: False},
    }
    created = records.post_remediation(kube, namespace, body)
    status = {
        "phase": Phase.Remediating,
        "cause": str(Cause.NodeUnreachable),
        "policy": policy,
        "optedIn": True,
        "stuckSince": rfc3339(at),
        "evidence": evidence,
        "plan": [
            *(
                [{"action": TAINT, "target": f"node/{node}", "reason": reason[:MAX_MESSAGE]}]
                if action == TAINT
                else []
            ),
            {
                "action": UNTAINT,
                "target": f"node/{node}",
                "reason": "once the node is Ready again and a live read shows no pod of it "
                "Terminating and no VolumeAttachment of it",
            },
        ],
        "actions": [
            entry(
                action,
                node,
                TAINTING if action == TAINT else UNTAINTING,
                "decided; the Node is written once this entry is on record",
                at,
            )
        ],
    }
    written = records.patch_status(kube, created, status)
    return _parse(written)


def add_action(
    kube: Kube,
    record: TaintRecord,
    item: dict[str, Any],
    *,
    replace_last: bool = False,
    phase: str | None = None,
    waiting_for: str | None = None,
    at: float | None = None,
) -> TaintRecord:
    """Append an action (or replace the last one: an intent's result), with the phase;
    `waitingFor` is set (or cleared with "")."""
    actions = [*(record.actions[:-1] if replace_last else record.actions), item]
    status: dict[str, Any] = {"actions": actions[-records.MAX_RECORDED_ACTIONS :]}
    if phase is not None:
        status["phase"] = phase
        if phase == Phase.Resolved:
            status["resolvedAt"] = rfc3339(at if at is not None else parse_time(item["time"]))
            status["waitingFor"] = None
    if waiting_for is not None and phase != Phase.Resolved:
        status["waitingFor"] = waiting_for or None
    written = records.patch_status(kube, record.body, status)
    return _parse(written)


def resolve_empty(kube: Kube, record: TaintRecord, now: float) -> None:
    """A record whose creator stopped before writing its intent: nothing was done."""
    status = {"phase": Phase.Resolved, "resolvedAt": rfc3339(now), "waitingFor": None}
    records.patch_status(kube, record.body, status)


def set_waiting(kube: Kube, record: TaintRecord, waiting_for: str) -> TaintRecord:
    """`status.waitingFor` (what the removal waits for), written only when it changed."""
    current = (record.body.get("status") or {}).get("waitingFor") or ""
    if current == waiting_for[:1024]:
        return record
    written = records.patch_status(kube, record.body, {"waitingFor": waiting_for[:1024]})
    return _parse(written)
