"""Whose record a Remediation is, and the refusals a record carries (design.md §3
invariant 7, §5).

A Remediation is a channel, not an authority: anyone with RBAC on Remediations (or a
bug) can write one. The controller therefore
- uses a Remediation for a pod only if its identity (`spec.podName`, `spec.podUID`,
  `spec.nodeName`) is that pod's (`identity_mismatch`);
- marks a Remediation that is not backed by a stuck pod as `Refused`, with the reason
  (`check_record`), so a forged record never sits in `kubectl get remediations -A` as
  if it were real;
- records every refusal: `status.refusals` and `unstick_refusals_total{reason}`.
"""

from __future__ import annotations

from typing import Any

from unstick.controller import metrics
from unstick.core.remediation import NODE_NAME, POD_NAME, POD_UID
from unstick.core.vocabulary import Refusal
from unstick.kube.client import JSON
from unstick.kube.podwatch import TerminatingPod

MAX_REFUSALS = 20  # status.refusals keeps the newest entries


def identity_mismatch(rem: JSON, record: TerminatingPod) -> str | None:
    """Why this Remediation is not the record of `record`'s pod; None when it is."""
    spec = rem.get("spec") or {}
    wanted = {POD_NAME: record.name, POD_UID: record.uid, NODE_NAME: record.node or ""}
    for key, value in wanted.items():
        have = spec.get(key) or ""
        if have != value:
            return (
                f"spec.{key} is {have!r}, but the pod {record.key} has {key} {value!r}: this "
                "record is not the pod's (forged, replayed or left from an earlier pod)"
            )
    return None


def refusal_entry(action: str, refusal: Refusal, message: str, now: str) -> dict[str, Any]:
    return {
        "action": action,
        "reason": str(refusal),
        "message": message[:1000],
        "time": now,
        "by": "controller",
    }


def add_refusal(
    current: list[Any], action: str, refusal: Refusal, message: str, now: str
) -> list[Any] | None:
    """`current` + a new refusal (counted in the metric), or None if already on record."""
    for item in current:
        if (
            isinstance(item, dict)
            and item.get("action") == action
            and item.get("reason") == str(refusal)
            and item.get("message") == message[:1000]
        ):
            return None
    metrics.REFUSALS.labels(str(refusal)).inc()
    return [*current, refusal_entry(action, refusal, message, now)][-MAX_REFUSALS:]


def check_record(rem: JSON, pod: JSON | None) -> str | None:
    """Why a Remediation is not backed by a Terminating pod with its identity; None if it is.

    `pod` is a fresh GET of `spec.podName` in the Remediation's namespace."""
    spec = rem.get("spec") or {}
    name, uid, node = spec.get(POD_NAME), spec.get(POD_UID), spec.get(NODE_NAME) or ""
    if pod is None:
        return (
            f"no pod {name!r} exists in this namespace: this record is not backed by a stuck "
            "pod (if it was genuine, the pod went while unstick was not watching)"
        )
    meta, pod_spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if meta.get("uid") != uid:
        return f"pod {name!r} has UID {meta.get('uid')!r}, not spec.{POD_UID} {uid!r}"
    if (pod_spec.get("nodeName") or "") != node:
        return (
            f"pod {name!r} is on node {pod_spec.get('nodeName')!r}, not spec.{NODE_NAME} {node!r}"
        )
    if not meta.get("deletionTimestamp"):
        return f"pod {name!r} is not being deleted: nothing to remediate"
    return None
