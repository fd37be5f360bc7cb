"""The agent's half of one round trip (design.md §11): its own diagnosis and plan on its
own fresh probe, cut to the controller's mandate and the policy in force.

The diagnosis and the planner are the core's, the controller's own (pure, no I/O): the
agent hands them a snapshot bundle of what it read itself — the pod from the API (GET),
its own node by name (`bundle`), the probe it just took, and, for the pod's CSI volumes,
the driver the kubelet recorded in each volume dir's `vol_data.json` (the file the replay
of a NodeUnpublishVolume reads too; the controller reads the same driver from the
volume's PersistentVolume). Nothing is taken from the Remediation but the mandate, a permission
that only narrows (`unstick.core.policy.mandate.mandated_steps`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from unstick.agent.authority.rederive import NodeBudget, PolicySources, read_mandate
from unstick.agent.authority.request import (
    NODE_STEPS,
    BadRemediation,
    check_request_age,
    refusal_entry,
    with_refusal,
)
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import DRY_RUN, REFUSED, StepResult
from unstick.agent.steps.vol_data import driver_at
from unstick.core import remediation as rem
from unstick.core.model.kubelet_paths import CSI_PLUGIN
from unstick.core.model.snapshot import BundleError, parse_bundle
from unstick.core.policy.mandate import Mandate, Mandated, mandated_steps, within
from unstick.core.policy.planner import Step, plan
from unstick.core.remediation import (
    API_VERSION,
    SNAPSHOT_KIND,
    NodeMandate,
    NodePlan,
    NodeStep,
    RemediationError,
    parse_mandate,
    parse_node_plan,
    rfc3339,
    time_or_none,
)
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import Cause, Refusal


class Served(Protocol):
    """What the round trip uses of the agent's Handler (agent/handler.py): its settings,
    API sources, node budget, status patches, refusal counter and clock, its probe, its
    pod check and its steps (one batch per pod, each step re-checked by the executor)."""

    @property
    def settings(self) -> AgentSettings: ...
    @property
    def policies(self) -> PolicySources: ...
    @property
    def budget(self) -> NodeBudget: ...
    @property
    def patch_status(self) -> Callable[[str, str, JSON], None]: ...
    @property
    def on_refusal(self) -> Callable[[Refusal], None]: ...
    @property
    def clock(self) -> Callable[[], datetime]: ...

    def probe(self, uid: str) -> JSON: ...

    def checked_pod(self, ns: str, spec: JSON) -> JSON: ...

    def act(self, uid: str, steps: list[tuple[str, str]], *, lazy: bool) -> list[StepResult]: ...


log = logging.getLogger(__name__)

JSON = dict[str, Any]
_DIR_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class OwnPlan:
    """The agent's diagnosis (its cause) and its plan within the mandate."""

    cause: Cause
    mandated: Mandated
    planned: tuple[Step, ...]  # the whole plan of the diagnosis, before the cut


