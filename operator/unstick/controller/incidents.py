"""Node incidents: one Remediation for the pods that one node-level fact holds.

When a node is deleted (NodeGone) or is fenced while unreachable (NodeUnreachable with the
`node.kubernetes.io/out-of-service` taint), every opted-in pod on it has the same
diagnosis from the same fact and the same fix, `force-delete`, and is gone a moment
later. A record and an Event per pod would cost more API requests than the fix itself
(2,000 pods: ~6 requests each, where the DELETE is one). So these pods share ONE
Remediation per (namespace, node, cause, policy) — the *incident* — that lists each pod
with what was done to it and when it went (docs/incidents.md):

- `spec.incident` (the cause) and `spec.nodeName`; no `spec.podName`/`podUID`: it is no
  channel to an agent (NodeGone and fenced nodes have none) and no authority for anything;
- a label `pod.unstick.dev/<pod name>` per pod, so `kubectl get remediations -A -l
  pod.unstick.dev/<pod>` finds any one pod's story by its name (per-pod records carry
  the same label);
- `status.pods`: name, uid, action, result, message, time, goneAt; `status.podCount`,
  `podsGone`; phase `Remediating` until every listed pod is gone, then `Resolved`;
- one Event on the incident when it opens and one when all its pods are gone.

Only pods that would be force-deleted take this path (opted in, not dry-run, the plan is
exactly `force-delete`); a pod that stays (observed, dry run, refused) keeps its own
Remediation and its own Event, where its owner looks. Each pod's action is still decided
and re-checked on its own (controller/reconciler.py), against a fresh read of its Node.

The record is written off the action path by one thread, at most every `FLUSH_S` per
incident; what it holds is in memory until written. A restarted controller starts new
incidents for the pods still stuck; the older record stays as written.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.controller import records
from unstick.controller.inputs import rfc3339
from unstick.controller.nodeside import Decision, status_summary
from unstick.controller.records import POD_LABEL_PREFIX, EventQueue, pod_label
from unstick.core.vocabulary import Action, Cause
from unstick.kube.client import JSON, Kube, remediation_path
from unstick.kube.podwatch import TerminatingPod

log = logging.getLogger("unstick.decisions")

INCIDENT_CAUSES = frozenset({Cause.NodeGone, Cause.NodeUnreachable})
INCIDENT_LABEL = "unstick.dev/incident"
FLUSH_S = 1.0  # an incident's record is written at most this often
MAX_PODS = 500  # per record (the status schema's bound); more pods open another record
JOIN_WINDOW_S = 120.0  # pods of the same node join an incident this long after its last one
MAX_MESSAGE = 512
MAX_BACKOFF_S = 60.0
GIVE_UP_AFTER = 6  # failed writes in a row after which a record whose pods are gone is let go


def takes_incident_path(dec: Decision) -> bool:
    """The pod would be force-deleted because of its node, and nothing else is planned."""
    d = dec.diagnosis
    return (
        d.cause in INCIDENT_CAUSES
        and dec.opted_in
        and not dec.policy.dry_run
        and [s.action for s in dec.steps] == [Action.FORCE_DELETE]
    )


@dataclass
class IncidentPod:
    name: str
    uid: str
    stuck_since: float
    action: str = ""
    result: str = ""
    message: str = ""
    at: float | None = None
    gone_at: float | None = None

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "uid": self.uid}
        if self.action:
            out.update(action=self.action, result=self.result, message=self.message)
        if self.at is not None:
            out["time"] = rfc3339(self.at)
        if self.gone_at is not None:
            out["goneAt"] = rfc3339(self.gone_at)
        return out


@dataclass
class Incident:
    namespace: str
    node: str
    cause: str
    policy: str
    name: str
    summary: dict[str, Any]  # cause, evidence, plan, policy of the first pod's decision
    opened: float
    last_join: float
    pods: dict[str, IncidentPod] = field(default_factory=dict)
    ref: JSON | None = None  # the record once created (for its Events)
    labelled: set[str] = field(default_factory=set)
    waiting: dict[str, str] = field(default_factory=dict)  # uid → what its action waits for
    dirty: bool = True
    written_at: float = 0.0
    announced_resolved: int = -1  # pod count when "all gone" was last announced
    failures: int = 0  # writes failed in a row (each waits longer before the next)

    def snapshot(self) -> Incident:
        """A copy whose pods and waits later changes do not touch (taken under the lock)."""
        return replace(
            self,
            pods={uid: replace(p) for uid, p in self.pods.items()},
            waiting=dict(self.waiting),
        )

    @property
    def all_gone(self) -> bool:
        return bool(self.pods) and all(p.gone_at is not None for p in self.pods.values())

    def status(self) -> dict[str, Any]:
        pods = list(self.pods.values())
        gone = [p.gone_at for p in pods if p.gone_at is not None]
        resolved = self.all_gone
        return {
            **self.summary,
            "stuckSince": rfc3339(min(p.stuck_since for p in pods)),
            "phase": "Resolved" if resolved else "Remediating",
            "resolvedAt": rfc3339(max(gone)) if resolved and gone else None,
            "waitingFor": None if resolved else next(iter(self.waiting.values()), None),
            "podCount": len(pods),
            "podsGone": len(gone),
            "pods": [p.entry() for p in pods],
        }


class Incidents:
    """The open incidents, in memory, and the thread that writes their records."""

    def __init__(self, kube: Kube, events: EventQueue, clock: Callable[[], float]) -> None:
        self.kube = kube
        self.events = events
        self.clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._current: dict[tuple[str, str, str, str], Incident] = {}  # taking pods
        self._live: list[Incident] = []  # every incident not forgotten yet
        self._by_uid: dict[str, Incident] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- membership (worker threads) ----------------------------------------------------

    def join(self, record: TerminatingPod, dec: Decision, now: float) -> Incident:
        """The incident holding this pod (it joins one, opened if need be)."""
        with self._lock:
            held = self._by_uid.get(record.uid)
            if held is not None:
                return held
            key = (record.namespace, record.node, str(dec.diagnosis.cause), dec.policy.name)
            inc = self._current.get(key)
            if inc is None or len(inc.pods) >= MAX_PODS:
                inc = self._current[key] = self._new(key, record, dec, now)
                self._live.append(inc)
            stuck_since = record.deletion_timestamp + dec.policy.slack_s
            inc.pods[record.uid] = IncidentPod(record.name, record.uid, stuck_since)
            inc.last_join = now
            inc.dirty = True
            self._by_uid[record.uid] = inc
            self._wake.notify()
            return inc

    def _new(
        self, key: tuple[str, str, str, str], record: TerminatingPod, dec: Decision, now: float
    ) -> Incident:
        namespace, node, cause, policy = key
        summary = status_summary(record, dec)
        summary.pop("stuckSince", None)
        summary["plan"] = [  # the same step for each pod, whose target is the pod
            {**step, "target": "each pod in status.pods"} for step in summary["plan"]
        ]
        name = f"{(node or 'none')[:200].rstrip('.-')}-{cause.lower()}-{uuid.uuid4().hex[:8]}"
        log.info(
            "incident=%s/%s node=%s cause=%s action=diagnose result=remediating plan=force-delete",
            namespace,
            name,
            node,
            cause,
        )
        return Incident(namespace, node, cause, policy, name, summary, now, now)

    def holds(self, uid: str) -> bool:
        with self._lock:
            return uid in self._by_uid

    def succeeded(self, uid: str, action: str) -> bool:
        """`action` is on record as done for this pod (restarts within a process never
        act twice: a pass that runs before the watch reports the pod gone does nothing)."""
        with self._lock:
            inc = self._by_uid.get(uid)
            pod = inc.pods.get(uid) if inc is not None else None
            return pod is not None and (pod.action, pod.result) == (action, "succeeded")

    def outcome(self, uid: str, action: str, result: str, message: str, now: float) -> bool:
        """Record what was done to the pod; False when the same result was on record."""
        with self._lock:
            inc = self._by_uid.get(uid)
            if inc is None:
                return False
            pod = inc.pods[uid]
            if (pod.action, pod.result) == (action, result):
                return False
            pod.action, pod.result, pod.message = action, result, message[:MAX_MESSAGE]
            pod.at = now
            inc.waiting.pop(uid, None)
            inc.dirty = True
            self._wake.notify()
            return True

    def waiting(self, uid: str, why: str) -> None:
        """The pod's action waits (for the rate-limit budget): the incident says so."""
        with self._lock:
            inc = self._by_uid.get(uid)
            if inc is not None and inc.waiting.get(uid) != why:
                inc.waiting[uid] = why
                inc.dirty = True
                self._wake.notify()

    def gone(self, uid: str, now: float) -> IncidentPod | None:
        """The pod left the API: noted in its incident (None: no incident holds it)."""
        with self._lock:
            inc = self._by_uid.pop(uid, None)
            if inc is None:
                return None
            pod = inc.pods[uid]
            pod.gone_at = now
            inc.waiting.pop(uid, None)
            inc.dirty = True
            self._wake.notify()
            return pod

    # -- the writer thread ---------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="incidents", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is pending, then stop."""
        with self._lock:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                due, wait = self._due()
                while not due and not self._stopping:
                    self._wake.wait(timeout=wait)
                    due, wait = self._due()
                stopping = self._stopping
                if stopping:
                    due = [i for i in self._live if i.dirty]
                # copies taken under the lock, the record built outside it: the workers
                # adding outcomes never wait for the formatting of 100s of entries
                batch = [(inc, inc.snapshot()) for inc in due]
                for inc in due:
                    inc.dirty = False
                    inc.written_at = self.clock()
            for inc, copy in batch:
                self._write(inc, copy.status(), self._new_labels(inc, copy))
            if stopping:
                return
            self._forget_closed()

    def _due(self) -> tuple[list[Incident], float | None]:
        """Dirty incidents not written in the last FLUSH_S, and how long until the next."""
        now = self.clock()
        due, wait = [], None
        for inc in self._live:
            if not inc.dirty:
                continue
            left = inc.written_at + min(MAX_BACKOFF_S, FLUSH_S * 2**inc.failures) - now
            if left <= 0:
                due.append(inc)
            else:
                wait = left if wait is None else min(wait, left)
        return due, wait

    @staticmethod
    def _new_labels(inc: Incident, copy: Incident) -> dict[str, str]:
        labels = {pod_label(p.name): "" for p in copy.pods.values()}
        return {k: v for k, v in labels.items() if k not in inc.labelled}

    def _forget_closed(self) -> None:
        """Incidents whose pods are all gone and that took no pod for JOIN_WINDOW_S."""
        now = self.clock()
        with self._lock:
            closed = [
                i
                for i in self._live
                if not i.dirty and i.all_gone and now - i.last_join > JOIN_WINDOW_S
            ]
            for inc in closed:
                self._live.remove(inc)
                key = (inc.namespace, inc.node, inc.cause, inc.policy)
                if self._current.get(key) is inc:
                    del self._current[key]

    def _write(self, inc: Incident, status: dict[str, Any], labels: dict[str, str]) -> None:
        try:
            if inc.ref is None:
                self._create(inc, labels)
            elif labels:
                self.kube.request(
                    "PATCH",
                    remediation_path(inc.namespace, inc.name),
                    body={"metadata": {"labels": labels}},
                    content_type="application/merge-patch+json",
                )
            inc.labelled.update(labels)
            rem = {"metadata": {"namespace": inc.namespace, "name": inc.name}}
            records.patch_status(self.kube, rem, status)
        except Exception as exc:  # written again later, with all it holds by then
            self._failed(inc, exc)
            return
        inc.failures = 0
        self._announce(inc, status)

    def _failed(self, inc: Incident, exc: Exception) -> None:
        if isinstance(exc, ApiException) and exc.status == 404:  # deleted: made again
            inc.ref, inc.labelled = None, set()
        with self._lock:
            inc.failures += 1
            inc.dirty = not (inc.all_gone and inc.failures >= GIVE_UP_AFTER)
        reason = f"({exc.status}) {exc.reason}" if isinstance(exc, ApiException) else str(exc)
        log.warning(
            "incident=%s/%s could not be written (%s)%s",
            inc.namespace,
            inc.name,
            reason,
            "" if inc.dirty else ": its pods are gone, giving up",
        )

    def _create(self, inc: Incident, labels: dict[str, str]) -> None:
        body = {
            "apiVersion": records.API_VERSION,
            "kind": "Remediation",
            "metadata": {
                "name": inc.name,
                "namespace": inc.namespace,
                "labels": {
                    records.NODE_LABEL: inc.node or "none",
                    INCIDENT_LABEL: inc.cause.lower(),
                    **labels,
                },
            },
            "spec": {"nodeName": inc.node, "incident": inc.cause, "dryRun": False},
        }
        try:
            created = self.kube.request("POST", remediation_path(inc.namespace), body=body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            created = records.get_remediation(self.kube, inc.namespace, inc.name) or {}
            if (created.get("spec") or {}) != body["spec"]:  # not ours: another name
                inc.name = f"{inc.name}-{uuid.uuid4().hex[:4]}"
                raise RuntimeError("the record's name was taken; trying another") from exc
        meta = created.get("metadata") or {}
        inc.ref = {
            "apiVersion": records.API_VERSION,
            "kind": "Remediation",
            "namespace": inc.namespace,
            "name": inc.name,
            "uid": meta.get("uid"),
        }
        evidence = "; ".join(e["message"] for e in inc.summary.get("evidence", [])[:2])
        self.events.post(
            {},
            f"Stuck{inc.cause}",
            f"pods of node {inc.node} stuck in Terminating: {inc.cause}. {evidence}. "
            f"Plan: force-delete — remediating. This record lists each pod and what was "
            "done to it; find one with -l " + POD_LABEL_PREFIX + "<pod name>.",
            rfc3339(self.clock()),
            involved=inc.ref,
        )

    def _announce(self, inc: Incident, status: dict[str, Any]) -> None:
        if status["phase"] != "Resolved" or inc.announced_resolved == status["podCount"]:
            return
        inc.announced_resolved = status["podCount"]
        done = sum(
            1
            for p in status["pods"]
            if p.get("action") == "force-delete" and p.get("result") == "succeeded"
        )
        self.events.post(
            {},
            "IncidentResolved",
            f"all {status['podCount']} pods of node {inc.node} ({inc.cause}) are gone; "
            f"unstick force-deleted {done} of them.",
            rfc3339(self.clock()),
            involved=inc.ref,
            event_type="Normal",
        )
