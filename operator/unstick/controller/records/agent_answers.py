"""The agent's answers as a Remediation holds them: the results of its node actions
(`status.nodeActions`, once `status.nodeStepsDoneAt` says it answered), whether it has
answered the latest request, and the results no pass recorded yet (recorded when the pod's
record is marked Resolved, or when a late answer lands)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unstick.controller import metrics
from unstick.controller.records.writer import MAX_RECORDED_ACTIONS, action_entry
from unstick.core.remediation import (
    MANDATE,
    NODE_PLAN,
    NODE_STEPS_DONE_AT,
    NODE_STEPS_REQUESTED_AT,
    node_results,
    rfc3339,
    steps_answered,
    time_or_none,
)
from unstick.core.vocabulary import NODE_ACTIONS, Cause
from unstick.kube.client import JSON

_NODE_ACTION_NAMES = frozenset(str(a) for a in NODE_ACTIONS)
_RESULTS = frozenset({"succeeded", "failed", "refused", "dry_run"})
_CAUSES = frozenset(str(c) for c in Cause)


def agent_results(rem: JSON) -> list[tuple[str, str, str, str]]:
    """(action, target, result, message) of the agent's node actions, once it has answered
    the latest request. Text from the CR becomes metric labels: only the fixed vocabulary
    gets through."""
    spec = rem.get("spec") or {}
    status = rem.get("status") or {}
    if not steps_answered(spec, status):
        return []
    return _node_actions(status)


def answered_results(rem: JSON) -> list[tuple[str, str, str, str]]:
    """Like `agent_results`, of the agent's answer on record whichever request it answered
    (`status.nodeStepsDoneAt` set): what a pass records in status.actions. An answer to an
    earlier request stays in `status.nodeActions` only until the agent answers the next:
    recorded from whichever version a pass or the resolve sees, never only when it is the
    latest request's answer."""
    status = rem.get("status") or {}
    return _node_actions(status) if status.get(NODE_STEPS_DONE_AT) else []


def _node_actions(status: JSON) -> list[tuple[str, str, str, str]]:
    """Each result with its target — a mandate's results name the plan's step instead
    (`core.remediation.node_results`)."""
    out = []
    for item in node_results(status):
        action, result = item.get("action"), item.get("result")
        out.append(
            (
                action if action in _NODE_ACTION_NAMES else "unknown",
                str(item.get("target", "")),
                result if result in _RESULTS else "failed",
                str(item.get("message", "")),
            )
        )
    return out


def answered_plan(rem: JSON) -> JSON | None:
    """The agent's own plan (`status.nodePlan`) of the answer on record: a mandate's (spec
    has one), planned for a request made before that answer (`for` not after
    `status.nodeStepsDoneAt`; a plan for the next request is not yet answered). None for an
    answer to a request of steps (`spec.nodeSteps`: the controller planned them)."""
    spec, status = rem.get("spec") or {}, rem.get("status") or {}
    plan = status.get(NODE_PLAN)
    if spec.get(MANDATE) is None or not isinstance(plan, dict):
        return None
    planned_for, done = time_or_none(plan.get("for")), time_or_none(status.get(NODE_STEPS_DONE_AT))
    if planned_for is None or done is None or planned_for > done:
        return None
    return plan


def steps_cause(rem: JSON) -> str | None:
    """The cause the agent's node steps on record were for — their one home: of a mandate,
    the cause the agent's own plan names (`answered_plan`: it diagnosed its own probe, the
    controller never saw the node before the steps); of a request of steps, the record's
    `status.cause` (the controller's diagnosis they were requested on, kept through the
    kubelet's window after them: `steps_diagnosis`). It is a metric label and the record's
    cause: only the fixed vocabulary gets through (None otherwise)."""
    plan = answered_plan(rem)
    cause = plan.get("cause") if plan is not None else (rem.get("status") or {}).get("cause")
    return cause if cause in _CAUSES else None


def steps_diagnosis(rem: JSON) -> dict[str, Any]:
    """The record's diagnosis keys while the kubelet has its window after the agent's node
    steps (reconciler.py): the diagnosis the steps were for, not KubeletNotProgressing —
    that is a diagnosis only once the window is over. `plan` is empty: the steps are said
    where they were handed over (`spec.nodeSteps`, a mandate's `status.nodePlan`) and their
    results in `status.actions`. Of a request of steps, the evidence as on record (the
    controller's diagnosis they were requested on); of a mandate, a pointer to the agent's
    plan (its evidence is its probe before the steps, replaced by the one after them).
    {} when the record says no such cause."""
    cause = steps_cause(rem)
    if cause is None:
        return {}
    plan = answered_plan(rem)
    if plan is None:
        status = rem.get("status") or {}
        kept = {k: status.get(k) or [] for k in ("evidence", "refused")}
        return {"cause": cause, "plan": [], **kept}
    said = (
        f"diagnosed by the node agent on its own probe before its steps (status.{NODE_PLAN}, "
        f"for the request of {plan.get('for')})"
    )
    return {"cause": cause, "evidence": [{"kind": "agent", "message": said}], "plan": []}


def steps_pending(rem: JSON) -> bool:
    """Node steps were handed to the agent and it has not answered them yet."""
    spec, status = rem.get("spec") or {}, rem.get("status") or {}
    requested = spec.get(NODE_STEPS_REQUESTED_AT)
    if not isinstance(requested, str) or not requested:
        return False
    return not steps_answered(spec, status)


@dataclass(frozen=True, slots=True)
class LateActions:
    """status.actions with the agent's results that no pass recorded yet (`actions`), and
    those results, counted in unstick_remediations_total by `count` — called once the
    write that records them succeeded, so a write made again after a 409 counts once."""

    actions: list[Any]
    added: tuple[tuple[str, str], ...]  # (action, result) of each result added
    cause: str

    def count(self) -> None:
        for action, result in self.added:
            metrics.REMEDIATIONS.labels(action, self.cause, result).inc()


def late_agent_actions(rem: JSON, now: float) -> LateActions | None:
    """The agent's results that no pass recorded yet, as status.actions with them added;
    None when there are none."""
    status = rem.get("status") or {}
    done = list(status.get("actions") or [])
    added: list[tuple[str, str]] = []
    for action, target, result, message in answered_results(rem):
        entry = {"action": action, "target": target, "result": result}
        if any(all(a.get(k) == v for k, v in entry.items()) for a in done):
            continue
        done.append(
            action_entry(action, target, result, message=message, when=rfc3339(now), by="agent")
        )
        added.append((action, result))
    if not added:
        return None
    cause = steps_cause(rem) or str(Cause.Unknown)
    return LateActions(done[-MAX_RECORDED_ACTIONS:], tuple(added), cause)