def csi_drivers(kubelet_root: str, uid: str) -> list[JSON]:
    """The pod's CSI volumes as PersistentVolume stubs `{metadata.name: <volume dir>,
    spec.csi.driver: <vol_data.json driverName>}` — the shape of a bundle's
    `persistentVolumes`. Read without following symlinks and without entering a mount
    (only the volume dir and its `vol_data.json`); what cannot be read is left out (the
    driver is then unknown and no replay is planned)."""
    base = os.path.join(kubelet_root, "pods", uid, "volumes", CSI_PLUGIN)
    try:
        names = sorted(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            dfd = os.open(os.path.join(base, name), _DIR_FLAGS)
        except OSError:
            continue
        try:
            driver = driver_at(dfd)
        finally:
            os.close(dfd)
        if driver is not None:
            out.append({"metadata": {"name": name}, "spec": {"csi": {"driver": driver}}})
    return out


def bundle(pod: JSON, node: str, probe: JSON, now: datetime, pvs: list[JSON]) -> JSON:
    """The snapshot bundle of design.md §6 from what the agent read itself. Its Node is
    only its name: the agent runs on it and the pod is bound to it (the Node's state in
    the API — gone, not Ready, fenced — is the controller's to judge, and it gives no
    mandate for such a node; the agent's RBAC reads no Node). With no Ready condition and
    no creation time the core counts it neither gone nor lost, and no node-side rule or
    step reads more of it."""
    return {
        "apiVersion": API_VERSION,
        "kind": SNAPSHOT_KIND,
        "capturedAt": rfc3339(now),
        "pod": {"apiVersion": "v1", "kind": "Pod", **pod},
        "node": {"metadata": {"name": node}},
        "persistentVolumes": pvs,
        "probe": probe,
    }


def own_plan(facts_bundle: JSON, granted: NodeMandate, m: Mandate) -> OwnPlan:
    """The core's diagnosis and plan of the bundle under the policy in force (`m`, judged
    by `mandate.within`), cut to the mandate. BundleError when the bundle is unusable."""
    assert m.policy is not None
    facts = parse_bundle(facts_bundle)
    d = diagnose(facts, m.policy.settings)
    p = plan(d, m.policy, opted_in=True)
    return OwnPlan(d.cause, mandated_steps(p.steps, granted, m), p.steps)


#: The message of a step planned and on record when the agent stopped (killed) before its
#: result was written: the next agent settles it by looking (design.md §3 invariant 10).
SETTLED_DONE = (
    "settled by looking: the agent stopped after recording this step; a fresh probe no "
    "longer calls for it"
)
SETTLED_LEFT = (
    "settled by looking: the agent stopped after recording this step; a fresh probe still "
    "calls for it (not carried out, or not to the end); the controller asks again"
)


@dataclass(frozen=True, slots=True)
class _Request:
    """The mandate request being served: its Remediation and its time."""

    ns: str
    name: str
    uid: str  # the pod's
    status: JSON  # the Remediation's status as received
    at: datetime  # spec.nodeStepsRequestedAt


class RoundTrip:
    """Serves one mandate request of a Remediation (the Handler's checks, probe, executor,
    budget and status patches): refusal, or probe + plan on record in one status write,
    then each step right after its own re-check, then the results with a probe taken
    after them in one more write."""

    def __init__(self, handler: Served) -> None:
        self.h = handler

    def serve(
        self,
        ns: str,
        name: str,
        uid: str,
        spec: JSON,
        status: JSON,
        *,
        asked: tuple[datetime, datetime],
    ) -> None:
        h = self.h
        r = _Request(ns, name, uid, status, asked[0])
        try:
            granted = parse_mandate(spec)
            recorded = parse_node_plan(status)
        except RemediationError as exc:
            self._refuse(r, Refusal.FORGED, str(exc))
            return
        assert granted is not None  # served only for a spec with a mandate
        if recorded is not None and recorded.requested_at == asked[0]:
            # This request's plan is on record without its results: an agent stopped
            # between its record and its results. Never acted on again: settled by looking.
            self._settle(ns, name, uid, spec, recorded)
            return
        try:
            check_request_age(asked[0], asked[1], h.settings)
            pod = h.checked_pod(ns, spec)
        except BadRemediation as exc:
            self._refuse(r, exc.refusal, str(exc))
            return
        m = within(
            granted,
            read_mandate(h.policies, ns, pod, policy_version=granted.policy_version),
            pod_uid=uid,
            node=h.settings.node_name,
        )
        if not m or m.policy is None:
            assert m.refusal is not None
            self._refuse(r, m.refusal, m.message)
            return
        probe = h.probe(uid)
        try:
            own = own_plan(self._bundle(pod, probe), granted, m)
        except (BundleError, BadRemediation) as exc:
            self._refuse(r, Refusal.UNSAFE, str(exc))
            return
        if own.cause is Cause.NotStuck:  # the controller's clock ran ahead of this node's
            why = (
                "the pod is not stuck yet by this node's clock (RemediationPolicy "
                f"{m.policy.name!r} slackSeconds after its deletionTimestamp): asked again"
            )
            self._refuse(r, Refusal.STALE, why)
            return
        self._carry_out(r, granted, m, own, probe)

    # --- the two writes ----------------------------------------------------------------

    def _carry_out(
        self, r: _Request, granted: NodeMandate, m: Mandate, own: OwnPlan, probe: JSON
    ) -> None:
        h = self.h
        requested = r.at
        assert m.policy is not None
        cut = own.mandated
        results = [self._refused(s, r, why) for s, r, why in cut.refused]
        steps = list(cut.steps)
        why: Refusal | None = None
        retry_after: float | None = None
        if steps and cut.dry_run:
            results += [
                self._refused(s, Refusal.DRY_RUN, "dry run: nothing changed") for s in steps
            ]
            steps = []
        elif steps and granted.slots < 1:
            message = f"spec.{rem.MANDATE}.slots: 0: no node-budget slot granted for the steps"
            results += [self._refused(s, Refusal.POLICY_FORBIDS, message) for s in steps]
            steps, why = [], Refusal.POLICY_FORBIDS
        elif steps:
            limit = m.policy.rate_limits.node_per_minute
            wait = h.budget.try_take(h.clock().timestamp(), limit)
            if wait > 0:
                message = (
                    f"rate limit: this node's budget ({min(limit, h.budget.cap)} per minute) "
                    f"is used up for {wait:.0f}s"
                )
                results += [self._refused(s, Refusal.POLICY_FORBIDS, message) for s in steps]
                steps, why, retry_after = [], Refusal.POLICY_FORBIDS, wait
        for _, refusal, _ in cut.refused:
            h.on_refusal(refusal)
        node_plan = NodePlan(
            requested,
            str(own.cause),
            tuple(NodeStep(s.action, s.target, s.reason) for s in steps),
            1 if steps else 0,
        )
        if not steps:  # nothing to carry out: the plan and its answer in one write
            # answered as of the probe (nothing ran after it: it is the after-probe too)
            done = max(time_or_none(probe.get(rem.PROBED_AT)) or h.clock(), requested)
            patch: JSON = {
                rem.PROBE: probe,
                rem.NODE_PLAN: node_plan.to_json(),
                rem.NODE_ACTIONS_FIELD: [r.to_json() for r in results],
                rem.NODE_STEPS_DONE_AT: rfc3339(done),
            }
            if why is not None and results:
                entry = refusal_entry(
                    NODE_STEPS, why, results[-1].message, done, retry_after_s=retry_after
                )
                patch[rem.NODE_REFUSALS] = with_refusal(r.status, entry)
            h.patch_status(r.ns, r.name, patch)
            return
        # record before act (design.md §3 invariant 10): the probe and the plan first
        intent: JSON = {rem.PROBE: probe, rem.NODE_PLAN: node_plan.to_json()}
        if _refers_to_a_plan(r.status):  # an older plan's results go with that plan
            intent[rem.NODE_ACTIONS_FIELD] = None
        h.patch_status(r.ns, r.name, intent)
        lazy = m.policy.lazy_unmount
        acted = h.act(r.uid, [(str(s.action), s.target) for s in steps], lazy=lazy)
        self._answer(r, [x.to_json() for x in results] + _of_plan(acted))

    def _answer(self, r: _Request, results: list[JSON]) -> None:
        """The results and a probe taken after them, in one write."""
        h = self.h
        done = max(h.clock(), r.at)  # never earlier than the request (clock skew)
        patch: JSON = {
            rem.NODE_ACTIONS_FIELD: results,
            rem.NODE_STEPS_DONE_AT: rfc3339(done),
        }
        try:
            patch[rem.PROBE] = h.probe(r.uid)
        except Exception as exc:  # the results are reported even if the probe fails
            log.warning("probe after node steps failed: %s", exc)
        h.patch_status(r.ns, r.name, patch)

    def _settle(self, ns: str, name: str, uid: str, spec: JSON, recorded: NodePlan) -> None:
        """Each step of a plan on record without results, judged by a fresh probe: the
        plan of a diagnosis on it still has the step (left) or not (done)."""
        h = self.h
        try:
            pod = h.checked_pod(ns, spec)
        except BadRemediation as exc:
            message = f"not settled: {exc}"
            results = [self._result(s, REFUSED, message) for s in recorded.steps]
            h.patch_status(
                ns,
                name,
                {
                    rem.NODE_ACTIONS_FIELD: _of_plan(results),
                    rem.NODE_STEPS_DONE_AT: rfc3339(max(h.clock(), recorded.requested_at)),
                },
            )
            return
        probe = h.probe(uid)
        m = read_mandate(h.policies, ns, pod)
        try:
            facts = parse_bundle(self._bundle(pod, probe))
        except (BundleError, BadRemediation) as exc:
            still = {(s.action, s.target) for s in recorded.steps}
            log.warning("settling %s/%s: %s", ns, name, exc)
        else:
            d = diagnose(facts, m.policy.settings if m.policy else None)
            still = {(s.action, s.target) for s in plan(d, m.policy if m else None).steps}
        results = [
            self._result(s, "failed", SETTLED_LEFT)
            if (s.action, s.target) in still
            else self._result(s, "succeeded", SETTLED_DONE)
            for s in recorded.steps
        ]
        h.patch_status(
            ns,
            name,
            {
                rem.PROBE: probe,
                rem.NODE_ACTIONS_FIELD: _of_plan(results),
                rem.NODE_STEPS_DONE_AT: rfc3339(max(h.clock(), recorded.requested_at)),
            },
        )

    def _refuse(self, r: _Request, why: Refusal, message: str) -> None:
        """The request refused as a whole, on record (nothing probed, planned or run)."""
        h = self.h
        log.warning("remediation %s/%s: mandate refused: %s", r.ns, r.name, message)
        h.on_refusal(why)
        done = max(h.clock(), r.at)
        result = StepResult("(none)", "", REFUSED, message, rfc3339(done))
        entry = refusal_entry(NODE_STEPS, why, message, done)
        h.patch_status(
            r.ns,
            r.name,
            {
                rem.NODE_ACTIONS_FIELD: [result.to_json()],
                rem.NODE_STEPS_DONE_AT: rfc3339(done),
                rem.NODE_REFUSALS: with_refusal(r.status, entry),
            },
        )

    # --- helpers -------------------------------------------------------------------------

    def _bundle(self, pod: JSON, probe: JSON) -> JSON:
        h = self.h
        uid = str((pod.get("metadata") or {}).get("uid"))
        pvs = csi_drivers(h.settings.kubelet_root, uid)
        return bundle(pod, h.settings.node_name, probe, h.clock(), pvs)

    def _result(self, step: Step | NodeStep, result: str, message: str) -> StepResult:
        return StepResult(str(step.action), step.target, result, message, rfc3339(self.h.clock()))

    def _refused(self, step: Step, refusal: Refusal, message: str) -> StepResult:
        return self._result(step, DRY_RUN if refusal is Refusal.DRY_RUN else REFUSED, message)


def _of_plan(results: list[StepResult]) -> list[JSON]:
    """The results of the plan's steps, in its order, as `status.nodeActions` entries that
    name the step (`step`: its index in `status.nodePlan.steps`) instead of repeating its
    target: the target is on record once, in the plan (issue 34, a lean record;
    `unstick.core.remediation.node_results` reads them back with their targets)."""
    return [
        {"action": x.action, rem.STEP: i, "result": x.result, "message": x.message, "time": x.time}
        for i, x in enumerate(results)
    ]


def _refers_to_a_plan(status: JSON) -> bool:
    """`status.nodeActions` holds results that name a step of the plan on record: a new
    plan must not be written under them (they would name its steps)."""
    entries = status.get(rem.NODE_ACTIONS_FIELD)
    return isinstance(entries, list) and any(isinstance(e, dict) and rem.STEP in e for e in entries)


__all__ = ["BundleError", "OwnPlan", "RoundTrip", "bundle", "csi_drivers", "own_plan"]
