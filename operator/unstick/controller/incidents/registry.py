"""Node incidents: one Remediation for the pods that one node-level fact holds
(docs/incidents.md).

When a node is deleted (NodeGone) or fenced while unreachable (NodeUnreachable with the
`node.kubernetes.io/out-of-service` taint), its opted-in pods share one diagnosis and one
fix, `force-delete`. A record and an Event per pod would cost more requests than the fix,
so they share ONE Remediation per (namespace, node, cause, policy), the *incident*:
`spec.incident` and `spec.nodeName` (no pod: it is no channel to an agent), a label
`pod.unstick.dev/<pod>` per pod, `status.pods` (name, uid, action, result, message, time,
goneAt), `podCount`/`podsGone`, `Remediating` until every pod is gone, then `Resolved`; one
Event when it opens and one when its pods are gone. A pod that stays (observed, dry run,
refused) keeps its own Remediation. Each pod is still decided and re-checked on its own
(controller/incidents/path.py) against a fresh read of its Node.

Record before act (design.md §3 invariant 10): a force-delete is first on record as an
intent (`result: deleting`, at the time its budget slot was taken) and the DELETE is sent
only once the record holding it is written — by one thread that writes every intent
pending at that moment in one status patch (a burst costs about one write per batch). The
DELETE's result follows at most every `FLUSH_S` per incident. A restarted controller
adopts the records it finds unresolved (controller/incidents/adoption.py).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from unstick.controller import failpoints
from unstick.controller.deciding.decision import Decision
from unstick.controller.incidents.record import (
    FLUSH_S,
    GATHER_S,
    GIVE_UP_AFTER,
    JOIN_WINDOW_S,
    MAX_BACKOFF_S,
    MAX_MESSAGE,
    MAX_PODS,
    Incident,
    IncidentPod,
    announce_resolved,
    create_record,
    patch_labels,
)
from unstick.controller.incidents.record import summary as incident_summary
from unstick.controller.records import writer as records
from unstick.controller.records.events import EventQueue
from unstick.core.remediation import DELETING, pod_label
from unstick.kube.actions import GONE
from unstick.kube.client import Kube
from unstick.kube.podwatch import TerminatingPod

log = logging.getLogger("unstick.decisions")


class Incidents:
    """The open incidents, in memory, and the thread that writes their records."""

    def __init__(self, kube: Kube, events: EventQueue, clock: Callable[[], float]) -> None:
        self.kube = kube
        self.events = events
        self.clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._written = threading.Condition(self._lock)  # a write finished (or failed)
        self._current: dict[tuple[str, str, str, str], Incident] = {}  # taking pods
        self._live: list[Incident] = []  # every incident not forgotten yet
        self._by_uid: dict[str, Incident] = {}
        # pods also listed by a second record of a dead controller (incidents/adoption.py): that
        # record notes when they go too, but never carries their action
        self._others: dict[str, list[Incident]] = {}
        self._sending: set[str] = set()  # intents whose DELETE's answer is still to come
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
            self._by_uid[record.uid] = inc
            self._touch(inc)
            return inc

    def _touch(self, inc: Incident, *, urgent: bool = False) -> None:
        """A change to write (under the lock); `urgent`: an intent waits for it."""
        inc.seq += 1
        inc.dirty = True
        if urgent and not inc.urgent:
            inc.urgent, inc.urgent_at = True, self.clock()
        self._wake.notify()

    def _new(
        self, key: tuple[str, str, str, str], record: TerminatingPod, dec: Decision, now: float
    ) -> Incident:
        namespace, node, cause, policy = key
        summary = incident_summary(record, dec)
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
        """`action` is on record as done for this pod (`succeeded`, or `gone`: settled by
        looking after its answer was lost) — restarts within a process never act twice: a
        pass that runs before the watch reports the pod gone does nothing."""
        with self._lock:
            inc = self._by_uid.get(uid)
            pod = inc.pods.get(uid) if inc is not None else None
            return pod is not None and pod.action == action and pod.result in ("succeeded", GONE)

    def intend(self, uid: str, action: str, at: float) -> tuple[Incident, int] | None:
        """Put the intent to act on the pod on record (`result: deleting`, at `at`: when its
        budget slot was taken); returns what `durable` waits for (None: no incident)."""
        with self._lock:
            inc = self._by_uid.get(uid)
            if inc is None:
                return None
            pod = inc.pods[uid]
            pod.action, pod.result, pod.at = action, DELETING, at
            self._sending.add(uid)
            pod.message = "decided; the DELETE is sent once this entry is on record"
            inc.waiting.pop(uid, None)
            self._touch(inc, urgent=True)
            return inc, inc.seq

    def durable(self, token: tuple[Incident, int], deadline: float) -> bool:
        """Wait until the record holding the intent is written: True once it is, False
        when that write failed or `deadline` (clock) passed first."""
        inc, seq = token
        with self._lock:
            while inc.written_seq < seq:
                left = deadline - self.clock()
                if inc.failed_seq >= seq or left <= 0 or self._stopping:
                    return False
                self._written.wait(timeout=left)
            return True

    def retract(self, uid: str) -> None:
        """The intent was not carried out (the API server refused the DELETE): no action on
        record for the pod until it is decided again."""
        with self._lock:
            self._sending.discard(uid)
            inc = self._by_uid.get(uid)
            if inc is not None and inc.pods[uid].result == DELETING:
                pod = inc.pods[uid]
                pod.action = pod.result = pod.message = ""
                pod.at = None
                self._touch(inc)
            if inc is not None and inc.pods[uid].gone_at is not None:  # went meanwhile
                del self._by_uid[uid]

    def outcome(self, uid: str, action: str, result: str, message: str, at: float) -> bool:
        """Record what was done to the pod (`at`: when its budget slot was taken, the time a
        restarted controller counts the grant at); False when the same result was on
        record."""
        with self._lock:
            self._sending.discard(uid)
            inc = self._by_uid.get(uid)
            if inc is None:
                return False
            pod = inc.pods[uid]
            if pod.gone_at is not None:  # the watch saw it go before this answer came
                del self._by_uid[uid]
            if (pod.action, pod.result) == (action, result):
                return False
            pod.action, pod.result, pod.message = action, result, message[:MAX_MESSAGE]
            pod.at = at
            inc.waiting.pop(uid, None)
            self._touch(inc)
            return True

    def waiting(self, uid: str, why: str) -> None:
        """The pod's action waits (for the rate-limit budget): the incident says so."""
        with self._lock:
            inc = self._by_uid.get(uid)
            if inc is not None and inc.waiting.get(uid) != why:
                inc.waiting[uid] = why
                self._touch(inc)

    def gone(self, uid: str, now: float) -> IncidentPod | None:
        """The pod left the API: noted in its incident (None: no incident holds it)."""
        with self._lock:
            for other in self._others.pop(uid, []):
                self._mark_gone(other, uid, now)
            if uid in self._sending and (inc := self._by_uid.get(uid)) is not None:
                # its DELETE's answer is on its way (a sender): `outcome` records it
                if inc.pods[uid].gone_at is None:
                    inc.pods[uid].gone_at = now
                    self._touch(inc)
                return inc.pods[uid]
            inc = self._by_uid.pop(uid, None)
            return None if inc is None else self._mark_gone(inc, uid, now)

    def _mark_gone(self, inc: Incident, uid: str, now: float) -> IncidentPod:
        pod = inc.pods[uid]
        if pod.gone_at is None:
            pod.gone_at = now
        if pod.result == DELETING:  # the DELETE's answer never made it to the record
            pod.result = GONE
            pod.message = (
                "gone when unstick looked again; its force-delete was on record as being "
                "sent (the answer was not): most likely that DELETE removed it"
            )
        inc.waiting.pop(uid, None)
        self._touch(inc)
        return pod

    # -- a restarted controller (adoption.py) -------------------------------------------

    def adopt(self, found: list[Incident]) -> None:
        """Carry on the unresolved records of a dead controller (before any pass runs): a
        pod they list stays in its record, and pods of the same node join them. A pod two
        records list is carried by one, the one that has its action (else the newer)."""
        with self._lock:
            for inc in sorted(found, key=lambda i: i.opened):
                self._live.append(inc)
                if len(inc.pods) < MAX_PODS:
                    self._current[(inc.namespace, inc.node, inc.cause, inc.policy)] = inc
                for uid, pod in inc.pods.items():
                    if pod.gone_at is not None:
                        continue
                    held = self._by_uid.get(uid)
                    if held is not None and held.pods[uid].action and not pod.action:
                        self._others.setdefault(uid, []).append(inc)
                        continue
                    if held is not None:
                        self._others.setdefault(uid, []).append(held)
                    self._by_uid[uid] = inc
                if inc.all_gone:
                    self._touch(inc)

    def settle(
        self, present: Callable[[str], bool], force_deleted: Callable[[str], bool], now: float
    ) -> tuple[int, list[tuple[str, float]]]:
        """Look at the pods of adopted records: a pod gone is noted (an intent without its
        answer becomes `gone`); a pod still there is decided again by its next pass. An
        intent whose pod is still there and was never force-deleted (its
        deletionGracePeriodSeconds is not 0) was not carried out: it is withdrawn, and
        returned as (node, time) so its budget grant is given back. Returns (how many
        pods were gone, those intents)."""
        with self._lock:
            absent = [uid for uid in self._by_uid if not present(uid)]
            unacted = []
            for uid, inc in self._by_uid.items():
                pod = inc.pods[uid]
                if present(uid) and pod.result == DELETING and not force_deleted(uid):
                    if pod.at is not None:
                        unacted.append((inc.node, pod.at))
                    pod.action = pod.result = pod.message = ""
                    pod.at = None
                    self._touch(inc)
        for uid in absent:
            self.gone(uid, now)
        return len(absent), unacted

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
                batch = [(inc, inc.snapshot(), inc.urgent) for inc in due]
                for inc in due:
                    inc.dirty = inc.urgent = False
                    inc.written_at = self.clock()
            for inc, copy, urgent in batch:
                # an intent's write carries only the status: new pods' labels follow
                # with the next regular write (at most FLUSH_S later)
                labels = self._new_labels(inc, copy)
                self._write(inc, copy, {} if urgent and inc.ref is not None else labels)
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
            pause = min(MAX_BACKOFF_S, FLUSH_S * 2**inc.failures)
            if inc.urgent and not inc.failures:  # the intents of GATHER_S go together
                left = inc.urgent_at + GATHER_S - now
            else:
                left = inc.written_at + pause - now
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

    def _write(self, inc: Incident, copy: Incident, labels: dict[str, str]) -> None:
        status = copy.status()
        try:
            failpoints.reached("incident-write")
            if inc.ref is None:
                create_record(self.kube, self.events, inc, labels, self.clock())
            elif labels:
                patch_labels(self.kube, inc, labels)
            inc.labelled.update(labels)
            if copy.seq > inc.written_seq:
                rem = {"metadata": {"namespace": inc.namespace, "name": inc.name}}
                records.patch_status(self.kube, rem, status)
        except Exception as exc:  # written again later, with all it holds by then
            self._failed(inc, copy.seq, exc)
            return
        with self._lock:
            inc.failures = 0
            inc.written_seq = max(inc.written_seq, copy.seq)
            if self._new_labels(inc, inc):  # labels left for the next regular write
                inc.dirty = True
            self._written.notify_all()
        failpoints.reached("incident-written")
        announce_resolved(self.events, inc, status, self.clock())

    def _failed(self, inc: Incident, seq: int, exc: Exception) -> None:
        if isinstance(exc, ApiException) and exc.status == 404:  # deleted: made again
            inc.ref, inc.labelled = None, set()
        with self._lock:
            inc.failures += 1
            inc.failed_seq = max(inc.failed_seq, seq)
            inc.dirty = not (inc.all_gone and inc.failures >= GIVE_UP_AFTER)
            self._written.notify_all()
        reason = f"({exc.status}) {exc.reason}" if isinstance(exc, ApiException) else str(exc)
        log.warning(
            "incident=%s/%s could not be written (%s)%s",
            inc.namespace,
            inc.name,
            reason,
            "" if inc.dirty else ": its pods are gone, giving up",
        )
        failpoints.reached("incident-backoff")
