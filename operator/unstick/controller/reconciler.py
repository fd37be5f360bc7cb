"""Reconcile ONE stuck pod: decide (from memory), record, act (at most one act).

Blocking code, run in a worker thread per pod. `reconcile()` returns when to look at the
pod again (epoch seconds) or None when nothing more is expected. Every change of state
(pod, Remediation status from the agent, Node) also pokes the pod, so these times are
only the deadlines: probe overdue, budget free again, slow re-check.

Safety: an action happens only for an opted-in pod under a valid policy, only if the
same step is still planned by a diagnosis of freshly read state right before acting,
only if the Remediation does not already record it as succeeded (restarts never act
twice), and only within the rate-limit budget; the API server guards again (uid
precondition, JSON-patch test).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.controller import budget, failpoints, metrics, records, trust
from unstick.controller.detector import Detector
from unstick.controller.incidentpath import (
    RECHECK_AFTER_CONFLICT_S,
    ActionInputs,
    IncidentPath,
)
from unstick.controller.incidentrecord import takes_incident_path
from unstick.controller.inputs import fetch_pod, rfc3339
from unstick.controller.nodeside import (
    KUBELET_FINISHING,
    RATE_LIMITED,
    Decision,
    NodeSide,
    Pass,
    ReconcileSettings,
    agent_results,
    status_summary,
)
from unstick.controller.policies import BUILTIN, Policy
from unstick.core import safety
from unstick.core.ratelimit import ActionBudget
from unstick.core.remediation import INTENTS
from unstick.core.snapshot import BundleError
from unstick.core.vocabulary import NODE_ACTIONS, Action, Cause, Refusal
from unstick.kube import actions
from unstick.kube.client import JSON, Kube
from unstick.kube.podwatch import TerminatingPod, parse_time, pod_json

log = logging.getLogger("unstick.decisions")

__all__ = ["RECHECK_AFTER_CONFLICT_S", "ActionInputs", "Reconciler"]

MAX_RECORDED_ACTIONS = 100  # status.actions keeps the newest entries


class Reconciler(NodeSide, IncidentPath):
    def __init__(
        self,
        kube: Kube,
        detector: Detector,
        settings: ReconcileSettings,
        clock: Callable[[], float],
        inputs: ActionInputs,
    ) -> None:
        self.kube = kube
        self.detector = detector
        self.settings = settings
        self.clock = clock
        self.inputs = inputs
        # Shared by all policies; the strictest limit in a window and the caps hold.
        self.budget = ActionBudget(
            cluster_cap=settings.max_cluster_per_minute, node_cap=settings.max_node_per_minute
        )
        self.budget_lock = threading.Lock()
        # Remediations this process read or wrote, by pod uid: (namespace, name, phase).
        # Lets `resolve` write without reading it again.
        self.known: dict[str, tuple[str, str, str]] = {}
        # When this process asked the agent about each pod (trust.ProbeRequests).
        self.requests = trust.ProbeRequests()
        # Pods whose finalizer patch the API server rejected (422, DESIGN §9): uid → the
        # resourceVersion it was rejected at. Not tried again until the pod changes.
        self.rejected: dict[str, str] = {}
        # Pods gone while the agent was still running their node steps: pod uid →
        # (namespace, pod name); its answer is recorded when it lands (record_late_answer).
        self.awaiting_agent: dict[str, tuple[str, str]] = {}

    # -- one pass ---------------------------------------------------------------------

    def reconcile(self, record: TerminatingPod) -> float | None:
        """One pass, decided from memory (the watcher's record, the caches and the
        Remediation's probe); right before an action the pod and Node are read again."""
        now = self.clock()
        rem, name = self._find_record(record, now)
        if name is None:
            log.warning(
                "pod=%s uid=%s every Remediation name of the pod is taken by a record that is "
                "not the pod's (marked Refused): observing only",
                record.key,
                record.uid,
            )
            return now + self.settings.recheck_s
        status = (rem or {}).get("status") or {}
        probe = trust.usable_probe(status.get("probe"), record, self.requests.first(record.uid))
        pod = pod_json(record)
        try:
            decision = self.detector.decide(pod, probe.probe, now, None)
        except BundleError as exc:
            log.warning("pod=%s uid=%s cannot diagnose: %s", record.key, record.uid, exc)
            self.inputs.events.post(pod, "UnstickCannotDiagnose", str(exc), rfc3339(now))
            return now + self.settings.recheck_s
        d = decision.diagnosis
        if not d.stuck:
            return max(record.deletion_timestamp + decision.policy.slack_s, now + 1.0)
        if rem is None and takes_incident_path(decision):
            self.detector.stuck.set(record.uid, record.namespace, str(d.cause))
            return self._act_in_incident(record, decision, now)
        if rem is None:
            rem, name = self._create_record(record, name, decision.policy.dry_run, now)
            if rem is None or name is None:
                return now + self.settings.recheck_s
            status = rem.get("status") or {}
        self.known[record.uid] = (record.namespace, name, status.get("phase") or "")
        self.detector.stuck.set(record.uid, record.namespace, str(d.cause))
        if status.get("cause") != str(d.cause):
            self._announce(pod, record, decision, now)
        due = self._advance(pod, record, rem, decision, now, probe=probe)
        # The node's Ready transition poked this pass; nothing pokes when it turns into
        # NodeUnreachable nodeLostAfter later: wake then, not at the slow re-check.
        if due is not None and d.node_lost_at is not None:
            due = min(due, d.node_lost_at.timestamp())
        return due

    def _create_record(
        self, record: TerminatingPod, name: str, dry_run: bool, now: float
    ) -> tuple[JSON | None, str | None]:
        """Create the pod's Remediation at `name`, or at the next name when a record that is
        not the pod's is found there (marked Refused); (None, None) when every name is
        taken so."""
        names = records.remediation_names(record.name, record.uid)
        for candidate in names[names.index(name) :] if name in names else (name,):
            rem = records.create_remediation(
                self.kube,
                record.namespace,
                record.name,
                record.uid,
                node=record.node,
                dry_run=dry_run,
                name=candidate,
            )
            why = trust.identity_mismatch(rem, record)
            if why is None:
                return rem, candidate
            self.refuse_record(rem, why, now)  # someone else's record holds that name
        log.warning(
            "pod=%s uid=%s every Remediation name of the pod is taken by a record that is "
            "not the pod's (marked Refused): observing only",
            record.key,
            record.uid,
        )
        return None, None

    def _find_record(self, record: TerminatingPod, now: float) -> tuple[JSON | None, str | None]:
        """(the pod's Remediation or None, the name it has or gets); name None when every
        name is taken by a record that is not the pod's (each is marked Refused)."""
        names: tuple[str, ...] = records.remediation_names(record.name, record.uid)
        known = self.known.get(record.uid)
        if known is None and not self.inputs.has_remediation(record.uid):
            return None, names[0]
        if known is not None:
            names = (known[1], *[n for n in names if n != known[1]])
        for name in names:
            rem = records.get_remediation(self.kube, record.namespace, name)
            if rem is None:
                return None, name
            why = trust.identity_mismatch(rem, record)
            if why is None:
                return rem, name
            self.refuse_record(rem, why, now)
        return None, None

    def refuse_record(self, rem: JSON, why: str, now: float) -> None:
        """Mark a Remediation that is not the record of its pod `Refused`, saying why."""
        status = rem.get("status") or {}
        refusals = trust.add_refusal(
            list(status.get("refusals") or []), "(record)", Refusal.FORGED, why, rfc3339(now)
        )
        if refusals is None and status.get("phase") == "Refused":
            return
        meta = rem.get("metadata") or {}
        log.warning(
            "remediation=%s/%s result=refused (forged): %s",
            meta.get("namespace"),
            meta.get("name"),
            why,
        )
        patch: dict[str, Any] = {"phase": "Refused", "waitingFor": None}
        if refusals is not None:
            patch["refusals"] = refusals
        try:
            self._patch(rem, patch)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _announce(self, pod: JSON, record: TerminatingPod, dec: Decision, now: float) -> None:
        d = dec.diagnosis
        planned = ", ".join(str(s.action) for s in dec.steps) or "observe"
        evidence = "; ".join(e.message for e in d.evidence[:3])
        mode = (
            "dry run"
            if dec.policy.dry_run and dec.opted_in
            else ("remediating" if dec.opted_in else f"observing ({dec.why})")
        )
        message = f"stuck in Terminating: {d.cause}. {evidence}. Plan: {planned} — {mode}."
        self.inputs.events.post(pod, f"Stuck{d.cause}", message, rfc3339(now))
        log.info(
            "pod=%s uid=%s cause=%s action=diagnose result=%s plan=%s",
            record.key,
            record.uid,
            d.cause,
            mode,
            planned,
        )

    # -- acting -----------------------------------------------------------------------

    def _advance(
        self,
        pod: JSON,
        record: TerminatingPod,
        rem: JSON,
        dec: Decision,
        now: float,
        *,
        probe: trust.ProbeVerdict,
    ) -> float | None:
        d = dec.diagnosis
        status = rem.get("status") or {}
        p = Pass(
            record,
            rem,
            dec,
            now,
            list(status.get("actions") or []),
            status_summary(record, dec),
            probe.probe,
        )
        if probe.refusal is Refusal.FORGED:  # on record; a stale one is only not used
            refusals = trust.add_refusal(
                list(status.get("refusals") or []),
                "(probe)",
                Refusal.FORGED,
                probe.reason,
                rfc3339(now),
            )
            if refusals is not None:
                p.summary["refusals"] = refusals
        self.record_agent_results(p)
        changing = [s for s in dec.steps if s.action != Action.OBSERVE]
        # Without a fresh probe ContainersStillRunning is the kubelet's last word in
        # pod.status, stale when the kubelet itself is what is stuck (found on the real
        # node: a wedged kubelet's pod read "running" forever): ask the node as for Unknown.
        unproven = (Cause.Unknown, Cause.ContainersStillRunning)
        if d.cause in unproven and not d.probe_fresh and record.node:
            return self._wait_for_probe(p)
        if not changing:
            self._count_once(p, Action.OBSERVE, "", "succeeded", "observed")
            self._write(p, "Observing")
            return now + self.settings.recheck_s
        if dec.policy.dry_run:
            for step in changing:
                self._count_once(p, step.action, step.target, "dry_run", "dry run: nothing changed")
            self._write(p, "DryRun")
            return now + self.settings.recheck_s
        step = next((s for s in changing if not _succeeded(p.done, s.action, s.target)), None)
        if step is not None and step.action in NODE_ACTIONS:
            return self._node_steps(p)
        if step is None and any(s.action in NODE_ACTIONS for s in changing):
            # The agent reported these steps done: judge them by a probe taken after them.
            return self._node_steps(p)
        if step is None:
            self._write(p, "Remediating")
            return now + self.settings.recheck_s
        if step.action == Action.FORCE_DELETE and d.cause is Cause.KubeletNotProgressing:
            finish_by = self._kubelet_finish_by(p)
            if finish_by > now:
                self._write(p, "Remediating", waitingFor=KUBELET_FINISHING)
                return finish_by
        # Only a look at the budget (no slot taken: that happens right before acting), so
        # pods waiting for it do not re-read pod and Node every time a slot frees.
        wait = self._budget_wait(dec.policy, record.node, now)
        if wait > 0:
            self._write(p, "Remediating", waitingFor=RATE_LIMITED)
            return now + wait
        return self._act_on_api(p, step)

    def _kubelet_finish_by(self, p: Pass) -> float:
        """When the agent's node steps for this pod succeeded, the time until which the
        kubelet may still finish the pod itself (0 when no node step ran): the on-call
        engineer's "unmounted it, now give the kubelet a moment", so a force-delete is only
        for a kubelet that really does not progress."""
        if not any(
            a.get("by") == "agent" and a.get("result") == "succeeded"
            for a in p.done
            if isinstance(a, dict)
        ):
            return 0.0
        done_at = (p.rem.get("status") or {}).get("nodeStepsDoneAt")
        if not isinstance(done_at, str) or not done_at:
            return 0.0
        try:
            return parse_time(done_at) + self.settings.kubelet_finish_s
        except ValueError:
            return 0.0

    def _act_on_api(self, p: Pass, step: Any) -> float | None:
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
            self._write(p, "Failed", waitingFor=None)  # rejected as it is: no loop
            return self.clock() + self.settings.recheck_s
        fresh = self.detector.decide(pod, p.probe, self.clock(), self.inputs.fresh)
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
            wait = self._take_budget(fresh.policy, record.node, slot)
            if wait > 0:
                self._write(p, "Remediating", waitingFor=RATE_LIMITED)
                return self.clock() + wait
        if not verdict:  # a safety invariant does not hold right before acting
            metrics.REFUSALS.labels(str(Refusal.UNSAFE)).inc()
            outcome = actions.Outcome("refused", verdict.reason)
        elif not self._intend(p, step, slot):
            return self.clock() + RECHECK_AFTER_CONFLICT_S  # no act without its record
        elif step.action == Action.FORCE_DELETE:
            # The version just read as a precondition too: an opt-out or a finalizer added
            # while the Node, claims and volumes were read makes the API server refuse it.
            outcome = actions.force_delete(
                self.kube, record.namespace, record.name, record.uid, version
            )
        else:
            finalizers = tuple(meta.get("finalizers") or ())
            outcome = actions.remove_finalizer(
                self.kube, record.namespace, record.name, finalizers, step.target
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
        p.done[:] = [a for a in p.done if a.get("result") not in INTENTS]  # the answer now
        if outcome.result == "conflict":  # nothing done: the slot back, the pod read again
            self._give_back(record.node, slot)
            self._write(p, "Remediating", waitingFor=None)
            return self.clock() + RECHECK_AFTER_CONFLICT_S
        if outcome.result == "rejected":  # recorded once as failed, in the server's words
            self.rejected[record.uid] = version
            self._count_once(p, step.action, step.target, "failed", outcome.message)
            self._write(p, "Failed", waitingFor=None)
            return self.clock() + self.settings.recheck_s
        self._count_once(
            p,
            step.action,
            step.target,
            outcome.result,
            outcome.message,
            force=outcome.result == "failed",
        )
        self._write(p, "Remediating", waitingFor=None)
        return self.clock() + (RECHECK_AFTER_CONFLICT_S if outcome.result == "succeeded" else 30)

    def _intend(self, p: Pass, step: Any, slot: float) -> bool:
        """Record before act (DESIGN §3 invariant 10): the action goes into status.actions
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
            self._write(p, "Remediating", waitingFor=None)
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

    # -- helpers ----------------------------------------------------------------------

    def _take_budget(self, policy: Policy, node: str, now: float) -> float:
        """One slot (0.0) or the seconds to wait. The slot counts from `now` +
        ACT_WITHIN_S: the act follows within that long, and a restarted controller counts
        the grant recorded at `now` as made then too (budget.py)."""
        limits = (policy.cluster_per_minute, policy.node_per_minute)
        with self.budget_lock:
            wait = self.budget.peek(node or "(none)", now, *limits)
            if wait <= 0:
                self.budget.record(node or "(none)", now + budget.ACT_WITHIN_S, *limits)
            return wait

    def release_recorded(self, node: str, at: float) -> None:
        """A grant put back by `rebuild_budget` from a record of time `at` whose act did
        not take effect after all (adoption.py: the pod is there, never force-deleted)."""
        self._give_back(node, at)

    def _give_back(self, node: str, slot: float) -> None:
        """The act taken at `slot` was not carried out (the API server refused it)."""
        with self.budget_lock:
            self.budget.release(node or "(none)", slot + budget.ACT_WITHIN_S)

    def _budget_wait(self, policy: Policy, node: str, now: float) -> float:
        with self.budget_lock:
            return self.budget.peek(
                node or "(none)", now, policy.cluster_per_minute, policy.node_per_minute
            )

    def rebuild_budget(self, remediations: list[JSON], now: float) -> int:
        """Put back the grants of the last minute recorded in `remediations` (a restart or
        failover does not reset the budget; controller/budget.py); returns their count."""
        grants = list(budget.recent_grants(remediations, now))
        with self.budget_lock:
            for g in grants:
                policy, _ = self.detector.policies.lookup(g.policy) if g.policy else (None, None)
                limits = policy or BUILTIN
                self.budget.record(g.node, g.at, limits.cluster_per_minute, limits.node_per_minute)
        return len(grants)

    def _count_once(
        self,
        p: Pass,
        action: Any,
        target: str,
        result: str,
        message: str,
        *,
        by: str = "controller",
        force: bool = False,
        cause: str | None = None,
    ) -> None:
        """Append to status.actions and count the metric, once per (action, target, result)."""
        entry = {"action": str(action), "target": target, "result": result}
        if not force and any(all(a.get(k) == v for k, v in entry.items()) for a in p.done):
            return
        p.done.append({**entry, "message": message, "time": rfc3339(p.now), "by": by})
        del p.done[:-MAX_RECORDED_ACTIONS]
        cause = cause or str(p.dec.diagnosis.cause)
        metrics.REMEDIATIONS.labels(str(action), cause, result).inc()

    def _write(self, p: Pass, phase: str, **extra: Any) -> None:
        # a copy: p.done changes after this write (an intent replaced by its answer)
        self._patch(p.rem, {**p.summary, "phase": phase, "actions": list(p.done), **extra})
        meta = p.rem.get("metadata") or {}
        self.known[p.record.uid] = (p.record.namespace, meta.get("name") or "", phase)

    def _patch(self, rem: JSON, desired: dict[str, Any]) -> None:
        """Status merge patch of only the keys whose value differs."""
        current = rem.get("status") or {}
        changed = {k: v for k, v in desired.items() if current.get(k) != v}
        if changed:
            rem["status"] = {**current, **changed}
            records.patch_status(self.kube, rem, changed)

    def record_late_answer(self, uid: str, namespace: str, name: str) -> None:
        """The agent answered node steps of a pod that is gone meanwhile: record and count
        its results in the Resolved Remediation (once)."""
        if uid not in self.awaiting_agent:
            return
        rem = records.get_remediation(self.kube, namespace, name)
        if rem is None or (rem.get("spec") or {}).get("podUID") != uid or _steps_pending(rem):
            return
        self.awaiting_agent.pop(uid, None)
        late = _late_agent_actions(rem, self.clock())
        if late is not None:
            records.patch_status(self.kube, rem, {"actions": late})

    def resolve(self, record: TerminatingPod) -> None:
        """The pod is gone: Remediation phase Resolved (kept as the audit trail)."""
        now = self.clock()
        self.detector.forget(record.uid)
        if self.inputs.incidents.gone(record.uid, now) is not None and record.uid not in self.known:
            # Only in its node's incident (no record of its own): the incident notes it.
            self.requests.forget(record.uid)
            metrics.TIME_TO_RESOLUTION.observe(max(0.0, now - record.deletion_timestamp))
            log.info(
                "pod=%s uid=%s action=resolve result=pod-gone after %.1fs",
                record.key,
                record.uid,
                now - record.deletion_timestamp,
            )
            return
        asked_agent = self.requests.last(record.uid) is not None
        self.requests.forget(record.uid)
        self.rejected.pop(record.uid, None)
        known = self.known.pop(record.uid, None)
        if known is not None and asked_agent:
            # The agent may have reported node steps that no pass has recorded yet (the
            # kubelet removes the pod right after them): read the record once to count them.
            namespace, name, phase = known
            found = records.get_remediation(self.kube, namespace, name)
            rem: JSON | None = (
                found
                if found is not None and trust.identity_mismatch(found, record) is None
                else {"metadata": {"namespace": namespace, "name": name}, "status": {}}
            )
        elif known is not None:  # written or read by this process: no need to read it again
            namespace, name, phase = known
            rem = {"metadata": {"namespace": namespace, "name": name}, "status": {}}
        elif self.inputs.has_remediation(record.uid):
            rem = None
            for name in records.remediation_names(record.name, record.uid):
                found = records.get_remediation(self.kube, record.namespace, name)
                if found is not None and trust.identity_mismatch(found, record) is None:
                    rem = found
                    break
            if rem is None:
                return
            phase = (rem.get("status") or {}).get("phase") or ""
        else:
            return  # never seen stuck: no Remediation
        if phase == "Resolved" or rem is None:
            return
        # A Remediation exists only for pods seen stuck: this pod counts for the histogram.
        metrics.TIME_TO_RESOLUTION.observe(max(0.0, now - record.deletion_timestamp))
        final: dict[str, Any] = {
            "phase": "Resolved",
            "resolvedAt": rfc3339(now),
            "waitingFor": None,
        }
        late = _late_agent_actions(rem, now)
        if late is not None:
            final["actions"] = late
        if _steps_pending(rem):  # the agent's answer comes after the pod went: await it
            self.awaiting_agent[record.uid] = (record.namespace, record.name)
            while len(self.awaiting_agent) > AWAITING_REMEMBERED:
                self.awaiting_agent.pop(next(iter(self.awaiting_agent)))
        rem["status"] = {}  # write all these keys: a merge patch of our own keys only
        try:
            self._patch(rem, final)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return  # someone deleted the Remediation meanwhile: nothing to mark
        log.info(
            "pod=%s uid=%s action=resolve result=pod-gone after %.1fs",
            record.key,
            record.uid,
            now - record.deletion_timestamp,
        )


AWAITING_REMEMBERED = 1000


def _steps_pending(rem: JSON) -> bool:
    """Node steps were handed to the agent and it has not answered them yet."""
    spec, status = rem.get("spec") or {}, rem.get("status") or {}
    requested, done_at = spec.get("nodeStepsRequestedAt"), status.get("nodeStepsDoneAt")
    if not isinstance(requested, str) or not requested:
        return False
    return not (
        isinstance(done_at, str) and done_at and parse_time(done_at) >= parse_time(requested)
    )


def _late_agent_actions(rem: JSON, now: float) -> list[Any] | None:
    """status.actions with the agent's results that no pass recorded yet (each counted in
    unstick_remediations_total), or None when there are none."""
    status = rem.get("status") or {}
    done = list(status.get("actions") or [])
    cause = str(status.get("cause") or "Unknown")
    added = False
    for action, target, result, message in agent_results(rem):
        entry = {"action": action, "target": target, "result": result}
        if any(all(a.get(k) == v for k, v in entry.items()) for a in done):
            continue
        done.append({**entry, "message": message, "time": rfc3339(now), "by": "agent"})
        metrics.REMEDIATIONS.labels(action, cause, result).inc()
        added = True
    return done[-MAX_RECORDED_ACTIONS:] if added else None


def _succeeded(done: list[Any], action: Any, target: str) -> bool:
    return any(
        a.get("action") == str(action)
        and a.get("target") == target
        and a.get("result") == "succeeded"
        for a in done
    )


def _allowlist(dec: Decision) -> tuple[str, ...]:
    parsed = dec.policy.parsed
    return tuple(getattr(parsed, "finalizer_allowlist", ()) or ())
