"""A Remediation's `status.conditions` in the metav1.Condition shape (type, status, reason,
message, lastTransitionTime, observedGeneration), derived from its phase — pure.

Two conditions, both read from `status.phase` and the words beside it:
- `Resolved`: True once the pod is gone (a node incident: every pod it lists); False
  before, its reason the phase (`Remediating`, `DryRun`, `WaitingForAgent`, ...).
- `Stalled`: True when the record will not get further by itself — `Failed` (the same
  node steps needed again, or the act rejected) or `Refused` (not a stuck pod's own record);
  False otherwise. (kstatus reads a True `Stalled` as failed.)

They are never written on their own: records/writer.patch_status folds them into a status
write that happens anyway, when they differ from the record's (no extra API write).
`lastTransitionTime` moves only when a condition's status changes."""

from __future__ import annotations

from typing import Any

from unstick.core.remediation import Phase, rfc3339

RESOLVED = "Resolved"
STALLED = "Stalled"
_STALLED_PHASES = frozenset({Phase.Failed, Phase.Refused})
_SAYS: dict[str, str] = {  # the message of a phase when the record says nothing more
    Phase.Diagnosing: "no verdict yet",
    Phase.Observing: "observed only: nothing unstick may do for this pod now",
    Phase.DryRun: "dry run: the plan is on record, nothing is changed",
    Phase.WaitingForAgent: "waiting for the agent's probe of the pod's node",
    Phase.Remediating: "carrying out the plan",
    Phase.Failed: "the plan did not free the pod; it is not tried again in a loop",
    Phase.Resolved: "the pod is gone",
    Phase.Refused: "not a stuck pod's own record",
}


def _message(phase: str, status: dict[str, Any]) -> str:
    if phase == Phase.Refused and status.get("refusal"):
        return str(status["refusal"])
    if phase == Phase.Resolved and status.get("podCount") is not None:
        return f"every pod of the node incident is gone ({status.get('podCount')})"
    if phase not in (Phase.Resolved, Phase.Refused) and status.get("waitingFor"):
        return f"waiting for {status['waitingFor']}"
    return _SAYS.get(phase, "")


def conditions(status: dict[str, Any], generation: Any, now: float) -> list[dict[str, Any]] | None:
    """The conditions for `status` (the record's status after the write), keeping each
    one's lastTransitionTime from `status["conditions"]` unless its status changes. None:
    no phase yet, nothing to say."""
    phase = status.get("phase")
    if not isinstance(phase, str) or not phase:
        return None
    before = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    wanted = [
        (RESOLVED, phase == Phase.Resolved),
        (STALLED, phase in _STALLED_PHASES),
    ]
    out: list[dict[str, Any]] = []
    for kind, true in wanted:
        value = "True" if true else "False"
        old = before.get(kind) or {}
        moved = old.get("status") != value or not old.get("lastTransitionTime")
        condition: dict[str, Any] = {
            "type": kind,
            "status": value,
            "reason": phase,
            "message": _message(phase, status),
            "lastTransitionTime": rfc3339(now) if moved else old["lastTransitionTime"],
        }
        if isinstance(generation, int):
            condition["observedGeneration"] = generation
        out.append(condition)
    return out
