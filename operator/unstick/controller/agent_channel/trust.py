"""The controller's side of the trust boundary (design.md §3 invariant 7, §5).

A Remediation is a channel, not an authority: anyone with RBAC on Remediations (or a
bug) can write one. The controller therefore
- uses a Remediation for a pod only if its identity (`spec.podName`, `spec.podUID`,
  `spec.nodeName`) is that pod's (`identity_mismatch`);
- uses its `status.probe` only if the probe names the pod's UID and node and was taken
  after a request this controller itself made, remembered in memory (`ProbeRequests`,
  `usable_probe`) — never the request time written in the record;
- marks a Remediation that is not backed by a stuck pod as `Refused`, with the reason
  (`check_record`), so a forged record never sits in `kubectl get remediations -A` as
  if it were real;
- records every refusal: `status.refusals` and `unstick_refusals_total{reason}`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from unstick.controller import metrics
from unstick.core import safety
from unstick.core.remediation import NODE_NAME, POD_NAME, POD_UID, probe_stamp
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


class ProbeRequests:
    """When this controller asked the agent about each pod (probe or node steps): the first
    request (a probe counts only if taken after it) and the latest (when to ask again).

    In memory only: after a restart nothing is remembered, so every probe in a record is
    old news and a fresh one is asked for — a record's own `probeRequestedAt` is never
    believed (anyone who writes the record can write it)."""

    def __init__(self) -> None:
        self._times: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def asked(self, uid: str, now: float) -> None:
        with self._lock:
            first = self._times.get(uid, (now, now))[0]
            self._times[uid] = (first, now)

    def first(self, uid: str) -> float | None:
        with self._lock:
            times = self._times.get(uid)
        return None if times is None else times[0]

    def last(self, uid: str) -> float | None:
        with self._lock:
            times = self._times.get(uid)
        return None if times is None else times[1]

    def forget(self, uid: str) -> None:
        with self._lock:
            self._times.pop(uid, None)


@dataclass(frozen=True, slots=True)
class ProbeVerdict:
    probe: Any  # the probe object when usable, else None
    refusal: Refusal | None = None
    reason: str = ""


def usable_probe(probe: Any, record: TerminatingPod, requested_at: float | None) -> ProbeVerdict:
    """The Remediation's probe if it is bound to this pod and this controller's request."""
    if not probe:
        return ProbeVerdict(None)
    if not isinstance(probe, dict):
        return ProbeVerdict(None, Refusal.FORGED, "status.probe is not an object")
    stamp = probe_stamp(probe)
    verdict = safety.bound_probe(
        stamp.pod_uid,
        stamp.node_name,
        stamp.probed_at,
        pod_uid=record.uid,
        node=record.node or None,
        requested_at=None if requested_at is None else datetime.fromtimestamp(requested_at, UTC),
    )
    if verdict:
        return ProbeVerdict(probe)
    if requested_at is None or "before this controller asked" in verdict.reason:
        # Not an attack by itself: an answer to an earlier request (or an earlier
        # controller): not used, and a fresh probe is asked for.
        return ProbeVerdict(None, Refusal.STALE, f"status.probe not used: {verdict.reason}")
    return ProbeVerdict(None, Refusal.FORGED, f"status.probe not used: {verdict.reason}")


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
