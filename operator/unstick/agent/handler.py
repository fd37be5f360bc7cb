"""What the agent does for one Remediation of its node: probe, run node steps, report.

Decisions read only `spec` (written by the controller) and the agent's own `status` keys.
Bad input in a Remediation gets a clear message naming the field and never an action.

A Remediation is a channel, not an authority (design.md §3 invariant 7): whoever wrote it,
node steps are refused (each reported as `refused`, with the reason, in
`status.nodeActions`, and counted in `unstick_refusals_total{reason}`) unless, right
before they run:
- the request was fresh when it reached the agent: `spec.nodeStepsRequestedAt` is at most
  `max_request_age_s` older and at most `max_request_skew_s` newer than the moment the
  agent received it (its watch event or list). A request the agent missed while it was
  down, or an old one written again, arrives old and is refused; one that waited only in
  the agent's own queue is not (the pod and the policy are re-read right before acting
  anyway). A refused request as a whole is also noted in `status.nodeRefusals` (action
  `node-steps`, its reason, `time` = that answer's `nodeStepsDoneAt`): the controller
  asks again after a `stale` one;
- the pod is the one named: GET `spec.podName` in the Remediation's namespace exists, its
  uid is `spec.podUID`, it is bound to this node, and its deletionTimestamp is set and in
  the past (the pod is Terminating and overdue);
- the pod opted in, and the RemediationPolicy in force for it — read from the API
  (`authority.read_mandate`), never from the Remediation — serves its namespace, permits
  the action and is not in dry-run (then the steps are reported `dry_run`); `lazyUnmount`
  is the policy's too;
- the batch fits this node's budget (`authority.NodeBudget`).
A probe is only taken for a pod that passes the same pod check: the probe of any other UID
would write another pod's mounts, holders and containers into the asker's record. A probe
refused is noted in `status.nodeRefusals` (no probe is written). The checks themselves and
the refusal entries are in `agent/authority/request.py`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from unstick.agent.authority.rederive import NodeBudget, PolicySources, read_mandate
from unstick.agent.authority.request import (
    MAX_NODE_REFUSALS,
    NODE_STEPS,
    BadRemediation,
    as_obj,
    check_pod,
    check_request_age,
    parse_steps,
    pod_uid,
    refusal_entry,
    time_of,
    with_refusal,
)
from unstick.agent.authority.request import PROBE as PROBE_REFUSAL
from unstick.agent.holders.scan_group import shared_scans
from unstick.agent.keylocks import KeyLocks
from unstick.agent.probe.collect import probe_pod
from unstick.agent.round_trip import RoundTrip
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import DRY_RUN, REFUSED, Executor, StepResult
from unstick.core import remediation as rem
from unstick.core.policy.mandate import Mandate, permit
from unstick.core.remediation import rfc3339
from unstick.core.vocabulary import Action, Refusal

__all__ = [
    "CALLS_OUT",
    "MAX_NODE_REFUSALS",
    "NODE_STEPS",
    "BadRemediation",
    "Handler",
    "KeyLocks",
    "check_pod",
    "parse_steps",
]

log = logging.getLogger(__name__)

_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # DNS subdomain

JSON = dict[str, Any]
StatusPatcher = Callable[[str, str, JSON], None]  # (namespace, name, status patch)
PodLookup = Callable[[str, str], JSON | None]  # (namespace, name) -> the pod, None if absent

#: Reads nothing, so every pod counts as not opted in: the safe default for a Handler
#: built without access to namespaces and policies.
NO_POLICIES = PolicySources(namespace=lambda _name: None, policy=lambda _name: None)


# steps run one at a time on the node: the restart's once-an-hour check is not raced (CSI
# calls are serialised per volume by the executor, as the CSI spec asks)
CALLS_OUT = frozenset({"restart-kubelet"})


@dataclass
class Handler:
    """Handles Remediation events for this node; remembers what it already served so its
    own status patches (which come back as MODIFIED events) never re-trigger work."""

    settings: AgentSettings
    executor: Executor
    patch_status: StatusPatcher
    lookup_pod: PodLookup  # the agent GETs the pod from the API (loop.Agent.get_pod)
    policies: PolicySources = NO_POLICIES  # namespace and RemediationPolicy GETs
    budget: NodeBudget = field(default_factory=lambda: NodeBudget(cap=10))
    on_probe_duration: Callable[[float], None] = lambda _s: None
    on_refusal: Callable[[Refusal], None] = lambda _r: None  # unstick_refusals_total
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    # `clock()` in the API server's time, never later (loop.py: kube/server_clock.py): a
    # pod's deletionTimestamp is the API server's, so it is judged in its time (#31)
    server_time: Callable[[datetime], datetime] = lambda now: now
    served_probes: dict[str, str] = field(default_factory=dict)
    served_steps: dict[str, str] = field(default_factory=dict)
    # one batch of node steps per pod at a time (other pods' steps may run meanwhile: each
    # step re-checks its own preconditions right before it acts); the kubelet restart one
    # at a time on the node (its once-an-hour check is not raced); CSI calls one at a time
    # per volume (the CSI spec's rule), in the executor — no longer one at a time per node,
    # which made the replays of a burst wait for each other
    pod_locks: KeyLocks = field(default_factory=KeyLocks)
    call_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def round_trip(self) -> RoundTrip:
        """The mandate's path (design.md §11), on this handler's checks and steps."""
        return RoundTrip(self)

    def probe(self, uid: str) -> JSON:
        """Probe the pod: the mount table from the executor's view (re-read only when the
        kernel says it changed, agent/probe/mount_table.py), the holder scan shared with the
        checks of other pods asked at the same time (one started after each asked)."""
        started = time.monotonic()
        try:
            table = self.executor.checks.pod_table(uid)
            with shared_scans(self.executor.checks.holder_scans):
                return probe_pod(self.settings, uid, now=self.clock(), table=table)
        finally:
            self.on_probe_duration(time.monotonic() - started)

    def handle(self, obj: JSON, received: datetime | None = None) -> None:
        """React to one Remediation (ADDED/MODIFIED or listed) that the agent `received`
        at that time (its watch event or list; None: now) — the request's age is judged
        then, not after the agent's own queue (docs/agent.md, "Request age")."""
        meta = obj.get("metadata") or {}
        ns, name, key = meta.get("namespace"), meta.get("name"), meta.get("uid") or ""
        if not isinstance(ns, str) or not isinstance(name, str):
            return
        spec = as_obj(obj.get("spec"))
        status = as_obj(obj.get("status"))
        if spec.get(rem.INCIDENT):
            return  # a node incident (docs/incidents.md) asks no agent anything
        try:
            self._handle(ns, name, key, spec, status, received=received or self.clock())
        except BadRemediation as exc:
            log.warning("remediation %s/%s: %s", ns, name, exc)

    def _handle(
        self, ns: str, name: str, key: str, spec: JSON, status: JSON, *, received: datetime
    ) -> None:
        node = spec.get(rem.NODE_NAME)
        if node not in (None, self.settings.node_name):
            raise BadRemediation(f"spec.{rem.NODE_NAME}: {node!r} is not this node")
        uid = pod_uid(spec)
        steps_at_raw = spec.get(rem.NODE_STEPS_REQUESTED_AT)
        steps_at = time_of(spec, rem.NODE_STEPS_REQUESTED_AT, f"spec.{rem.NODE_STEPS_REQUESTED_AT}")
        done_at = time_of(status, rem.NODE_STEPS_DONE_AT, f"status.{rem.NODE_STEPS_DONE_AT}")
        steps_due = steps_at and (done_at is None or steps_at > done_at)
        if steps_at and steps_due and self.served_steps.get(key) != steps_at_raw:
            self.served_steps[key] = str(steps_at_raw)
            if spec.get(rem.MANDATE) is not None:  # one round trip (design.md §11)
                self.round_trip.serve(ns, name, uid, spec, status, asked=(steps_at, received))
            else:
                self._run_steps(ns, name, uid, spec, status, asked=(steps_at, received))
            return
        probe_at_raw = spec.get(rem.PROBE_REQUESTED_AT)
        probe_at = time_of(spec, rem.PROBE_REQUESTED_AT, f"spec.{rem.PROBE_REQUESTED_AT}")
        probe = as_obj(status.get(rem.PROBE))
        probed_at = time_of(probe, rem.PROBED_AT, f"status.{rem.PROBE}.{rem.PROBED_AT}")
        probe_due = probe_at and (probed_at is None or probe_at > probed_at)
        if probe_due and self.served_probes.get(key) != probe_at_raw:
            self.served_probes[key] = str(probe_at_raw)
            try:
                self.checked_pod(ns, spec)
            except BadRemediation as exc:
                log.warning("remediation %s/%s: probe refused: %s", ns, name, exc)
                self._refuse_probe(ns, name, status, exc)
                return
            self.patch_status(ns, name, {rem.PROBE: self.probe(uid)})

    def _refuse_probe(self, ns: str, name: str, status: JSON, exc: BadRemediation) -> None:
        """No probe for a pod that fails the pod check: a refusal on record instead."""
        self.on_refusal(exc.refusal)
        entry = refusal_entry(PROBE_REFUSAL, exc.refusal, str(exc), self.clock())
        self.patch_status(ns, name, {rem.NODE_REFUSALS: with_refusal(status, entry)})

    def checked_pod(self, ns: str, spec: JSON) -> JSON:
        """The pod named in spec, from the API: this uid, on this node, overdue Terminating."""
        name = spec.get(rem.POD_NAME)
        if not isinstance(name, str) or not _POD_NAME.fullmatch(name):
            raise BadRemediation(f"spec.{rem.POD_NAME}: missing or not a pod name")
        try:
            pod = self.lookup_pod(ns, name)
        except Exception as exc:  # API down, forbidden, ...: never act on an unchecked pod
            status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
            why = f"{status} {reason}" if status else f"{type(exc).__name__}: {exc}"
            raise BadRemediation(
                f"spec.{rem.POD_NAME}: cannot GET pod {name!r}: {why}", Refusal.UNSAFE
            ) from None
        check_pod(pod, spec, self.settings.node_name, self.server_time(self.clock()))
        assert pod is not None
        return pod

    def _check_request(self, ns: str, spec: JSON, asked: tuple[datetime, datetime]) -> Mandate:
        """The request (`asked`: its time and when the agent received it) was fresh when
        it came and names an overdue Terminating pod of this node; returns the policy in
        force for that pod, read from the API."""
        check_request_age(asked[0], asked[1], self.settings)
        pod = self.checked_pod(ns, spec)
        return read_mandate(self.policies, ns, pod)

    def _refused(self, action: str, target: str, refusal: Refusal, message: str) -> StepResult:
        result = DRY_RUN if refusal is Refusal.DRY_RUN else REFUSED
        return StepResult(action, target, result, message, rfc3339(self.clock()))

    def _refuse_all(
        self, steps: list[tuple[str, str]], refusal: Refusal, message: str
    ) -> list[StepResult]:
        """Every step of the request refused for one reason: one refusal in the metric (a
        request refused, whatever its length)."""
        self.on_refusal(refusal)
        return [self._refused(a, t, refusal, message) for a, t in steps]

    def _authorised(
        self, ns: str, spec: JSON, asked: tuple[datetime, datetime], steps: list[tuple[str, str]]
    ) -> tuple[list[StepResult], Mandate | Refusal, float | None]:
        """(refusals, why, seconds until the node budget has room again when that is why)
        or ([], the mandate every step is permitted under, None)."""
        try:
            m = self._check_request(ns, spec, asked)
        except BadRemediation as exc:
            return self._refuse_all(steps, exc.refusal, str(exc)), exc.refusal, None
        for action, _target in steps:
            narrowed = permit(m, Action(action))
            if not narrowed:
                assert narrowed.refusal is not None
                why = narrowed.refusal
                return self._refuse_all(steps, why, narrowed.message), why, None
        assert m.policy is not None
        limit = m.policy.rate_limits.node_per_minute
        wait = self.budget.try_take(self.clock().timestamp(), limit)
        if wait > 0:
            message = (
                # with retryAfterSeconds on record: the controller asks again
                # (controller/agent_channel/node_steps.py)
                f"rate limit: this node's budget ({min(limit, self.budget.cap)} per minute: "
                f"RemediationPolicy {m.policy.name!r} allows {limit}, the agent's "
                f"--max-node-actions-per-minute {self.budget.cap}, or a stricter policy's "
                f"in the last minute) is used up for {wait:.0f}s"
            )
            refused = self._refuse_all(steps, Refusal.POLICY_FORBIDS, message)
            return refused, Refusal.POLICY_FORBIDS, wait
        return [], m, None

    def act(self, uid: str, steps: list[tuple[str, str]], *, lazy: bool) -> list[StepResult]:
        """Run the steps in order until one fails or is refused (see `pod_locks`)."""
        with self.pod_locks.held(uid):
            return self._act_held(uid, steps, lazy=lazy)

    def _act_held(self, uid: str, steps: list[tuple[str, str]], *, lazy: bool) -> list[StepResult]:
        results = []
        for action, target in steps:
            with self.call_lock if action in CALLS_OUT else contextlib.nullcontext():
                result = self.executor.run_step(
                    uid, action, target, dry_run=False, lazy_unmount=lazy
                )
            results.append(result)
            if result.result == REFUSED:
                self.on_refusal(Refusal.UNSAFE)
            if result.result in ("failed", "refused"):
                break
        return results

    def _run_steps(
        self,
        ns: str,
        name: str,
        uid: str,
        spec: JSON,
        status: JSON,
        *,
        asked: tuple[datetime, datetime],
    ) -> None:
        results: list[StepResult] = []
        why: Refusal | None = None
        retry_after: float | None = None  # refused for the node budget: room again then
        try:
            steps = parse_steps(spec)
        except BadRemediation as exc:
            results = self._refuse_all([("(none)", "")], exc.refusal, str(exc))
            steps, why = [], exc.refusal
        m: Mandate | None = None
        if steps:
            results, granted, retry_after = self._authorised(ns, spec, asked, steps)
            if isinstance(granted, Refusal):
                log.warning(
                    "remediation %s/%s: node steps refused: %s", ns, name, results[0].message
                )
                steps, why = [], granted
            else:
                m = granted
        lazy = bool(m is not None and m.policy is not None and m.policy.lazy_unmount)
        results.extend(self.act(uid, steps, lazy=lazy))
        done = max(self.clock(), asked[0])  # never earlier than the request (clock skew)
        patch: JSON = {
            rem.NODE_ACTIONS_FIELD: [r.to_json() for r in results],
            rem.NODE_STEPS_DONE_AT: rfc3339(done),
        }
        if why is not None:  # the request as a whole, with its reason (the controller's cue)
            entry = refusal_entry(
                NODE_STEPS, why, results[0].message, done, retry_after_s=retry_after
            )
            patch[rem.NODE_REFUSALS] = with_refusal(status, entry)
        if m is not None:  # a refused request gets no probe either (same pod check)
            try:
                patch[rem.PROBE] = self.probe(uid)
            except Exception as exc:  # steps are reported even if the probe fails
                log.warning("probe after node steps failed: %s", exc)
        self.patch_status(ns, name, patch)
