"""The controller's side of the trust boundary on the agent's probe (design.md §3
invariant 7, §5).

A Remediation is a channel, not an authority: anyone with RBAC on Remediations (or a
bug) can write one. The controller therefore uses its `status.probe` only if the probe
names the pod's UID and node and was taken after a request this controller itself made,
remembered in memory (`ProbeRequests`, `usable_probe`) — never the request time written
in the record. Whose record a Remediation is, and the refusals it carries:
controller/records/identity.py.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from unstick.core import safety
from unstick.core.remediation import probe_stamp
from unstick.core.vocabulary import Refusal
from unstick.kube.podwatch import TerminatingPod


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
