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

The Reconciler decides and holds its collaborators, each with a small interface (its
frozen settings and the callables it needs): `NodeSide` (agent_channel/node_steps.py:
node steps and probes through the agent), `PodActions` (acting/pod_actions.py: a per-pod
force-delete or finalizer removal, re-checked, intent first), `IncidentPath`
(incidents/path.py: a pod its node holds, in the node's incident), `PodRecords`
(records/pod_record.py: the pod's own record found, created, refused, resolved), all
writing through one `RecordWriter` (records/writer.py) and taking slots of one `Grants`
budget (acting/grants.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.controller.acting.grants import Grants
from unstick.controller.acting.pod_actions import PodActions, PodActionSettings
from unstick.controller.agent_channel import trust
from unstick.controller.agent_channel.node_steps import (
    NodeSide,
    NodeSideSettings,
    handed_steps,
)
from unstick.controller.deciding.decision import (
    KUBELET_FINISHING,
    RATE_LIMITED,
    RECHECK_AFTER_CONFLICT_S,
    Decision,
    Pass,
    announces,
    needs_probe,
    status_summary,
)
from unstick.controller.deciding.detector import Detector
from unstick.controller.deciding.inputs import NodeInputs, claims_and_volumes
from unstick.controller.incidents.path import IncidentPath, IncidentPathSettings
from unstick.controller.incidents.record import takes_incident_path
from unstick.controller.incidents.registry import Incidents
from unstick.controller.records import identity
from unstick.controller.records.agent_answers import steps_diagnosis
from unstick.controller.records.events import EventQueue
from unstick.controller.records.pod_record import PodRecords, log_resolved
from unstick.controller.records.writer import RecordWriter, Stale
from unstick.core.model.snapshot import BundleError
from unstick.core.policy.ratelimit import DEFAULT_CLUSTER_CAP, DEFAULT_NODE_CAP
from unstick.core.remediation import NODE_STEPS_DONE_AT, PROBE, Phase, parse_time, rfc3339
from unstick.core.vocabulary import NODE_ACTIONS, Action, Cause, Refusal
from unstick.kube.client import JSON, Kube
from unstick.kube.podwatch import TerminatingPod, pod_json

log = logging.getLogger("unstick.decisions")

#: A pod whose final delete was issued (grace 0, no finalizers) normally goes in that same
#: request; one still there this long after it was first seen so was deleted only half
#: (docs/incidents.md, "A force-delete carried out only half") and is decided again.
FINAL_DELETE_WAIT_S = 5.0
STALE_RETRIES = 3  # passes made in a row when each met a newer version of the record

__all__ = ["RECHECK_AFTER_CONFLICT_S", "ActionInputs", "ReconcileSettings", "Reconciler"]

#: How often a pod on a lost node that no trusted source has proven off is looked at again
#: while the policy trusts a medik8s record (fencing_records.py): a FenceAgentsRemediation
#: or SelfNodeRemediation that proves the node off changes neither the pod nor its Node, so
#: no watch event would bring the pod back before the slow re-check.
FENCING_PROOF_POLL_S = 10.0


def _waits_for_a_medik8s_proof(decision: Decision) -> bool:
    """NodeUnreachable and not fenced, under a policy that reads FAR or SNR records."""
    d = decision.diagnosis
    if d.cause is not Cause.NodeUnreachable or d.fenced:
        return False
    fencing = decision.policy.diagnosis_settings.fencing
    return fencing.reads_far or fencing.reads_snr


@dataclass(frozen=True, slots=True)
class ReconcileSettings:
    recheck_s: float = 300.0  # slow re-check of a stuck pod nobody poked
    reprobe_s: float = 600.0  # ask the agent again after an unanswered probe request
    # After the agent's node steps left nothing of the pod on the node, the kubelet gets
    # this long to finish the pod itself (its volume reconciler and status sync, about
    # 10 s) before KubeletNotProgressing force-deletes it.
    kubelet_finish_s: float = 20.0
    # Caps on the action budget that no policy can raise (--max-actions-per-minute,
    # --max-node-actions-per-minute).
    max_cluster_per_minute: int = DEFAULT_CLUSTER_CAP
    max_node_per_minute: int = DEFAULT_NODE_CAP
    # --node-round-trip: ask the agent once, with a mandate (design.md §11; node_steps.py)
    node_round_trip: bool = True


@dataclass(frozen=True, slots=True)
class ActionInputs:
    """What a pass uses besides the API: the Remediation index, Events, fresh reads."""

    has_remediation: Callable[[str], bool]  # a Remediation for this pod uid is known
    events: EventQueue  # Events are posted off the action path
    fresh: NodeInputs  # Node (shared GET, <= 1 s old) and CSINode for the re-check
    incidents: Incidents  # one record for the pods a node-level fact holds


class Reconciler:
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
        self.grants = Grants(settings.max_cluster_per_minute, settings.max_node_per_minute)
        self.writer = RecordWriter(kube)
        self.known = self.writer.known  # the pods' Remediations this process read or wrote
        # When this process asked the agent about each pod (trust.ProbeRequests).
        self.requests = trust.ProbeRequests()
        self.pod_records = PodRecords(
            clock,
            writer=self.writer,
            requests=self.requests,
            has_remediation=inputs.has_remediation,
        )
        # Pods gone while the agent still ran their node steps (record_late_answer).
        self.awaiting_agent = self.pod_records.awaiting_agent
        # When each pod was first seen with its final delete issued (FINAL_DELETE_WAIT_S).
        self._final_delete_seen: dict[str, float] = {}
        self.node_side = NodeSide(
            kube,
            NodeSideSettings(
                recheck_s=settings.recheck_s,
                reprobe_s=settings.reprobe_s,
                round_trip=settings.node_round_trip,
            ),
            requests=self.requests,
            writer=self.writer,
            take_budget=self.grants.take,
            give_back=self.grants.give_back,
        )
        self.pod_actions = PodActions(
            kube,
            PodActionSettings(recheck_s=settings.recheck_s),
            clock,
            fresh=inputs.fresh,
            decide=detector.decide,
            writer=self.writer,
            take_budget=self.grants.take,
            give_back=self.grants.give_back,
            resolve=self.resolve,
        )
        self.incident_path = IncidentPath(
            kube,
            IncidentPathSettings(recheck_s=settings.recheck_s),
            clock,
            incidents=inputs.incidents,
            fresh=inputs.fresh,
            decide=detector.decide,
            take_budget=self.grants.take,
            give_back=self.grants.give_back,
        )

    # -- one pass ---------------------------------------------------------------------

    def reconcile(self, record: TerminatingPod) -> float | None:
        """One pass, decided from memory (the watcher's record, the caches and the
        Remediation's copy); right before an action the pod and Node are read again. A
        write from a copy older than the record (409) or of a record gone (404) wrote
        nothing: the pass is made again at once from a fresh read (records/writer.py Stale)."""
        for _ in range(STALE_RETRIES):
            try:
                return self._pass(record)
            except Stale as exc:
                log.debug("pod=%s uid=%s deciding again: %s", record.key, record.uid, exc)
        return self.clock() + RECHECK_AFTER_CONFLICT_S

    def _pass(self, record: TerminatingPod) -> float | None:
        now = self.clock()
        if record.deletion_grace_period_s == 0 and not record.finalizers:
            # The final delete was issued (the kubelet's, or ours) and nothing can keep the
            # object (design.md §1): it goes in that request, the watch says so. Nothing to
            # decide — unless it is still there a while later: the API server writes grace 0
            # first and removes the pod second, and when the second step did not happen (the
            # DELETE's sender was killed in between, or the removal failed) nothing finishes
            # it (a gone node has no kubelet to send it again). Then it is decided again.
            seen = self._final_delete_seen.setdefault(record.uid, now)
            if now < seen + FINAL_DELETE_WAIT_S:
                return seen + FINAL_DELETE_WAIT_S
            if seen > 0:
                self._final_delete_seen[record.uid] = 0.0  # logged once
                log.warning(
                    "pod=%s uid=%s deletionGracePeriodSeconds is 0 but the pod is still there "
                    "%.0fs later: its final delete was carried out only half; deciding again",
                    record.key,
                    record.uid,
                    now - seen,
                )
        rem, name = self.pod_records.find(record, now)
        if name is None:
            log.warning(
                "pod=%s uid=%s every Remediation name of the pod is taken by a record that is "
                "not the pod's (marked Refused): observing only",
                record.key,
                record.uid,
            )
            return now + self.settings.recheck_s
        status = (rem or {}).get("status") or {}
        probe = trust.usable_probe(status.get(PROBE), record, self.requests.first(record.uid))
        pod = pod_json(record)
        # Without a probe no rule reads claims or volumes (only a mount's driver does):
        # decided from memory, and they are read after this pass's writes (`_read_claims`).
        memory = self.detector.from_memory if probe.probe is None else None
        try:
            decision = self.detector.decide(pod, probe.probe, now, memory)
        except BundleError as exc:
            log.warning("pod=%s uid=%s cannot diagnose: %s", record.key, record.uid, exc)
            self.inputs.events.post(pod, "UnstickCannotDiagnose", str(exc), rfc3339(now))
            return now + self.settings.recheck_s
        d = decision.diagnosis
        if not d.stuck:
            return max(self.detector.due(record, decision.policy.slack_s), now + 1.0)
        if rem is None and takes_incident_path(decision):
            self.detector.stuck.set(record.uid, record.namespace, str(d.cause))
            return self.incident_path.act(record, decision, now)
        if rem is None:
            # With --node-round-trip the create carries the mandate (node_steps.py): the
            # one request of the round trip; else (none to give, no budget slot now) the
            # pass asks after it. Without the flag: the probe request.
            request = (
                self.node_side.create_request(record, decision, now)
                if needs_probe(record, d)
                else None
            )
            ask = needs_probe(record, d) and not self.settings.node_round_trip
            rem, name = self.pod_records.create(
                record, name, decision.policy.dry_run, now, ask_probe=ask, request=request
            )
            self.node_side.created(record, request, now)
            if rem is None or name is None:
                return now + self.settings.recheck_s
            status = rem.get("status") or {}
        self.known[record.uid] = (record.namespace, name, status.get("phase") or "")
        self.detector.stuck.set(record.uid, record.namespace, str(d.cause))
        due = self._advance(pod, record, rem, decision, now, probe=probe)
        if announces(status, rem.get("status") or {}, str(d.cause), needs_probe(record, d)):
            self._announce(pod, record, decision, now, rem)
        if memory is not None and not self.settings.node_round_trip:
            # (with the round trip the agent reads each volume's driver itself, and the
            # controller's decisions on its answer read them only when needed: inputs.py)
            self._read_claims(pod)
        # The node's Ready transition poked this pass; nothing pokes when it turns into
        # NodeUnreachable nodeLostAfter later: wake then, not at the slow re-check.
        if due is not None and d.node_lost_at is not None:
            due = min(due, d.node_lost_at.timestamp())
        if due is not None and _waits_for_a_medik8s_proof(decision):
            due = min(due, now + FENCING_PROOF_POLL_S)
        return due

    def _read_claims(self, pod: JSON) -> None:
        """Read (and keep, caches.BoundVolumes) the pod's claims and volumes now, after the
        pass's writes, so the decision on its probe finds them kept."""
        get = self.detector.cached.get
        if get is None:
            return
        try:
            claims_and_volumes(pod, get)
        except ApiException as exc:  # read again by the next decision that needs them
            log.debug(
                "claims of %s not read ahead: %s", (pod.get("metadata") or {}).get("name"), exc
            )

    def _announce(
        self, pod: JSON, record: TerminatingPod, dec: Decision, now: float, rem: JSON
    ) -> None:
        d = dec.diagnosis
        cause = str(d.cause)
        planned = ", ".join(str(s.action) for s in dec.steps) or "observe"
        evidence = "; ".join(e.message for e in d.evidence[:3])
        status = rem.get("status") or {}
        if status.get("waitingFor") == KUBELET_FINISHING:
            # the kubelet's window after node steps: what they were for (steps_diagnosis),
            # never announced yet (a mandate's plan whose pass this process did not make)
            cause = str(status.get("cause"))
            steps = [s for s in handed_steps(rem) or [] if isinstance(s, dict)]
            planned = ", ".join(str(s.get("action")) for s in steps)
            evidence = "; ".join(str(e.get("message")) for e in (status.get("evidence") or [])[:3])
        mode = (
            "dry run"
            if dec.policy.dry_run and dec.opted_in
            else ("remediating" if dec.opted_in else f"observing ({dec.why})")
        )
        message = f"stuck in Terminating: {cause}. {evidence}. Plan: {planned} — {mode}."
        self.inputs.events.post(pod, f"Stuck{cause}", message, rfc3339(now))
        log.info(
            "pod=%s uid=%s cause=%s action=diagnose result=%s plan=%s",
            record.key,
            record.uid,
            cause,
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
            refusals = identity.add_refusal(
                list(status.get("refusals") or []),
                "(probe)",
                Refusal.FORGED,
                probe.reason,
                rfc3339(now),
            )
            if refusals is not None:
                p.summary["refusals"] = refusals
        self.node_side.record_results(p)
        changing = [s for s in dec.steps if s.action != Action.OBSERVE]
        if needs_probe(record, d):
            return self.node_side.wait_for_probe(p)
        if d.cause is Cause.KubeletNotProgressing:
            # The agent's steps left nothing of the pod: the kubelet gets its window to
            # finish the pod itself, whatever is planned after it (force-delete, observe).
            finish_by = self._kubelet_finish_by(p)
            if finish_by > now:
                # Not KubeletNotProgressing yet: the record (its cause, the stuck gauge)
                # says what the steps were for — a mandate's: the agent's own diagnosis
                # (the same cause, e.g. a kubelet restarted: this pass's diagnosis says it).
                steps = steps_diagnosis(rem)
                if steps and steps["cause"] != str(d.cause):
                    p.summary.update(steps)
                    self.detector.stuck.set(record.uid, record.namespace, str(steps["cause"]))
                phase = Phase.Remediating if changing else Phase.Observing
                # progress only: carried by the next write (the pod's Resolved, most often)
                self.writer.write(p, phase, waitingFor=KUBELET_FINISHING, defer=True)
                return finish_by
        if not changing:
            self.writer.count_once(p, Action.OBSERVE, "", "succeeded", "observed")
            # the kubelet's window (above) is over: its waitingFor goes (a finalizer
            # owner's, in the summary, stays)
            self.writer.write(p, Phase.Observing, waitingFor=p.summary.get("waitingFor"))
            return now + self.settings.recheck_s
        if dec.policy.dry_run:
            for step in changing:
                self.writer.count_once(
                    p, step.action, step.target, "dry_run", "dry run: nothing changed"
                )
            self.writer.write(p, Phase.DryRun, waitingFor=p.summary.get("waitingFor"))
            return now + self.settings.recheck_s
        step = next((s for s in changing if not _succeeded(p.done, s.action, s.target)), None)
        if step is not None and step.action in NODE_ACTIONS:
            return self.node_side.steps(p)
        if step is None and any(s.action in NODE_ACTIONS for s in changing):
            # The agent reported these steps done: judge them by a probe taken after them.
            return self.node_side.steps(p)
        if step is None:
            self.writer.write(p, Phase.Remediating)
            return now + self.settings.recheck_s
        # Only a look at the budget (no slot taken: that happens right before acting), so
        # pods waiting for it do not re-read pod and Node every time a slot frees.
        wait = self.grants.wait(dec.policy, record.node, now)
        if wait > 0:
            self.writer.write(p, Phase.Remediating, waitingFor=RATE_LIMITED)
            return now + wait
        return self.pod_actions.act(p, step)

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
        done_at = (p.rem.get("status") or {}).get(NODE_STEPS_DONE_AT)
        if not isinstance(done_at, str) or not done_at:
            return 0.0
        try:
            return parse_time(done_at) + self.settings.kubelet_finish_s
        except ValueError:
            return 0.0

    # -- the action budget across restarts (acting/budget_rebuild.py, incidents/adoption.py) --

    def rebuild_budget(
        self, remediations: list[JSON], now: float, local_at: Callable[[float], float]
    ) -> int:
        """Put back the grants of the last minute recorded in `remediations` (a restart or
        failover does not reset the budget; controller/acting/budget_rebuild.py); returns
        their count."""
        return self.grants.rebuild(
            remediations, now, lambda name: self.detector.policies.lookup(name)[0], local_at
        )

    def release_recorded(self, node: str, at: float) -> None:
        """A grant put back by `rebuild_budget` from a record of time `at` whose act did
        not take effect after all (incidents/adoption.py: the pod is there, never
        force-deleted)."""
        self.grants.give_back(node, at)

    # -- the pod is gone ------------------------------------------------------------------

    def record_late_answer(self, uid: str, namespace: str, name: str) -> None:
        """The agent answered node steps of a pod gone meanwhile (records/pod_record.py)."""
        self.pod_records.record_late_answer(uid, namespace, name)

    def refuse_record(self, rem: JSON, why: str, now: float) -> None:
        """Mark a Remediation that is not the record of its pod `Refused`
        (records/pod_record.py)."""
        self.pod_records.refuse(rem, why, now)

    def resolve(self, record: TerminatingPod) -> bool:
        """The pod is gone: forgotten here, noted in its node's incident, or its own
        Remediation marked Resolved (records/pod_record.py; kept as the audit trail). False when
        that record kept changing under the write: call again later."""
        now = self.clock()
        self._final_delete_seen.pop(record.uid, None)
        self.detector.forget(record.uid)
        if self.inputs.incidents.gone(record.uid, now) is not None and record.uid not in self.known:
            # Only in its node's incident (no record of its own): the incident notes it.
            self.requests.forget(record.uid)
            log_resolved(record, now)
            return True
        self.pod_actions.forget(record.uid)
        return self.pod_records.resolve(record, now)


def _succeeded(done: list[Any], action: Any, target: str) -> bool:
    return any(
        a.get("action") == str(action)
        and a.get("target") == target
        and a.get("result") == "succeeded"
        for a in done
    )
