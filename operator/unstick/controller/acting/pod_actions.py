"""The API actions of a per-pod record: `force-delete` and `remove-finalizer`, decided by a
pass (controller/reconciler.py) and carried out here — re-checked right before acting
against the pod and its Node read again, within the action budget, and put on record as
an intent (`deleting`/`removing` in status.actions) before the request is sent (record
before act, design.md §3 invariant 10). The API server guards again: a force-delete
carries the pod's UID and the resourceVersion just read as preconditions, a finalizer
removal its JSON-patch `test`. Each is sent once; one whose answer is lost keeps its
intent and its slot and is settled by looking at the pod (kube/actions.py `settle`).

`PodActions` is the reconciler's collaborator for that: it gets its settings, the fresh
Node inputs, the detector's `decide`, the pass's status writer, the budget's `take` and
`give_back`, and the reconciler's `resolve` (the pod turned out gone).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.controller import failpoints, metrics
from unstick.controller.acting import budget_rebuild as budget
from unstick.controller.deciding.decision import (
    RATE_LIMITED,
    RECHECK_AFTER_CONFLICT_S,
    Decide,
    Decision,
    Pass,
)
from unstick.controller.deciding.inputs import NodeInputs, fetch_pod
from unstick.controller.deciding.policies import Policy
from unstick.controller.records.writer import RecordWriter
from unstick.core import safety
from unstick.core.remediation import INTENTS, Phase, rfc3339
from unstick.core.vocabulary import Action, Refusal
from unstick.kube import actions
from unstick.kube.client import Kube
from unstick.kube.podwatch import TerminatingPod

log = logging.getLogger("unstick.decisions")

RETRY_UNSETTLED_S = 30.0  # an act whose outcome not even a look could tell: decided again then
MAX_MESSAGE = 1024  # of a message on record (the schema allows 2048)


@dataclass(frozen=True, slots=True)
class PodActionSettings:
    recheck_s: float = 300.0  # after an act failed or was rejected: looked at again then


class PodActions:
    """Re-check, budget, intent, act and answer for one API step of a per-pod record."""

    def __init__(
        self,
        kube: Kube,
        settings: PodActionSettings,
        clock: Callable[[], float],
        *,
        fresh: NodeInputs,
        decide: Decide,
        writer: RecordWriter,
        take_budget: Callable[[Policy, str, float], float],
        give_back: Callable[[str, float], None],
        resolve: Callable[[TerminatingPod], object],
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.clock = clock
        self.fresh = fresh  # Node (shared GET, <= 1 s old) and CSINode for the re-check
        self.decide = decide
        self.writer = writer
        self.take_budget = take_budget
        self.give_back = give_back
        self.resolve = resolve
        # Pods whose finalizer patch the API server rejected (422, design.md §9): uid → the
        # resourceVersion it was rejected at. Not tried again until the pod changes.
        self.rejected: dict[str, str] = {}

    def forget(self, uid: str) -> None:
        """The pod is gone."""
        self.rejected.pop(uid, None)

    def act(self, p: Pass, step: Any) -> float | None:
        record = p.record
        # Re-check right before acting: fresh pod, same uid, still terminating, same step.
        # The Node comes from a GET made at most SHARED_NODE_READ_S before (shared by the
        # pods of that node), never from a watch cache: NodeGone needs proof of absence,
        # fenced NodeUnreachable the taint as it is now.
        pod = fetch_pod(self.kube, record.namespace, record.name)
        meta = (pod or {}).get("metadata") or {}
        if pod is None or meta.get("uid") != record.uid or not meta.get("deletionTimestamp"):
            self.resolve(record)
            return None
        version = str(meta.get("resourceVersion") or "")
        if step.action == Action.REMOVE_FINALIZER and self.rejected.get(record.uid) == version:
            self.writer.write(p, Phase.Failed, waitingFor=None)  # rejected as it is: no loop
            return self.clock() + self.settings.recheck_s
        fresh = self.decide(pod, p.probe, self.clock(), self.fresh)
        fd = fresh.diagnosis
        still_planned = any(
            s.action == step.action and s.target == step.target for s in fresh.steps
        )
        if (
            fd.cause != p.dec.diagnosis.cause
            or not still_planned
            or not fresh.opted_in
            or (fresh.policy.dry_run)
        ):
            log.info(
                "pod=%s uid=%s cause=%s action=%s result=skipped: changed before acting",
                record.key,
                record.uid,
                fd.cause,
                step.action,
            )
            return self.clock() + RECHECK_AFTER_CONFLICT_S
        if step.action == Action.FORCE_DELETE:
            verdict = safety.force_delete_safe(fd.cause, fd.fenced, fd.nothing_left, fd.probe_fresh)
        else:
            verdict = safety.finalizer_allowed(step.target, _allowlist(fresh))
        slot = self.clock()
        if verdict:
            # A slot of the budget only for an action carried out: a step skipped at the
            # re-check above or refused here costs nothing.
            wait = self.take_budget(fresh.policy, record.node, slot)
            if wait > 0:
                self.writer.write(p, Phase.Remediating, waitingFor=RATE_LIMITED)
                return self.clock() + wait
        if not verdict:  # a safety invariant does not hold right before acting
            metrics.REFUSALS.labels(str(Refusal.UNSAFE)).inc()
            outcome = actions.Outcome("refused", verdict.reason)
        elif not self._intend(p, step, slot):
            self.give_back(record.node, slot)  # not carried out: its intent is not on record
            return self.clock() + RECHECK_AFTER_CONFLICT_S  # no act without its record
        else:
            # Sent once, a lost answer settled by looking at the pod. A force-delete has the
            # version just read as a precondition too: an opt-out or a finalizer added while
            # the Node, claims and volumes were read makes the API server refuse it.
            outcome = actions.carry_out(
                self.kube,
                record.namespace,
                record.name,
                record.uid,
                action=str(step.action),
                target=step.target,
                version=version,
                finalizers=tuple(meta.get("finalizers") or ()),
            )
        log.info(
            "pod=%s uid=%s cause=%s action=%s target=%s result=%s %s",
            record.key,
            record.uid,
            fd.cause,
            step.action,
            step.target,
            outcome.result,
            outcome.message,
        )
        # The answer records what happened (decided nothing): written whatever the record's
        # version now (guarded=False), so it is not lost to an agent's write meanwhile.
        if outcome.result == actions.UNKNOWN:  # not even a look told: the intent stays on
            for entry in p.done:  # record, its slot taken; a later pass decides again
                if entry.get("result") in INTENTS:
                    entry["message"] = outcome.message[:MAX_MESSAGE]
            self.writer.write(p, Phase.Remediating, guarded=False, waitingFor=None)
            return self.clock() + RETRY_UNSETTLED_S
        p.done[:] = [a for a in p.done if a.get("result") not in INTENTS]  # the answer now
        if outcome.result == "conflict":  # nothing done: the slot back, the pod read again
            self.give_back(record.node, slot)
            self.writer.write(p, Phase.Remediating, guarded=False, waitingFor=None)
            return self.clock() + RECHECK_AFTER_CONFLICT_S
        if outcome.result == "rejected":  # recorded once as failed, in the server's words
            self.rejected[record.uid] = version
            self.writer.count_once(p, step.action, step.target, "failed", outcome.message)
            self.writer.write(p, Phase.Failed, guarded=False, waitingFor=None)
            return self.clock() + self.settings.recheck_s
        self.writer.count_once(
            p,
            step.action,
            step.target,
            outcome.result,
            outcome.message,
            force=outcome.result == "failed",
        )
        self.writer.write(p, Phase.Remediating, guarded=False, waitingFor=None)
        done = outcome.result in ("succeeded", actions.GONE)  # gone: the watch says so next
        return self.clock() + (RECHECK_AFTER_CONFLICT_S if done else 30)

    def _intend(self, p: Pass, step: Any, slot: float) -> bool:
        """Record before act (design.md §3 invariant 10): the action goes into status.actions
        as an intent (`deleting`/`removing`, at its budget slot's time) before it is
        carried out, so a controller killed right after the act still left its grant on
        record; its answer replaces it. False when it could not be written, or not within
        ACT_WITHIN_S of the slot (a restart counts the grant only that long after it)."""
        p.done[:] = [a for a in p.done if a.get("result") not in INTENTS]
        result = INTENTS[0] if step.action == Action.FORCE_DELETE else INTENTS[1]
        p.done.append(
            {
                "action": str(step.action),
                "target": step.target,
                "result": result,
                "message": "decided; being carried out",
                "time": rfc3339(slot),
                "by": "controller",
            }
        )
        try:
            self.writer.write(p, Phase.Remediating, waitingFor=None)
        except ApiException as exc:
            log.warning(
                "pod=%s uid=%s action=%s result=postponed: its intent could not be recorded (%s)",
                p.record.key,
                p.record.uid,
                step.action,
                exc.status,
            )
            return False
        if self.clock() > slot + budget.ACT_WITHIN_S:  # the grant may have lapsed: not now
            log.warning(
                "pod=%s uid=%s action=%s result=postponed: its intent took too long to record",
                p.record.key,
                p.record.uid,
                step.action,
            )
            return False
        failpoints.reached("pod-intent-durable")
        return True


def _allowlist(dec: Decision) -> tuple[str, ...]:
    parsed = dec.policy.parsed
    return tuple(getattr(parsed, "finalizer_allowlist", ()) or ())
