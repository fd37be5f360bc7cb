"""The controller's node-level actions `taint-out-of-service` and `untaint-out-of-service`
(design.md §10, docs/fencing.md): a thread that looks at the nodes every `PERIOD_S` (and
when a Node changes), decides with the core (core/policy/out_of_service.py) and acts —
only while this replica leads, only what the policy named `default` lists (a node is no
tenant's: a policy scoped to namespaces never taints a node).

Each act, in order:
1. decided from what the Node watch holds (no request while no node is NotReady and none
   carries unstick's mark);
2. decided again from live reads (the Nodes, the node's medik8s records, unstick's taint
   records for the guards and the budget);
3. on record: a node incident (controller/incidents/taint_record.py) holding the intent;
4. every precondition read live once more and decided again, right before the write;
5. the Node written with its resourceVersion as precondition (a merge patch of
   `spec.taints` and unstick's annotation: a Node changed since step 4 is a 409, and
   nothing is written);
6. the result on record.
A crash anywhere leaves at worst an intent without its result: each pass first settles
those by looking at the Node (the taint there with unstick's mark naming that record:
done; else: not carried out).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.controller import failpoints, metrics
from unstick.controller.deciding.policies import DEFAULT_POLICY, PolicyBook
from unstick.controller.incidents import taint_reads as reads
from unstick.controller.incidents import taint_record as rec
from unstick.controller.records.events import EventQueue
from unstick.core.fields import FieldError
from unstick.core.policy.out_of_service import (
    APPLIED_ANNOTATION,
    Applied,
    Cluster,
    NodeState,
    OutOfServiceGuards,
    TaintVerdict,
    decide_taint,
    decide_untaint,
    held_seconds,
    node_state,
    out_of_service_taint,
)
from unstick.core.remediation import Phase, rfc3339
from unstick.core.rules.fencing import FencingSettings, node_fencing
from unstick.core.vocabulary import Action, Cause
from unstick.kube.client import JSON, Kube

log = logging.getLogger("unstick.decisions")

PERIOD_S = 5.0  # the nodes are looked at this often (and when a Node changes)
RETRY_FAILED_S = 60.0  # a removal the API server refused (not a precondition): again then
ERROR_PAUSE_S = 10.0  # after a pass that failed


def controller_namespace() -> str:
    """Where the taint records live: the controller's own namespace."""
    return os.environ.get("POD_NAMESPACE") or "default"


