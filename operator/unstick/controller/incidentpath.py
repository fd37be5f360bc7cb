"""The node incident path of a pass (controller/reconciler.py): force-delete a pod its
node holds (NodeGone, fenced NodeUnreachable), recorded in the node's incident
(controller/incidents.py) — the intent on record before the DELETE, a refused DELETE
read again and decided again.

`IncidentPath` is the reconciler's collaborator for that path: it gets its settings, the
incidents, the fresh Node inputs, the detector's `decide` and the budget's `take` and
`give_back` — nothing else of the reconciler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unstick.controller import budget, failpoints, metrics
from unstick.controller.decision import RATE_LIMITED, Decision
from unstick.controller.incidentrecord import takes_incident_path
from unstick.controller.incidents import Incidents
from unstick.controller.inputs import NodeInputs, fetch_pod
from unstick.controller.policies import Policy
from unstick.core import safety
from unstick.core.vocabulary import Action, Refusal
from unstick.kube import actions
from unstick.kube.client import JSON, Kube
from unstick.kube.podwatch import TerminatingPod, pod_json, terminating_record

log = logging.getLogger("unstick.decisions")

RECHECK_AFTER_CONFLICT_S = 1.0

#: The detector's decision: (pod, probe, now, Node/CSINode sources) → Decision.
Decide = Callable[[JSON, Any, float, NodeInputs | None], Decision]


@dataclass(frozen=True, slots=True)
class IncidentPathSettings:
    recheck_s: float = 300.0  # a pod whose force-delete is on record: looked at again then


class IncidentPath:
    """Force-delete a pod its node holds, recorded in the node's incident."""

    def __init__(
        self,
        kube: Kube,
        settings: IncidentPathSettings,
        clock: Callable[[], float],
        *,
        incidents: Incidents,
        fresh: NodeInputs,
        decide: Decide,
        take_budget: Callable[[Policy, str, float], float],
        give_back: Callable[[str, float], None],
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.clock = clock
        self.incidents = incidents
        self.fresh = fresh  # Node (shared GET, <= 1 s old) and CSINode for the re-check
        self.decide = decide
        self.take_budget = take_budget
        self.give_back = give_back

    def act(self, record: TerminatingPod, dec: Decision, now: float) -> float | None:
        """Force-delete a pod its node holds (NodeGone, fenced NodeUnreachable), recorded in
        the node's incident (controller/incidents.py). Re-checked right before acting like
        any action, but with no per-pod read: the pod as the watch last delivered it (the
        DELETE carries its UID and resourceVersion as preconditions, so the API server
        refuses if the pod changed since) and the Node read fresh (one GET shared by the
        pods of that node, <= 1 s old). A refusal (409) reads the pod once and decides
        again from what it is now."""
        incidents = self.incidents
        incidents.join(record, dec, now)
        for _ in range(2):
            if incidents.succeeded(record.uid, str(Action.FORCE_DELETE)):
                return now + self.settings.recheck_s  # done: the watch reports it gone
            result = self._incident_attempt(record, dec)
            if not isinstance(result, TerminatingPod):
                return result
            record = result  # refused (409): the pod as it is now
        return self.clock() + RECHECK_AFTER_CONFLICT_S

    def _incident_attempt(
        self, record: TerminatingPod, dec: Decision
    ) -> float | TerminatingPod | None:
        """Decide, take the budget, put the intent on record, DELETE, record its result.
        Returns the next due time, or the pod as read again after a 409."""
        incidents = self.incidents
        fresh = self.decide(pod_json(record), None, self.clock(), self.fresh)
        fd = fresh.diagnosis
        action = str(Action.FORCE_DELETE)
        if fd.cause != dec.diagnosis.cause or not takes_incident_path(fresh):
            log.info(
                "pod=%s uid=%s cause=%s action=force-delete result=skipped: changed before acting",
                record.key,
                record.uid,
                fd.cause,
            )
            return self.clock() + RECHECK_AFTER_CONFLICT_S
        verdict = safety.force_delete_safe(fd.cause, fd.fenced, fd.nothing_left, fd.probe_fresh)
        if not verdict:
            metrics.REFUSALS.labels(str(Refusal.UNSAFE)).inc()
            self._incident_outcome(record, fd, actions.Outcome("refused", verdict.reason), 0.0)
            return self.clock() + 30
        slot = self.clock()
        wait = self.take_budget(fresh.policy, record.node, slot)
        if wait > 0:
            incidents.waiting(record.uid, RATE_LIMITED)
            failpoints.reached("incident-rate-limited")
            return self.clock() + wait
        # Record before act: the DELETE only once its intent is on record, and within
        # ACT_WITHIN_S of the slot (a restart counts the grant until then + 60 s).
        failpoints.reached("incident-before-intent")
        token = incidents.intend(record.uid, action, slot)
        if token is None or not incidents.durable(token, slot + budget.ACT_WITHIN_S):
            incidents.retract(record.uid)  # not sent (its slot stays taken: it may be on record)
            log.warning(
                "pod=%s uid=%s action=force-delete result=postponed: its intent could not be "
                "put on record in time",
                record.key,
                record.uid,
            )
            return self.clock() + RECHECK_AFTER_CONFLICT_S
        failpoints.reached("incident-intent-durable")
        outcome = actions.force_delete(
            self.kube, record.namespace, record.name, record.uid, record.resource_version
        )
        failpoints.reached("incident-deleted")
        if outcome.result == "conflict":  # nothing done: the slot back, the pod read again
            self.give_back(record.node, slot)
            incidents.retract(record.uid)
            log.info(
                "pod=%s uid=%s cause=%s action=force-delete result=conflict %s",
                record.key,
                record.uid,
                fd.cause,
                outcome.message,
            )
            return self._refresh(record)
        self._incident_outcome(record, fd, outcome, slot)
        return self.clock() + (RECHECK_AFTER_CONFLICT_S if outcome.result == "succeeded" else 30)

    def _incident_outcome(
        self, record: TerminatingPod, fd: Any, outcome: actions.Outcome, slot: float
    ) -> None:
        log.info(
            "pod=%s uid=%s cause=%s action=force-delete result=%s %s",
            record.key,
            record.uid,
            fd.cause,
            outcome.result,
            outcome.message,
        )
        action = str(Action.FORCE_DELETE)
        at = slot or self.clock()
        if self.incidents.outcome(record.uid, action, outcome.result, outcome.message, at):
            metrics.REMEDIATIONS.labels(action, str(fd.cause), outcome.result).inc()

    def _refresh(self, record: TerminatingPod) -> float | TerminatingPod | None:
        """The pod read again after a refused DELETE; None when it is gone (or another pod
        has its name): the watch reports that."""
        pod = fetch_pod(self.kube, record.namespace, record.name)
        fresh = terminating_record(pod) if pod is not None else None
        if fresh is None or fresh.uid != record.uid:
            return self.clock() + RECHECK_AFTER_CONFLICT_S
        return fresh
