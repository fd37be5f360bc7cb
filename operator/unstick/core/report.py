"""A diagnosis and its plan as the JSON of design.md §6 (also the Remediation's status)."""

from __future__ import annotations

from unstick.core.policy.planner import Plan
from unstick.core.rules.diagnosis import Diagnosis

JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]


def to_report(d: Diagnosis, p: Plan) -> dict[str, JSONValue]:
    """Keys: pod, uid, node, overdueSeconds, stuck, cause, evidence, plan, refused."""
    return {
        "pod": d.pod,
        "uid": d.uid,
        "node": d.node,
        "overdueSeconds": d.overdue_seconds,
        "stuck": d.stuck,
        "cause": d.cause.value,
        "evidence": [{"kind": e.kind, "message": e.message} for e in d.evidence],
        "plan": [
            {"action": s.action.value, "target": s.target, "reason": s.reason} for s in p.steps
        ],
        "refused": [{"action": r.action.value, "reason": r.reason} for r in p.refused],
    }


def to_text(d: Diagnosis, p: Plan) -> str:
    """The same, for people."""
    lines = [f"pod {d.pod} (uid {d.uid}) on node {d.node or '(none)'}"]
    if d.overdue_seconds is None:
        lines.append("not being deleted")
    else:
        state = "STUCK" if d.stuck else "not stuck"
        lines.append(f"{state}: {d.overdue_seconds:.0f}s past its deletionTimestamp")
    lines.append(f"cause: {d.cause.value}")
    lines.append("evidence:")
    lines += [f"  - [{e.kind}] {e.message}" for e in d.evidence]
    lines.append("plan:" if p.steps else "plan: (nothing to do)")
    lines += [
        f"  {i}. {s.action.value} {s.target}\n     why: {s.reason}"
        for i, s in enumerate(p.steps, 1)
    ]
    if p.refused:
        lines.append("refused:")
        lines += [f"  - {r.action.value}: {r.reason}" for r in p.refused]
    return "\n".join(lines)
