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
not in force (`agent/authority/admission.py`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from unstick.agent.authority.request import (
    PROBE,
    BadRemediation,
    as_obj,
    parse_steps,
    refusal_entry,
    time_of,
    with_refusal,
)
from unstick.agent.steps.executor import REFUSED, StepResult
from unstick.core import remediation as rem
from unstick.core.remediation import rfc3339
from unstick.core.vocabulary import Refusal

log = logging.getLogger(__name__)

JSON = dict[str, Any]
StatusPatcher = Callable[[str, str, JSON], None]


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
            as_obj(obj.get("metadata")),
            as_obj(obj.get("spec")),
            as_obj(obj.get("status")),
        )
        ns, name, uid = meta.get("namespace"), meta.get("name"), str(meta.get("uid") or "")
        if not isinstance(ns, str) or not isinstance(name, str) or spec.get(rem.INCIDENT):
            return
        requests = (spec.get(rem.NODE_STEPS_REQUESTED_AT), spec.get(rem.PROBE_REQUESTED_AT))
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
        steps_at = time_of(spec, rem.NODE_STEPS_REQUESTED_AT, f"spec.{rem.NODE_STEPS_REQUESTED_AT}")
        done_at = time_of(status, rem.NODE_STEPS_DONE_AT, f"status.{rem.NODE_STEPS_DONE_AT}")
        if steps_at is not None and (done_at is None or steps_at > done_at):
            try:
                steps = parse_steps(spec) or [("(none)", "")]
            except BadRemediation:
                steps = [("(none)", "")]
            stamp = rfc3339(now)
            patch[rem.NODE_ACTIONS_FIELD] = [
                StepResult(a, t, REFUSED, message, stamp).to_json() for a, t in steps
            ]
            patch[rem.NODE_STEPS_DONE_AT] = rfc3339(max(now, steps_at))
        probe_at = time_of(spec, rem.PROBE_REQUESTED_AT, f"spec.{rem.PROBE_REQUESTED_AT}")
        probe = as_obj(status.get(rem.PROBE))
        probed_at = time_of(probe, rem.PROBED_AT, f"status.{rem.PROBE}.{rem.PROBED_AT}")
        if probe_at is not None and (probed_at is None or probe_at > probed_at):
            entry = refusal_entry(PROBE, reason, message, now)
            patch[rem.NODE_REFUSALS] = with_refusal(status, entry)
        return patch
