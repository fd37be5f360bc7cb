"""The node incident path of a pass (controller/reconciler.py): force-delete a pod its
node holds (NodeGone, fenced NodeUnreachable), recorded in the node's incident
(controller/incidents/registry.py) — the intent on record before the DELETE, a refused DELETE
read again and decided again. A worker decides and puts the intent in the incident; a
sender thread waits for that record and sends the DELETE, so the worker goes on to the
next pod and the intents of a burst share their incident's writes. The DELETE is sent
once; one whose answer is lost keeps its intent and its slot and is settled by looking at
the pod (kube/actions.py `settle`: `gone`, `succeeded` or `failed`).

`IncidentPath` is the reconciler's collaborator for that path: it gets its settings, the
incidents, the fresh Node inputs, the detector's `decide` and the budget's `take` and
`give_back` — nothing else of the reconciler.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from unstick.controller import failpoints, metrics
from unstick.controller.acting import budget_rebuild as budget
from unstick.controller.deciding.decision import (
    RATE_LIMITED,
    RECHECK_AFTER_CONFLICT_S,
    Decide,
    Decision,
)
from unstick.controller.deciding.inputs import NodeInputs, fetch_pod
from unstick.controller.deciding.policies import Policy
from unstick.controller.incidents.record import takes_incident_path
from unstick.controller.incidents.registry import Incidents
from unstick.core import safety
from unstick.core.remediation import DELETING
from unstick.core.vocabulary import Action, Refusal
from unstick.kube import actions
from unstick.kube.client import Kube
from unstick.kube.podwatch import TerminatingPod, pod_json, terminating_record

log = logging.getLogger("unstick.decisions")

#: Threads that wait for an intent's record and then send its DELETE. A worker hands its
#: pod over and goes on to the next, so every pod decided while a record is being written
#: joins the next write of its incident: with the waits on the workers themselves a
#: 2,000-pod burst on 20 nodes wrote about one intent per write (32 workers over 20
#: incidents; 2.18 requests per force-deleted pod at load 40, the benchmark's budget is
#: 1.5). The senders mostly wait; their DELETEs share the client's connection pool.
SENDERS = 32
RETRY_FAILED_S = 30.0  # a DELETE that failed (not refused by a precondition): again then


@dataclass(frozen=True, slots=True)
class _Intent:
    """A force-delete decided and in the incident, its record not yet known written."""

    record: TerminatingPod
    dec: Decision
    fd: Any  # the diagnosis it was decided on
    slot: float  # when its budget slot was taken
    token: Any  # what Incidents.durable waits for


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
        # Pods whose intent is on its way to the record or whose DELETE is being sent: a
        # pass over one of them (a watch event, its schedule) only looks again later.
        self._in_flight: set[str] = set()
        self._not_before: dict[str, float] = {}  # a failed DELETE: tried again at
        self._lock = threading.Lock()
        self._senders = ThreadPoolExecutor(SENDERS, thread_name_prefix="incident-delete")

    def act(self, record: TerminatingPod, dec: Decision, now: float) -> float | None:
        """Force-delete a pod its node holds (NodeGone, fenced NodeUnreachable), recorded in
        the node's incident (controller/incidents/registry.py). Re-checked right before acting like
        any action, but with no per-pod read: the pod as the watch last delivered it (the
        DELETE carries its UID and resourceVersion as preconditions, so the API server
        refuses if the pod changed since) and the Node read fresh (one GET shared by the
        pods of that node, <= 1 s old). A refusal (409) reads the pod once and decides
        again from what it is now."""
        incidents = self.incidents
        incidents.join(record, dec, now)
        with self._lock:
            if record.uid in self._in_flight:  # a sender has its intent or DELETE
                return now + RECHECK_AFTER_CONFLICT_S
            not_before = self._not_before.pop(record.uid, 0.0)
            if not_before > now:  # its DELETE failed (not refused): tried again then
                self._not_before[record.uid] = not_before
                return not_before
            self._in_flight.add(record.uid)
        handed = False
        try:
            if incidents.succeeded(record.uid, str(Action.FORCE_DELETE)):
                return now + self.settings.recheck_s  # done: the watch reports it gone
            intended = self._intend(record, dec)
            if not isinstance(intended, _Intent):
                return intended
            handed = self._hand_over(intended, attempts=2)
            if not handed:
                return self.clock() + RECHECK_AFTER_CONFLICT_S
            # Looked at again once the DELETE's answer is in; a 409 is decided again by
            # the sender itself, with the pod read again.
            return intended.slot + budget.ACT_WITHIN_S + RECHECK_AFTER_CONFLICT_S
        finally:
            if not handed:
                self._sent(record.uid)

    def stop(self) -> None:
        """No new DELETE after this; the senders at work finish (each waits at most
        ACT_WITHIN_S for its record)."""
        self._senders.shutdown(wait=True, cancel_futures=True)

    def _hand_over(self, intent: _Intent, attempts: int) -> bool:
        """A sender waits for the intent's record, then DELETEs. False when stopping:
        nothing is sent and the intent is taken back."""
        try:
            self._senders.submit(self._send, intent, attempts)
        except RuntimeError:  # shut down
            self.incidents.retract(intent.record.uid)
            return False
        return True

    def _sent(self, uid: str) -> None:
        with self._lock:
            self._in_flight.discard(uid)

    def _send(self, intent: _Intent, attempts: int) -> None:
        """A sender: the pod stays in flight until its DELETE's answer is recorded (or a
        refused one was decided again and handed over once more)."""
        record = intent.record
        handed = False
        try:
            again = self._delete_once_durable(intent)
            if again is not None and attempts > 1:  # refused (409): decided again, once
                intended = self._intend(again, intent.dec)
                if isinstance(intended, _Intent):
                    handed = self._hand_over(intended, attempts - 1)
        except Exception:  # never silently: the pod's next pass decides again
            log.exception(
                "pod=%s uid=%s action=force-delete: sender failed", record.key, record.uid
            )
        finally:
            if not handed:
                self._sent(record.uid)

    def _intend(self, record: TerminatingPod, dec: Decision) -> float | _Intent:
        """Decide, take the budget, put the intent in the incident (the worker's part, and
        a sender's after a 409): the intent to hand to a sender, or the next due time when
        nothing is to be sent."""
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
        if token is None:
            incidents.retract(record.uid)
            return self._postponed(record)
        return _Intent(record, dec, fd, slot, token)

    def _postponed(self, record: TerminatingPod) -> float:
        log.warning(
            "pod=%s uid=%s action=force-delete result=postponed: its intent could not be "
            "put on record in time",
            record.key,
            record.uid,
        )
        return self.clock() + RECHECK_AFTER_CONFLICT_S

    def _delete_once_durable(self, intent: _Intent) -> TerminatingPod | None:
        """The sender's part: wait for the intent's record, DELETE, record the result.
        Returns the pod as read again after a 409 (to decide again), else None."""
        record, fd, slot = intent.record, intent.fd, intent.slot
        incidents = self.incidents
        if not incidents.durable(intent.token, slot + budget.ACT_WITHIN_S):
            incidents.retract(record.uid)  # not sent (its slot stays taken: it may be on record)
            self._postponed(record)
            return None
        failpoints.reached("incident-intent-durable")
        outcome = actions.carry_out(  # sent once, a lost answer settled by looking at the pod
            self.kube,
            record.namespace,
            record.name,
            record.uid,
            action=str(Action.FORCE_DELETE),
            target=record.name,
            version=record.resource_version,
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
        if outcome.result == actions.UNKNOWN:  # not even a look told: the intent stays on
            # record (`deleting`), its slot taken; the watch settles it when the pod goes
            # (`gone`), else a later pass decides again
            log.warning(
                "pod=%s uid=%s cause=%s action=force-delete result=unknown %s",
                record.key,
                record.uid,
                fd.cause,
                outcome.message,
            )
            incidents.outcome(record.uid, str(Action.FORCE_DELETE), DELETING, outcome.message, slot)
        else:
            self._incident_outcome(record, fd, outcome, slot)
        if outcome.result not in ("succeeded", actions.GONE):
            with self._lock:
                self._not_before[record.uid] = self.clock() + RETRY_FAILED_S
        else:
            with self._lock:
                self._not_before.pop(record.uid, None)
        return None

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

    def _refresh(self, record: TerminatingPod) -> TerminatingPod | None:
        """The pod read again after a refused DELETE; None when it is gone (or another pod
        has its name): the watch reports that."""
        pod = fetch_pod(self.kube, record.namespace, record.name)
        fresh = terminating_record(pod) if pod is not None else None
        if fresh is None or fresh.uid != record.uid:
            return None
        return fresh
