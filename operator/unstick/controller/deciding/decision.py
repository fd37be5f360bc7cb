"""What the controller decided about one stuck pod, and the status keys it is written as.

`Decision` is the detector's verdict (controller/deciding/detector.py: opt-in, policy, diagnosis,
plan); `Pass` is one reconcile pass over one pod (controller/reconciler.py) — what it
decided and what it has recorded so far; `status_summary` is the part of the
Remediation's status every write of a pass carries. The reconciler and its collaborators
(agent_channel/node_steps.py, acting/pod_actions.py, incidents/path.py) all speak in
these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unstick.controller.deciding.inputs import NodeInputs
from unstick.controller.deciding.policies import Policy
from unstick.core.remediation import Phase, rfc3339
from unstick.core.rules.diagnosis import Diagnosis
from unstick.core.rules.finalizer_owners import waiting_for
from unstick.core.vocabulary import Action, Cause
from unstick.kube.client import JSON
from unstick.kube.podwatch import TerminatingPod

#: `status.waitingFor` while the action budget is used up.
RATE_LIMITED = "rate limit: the policy's action budget is used up; retried when it refills"
#: `status.waitingFor` while the kubelet gets --kubelet-finish-seconds after node steps.
KUBELET_FINISHING = "the kubelet to finish the pod itself after the node steps"
#: A write that met a newer version of the record, or an act refused by a precondition:
#: the pod is decided again this long after, from a fresh read.
RECHECK_AFTER_CONFLICT_S = 1.0


@dataclass(frozen=True, slots=True)
class Decision:
    diagnosis: Diagnosis
    steps: tuple[Any, ...]  # core planner Steps
    refused: tuple[Any, ...]
    policy: Policy
    opted_in: bool
    why: str


@dataclass(frozen=True, slots=True)
class Pass:
    """One reconcile pass over one pod: what it decided and what it has recorded."""

    record: TerminatingPod
    rem: JSON
    dec: Decision
    now: float
    done: list[Any]  # status.actions, appended to during the pass
    summary: dict[str, Any]  # the status keys every write carries
    probe: Any = None  # the Remediation's probe, when bound to this pod and our request


#: The detector's decision: (pod, probe, now, Node/CSINode sources) → Decision.
Decide = Callable[[JSON, Any, float, NodeInputs | None], Decision]


#: Bounds of the Remediation's status schema (operator/unstick/crds/remediations.yaml): a
#: pod with thousands of volumes must not turn every status write into a 422.
MAX_LIST_ITEMS = {"evidence": 256, "plan": 256, "refused": 64}
MAX_MESSAGE = 2000


def _bounded(key: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cap = MAX_LIST_ITEMS[key]
    out = [
        {k: (v[:MAX_MESSAGE] if isinstance(v, str) else v) for k, v in item.items()}
        for item in items
    ]
    if len(out) <= cap:
        return out
    dropped = len(out) - cap + 1
    last = {**out[cap - 1]}
    field = "message" if "message" in last else "reason"
    last[field] = f"... and {dropped} more not recorded (status is bounded)"
    return [*out[: cap - 1], last]


def status_summary(record: TerminatingPod, dec: Decision) -> dict[str, Any]:
    d = dec.diagnosis
    return {
        "cause": str(d.cause),
        "stuckSince": rfc3339(record.deletion_timestamp + dec.policy.slack_s),
        "evidence": _bounded(
            "evidence", [{"kind": e.kind, "message": e.message} for e in d.evidence]
        ),
        "plan": _bounded(
            "plan",
            [{"action": str(s.action), "target": s.target, "reason": s.reason} for s in dec.steps],
        ),
        "refused": _bounded(
            "refused", [{"action": str(r.action), "reason": r.reason} for r in dec.refused]
        ),
        "optedIn": dec.opted_in,
        "policy": dec.policy.name,
        **_owner_wait(dec),
    }


def _owner_wait(dec: Decision) -> dict[str, Any]:
    """FinalizerBlocked, finalizer triage: `waitingFor` names the owner an allowlisted finalizer
    waits for (alive, or not gone for spec.finalizerOwnerGoneSeconds yet), else null."""
    d, parsed = dec.diagnosis, dec.policy.parsed
    if str(d.cause) != "FinalizerBlocked" or parsed is None or not dec.opted_in:
        return {}
    if not parsed.permits(Action.REMOVE_FINALIZER):
        return {}
    owners, allowlist = d.finalizer_owners, parsed.finalizer_allowlist
    gone_s = parsed.finalizer_owner_gone_seconds
    return {"waitingFor": waiting_for(d.finalizers, owners, allowlist, gone_s, d.now)}


def needs_probe(record: TerminatingPod, d: Diagnosis) -> bool:
    """The pass waits for a probe of the pod's node. Without a fresh probe
    ContainersStillRunning is the kubelet's last word in pod.status, stale when the kubelet
    itself is what is stuck (found on the real node: a wedged kubelet's pod read "running"
    forever): the node is asked as for Unknown."""
    unproven = (Cause.Unknown, Cause.ContainersStillRunning)
    return d.cause in unproven and not d.probe_fresh and bool(record.node)


def announces(before: JSON, after: JSON, cause: str, waiting: bool) -> bool:
    """Whether a pass posts the pod's Event (`before`/`after`: its status): once per
    diagnosis, and not while the diagnosis waits for the node — for its probe (the cause
    is not known yet) or, after node steps, for the kubelet to finish the pod itself
    (KubeletNotProgressing is not shown yet): posted when that wait ends, with the cause
    it ended on (Unknown once, the first time a wait ends without a probe). In that
    window the record's cause is the one the steps were for (a mandate's: the agent's
    plan, agent_answers.steps_diagnosis), posted there when no pass announced it yet."""
    if waiting:
        observed = any(
            isinstance(a, dict) and a.get("action") == str(Action.OBSERVE)
            for a in before.get("actions") or []
        )
        begins = after.get("phase") == Phase.Observing and before.get("phase") != Phase.Observing
        return begins and not observed
    if after.get("waitingFor") == KUBELET_FINISHING:
        return before.get("cause") != after.get("cause")
    held = (
        before.get("phase") == Phase.WaitingForAgent
        or before.get("waitingFor") == KUBELET_FINISHING
    )
    return before.get("cause") != cause or held
