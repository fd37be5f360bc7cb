"""What a Remediation's request must pass before the agent probes or acts, and how a
refusal is put on record (docs/agent.md; the Handler, `agent/handler.py`, applies them).

A Remediation is a channel, not an authority (design.md §3 invariant 7). Its fields are
read with `unstick.core.remediation` (the one parser of its times and steps); a field the
agent cannot use is a `BadRemediation` whose message names the field, never an action.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from unstick.agent.settings import AgentSettings
from unstick.core.remediation import (
    NODE_REFUSALS,
    NODE_STEPS_REQUESTED_AT,
    POD_NAME,
    POD_UID,
    RETRY_AFTER,
    RemediationError,
    field_time,
    rfc3339,
)
from unstick.core.remediation import parse_steps as parse_node_step_list
from unstick.core.vocabulary import Refusal

JSON = dict[str, Any]
MAX_NODE_REFUSALS = 20  # status.nodeRefusals keeps the newest entries
#: `status.nodeRefusals[].action` of a request of node steps refused as a whole; its
#: `time` is the `status.nodeStepsDoneAt` of that answer.
NODE_STEPS = "node-steps"
#: `status.nodeRefusals[].action` of a probe refused.
PROBE = "probe"


class BadRemediation(ValueError):
    """A Remediation field the agent cannot use; the message names the field."""

    def __init__(self, message: str, refusal: Refusal = Refusal.FORGED) -> None:
        super().__init__(message)
        self.refusal = refusal


def as_obj(value: object) -> JSON:
    """`value` when it is an object, else an empty one."""
    return value if isinstance(value, dict) else {}


def time_of(source: Mapping[str, Any], key: str, field: str) -> datetime | None:
    """`source[key]` as a time (None when absent or empty); BadRemediation naming `field`
    (e.g. `spec.nodeStepsRequestedAt`) when it is not an RFC 3339 time."""
    try:
        return field_time(source, key, field)
    except RemediationError as exc:
        raise BadRemediation(str(exc)) from None


def pod_uid(spec: JSON) -> str:
    uid = spec.get(POD_UID)
    if not isinstance(uid, str) or not uid or "/" in uid or uid in (".", ".."):
        raise BadRemediation(f"spec.{POD_UID}: missing or not a pod UID")
    return uid


def parse_steps(spec: JSON) -> list[tuple[str, str]]:
    """(action, target) of spec.nodeSteps, validated."""
    try:
        return [(str(s.action), s.target) for s in parse_node_step_list(spec)]
    except RemediationError as exc:
        raise BadRemediation(str(exc)) from None


def check_request_age(requested: datetime, now: datetime, settings: AgentSettings) -> None:
    """BadRemediation unless the node-step request is fresh (docs/agent.md, "Request age")."""
    age = (now - requested).total_seconds()
    if age > settings.max_request_age_s:
        raise BadRemediation(
            f"spec.{NODE_STEPS_REQUESTED_AT}: the request is {age:.0f}s old, older than "
            f"--max-request-age ({settings.max_request_age_s:.0f}s); not running stale steps, "
            "the controller re-requests them if it still wants them",
            Refusal.STALE,
        )
    if -age > settings.max_request_skew_s:
        raise BadRemediation(
            f"spec.{NODE_STEPS_REQUESTED_AT}: the request is {-age:.0f}s in the future, more "
            f"than the allowed clock skew ({settings.max_request_skew_s:.0f}s)",
            Refusal.STALE,
        )


def check_pod(pod: JSON | None, spec: JSON, node: str, now: datetime) -> None:
    """BadRemediation unless `pod` (from the API) is spec's pod, on `node`, overdue."""
    name, uid = spec.get(POD_NAME), spec.get(POD_UID)
    if pod is None:
        raise BadRemediation(f"spec.{POD_NAME}: pod {name!r} does not exist in this namespace")
    meta, pod_spec = as_obj(pod.get("metadata")), as_obj(pod.get("spec"))
    if meta.get("uid") != uid:
        raise BadRemediation(
            f"spec.{POD_UID}: pod {name!r} has uid {meta.get('uid')!r}, not {uid!r}"
        )
    if pod_spec.get("nodeName") != node:
        raise BadRemediation(
            f"spec.{POD_NAME}: pod {name!r} is bound to {pod_spec.get('nodeName')!r}, not this node"
        )
    deleted = time_of(meta, "deletionTimestamp", "pod metadata.deletionTimestamp")
    if deleted is None:
        raise BadRemediation(f"spec.{POD_NAME}: pod {name!r} is not terminating")
    if deleted > now:
        raise BadRemediation(
            f"spec.{POD_NAME}: pod {name!r} is still within its grace period (until "
            f"{rfc3339(deleted)})"
        )


def refusal_entry(
    action: str,
    refusal: Refusal,
    message: str,
    at: datetime,
    *,
    retry_after_s: float | None = None,
) -> JSON:
    """One `status.nodeRefusals` entry; `retryAfterSeconds` when what refused it was a
    limit that has room again after that long (the agent's node budget), so the request
    says nothing about its steps and may be asked again."""
    entry: JSON = {
        "action": action,
        "reason": str(refusal),
        "message": message[:1000],
        "time": rfc3339(at),
        "by": "agent",
    }
    if retry_after_s is not None:
        entry[RETRY_AFTER] = max(1, math.ceil(retry_after_s))
    return entry


def with_refusal(status: JSON, entry: JSON) -> list[JSON]:
    """`status.nodeRefusals` with `entry` appended, the newest MAX_NODE_REFUSALS kept."""
    current = status.get(NODE_REFUSALS)
    kept = [e for e in current if isinstance(e, dict)] if isinstance(current, list) else []
    return [*kept, entry][-MAX_NODE_REFUSALS:]
