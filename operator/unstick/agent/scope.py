"""The controller's namespace scope, as the agent knows it (`--namespace-scope`, from the
chart's `controller.namespaceScope`).

A controller started with a scope makes requests only in those namespaces. The agent lists
the Remediations of its node in every namespace (one watch), so a Remediation outside the
scope is a request the controller never made: nothing is probed or run for it, and the
refusal is on record in that Remediation (`status.nodeActions` for node steps, with
`status.nodeStepsDoneAt`; `status.nodeRefusals` for a probe) and counted as `forged` in
`unstick_refusals_total`. Each request is refused once (the agent's own status patch comes
back as a MODIFIED event). The admission policy already refuses such a Remediation when it
is written (docs/admission.md); this is the agent's own check, for a cluster where the
policy is off or was removed. The same gate records the refusals while that policy is
not in force (`agent/admission_check.py`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from unstick.agent.executor import REFUSED, StepResult
from unstick.agent.handler import MAX_NODE_REFUSALS, BadRemediation, parse_steps, parse_time
from unstick.agent.probe import rfc3339
from unstick.core.vocabulary import Refusal

log = logging.getLogger(__name__)

JSON = dict[str, Any]
StatusPatcher = Callable[[str, str, JSON], None]


def _obj(value: object) -> JSON:
    return value if isinstance(value, dict) else {}


class ScopeGate:
    """Refuses, on record, the requests of Remediations outside the namespace scope."""

    def __init__(
        self,
        scope: tuple[str, ...],
        patch_status: StatusPatcher,
        on_refusal: Callable[[Refusal], None],
        clock: Callable[[], datetime],
    ) -> None:
        self.scope = frozenset(scope)
        self.patch_status = patch_status
        self.on_refusal = on_refusal
        self.clock = clock
        self._refused: dict[str, tuple[object, object]] = {}  # uid -> requests refused
        self._lock = threading.Lock()

    def allows(self, namespace: object) -> bool:
        """True without a scope, or for a namespace in it."""
        return not self.scope or namespace in self.scope

    def message(self, namespace: str) -> str:
        return (
            f"metadata.namespace: {namespace!r} is outside the controller's namespace scope "
            f"({', '.join(sorted(self.scope))}; the agent's --namespace-scope): the controller "
            "makes no requests there, so this one is not the controller's"
        )

    def forget(self, uid: str) -> None:
        with self._lock:
            self._refused.pop(uid, None)

    def refuse(self, obj: JSON, why: str | None = None, reason: Refusal = Refusal.FORGED) -> None:
        """Record the refusal of the requests this Remediation carries (each once), for
        `why`, by default: outside the scope."""
        meta, spec, status = (
            _obj(obj.get("metadata")),
            _obj(obj.get("spec")),
            _obj(obj.get("status")),
        )
        ns, name, uid = meta.get("namespace"), meta.get("name"), str(meta.get("uid") or "")
        if not isinstance(ns, str) or not isinstance(name, str) or spec.get("incident"):
            return
        requests = (spec.get("nodeStepsRequestedAt"), spec.get("probeRequestedAt"))
        with self._lock:
            if self._refused.get(uid) == requests:
                return
            self._refused[uid] = requests
        message = why or self.message(ns)
        try:
            patch = self._patch(spec, status, message, reason)
        except BadRemediation as exc:
            log.warning("remediation %s/%s: refused (%s): %s", ns, name, message, exc)
            return
        if not patch:
            return
        log.warning("remediation %s/%s: refused: %s", ns, name, message)
        self.on_refusal(reason)
        self.patch_status(ns, name, patch)

    def _patch(self, spec: JSON, status: JSON, message: str, reason: Refusal) -> JSON:
        now = self.clock()
        patch: JSON = {}
        steps_at = parse_time(spec.get("nodeStepsRequestedAt"), "spec.nodeStepsRequestedAt")
        done_at = parse_time(status.get("nodeStepsDoneAt"), "status.nodeStepsDoneAt")
        if steps_at is not None and (done_at is None or steps_at > done_at):
            try:
                steps = parse_steps(spec) or [("(none)", "")]
            except BadRemediation:
                steps = [("(none)", "")]
            stamp = rfc3339(now)
            patch["nodeActions"] = [
                StepResult(a, t, REFUSED, message, stamp).to_json() for a, t in steps
            ]
            patch["nodeStepsDoneAt"] = rfc3339(max(now, steps_at))
        probe_at = parse_time(spec.get("probeRequestedAt"), "spec.probeRequestedAt")
        probed_at = parse_time(_obj(status.get("probe")).get("probedAt"), "status.probe.probedAt")
        if probe_at is not None and (probed_at is None or probe_at > probed_at):
            entry = {
                "action": "probe",
                "reason": str(reason),
                "message": message[:1000],
                "time": rfc3339(now),
                "by": "agent",
            }
            current = status.get("nodeRefusals")
            kept = [e for e in current if isinstance(e, dict)] if isinstance(current, list) else []
            patch["nodeRefusals"] = [*kept, entry][-MAX_NODE_REFUSALS:]
        return patch
