"""Node-side steps and probes: the controller's half of the channel to the node agent.

Node actions are never run by the controller. With `--node-round-trip` (design.md §11) it
asks once: a mandate (`spec.mandate` + `spec.nodeStepsRequestedAt`, `NodeMandate` of
core/remediation.py: the node actions the policy in force permits, its name and
resourceVersion, dry-run, one node-budget slot counted here) in place of a probe request;
the agent probes, plans with the core on its own probe, records probe + plan
(`status.nodePlan`) before it acts, and answers with `status.nodeActions`,
`status.nodeStepsDoneAt` and a probe taken after the steps; a slot it did not use
(`nodePlan.slotsUsed` 0) is given back. Without the flag (the flow before §11) it writes
the approved steps (`spec.nodeSteps` + `spec.nodeStepsRequestedAt`, `NodeStepsRequest`)
and asks for probes (`spec.probeRequestedAt`). Either way steps are only handed over with
a fresh probe of the node (invariant 1; a mandate's steps with the agent's own), judged by
a probe taken after they ran — never re-issued in a loop; a request the agent refused as
`stale` or `busy` is asked again after a backoff.

`NodeSide` is the reconciler's collaborator for all of that (controller/reconciler.py
holds one): it gets its settings, the record of our own requests (trust.ProbeRequests),
the pass's status writer and the budget's `take` — nothing else of the reconciler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from unstick.controller import failpoints
from unstick.controller.agent_channel.trust import ProbeRequests
from unstick.controller.deciding.decision import RATE_LIMITED, Decision, Pass
from unstick.controller.deciding.policies import Policy
from unstick.controller.records.agent_answers import (
    agent_results,
    answered_results,
    steps_cause,
)
from unstick.controller.records.writer import RecordWriter, Stale
from unstick.core.remediation import (
    MANDATE,
    NODE_PLAN,
    RETRY_AFTER,
    NodeMandate,
    NodeStep,
    NodeStepsRequest,
    Phase,
    parse_time,
    rfc3339,
    steps_answered,
    time_or_none,
)
from unstick.core.vocabulary import NODE_ACTIONS, Action, Refusal
from unstick.kube.client import JSON, Kube
from unstick.kube.podwatch import TerminatingPod

log = logging.getLogger("unstick.decisions")

AFTER_NODE_STEPS = "a fresh probe from the agent after the node steps"
#: Refusals of a whole request that say nothing about the steps — the request reached the
#: agent too old or from the future of its clock (`stale`), or the agent's own node budget
#: was used up (`policy_forbids` with `retryAfterSeconds`): asked again after a
#: backoff. A refusal for a safety reason (forged, unsafe, not opted in, a policy that does
#: not permit the step, dry-run) is not.
RETRIED_REFUSALS = frozenset({str(Refusal.STALE), "busy"})
BUSY = "rate limit:"  # how an older agent's node-budget refusal began (no retryAfterSeconds)
RETRY_FIRST_S = 5.0  # the first re-ask; doubled each time, at most the re-check period
NODE_STEPS = "node-steps"  # status.nodeRefusals[].action of a request refused as a whole


@dataclass(frozen=True, slots=True)
class NodeSideSettings:
    recheck_s: float = 300.0  # slow re-check; also the ceiling of the re-ask backoff
    reprobe_s: float = 600.0  # ask the agent again after an unanswered probe request
    round_trip: bool = True  # --node-round-trip: a mandate in place of probe + steps (§11)


def _word(entry: dict[str, Any]) -> str:
    """The refusal's reason, `busy` for the agent's node budget (counted policy_forbids):
    the entry carries `retryAfterSeconds` (or, from an agent before it did, a message
    starting BUSY)."""
    reason = str(entry.get("reason"))
    if reason == str(Refusal.POLICY_FORBIDS) and (
        isinstance(entry.get(RETRY_AFTER), int) or str(entry.get("message", "")).startswith(BUSY)
    ):
        return "busy"
    return reason


def refused_request(rem: JSON) -> tuple[str, int] | None:
    """(reason, how many times in a row) when the agent refused the latest node-step
    request as a whole: every result `refused`, and its `status.nodeRefusals` entry
    (action node-steps) is of that answer (time = nodeStepsDoneAt). None otherwise.
    The reason is `busy` for a refusal by the agent's node budget (`_word`)."""
    status = rem.get("status") or {}
    if not agent_results(rem) or any(r[2] != "refused" for r in agent_results(rem)):
        return None
    entries = [
        e
        for e in status.get("nodeRefusals") or []
        if isinstance(e, dict) and e.get("action") == NODE_STEPS
    ]
    try:
        if not entries or parse_time(str(entries[-1].get("time"))) != parse_time(
            str(status.get("nodeStepsDoneAt"))
        ):
            return None
    except ValueError:
        return None
    reason = _word(entries[-1])
    times = 0
    for entry in reversed(entries):
        if _word(entry) != reason:
            break
        times += 1
    return reason, times


