"""The pod's own Remediation, from its first pass to the pod leaving: found (only the
record whose identity is the pod's — identity.identity_mismatch), created at the pod's
name or, when a record that is not the pod's holds it, at the alternate name; a record
that is not the pod's marked `Refused`; and, when the pod is gone, marked `Resolved` with
the agent's results no pass recorded yet (a late answer of the agent is recorded when it
lands). Node incidents keep their own records (controller/incidents/registry.py).

`PodRecords` is the reconciler's collaborator for that: it reads and writes only through
the one writer (writer.py `RecordWriter`, which remembers the records this process keeps
and their copies), and gets the record of our own requests to the agent (`AgentRequests`)
and the Remediation index — nothing else of the reconciler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from unstick.controller import metrics
from unstick.controller.records import identity
from unstick.controller.records.agent_answers import (
    LateActions,
    answered_plan,
    late_agent_actions,
    steps_cause,
    steps_diagnosis,
    steps_pending,
)
from unstick.controller.records.writer import (
    RecordWriter,
    Stale,
    get_remediation,
    patch_status,
    remediation_names,
)
from unstick.core.remediation import (
    FINAL_PHASES,
    INCIDENT,
    POD_NAME,
    POD_UID,
    PROBE_REQUESTED_AT,
    Phase,
    rfc3339,
)
from unstick.core.vocabulary import Refusal
from unstick.kube.client import JSON, Kube, pod_path
from unstick.kube.podwatch import TerminatingPod

log = logging.getLogger("unstick.decisions")

AWAITING_REMEMBERED = 1000  # pods gone while the agent ran their steps, remembered
# Writes of Resolved for one pod gone, each onto a fresh read after the one before met a
# newer version; then the runtime tries again later (controller/runtime.py).
RESOLVE_ATTEMPTS = 8


def log_resolved(record: TerminatingPod, now: float) -> None:
    """A pod seen stuck is gone: the time-to-resolution histogram and the decision log."""
    metrics.TIME_TO_RESOLUTION.observe(max(0.0, now - record.deletion_timestamp))
    log.info(
        "pod=%s uid=%s action=resolve result=pod-gone after %.1fs",
        record.key,
        record.uid,
        now - record.deletion_timestamp,
    )


def resolved_status(rem: JSON, now: float) -> tuple[dict[str, Any], LateActions | None]:
    """The status keys that mark `rem` Resolved at `now`, with the agent's results no pass
    recorded yet (counted by the caller once the write succeeded: LateActions.count)."""
    final: dict[str, Any] = {
        "phase": Phase.Resolved,
        "resolvedAt": rfc3339(now),
        "waitingFor": None,
    }
    late = late_agent_actions(rem, now)
    if late is not None:
        final["actions"] = late.actions
    # gone before a pass read the agent's answer to a mandate (its results not recorded
    # yet): the cause its plan names, not the one the record had before the answer
    cause = steps_cause(rem)
    recorded = (rem.get("status") or {}).get("cause")
    if late is not None and answered_plan(rem) is not None and recorded != cause:
        final.update(steps_diagnosis(rem))
    return final, late


def left_behind(found: list[JSON], listed: Callable[[str], bool]) -> list[JSON]:
    """The pods' own Remediations among `found` (not node incidents) not `Resolved` or
    `Refused` whose pod the pod watch did not list as Terminating (`listed`: by pod uid):
    their pods may have gone while no controller ran (resolve_left_behind)."""
    left: list[JSON] = []
    for rem in found:
        spec, status = rem.get("spec") or {}, rem.get("status") or {}
        uid, name = spec.get(POD_UID), spec.get(POD_NAME)
        if spec.get(INCIDENT) or status.get("phase") in FINAL_PHASES:
            continue
        if isinstance(uid, str) and uid and isinstance(name, str) and name and not listed(uid):
            left.append(rem)
    return left


def resolve_left_behind(kube: Kube, left: list[JSON], now: float) -> int:
    """Start-up (controller/startup.py): mark `Resolved` each record of `left_behind` whose
    pod is gone — a fresh GET of `spec.podName` answers 404 or with another uid — as its
    pod watch would have, had a controller run when the pod went. Nothing is observed in
    the time-to-resolution histogram: when the pod went is not known. A record whose pod
    is there is left alone (its pass decides). Returns how many were marked; an API error
    leaves the records as they were (a warning: the next start looks again)."""
    resolved = 0
    for index, rem in enumerate(left):
        meta = rem.get("metadata") or {}
        try:
            if _resolve_left_behind(kube, rem, now):
                resolved += 1
        except ApiException as exc:
            log.warning(
                "remediation=%s/%s not checked for a pod gone while no controller ran, or "
                "not marked Resolved: (%s) %s",
                meta.get("namespace"),
                meta.get("name"),
                exc.status,
                exc.reason,
            )
        except Exception as exc:  # the API server unreachable: the rest stay as they are
            log.warning(
                "records of pods gone while no controller ran not checked (%s): %d left as "
                "they were",
                exc,
                len(left) - index,
            )
            break
    return resolved


def _resolve_left_behind(kube: Kube, rem: JSON, now: float) -> bool:
    spec = rem.get("spec") or {}
    meta = rem.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    pod = kube.get(pod_path(namespace, str(spec[POD_NAME])))
    if pod is not None and (pod.get("metadata") or {}).get("uid") == spec[POD_UID]:
        return False  # the pod is there: decided by its pass (or checked: stray_records.py)
    for attempt in range(1, RESOLVE_ATTEMPTS + 1):
        final, late = resolved_status(rem, now)
        version = str((rem.get("metadata") or {}).get("resourceVersion") or "")
        try:
            patch_status(kube, rem, final, resource_version=version)
            if late is not None:
                late.count()
        except ApiException as exc:
            if exc.status == 404:
                return False  # deleted meanwhile: nothing to mark
            if exc.status != 409 or attempt == RESOLVE_ATTEMPTS:
                raise
            fresh = get_remediation(kube, namespace, name)  # changed: decide again
            if fresh is None or (fresh.get("status") or {}).get("phase") in FINAL_PHASES:
                return False
            rem = fresh
            continue
        log.info(
            "pod=%s/%s uid=%s action=resolve result=pod-gone while no controller ran "
            "(remediation=%s)",
            namespace,
            spec[POD_NAME],
            spec[POD_UID],
            name,
        )
        return True
    return False


class AgentRequests(Protocol):
    """When this controller asked the agent about each pod, in memory
    (controller/agent_channel/trust.py `ProbeRequests`)."""

    def asked(self, uid: str, now: float) -> None: ...
    def last(self, uid: str) -> float | None: ...
    def forget(self, uid: str) -> None: ...


class PodRecords:
    def __init__(
        self,
        clock: Callable[[], float],
        *,
        writer: RecordWriter,
        requests: AgentRequests,
        has_remediation: Callable[[str], bool],
    ) -> None:
        self.clock = clock
        self.writer = writer
        self.known = writer.known  # the Remediations this process read or wrote, by pod uid
        self.requests = requests
        self.has_remediation = has_remediation  # the Remediation watch knows one
        # Pods gone while the agent was still running their node steps: pod uid →
        # (namespace, pod name); its answer is recorded when it lands (record_late_answer).
        self.awaiting_agent: dict[str, tuple[str, str]] = {}

    def create(
        self,
        record: TerminatingPod,
        name: str,
        dry_run: bool,
        now: float,
        *,
        ask_probe: bool,
        request: JSON | None = None,
    ) -> tuple[JSON | None, str | None]:
        """Create the pod's Remediation at `name`, or at the next name when a record that is
        not the pod's is found there (marked Refused); (None, None) when every name is
        taken so. With `ask_probe` the creation is the probe request too
        (`spec.probeRequestedAt`); with `request` (spec keys: a mandate, design.md §11)
        that request. Remembered as ours only when this POST created it."""
        names = remediation_names(record.name, record.uid)
        asked = {PROBE_REQUESTED_AT: rfc3339(now)} if ask_probe else {}
        if request is not None:
            asked = {k: v for k, v in request.items() if v is not None}
        for candidate in names[names.index(name) :] if name in names else (name,):
            rem = self.writer.create(
                record.namespace,
                record.name,
                record.uid,
                node=record.node,
                dry_run=dry_run,
                name=candidate,
                spec=asked,
            )
            why = identity.identity_mismatch(rem, record)
            if why is None:
                spec = rem.get("spec") or {}
                if asked and all(spec.get(k) == v for k, v in asked.items()):
                    self.requests.asked(record.uid, now)  # the record we just created
                return rem, candidate
            self.refuse(rem, why, now)  # someone else's record holds that name
        log.warning(
            "pod=%s uid=%s every Remediation name of the pod is taken by a record that is "
            "not the pod's (marked Refused): observing only",
            record.key,
            record.uid,
        )
        return None, None

    def find(self, record: TerminatingPod, now: float) -> tuple[JSON | None, str | None]:
        """(the pod's Remediation or None, the name it has or gets); name None when every
        name is taken by a record that is not the pod's (each is marked Refused)."""
        names: tuple[str, ...] = remediation_names(record.name, record.uid)
        known = self.known.get(record.uid)
        if known is None and not self.has_remediation(record.uid):
            return None, names[0]
        if known is not None:
            names = (known[1], *[n for n in names if n != known[1]])
        for name in names:
            rem = self.writer.read(record.namespace, name)
            if rem is None:
                return None, name
            why = identity.identity_mismatch(rem, record)
            if why is None:
                return rem, name
            self.refuse(rem, why, now)
        return None, None

    def refuse(self, rem: JSON, why: str, now: float) -> None:
        """Mark a Remediation that is not the record of its pod `Refused`, saying why."""
        status = rem.get("status") or {}
        refusals = identity.add_refusal(
            list(status.get("refusals") or []), "(record)", Refusal.FORGED, why, rfc3339(now)
        )
        if refusals is None and status.get("phase") == Phase.Refused:
            return
        meta = rem.get("metadata") or {}
        log.warning(
            "remediation=%s/%s result=refused (forged): %s",
            meta.get("namespace"),
            meta.get("name"),
            why,
        )
        patch: dict[str, Any] = {"phase": Phase.Refused, "waitingFor": None}
        if refusals is not None:
            patch["refusals"] = refusals
        try:
            self.writer.patch(rem, patch, guarded=False)  # identity is immutable (CEL)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def record_late_answer(self, uid: str, namespace: str, name: str) -> None:
        """The agent answered node steps of a pod that is gone meanwhile: record and count
        its results in the Resolved Remediation (once)."""
        if uid not in self.awaiting_agent:
            return
        rem = self.writer.get(namespace, name)
        if rem is None or (rem.get("spec") or {}).get(POD_UID) != uid or steps_pending(rem):
            return
        late = late_agent_actions(rem, self.clock())
        if late is not None:
            self.writer.patch_status(rem, {"actions": late.actions})
            late.count()
        # only once recorded: a write that failed (a timeout, a newer version of the
        # record) leaves the pod awaited, and the next event of its record tries again
        self.awaiting_agent.pop(uid, None)

    def resolve(self, record: TerminatingPod, now: float) -> bool:
        """The pod is gone: its Remediation phase Resolved (kept as the audit trail), with
        the agent's results no pass recorded yet; none is written for a pod never seen
        stuck. False when every write met a newer version of the record (others — the
        agent's answer, the pod's last pass — kept writing it): the caller tries again
        later, so a record is never left Remediating for a pod that is gone."""
        asked_agent = self.requests.last(record.uid) is not None
        self.requests.forget(record.uid)
        known = self.known.get(record.uid)
        try:
            return self._resolve(record, now, known, asked_agent=asked_agent)
        finally:  # the pod is gone: its record's copy is not needed any more
            self.writer.forget(record.uid)

    def _resolve(
        self,
        record: TerminatingPod,
        now: float,
        known: tuple[str, str, str] | None,
        *,
        asked_agent: bool,
    ) -> bool:
        if known is not None and asked_agent:
            # The agent may have reported node steps that no pass has recorded yet (the
            # kubelet removes the pod right after them): read the record once to count them.
            namespace, name, phase = known
            found = self.writer.read(namespace, name)  # its copy: the write below is guarded
            rem: JSON | None = (
                found
                if found is not None and identity.identity_mismatch(found, record) is None
                else {"metadata": {"namespace": namespace, "name": name}, "status": {}}
            )
        elif known is not None:  # written or read by this process: no need to read it again
            namespace, name, phase = known
            rem = {"metadata": {"namespace": namespace, "name": name}, "status": {}}
        elif self.has_remediation(record.uid):
            rem = None
            for name in remediation_names(record.name, record.uid):
                found = self.writer.get(record.namespace, name)
                if found is not None and identity.identity_mismatch(found, record) is None:
                    rem = found
                    break
            if rem is None:
                return True
            phase = (rem.get("status") or {}).get("phase") or ""
        else:
            return True  # never seen stuck: no Remediation
        if phase == Phase.Resolved or rem is None:
            return True
        for attempt in range(1, RESOLVE_ATTEMPTS + 1):
            try:
                self._mark_resolved(record, rem, now)
                break
            except Stale as exc:  # the copy was older than the record: read it again
                fresh = None if exc.status == 404 else self.writer.get(*exc.record)
                if fresh is None:  # someone deleted the Remediation meanwhile: nothing to mark
                    break
                if attempt == RESOLVE_ATTEMPTS:
                    log.warning(
                        "pod=%s uid=%s the pod is gone but its Remediation %s/%s changed under "
                        "each of %d writes of Resolved: trying again later",
                        record.key,
                        record.uid,
                        *exc.record,
                        RESOLVE_ATTEMPTS,
                    )
                    return False
                rem = fresh
            except ApiException as exc:
                if exc.status != 404:
                    raise
                break  # someone deleted the Remediation meanwhile: nothing to mark
        # A Remediation exists only for pods seen stuck: this pod counts for the histogram.
        log_resolved(record, now)
        return True

    def _mark_resolved(self, record: TerminatingPod, rem: JSON, now: float) -> None:
        """Phase Resolved, with the agent's results no pass recorded yet; written onto the
        version `rem` is a copy of when it has one (writer.py)."""
        final, late = resolved_status(rem, now)
        if steps_pending(rem):  # the agent's answer comes after the pod went: await it
            self.awaiting_agent[record.uid] = (record.namespace, record.name)
            while len(self.awaiting_agent) > AWAITING_REMEMBERED:
                self.awaiting_agent.pop(next(iter(self.awaiting_agent)))
        rem["status"] = {}  # write all these keys: a merge patch of our own keys only
        self.writer.patch(rem, final, nulls=True)  # waitingFor goes (sent as null)
        if late is not None:  # counted once written (a 409 raised above: not written)
            late.count()