def _stamp(now: float) -> str:
    """A taint's timeAdded: RFC 3339 in whole seconds, as the API server keeps it."""
    return datetime.fromtimestamp(int(now), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class _Policy:
    taint: bool
    untaint: bool
    dry_run: bool
    guards: OutOfServiceGuards
    fencing: FencingSettings
    name: str = DEFAULT_POLICY


def _policy(policies: PolicyBook) -> _Policy:
    policy, _ = policies.lookup(DEFAULT_POLICY)
    parsed = policy.parsed if policy is not None else None
    if parsed is None:
        return _Policy(False, False, True, OutOfServiceGuards(), FencingSettings())
    return _Policy(
        parsed.permits(Action.TAINT_OUT_OF_SERVICE),
        parsed.permits(Action.UNTAINT_OUT_OF_SERVICE),
        parsed.dry_run,
        parsed.out_of_service,
        parsed.fencing,
    )


def _states(objects: list[JSON]) -> list[NodeState]:
    """The Nodes as the core reads them; one it cannot read (a malformed field) is left
    out, with the field named in the log — never taken for Ready or NotReady."""
    out = []
    for obj in objects:
        try:
            out.append(node_state(obj))
        except FieldError as err:
            name = (obj.get("metadata") or {}).get("name")
            log.warning("node=%s not read: %s", name, err)
    return out


def _not_ready(state: NodeState) -> bool:
    return not state.ready


class OutOfService:
    """The thread of the node-level actions."""

    def __init__(
        self,
        kube: Kube,
        policies: PolicyBook,
        cached_nodes: Callable[[], list[JSON]],
        events: EventQueue,
        *,
        clock: Callable[[], float] = time.time,
        gate: Callable[[], bool] = lambda: True,
        namespace: str | None = None,
    ) -> None:
        self.kube, self.policies, self.events = kube, policies, events
        self.cached_nodes, self.clock, self.gate = cached_nodes, clock, gate
        self.namespace = namespace or controller_namespace()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.said: dict[str, str] = {}  # node → the last refusal said (logged, Event)
        self._fenced_nodes: set[str] = set()  # nodes with a fenced-seconds series
        self._not_before: dict[str, float] = {}  # node → its failed removal is tried again

    # -- the thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="out-of-service", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def poke(self) -> None:
        """A Node changed: look now."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            pause = PERIOD_S
            try:
                if self.gate():
                    self.run_once()
            except Exception:  # never silently; the next pass looks again
                log.exception("out-of-service pass failed")
                pause = ERROR_PAUSE_S
            self._wake.wait(timeout=pause)
            self._wake.clear()

    # -- one pass ------------------------------------------------------------------------

    def run_once(self) -> None:
        policy = _policy(self.policies)
        cached = _states(self.cached_nodes())
        marked = [s for s in cached if s.applied is not None]
        candidates = [s for s in cached if _not_ready(s) and not s.out_of_service]
        if not marked and not (policy.taint and candidates) and not self._fenced_nodes:
            return  # nothing to look at: no request
        records = rec.list_records(self.kube, self.namespace)
        if self._settle(records):
            records = rec.list_records(self.kube, self.namespace)
        live = {s.name: s for s in _states(reads.nodes(self.kube))}
        self._report(live, policy)
        for state in live.values():
            if state.applied is not None:
                self._untaint(state, records, policy)
        candidates = [s for s in live.values() if _not_ready(s) and not s.out_of_service]
        if not policy.taint or not candidates:
            return
        # one read of everything for all the candidates; a node that passes is read and
        # decided again on its own (`_taint`)
        medik8s = reads.medik8s_records(self.kube, policy.fencing)
        everyone = list(live.values())
        for state in candidates:
            verdict = self._verdict(state, policy, everyone, records, medik8s)
            if verdict.act:
                self._taint(state, policy)
                everyone = _states(reads.nodes(self.kube))
                records = rec.list_records(self.kube, self.namespace)
            else:
                self._say(state.name, verdict)

    def _report(self, live: dict[str, NodeState], policy: _Policy) -> None:
        """The metrics: how long each node has carried unstick's taint, and whether that is
        longer than fencedTaintMaxSeconds (the alert UnstickNodeFencedTooLong)."""
        now = datetime.fromtimestamp(self.clock(), UTC)
        fenced = set()
        for state in live.values():
            held = held_seconds(state, now)
            if held is None:
                continue
            fenced.add(state.name)
            metrics.NODE_FENCED_SECONDS.labels(state.name).set(held)
            too_long = held > policy.guards.fenced_taint_max_seconds
            metrics.NODE_FENCED_TOO_LONG.labels(state.name).set(1 if too_long else 0)
        for gone in self._fenced_nodes - fenced:
            metrics.NODE_FENCED_SECONDS.remove(gone)
            metrics.NODE_FENCED_TOO_LONG.remove(gone)
        self._fenced_nodes = fenced

    # -- crash recovery: intents without their result ------------------------------------

    def _settle(self, records: list[rec.TaintRecord]) -> bool:
        """An intent whose result is not on record (a controller stopped between the
        record and the act, or before the result): settled by looking at the Node. A
        record created by a controller stopped before it wrote the intent into it: no
        Node was written for it, it is resolved. Returns whether anything was settled."""
        settled = False
        for r in records:
            last = r.last
            if r.open and not r.actions:
                rec.resolve_empty(self.kube, r, self.clock())
                settled = True
                continue
            if not r.open or last.get("result") not in (rec.TAINTING, rec.UNTAINTING):
                continue
            settled = True
            obj = reads.node(self.kube, r.node)
            now = self.clock()
            if obj is None:
                item = rec.entry(
                    str(last.get("action")), r.node, "gone", f"node {r.node} was deleted", now
                )
                rec.add_action(self.kube, r, item, replace_last=True, phase=Phase.Resolved, at=now)
                continue
            state = node_state(obj)
            ours = (
                state.unstick_taint is not None
                and state.applied is not None
                and state.applied.record == r.key
            )
            if last.get("result") == rec.TAINTING:
                if ours:
                    msg = (
                        "settled by looking: the taint with unstick's mark naming this "
                        "record is on the node"
                    )
                    item = rec.entry(rec.TAINT, r.node, "succeeded", msg, now)
                    rec.add_action(
                        self.kube,
                        r,
                        item,
                        replace_last=True,
                        waiting_for="the node to be Ready again",
                    )
                else:
                    msg = (
                        "settled by looking: the node does not carry this record's taint; "
                        "not carried out"
                    )
                    item = rec.entry(rec.TAINT, r.node, "withdrawn", msg, now)
                    rec.add_action(
                        self.kube, r, item, replace_last=True, phase=Phase.Resolved, at=now
                    )
            elif ours:  # untainting, and the taint is still there: not carried out
                msg = "settled by looking: the taint is still on the node; not carried out"
                item = rec.entry(rec.UNTAINT, r.node, "withdrawn", msg, now)
                rec.add_action(self.kube, r, item, replace_last=True)
            else:
                msg = "settled by looking: unstick's taint is gone from the node"
                item = rec.entry(rec.UNTAINT, r.node, "succeeded", msg, now)
                rec.add_action(self.kube, r, item, replace_last=True, phase=Phase.Resolved, at=now)
            log.info("node=%s record=%s %s", r.node, r.key, msg)
        return settled

    # -- taint ---------------------------------------------------------------------------

    def _decide_taint(
        self, name: str, policy: _Policy, *, exclude: str = ""
    ) -> tuple[NodeState | None, TaintVerdict]:
        """Everything read live and decided: the node, its proofs and managers, the
        Nodes (the guards) and unstick's taint records (the count and the budget);
        `exclude`: the record of this very act (its own intent is no other taint)."""
        obj = reads.node(self.kube, name)
        if obj is None:
            return None, TaintVerdict(False, f"node {name} was deleted")
        state = node_state(obj)
        medik8s = reads.medik8s_records(self.kube, policy.fencing)
        everyone = _states(reads.nodes(self.kube))
        records = rec.list_records(self.kube, self.namespace)
        return state, self._verdict(state, policy, everyone, records, medik8s, exclude=exclude)

    def _verdict(
        self,
        state: NodeState,
        policy: _Policy,
        everyone: list[NodeState],
        records: list[rec.TaintRecord],
        medik8s: tuple[list[JSON], list[JSON]],
        *,
        exclude: str = "",
    ) -> TaintVerdict:
        """The core's decision on what was read."""
        now = self.clock()
        fars, snrs, managers = reads.medik8s_of(*medik8s, state.name)
        fencing = node_fencing(
            state.facts, fars, snrs, datetime.fromtimestamp(now, UTC), policy.fencing
        )
        others = [r for r in records if r.key != exclude]
        in_flight = {r.node for r in others if r.open and r.last.get("result") == rec.TAINTING}
        cluster = Cluster(
            nodes=len(everyone),
            not_ready=sum(1 for s in everyone if _not_ready(s)),
            fenced=frozenset({s.name for s in everyone if s.unstick_taint is not None} | in_flight),
            recent_taints=tuple(t for r in others for t in r.taint_times()),
        )
        return decide_taint(
            state,
            fencing,
            managers,
            cluster,
            policy.guards,
            permitted=policy.taint,
            dry_run=policy.dry_run,
            now=now,
        )

    def _taint(self, cached: NodeState, policy: _Policy) -> None:
        name = cached.name
        state, verdict = self._decide_taint(name, policy)
        if not verdict.act or state is None or verdict.proof is None:
            self._say(name, verdict)
            return
        proof, now = verdict.proof, self.clock()
        evidence = [{"kind": "fencing", "message": proof.message[:2048]}]
        record = rec.create_intent(
            self.kube,
            self.namespace,
            name,
            evidence=evidence,
            reason=verdict.reason,
            policy=policy.name,
            at=now,
        )
        log.info(
            "node=%s record=%s action=taint-out-of-service result=intended %s",
            name,
            record.key,
            verdict.reason,
        )
        failpoints.reached("taint-intent-durable")
        # right before the write: everything read live and decided once more
        state, verdict = self._decide_taint(name, policy, exclude=record.key)
        if not verdict.act or state is None or verdict.proof is None:
            self._result(
                record,
                rec.TAINT,
                "refused",
                f"changed before acting: {verdict.reason}",
                Phase.Resolved,
            )
            self._say(name, verdict)
            return
        proof = verdict.proof
        stamp = _stamp(self.clock())
        mark = Applied(
            stamp,
            proof.source.value,
            proof.object,
            rfc3339(proof.at) if proof.at is not None else None,
            record.key,
        )
        taints = [t.entry() for t in state.taints] + [out_of_service_taint(stamp).entry()]
        body: JSON = {
            "metadata": {
                "resourceVersion": state.resource_version,
                "annotations": {APPLIED_ANNOTATION: mark.to_json()},
            },
            "spec": {"taints": taints},
        }
        result, message = self._write_node(name, body)
        if result == "succeeded":
            message = (
                f"applied node.kubernetes.io/out-of-service=nodeshutdown:NoExecute to node "
                f"{name} on the evidence of {proof.source.value}: {proof.message}"
            )
            self._result(
                record, rec.TAINT, result, message, None, waiting_for="the node to be Ready again"
            )
            self._event(state, "OutOfServiceTaintApplied", message, "Normal")
            self.said.pop(name, None)
        else:
            self._result(record, rec.TAINT, result, message, Phase.Resolved)

    # -- untaint -------------------------------------------------------------------------

    def _untaint(self, cached: NodeState, records: list[rec.TaintRecord], policy: _Policy) -> None:
        name = cached.name
        if self._not_before.get(name, 0.0) > self.clock():
            return
        record = next(
            (r for r in records if cached.applied is not None and r.key == cached.applied.record),
            None,
        )
        verdict, state = self._decide_untaint(name, policy)
        if state is None:
            return
        if verdict.clear_mark:  # the mark describes no taint: only the annotation goes
            unmark: JSON = {
                "metadata": {
                    "resourceVersion": state.resource_version,
                    "annotations": {APPLIED_ANNOTATION: None},
                }
            }
            result, message = self._write_node(name, unmark)
            log.info("node=%s %s; unstick's annotation removed: %s", name, verdict.reason, result)
            if record is not None and record.open and result == "succeeded":
                self._result(record, rec.UNTAINT, "gone", verdict.reason, Phase.Resolved, new=True)
            return
        if not verdict.act:
            if record is not None and record.open:
                rec.set_waiting(self.kube, record, verdict.reason)
            return
        # record before act: the intent on the taint's record, or on a new one when that
        # record is gone (retention) or closed
        intent = "decided; the Node is written once this entry is on record"
        if record is not None and record.open:
            item = rec.entry(rec.UNTAINT, name, rec.UNTAINTING, intent, self.clock())
            record = rec.add_action(self.kube, record, item)
        else:
            record = rec.create_intent(
                self.kube,
                self.namespace,
                name,
                action=rec.UNTAINT,
                evidence=[{"kind": "fencing", "message": _applied_words(state)}],
                reason=verdict.reason,
                policy=policy.name,
                at=self.clock(),
            )
        failpoints.reached("untaint-intent-durable")
        verdict, state = self._decide_untaint(name, policy)
        if state is None or not verdict.act:
            why = verdict.reason if verdict is not None else f"node {name} was deleted"
            self._result(
                record, rec.UNTAINT, "refused", f"changed before acting: {why}", None,
                waiting_for=why,
            )  # fmt: skip
            return
        ours = state.unstick_taint
        taints = [t.entry() for t in state.taints if t != ours]
        body: JSON = {
            "metadata": {
                "resourceVersion": state.resource_version,
                "annotations": {APPLIED_ANNOTATION: None},
            },
            "spec": {"taints": taints},
        }
        result, message = self._write_node(name, body)
        if result == "succeeded":
            message = f"removed unstick's out-of-service taint from node {name}: {verdict.reason}"
            self._event(state, "OutOfServiceTaintRemoved", message, "Normal")
        phase = Phase.Resolved if result == "succeeded" else None
        self._result(record, rec.UNTAINT, result, message, phase)
        if result == "failed":
            self._not_before[name] = self.clock() + RETRY_FAILED_S
        else:
            self._not_before.pop(name, None)

    def _decide_untaint(self, name: str, policy: _Policy) -> tuple[Any, NodeState | None]:
        obj = reads.node(self.kube, name)
        if obj is None:
            return None, None
        state = node_state(obj)
        now = datetime.fromtimestamp(self.clock(), UTC)
        permitted = policy.untaint
        # the live read of what is left, only when it decides something
        leftovers = (
            reads.leftovers(self.kube, name)
            if permitted and state.ready and state.unstick_taint is not None
            else None
        )
        verdict = decide_untaint(state, leftovers, policy.guards, permitted=permitted, now=now)
        return verdict, state

    # -- writes --------------------------------------------------------------------------

    def _write_node(self, name: str, body: JSON) -> tuple[str, str]:
        """The merge patch of the Node, sent once, with its resourceVersion as precondition."""
        try:
            self.kube.request(
                "PATCH",
                reads.node_path(name),
                body=body,
                content_type="application/merge-patch+json",
                retry=False,
            )
        except ApiException as exc:
            if exc.status == 409:
                return "conflict", (
                    f"node {name} changed since it was read (409); nothing written, decided "
                    "again on the next pass"
                )
            return "failed", f"({exc.status}) {exc.reason}"
        return "succeeded", ""

    def _result(
        self,
        record: rec.TaintRecord,
        action: str,
        result: str,
        message: str,
        phase: str | None,
        *,
        waiting_for: str | None = None,
        new: bool = False,
    ) -> None:
        now = self.clock()
        item = rec.entry(action, record.node, result, message, now)
        replace_last = (
            not new
            and record.last.get("action") == action
            and record.last.get("result") in (rec.TAINTING, rec.UNTAINTING)
        )
        rec.add_action(
            self.kube,
            record,
            item,
            replace_last=replace_last,
            phase=phase,
            waiting_for=waiting_for,
            at=now,
        )
        metrics.REMEDIATIONS.labels(action, str(Cause.NodeUnreachable), _label(result)).inc()
        log.info(
            "node=%s record=%s action=%s result=%s %s",
            record.node,
            record.key,
            action,
            result,
            message,
        )

    def _say(self, name: str, verdict: TaintVerdict) -> None:
        """A taint not taken, logged once per change of reason — and as an Event on the
        Node when it is notable: FAR or SNR manage the node, or a guard holds back a node
        proven off."""
        if self.said.get(name) == verdict.reason:
            return
        self.said[name] = verdict.reason
        log.info(
            "node=%s action=taint-out-of-service result=%s %s",
            name,
            "dry_run" if verdict.dry_run else "not-taken",
            verdict.reason,
        )
        if verdict.dry_run:
            metrics.REMEDIATIONS.labels(rec.TAINT, str(Cause.NodeUnreachable), "dry_run").inc()
        if verdict.notable:
            ref = {"apiVersion": "v1", "kind": "Node", "name": name, "namespace": ""}
            self.events.post(
                {},
                "OutOfServiceTaintNotApplied",
                verdict.reason,
                rfc3339(self.clock()),
                involved=ref,
            )

    def _event(self, state: NodeState, reason: str, message: str, kind: str) -> None:
        ref = {"apiVersion": "v1", "kind": "Node", "name": state.name, "namespace": ""}
        self.events.post({}, reason, message, rfc3339(self.clock()), involved=ref, event_type=kind)


def _applied_words(state: NodeState) -> str:
    """What unstick's mark on the Node says (for a record made at the removal)."""
    mark = state.applied
    if mark is None:
        return f"node {state.name} carries no mark of unstick"
    return (
        f"unstick applied the out-of-service taint to node {state.name} at {mark.time_added} "
        f"on the evidence of {mark.source} ({mark.obj}); its record {mark.record} is gone "
        "or closed"
    )


def _label(result: str) -> str:
    """The fixed results of unstick_remediations_total (design.md §7)."""
    if result == "succeeded":
        return "succeeded"
    if result in ("refused", "conflict"):
        return "refused"
    return "failed"