def handed_steps(rem: JSON) -> list[Any] | None:
    """The node steps of the latest request, as JSON: `spec.nodeSteps` of a request of
    steps; of a mandate, the steps of the agent's plan for it (`status.nodePlan` whose
    `for` is the request's time), None while there is none."""
    spec, status = rem.get("spec") or {}, rem.get("status") or {}
    if spec.get(MANDATE) is None:
        steps = spec.get("nodeSteps")
        return steps if isinstance(steps, list) else None
    plan = status.get(NODE_PLAN)
    if not isinstance(plan, dict) or time_or_none(plan.get("for")) is None:
        return None
    if time_or_none(plan.get("for")) != time_or_none(spec.get("nodeStepsRequestedAt")):
        return None
    steps = plan.get("steps")
    return steps if isinstance(steps, list) else None


def retry_backoff_s(times: int, ceiling_s: float) -> float:
    """Seconds from a refusal to the re-ask: RETRY_FIRST_S, doubled each time in a row."""
    return min(RETRY_FIRST_S * 2.0 ** min(max(times - 1, 0), 20), ceiling_s)


class NodeSide:
    """Everything a pass hands to the agent or reads back from it."""

    def __init__(
        self,
        kube: Kube,
        settings: NodeSideSettings,
        *,
        requests: ProbeRequests,
        writer: RecordWriter,
        take_budget: Callable[[Policy, str, float], float],
        give_back: Callable[[str, float], None] = lambda node, slot: None,
    ) -> None:
        self.kube = kube
        self.give_back = give_back  # a slot whose request was not written (409)
        self.settings = settings
        self.requests = requests  # when this process asked the agent about each pod
        self.writer = writer
        self.take_budget = take_budget  # one slot of the action budget, or the wait
        # the slot granted with each pod's latest mandate: (its request time as written,
        # the slot's time), until the agent's plan says whether it used it
        self._slots: dict[str, tuple[str, float]] = {}

    def _ask(self, p: Pass, spec: dict[str, Any]) -> None:
        """Write a request to the agent and remember, in memory, that we made it."""
        self.writer.patch_spec(p.rem, spec)  # onto the version decided from (records/writer.py)
        self.requests.asked(p.record.uid, p.now)

    def steps(self, p: Pass) -> float | None:
        """Hand node steps to the agent (spec.nodeSteps) and read its results back."""
        spec = p.rem.get("spec") or {}
        status = p.rem.get("status") or {}
        planned = tuple(
            NodeStep(s.action, s.target, s.reason) for s in p.dec.steps if s.action in NODE_ACTIONS
        )
        steps = [s.to_json() for s in planned]
        handed = handed_steps(p.rem)  # of the latest request (a mandate's: the agent's plan)
        requested: str = spec.get("nodeStepsRequestedAt") or ""
        done_at: str = status.get("nodeStepsDoneAt") or ""
        finished = bool(requested) and steps_answered(spec, status)
        if not p.dec.diagnosis.probe_fresh:  # invariant 1: no node action without a fresh probe
            return self.wait_for_probe(p)
        asked_at = time_or_none(requested)
        deadline = asked_at.timestamp() + p.dec.policy.probe_max_age_s * 2 if asked_at else 0.0
        if requested and not finished and (handed == steps or p.now < deadline):
            # An unanswered request is not replaced by other steps while the agent may
            # still run it: the next request's answer would take the place of its answer in
            # status.nodeActions before a pass recorded it (every node act on record).
            # With a mandate the agent is at work: this waits for its answer, deferred.
            self.writer.write(p, Phase.Remediating, defer=self.settings.round_trip)
            # Never a time already past: that would re-run this pass back to back (a long
            # agent backlog is many such passes). The agent's answer pokes the pod anyway.
            return deadline if deadline > p.now else p.now + p.dec.policy.probe_max_age_s
        refused = refused_request(p.rem) if finished else None
        mandate = spec.get(MANDATE) is not None
        if refused and refused[0] in RETRIED_REFUSALS and (mandate or handed == steps):
            return self._ask_again(p, planned, *refused)
        if finished:
            probed = ((status.get("probe") or {}).get("probedAt")) or ""
            if p.probe is None or not probed or parse_time(probed) < parse_time(done_at):
                # Judge the node steps by a probe taken after them, never by the old one.
                asked = self.requests.last(p.record.uid)
                if asked is None or asked < parse_time(done_at):
                    self._ask(p, {"probeRequestedAt": rfc3339(p.now)})
                self.writer.write(p, Phase.Remediating, waitingFor=AFTER_NODE_STEPS)
                return p.now + p.dec.policy.probe_max_age_s
            if handed == steps or (mandate and not handed):
                # The same steps again after they ran: they did not help. Do not loop. (A
                # mandate answered with a plan of none of them — its own diagnosis of the
                # node disagrees with ours on this very probe — or with no plan at all — it
                # was refused, or the agent is older than the mandate — would loop too.)
                self.writer.write(p, Phase.Failed, waitingFor=None)
                why = "still needed after the agent ran them"
                if mandate and handed is None:
                    why = (
                        f"the agent answered the mandate without status.{NODE_PLAN} (refused: "
                        "status.nodeRefusals; or an agent older than --node-round-trip)"
                    )
                elif mandate and not handed:
                    why = "the agent's own diagnosis planned none of them"
                log.info(
                    "pod=%s uid=%s cause=%s action=%s result=failed: %s",
                    p.record.key,
                    p.record.uid,
                    p.dec.diagnosis.cause,
                    ",".join(s["action"] for s in steps),
                    why,
                )
                return p.now + self.settings.recheck_s
        # The batch of node steps for one pod is one remediation handed to the agent and
        # takes one action of the budget: counted per step, a plan longer than
        # nodePerMinute (a CSI volume plus the projected token volume makes 8) never ran.
        wait = self.take_budget(p.dec.policy, p.record.node, p.now)
        if wait > 0:
            self.writer.write(p, Phase.Remediating, waitingFor=RATE_LIMITED)
            return p.now + wait
        try:
            return self._request_steps(p, planned, "requested-from-agent")
        except Stale:
            if self.requests.last(p.record.uid) != p.now:  # not handed over: the slot back
                self.give_back(p.record.node, p.now)
            raise

    def _request_steps(self, p: Pass, steps: tuple[NodeStep, ...], result: str) -> float:
        at = datetime.fromtimestamp(p.now, UTC)
        mandate = self.mandate(p, slots=1) if self.settings.round_trip else None
        if mandate is not None:
            spec = mandate.request(at)  # the agent plans the steps itself, on its own probe
        else:
            request = NodeStepsRequest(
                steps, at, dry_run=False, lazy_unmount=p.dec.policy.lazy_unmount
            )
            spec = request.to_spec()
        if p.done != ((p.rem.get("status") or {}).get("actions") or []):
            # The agent's answer to the last request, recorded in this pass, goes on record
            # before the next request: the agent answers that one at once, in place of it.
            self.writer.write(p, Phase.Remediating, waitingFor=None)
        self._ask(p, spec)
        if mandate is not None:
            self._slots[p.record.uid] = (spec["nodeStepsRequestedAt"], p.now)
        failpoints.reached("node-steps-requested")
        log.info(
            "pod=%s uid=%s cause=%s action=%s result=%s",
            p.record.key,
            p.record.uid,
            p.dec.diagnosis.cause,
            ",".join(str(s.action) for s in steps),
            result,
        )
        # The request's own write was guarded (the decision was made from the record as
        # it is); this one records that decision in our own keys only, whatever the agent
        # wrote since (it reacts to the request at once): not bound to a version.
        self.writer.write(p, Phase.Remediating, guarded=False, waitingFor=None)
        return p.now + p.dec.policy.probe_max_age_s * 2

    def _ask_again(self, p: Pass, steps: tuple[NodeStep, ...], reason: str, times: int) -> float:
        """The agent refused our request as `reason` (stale, busy): nothing ran, so this is
        not a failed action; the same steps are asked again after a backoff (RETRY_FIRST_S,
        doubled each refusal in a row, at most the re-check period), without a budget
        slot (the first request took it; the agent keeps its own node budget too)."""
        done_at = parse_time((p.rem.get("status") or {}).get("nodeStepsDoneAt") or "")
        at = done_at + retry_backoff_s(times, self.settings.recheck_s)
        if p.now < at:
            why = f"the agent refused the node steps ({reason}); asking again at {rfc3339(at)}"
            self.writer.write(p, Phase.Remediating, waitingFor=why)
            return at
        return self._request_steps(p, steps, f"asked-again-after-{reason}-refusal-{times}")

    def mandate(self, p: Pass, *, slots: int) -> NodeMandate | None:
        """`mandate_for` the pass's pod and decision."""
        return self.mandate_for(p.record, p.dec, slots=slots)

    def mandate_for(
        self, record: TerminatingPod, dec: Decision, *, slots: int
    ) -> NodeMandate | None:
        """The mandate for this pod under the policy in force: the node actions it permits,
        its name and resourceVersion, dry-run (then no slot), `slots`. None when there is
        nothing to permit: not opted in, no valid policy, no node, no node action."""
        policy = dec.policy
        parsed = policy.parsed
        if not dec.opted_in or parsed is None or not record.node:
            return None
        actions = tuple(a for a in Action if a in NODE_ACTIONS and parsed.permits(a))
        if not actions:
            return None
        return NodeMandate(
            record.uid,
            record.node,
            actions,
            policy.name,
            parsed.resource_version,
            dry_run=policy.dry_run,
            slots=0 if policy.dry_run else slots,
        )

    def create_request(self, record: TerminatingPod, dec: Decision, now: float) -> JSON | None:
        """With --node-round-trip, the mandate the pod's Remediation is created with (its
        slot taken here), so the create is the one request; None: no mandate to give, or
        no budget slot now (the create then asks for nothing, and the pass asks after it)."""
        if not self.settings.round_trip:
            return None
        mandate = self.mandate_for(record, dec, slots=1)
        if mandate is None:
            return None
        if mandate.slots and self.take_budget(dec.policy, record.node, now) > 0:
            return None
        request = mandate.request(datetime.fromtimestamp(now, UTC))
        if mandate.slots:
            self._slots[record.uid] = (request["nodeStepsRequestedAt"], now)
        return request

    def created(self, record: TerminatingPod, request: JSON | None, now: float) -> None:
        """The create is done: a mandate's slot back when the record it made (or found)
        does not carry our request (PodRecords.create remembers it as asked when it does)."""
        if request is None or record.uid not in self._slots:
            return
        if self.requests.last(record.uid) != now:
            del self._slots[record.uid]
            self.give_back(record.node, now)

    def _return_unused(self, p: Pass) -> None:
        """The slot granted with the pod's latest mandate back to the budget when the
        agent's plan for it (`status.nodePlan`, `for` that request) used none."""
        granted = self._slots.get(p.record.uid)
        if granted is None:
            return
        plan = (p.rem.get("status") or {}).get(NODE_PLAN)
        if not isinstance(plan, dict) or time_or_none(plan.get("for")) != time_or_none(granted[0]):
            return
        del self._slots[p.record.uid]
        if plan.get("slotsUsed") == 0:
            self.give_back(p.record.node, granted[1])

    def record_results(self, p: Pass) -> None:
        """Copy the agent's finished node actions into status.actions (by: agent), once;
        give back a mandate's slot the agent did not use."""
        self._return_unused(p)
        for action, target, result, message in answered_results(p.rem):
            self.writer.count_once(
                p,
                action,
                target,
                result,
                message,
                by="agent",
                cause=steps_cause(p.rem),  # what the steps were for (a mandate's: the agent's)
            )

    def _ask_probe(self, p: Pass) -> None:
        """Ask for a probe — with --node-round-trip, a mandate where there is one to give
        and a budget slot for it (the agent probes, plans and acts in one round trip);
        a plain probe request otherwise — also after a mandate answered without a plan
        (refused, or by an agent older than the mandate): never a mandate after a mandate
        without a probe in between (steps() decides on that probe)."""
        spec, status = p.rem.get("spec") or {}, p.rem.get("status") or {}
        unplanned = (
            spec.get(MANDATE) is not None
            and steps_answered(spec, status)
            and handed_steps(p.rem) is None
        )
        mandate = self.mandate(p, slots=1) if self.settings.round_trip and not unplanned else None
        if (
            mandate is not None
            and mandate.slots
            and self.take_budget(p.dec.policy, p.record.node, p.now) > 0
        ):
            mandate = None  # budget used up: only a probe; the steps wait for a slot
        if mandate is None:
            self._ask(p, {"probeRequestedAt": rfc3339(p.now)})
            return
        spec = mandate.request(datetime.fromtimestamp(p.now, UTC))
        try:
            self._ask(p, spec)
        except Stale:
            if mandate.slots and self.requests.last(p.record.uid) != p.now:
                self.give_back(p.record.node, p.now)  # not handed over: the slot back
            raise
        if mandate.slots:
            self._slots[p.record.uid] = (spec["nodeStepsRequestedAt"], p.now)

    def wait_for_probe(self, p: Pass) -> float:
        """Ask the agent for a probe (unless our last request is recent and not older than
        the node steps' answer) and wait for it, `probeMaxAgeSeconds`; without a fresh
        probe in time the pod is only observed, and asked about again after reprobe_s."""
        # Our own request time, from memory: the record's probeRequestedAt may be anyone's.
        asked = self.requests.last(p.record.uid)
        steps_done = (p.rem.get("status") or {}).get("nodeStepsDoneAt")
        outdated = bool(asked is not None and steps_done and asked < parse_time(steps_done))
        if asked is None or outdated or p.now - asked >= self.settings.reprobe_s:
            self._ask_probe(p)
            asked = p.now
        deadline = asked + p.dec.policy.probe_max_age_s
        if p.now < deadline:
            # Asked in this pass (its write guarded, or the record's create): this records
            # that decision whatever the agent answered since, as after a steps request.
            # (a mandate's answer is the agent's next write: this one waits for it, deferred)
            defer = self.settings.round_trip and asked == p.now
            self.writer.write(p, Phase.WaitingForAgent, guarded=asked != p.now, defer=defer)
            return deadline
        # No fresh probe in time: node state is unknown — observe only (design.md §2).
        self.writer.count_once(
            p, Action.OBSERVE, "", "succeeded", "no fresh probe from the agent: observing"
        )
        self.writer.write(p, Phase.Observing)
        return asked + self.settings.reprobe_s
