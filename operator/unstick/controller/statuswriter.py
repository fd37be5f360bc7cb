"""How a pass writes the pod's Remediation: its status keys (a merge patch of only the
keys that changed) and its `status.actions` (each counted once in
`unstick_remediations_total`). The reconciler and its collaborators (nodeside.py,
podactions.py) write through one StatusWriter, which also remembers which Remediation
this process keeps for each pod (`known`), so resolving a pod needs no read."""

from __future__ import annotations

from typing import Any

from unstick.controller import metrics, records
from unstick.controller.decision import Pass
from unstick.core.remediation import rfc3339
from unstick.kube.client import JSON, Kube

MAX_RECORDED_ACTIONS = 100  # status.actions keeps the newest entries


class StatusWriter:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        # Remediations this process read or wrote, by pod uid: (namespace, name, phase).
        # Lets `resolve` write without reading it again.
        self.known: dict[str, tuple[str, str, str]] = {}

    def count_once(
        self,
        p: Pass,
        action: Any,
        target: str,
        result: str,
        message: str,
        *,
        by: str = "controller",
        force: bool = False,
        cause: str | None = None,
    ) -> None:
        """Append to status.actions and count the metric, once per (action, target, result)."""
        entry = {"action": str(action), "target": target, "result": result}
        if not force and any(all(a.get(k) == v for k, v in entry.items()) for a in p.done):
            return
        p.done.append({**entry, "message": message, "time": rfc3339(p.now), "by": by})
        del p.done[:-MAX_RECORDED_ACTIONS]
        cause = cause or str(p.dec.diagnosis.cause)
        metrics.REMEDIATIONS.labels(str(action), cause, result).inc()

    def write(self, p: Pass, phase: str, **extra: Any) -> None:
        """The pass's status: its summary, `phase`, status.actions and `extra` keys."""
        # a copy: p.done changes after this write (an intent replaced by its answer)
        self.patch(p.rem, {**p.summary, "phase": phase, "actions": list(p.done), **extra})
        meta = p.rem.get("metadata") or {}
        self.known[p.record.uid] = (p.record.namespace, meta.get("name") or "", phase)

    def patch(self, rem: JSON, desired: dict[str, Any]) -> None:
        """Status merge patch of only the keys whose value differs."""
        current = rem.get("status") or {}
        changed = {k: v for k, v in desired.items() if current.get(k) != v}
        if changed:
            rem["status"] = {**current, **changed}
            records.patch_status(self.kube, rem, changed)
