"""Blocked replacements and blocked namespaces (docs/design.md §9), the controller's side.

What is watched (lean, no cluster-wide LIST per decision):
- Events with `fieldSelector=reason=FailedAttachVolume` and `reason=FailedMount` (one
  list+watch each; only Events about pods, newer than `EVENT_MAX_AGE_S`);
- VolumeAttachments (few: one per attached volume), kept in memory (PV → nodes);
- Namespaces (their phase), kept in memory.
A waiting pod named by such an Event is checked in this module's own thread: a fresh GET of
the pod and of its claims, the Terminating pods from the lean pod watcher's memory, the
VolumeAttachments from memory → `unstick.core.rules.aftermath.find_blocks`. For each block an
Event on the waiting pod (reason `BlockedReplacement`, once per blocker and cause) names
the blocker and what will free it, the holder's Remediation lists the waiter in
`status.waiters` (with how long it waited), and `unstick_blocked_replacements{namespace}`
counts the waiting pods. Blocked waiters are re-checked every `recheck_s`.

A Terminating namespace with stuck pods gets an Event (reason `NamespaceBlockedByStuckPods`,
in namespace `default`: a Terminating namespace accepts no new objects) naming them and
their causes, once per change; `unstick_blocked_namespaces` counts such namespaces.

Nothing here writes anything but Events and the holder's `status.waiters`: a
VolumeAttachment is never deleted or changed, nothing is detached.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from kubernetes.client.exceptions import ApiException

from unstick.controller.aftermath.held_namespaces import ApiBlockedNamespaces
from unstick.controller.deciding.kill_events import event_time
from unstick.controller.metrics import BLOCKED_NAMESPACES, BLOCKED_REPLACEMENTS, StuckPods
from unstick.controller.records import writer as records
from unstick.core.remediation import POD_UID, rfc3339
from unstick.core.rules.aftermath import (
    ATTACH_REASONS,
    FENCING_TAINT,
    Block,
    Claim,
    HolderState,
    PodRef,
    block_message,
    find_blocks,
    namespace_message,
    waiter_entry,
)
from unstick.kube.client import JSON, Kube
from unstick.kube.events import EventFeed, post_event
from unstick.kube.objectwatch import DictStore, ObjectWatcher
from unstick.kube.podwatch import TerminatingPod

log = logging.getLogger(__name__)

EVENT_MAX_AGE_S = 900.0  # older attach/mount failures are history, not a waiting pod
MAX_WAITERS = 20
PENDING_RECHECK_S = 2.0
VOLUME_ATTACHMENTS = "/apis/storage.k8s.io/v1/volumeattachments"


#: How the attach/detach controller says a volume is still attached elsewhere: "Multi-Attach
#: error for volume ..." up to Kubernetes 1.36; "Waiting for detach for volume ... Volume is
#: already exclusively attached to one node, waiting on detach before it can be attached to
#: another node" in 1.37 (seen in make test-matrix's kind run on v1.37.2).
MULTI_ATTACH = ("Multi-Attach", "already exclusively attached to one node")


@dataclass
class Waiting:
    """A pod that waits for a volume, as this process knows it."""

    ref: PodRef
    since: float
    last_event: float = 0.0
    reasons: set[str] = field(default_factory=set)
    blocks: tuple[Block, ...] = ()
    announced: set[tuple[str, ...]] = field(default_factory=set)


@dataclass
class Sources:
    """What the checks read from the controller's memory (no API call)."""

    terminating: Callable[[], list[TerminatingPod]]
    stuck: StuckPods
    node: Callable[[str], JSON | None]  # from the Node cache (fencing taint)
    gate: Callable[[], bool] = lambda: True  # False while another replica is active


class Aftermath:
    """Blocked replacements and blocked namespaces; one thread of its own."""

    def __init__(
        self,
        kube: Kube,
        sources: Sources,
        *,
        recheck_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube, self.sources, self.recheck_s, self.clock = kube, sources, recheck_s, clock
        self.attachments = DictStore()
        self.namespaces = DictStore()
        self.waiting: dict[str, Waiting] = {}
        self.ns_announced: dict[str, tuple[tuple[str, str], ...]] = {}
        self.api_blocked = ApiBlockedNamespaces(kube)  # namespaces a dead aggregated API holds
        self._due: dict[str, tuple[str, str, str, float, str]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.feeds = [EventFeed(kube, r, self.on_event) for r in ATTACH_REASONS]
        self.watchers = [
            ObjectWatcher(kube, VOLUME_ATTACHMENTS, self.attachments, self._changed, what="va"),
            ObjectWatcher(kube, "/api/v1/namespaces", self.namespaces, self._changed, what="ns"),
        ]
        self._pending = False  # a waiter's holder has no cause yet: look again soon
        self._thread = threading.Thread(target=self._run, name="aftermath", daemon=True)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        for watcher in self.watchers:
            watcher.start()
        for feed in self.feeds:
            feed.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for feed in self.feeds:
            feed.stop()
        for watcher in self.watchers:
            watcher.stop()
        self._thread.join(timeout=5)

    def _changed(self, _name: str, _old: JSON | None, _new: JSON | None) -> None:
        self._wake.set()

    def poke(self) -> None:
        """Something changed (a pod became stuck or went): look again soon."""
        self._wake.set()

    # -- events -> waiters ----------------------------------------------------------------

    def on_event(self, ev: JSON) -> None:
        """From an EventFeed thread: an attach/mount failure of a pod makes it due."""
        obj = ev.get("involvedObject") or {}
        when = event_time(ev)
        if obj.get("kind") != "Pod" or when is None or self.clock() - when > EVENT_MAX_AGE_S:
            return
        ns, name, uid = obj.get("namespace"), obj.get("name"), obj.get("uid")
        if not (isinstance(ns, str) and isinstance(name, str) and isinstance(uid, str)):
            return
        first = event_time({"firstTimestamp": ev.get("firstTimestamp")}) or when
        reason = str(ev.get("reason") or "")
        if any(words in str(ev.get("message") or "") for words in MULTI_ATTACH):
            reason = "Multi-Attach"
        with self._lock:
            self._due[uid] = (ns, name, uid, first, reason)
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(PENDING_RECHECK_S if self._pending else self.recheck_s)
            self._pending = False
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception:
                log.exception("aftermath pass failed")

    def run_once(self) -> None:
        """Check the waiters that are due or still blocked, then the namespaces."""
        if not self.sources.gate():
            return
        with self._lock:
            due, self._due = self._due, {}
        for uid, (ns, name, _uid, first, reason) in due.items():
            w = self.waiting.get(uid)
            if w is None:
                w = self.waiting[uid] = Waiting(PodRef(ns, name, uid, ""), first)
            w.since = min(w.since, first)
            w.last_event = self.clock()
            w.reasons.add(reason)
        for uid in list(self.waiting):
            self._check(self.waiting[uid])
        self._count_waiters()
        self.check_namespaces()

    # -- one waiter -----------------------------------------------------------------------

    def _check(self, w: Waiting) -> None:
        pod = self.kube.get(f"/api/v1/namespaces/{w.ref.namespace}/pods/{quote(w.ref.name)}")
        meta = (pod or {}).get("metadata") or {}
        if pod is None or meta.get("uid") != w.ref.uid or meta.get("deletionTimestamp"):
            self._clear(w)
            return
        if _started(pod):
            self._clear(w)
            return
        claims = tuple(
            c
            for v in (pod.get("spec") or {}).get("volumes") or []
            if isinstance(c := (v.get("persistentVolumeClaim") or {}).get("claimName"), str)
        )
        w.ref = PodRef(w.ref.namespace, w.ref.name, w.ref.uid, _node(pod), claims)
        blocks = find_blocks(w.ref, self._claims(w.ref), self._terminating(), self._attached())
        blocks = tuple(
            Block(b.waiter, b.claim, b.holder, b.attached_node, tuple(sorted(w.reasons)))
            for b in blocks
        )
        current = {b.holder.uid for b in blocks if b.holder}
        ended = [b for b in w.blocks if b.holder and b.holder.uid not in current]
        w.blocks = blocks
        for block in blocks:
            self._announce(w, pod, block)
        for block in ended:
            self._end_wait(w, block)
        if not blocks and self.clock() - w.last_event > EVENT_MAX_AGE_S:
            self.waiting.pop(w.ref.uid, None)  # no blocker known and no news: forget it

    def _clear(self, w: Waiting) -> None:
        for block in w.blocks:
            self._end_wait(w, block)
        self.waiting.pop(w.ref.uid, None)

    def _claims(self, ref: PodRef) -> dict[tuple[str, str], Claim]:
        out = {}
        for name in ref.claims:
            pvc = self.kube.get(
                f"/api/v1/namespaces/{ref.namespace}/persistentvolumeclaims/{quote(name)}"
            )
            if pvc is None:
                continue
            spec = pvc.get("spec") or {}
            modes = frozenset(m for m in spec.get("accessModes") or [] if isinstance(m, str))
            out[(ref.namespace, name)] = Claim(
                ref.namespace, name, spec.get("volumeName") or "", modes
            )
        return out

    def _terminating(self) -> list[PodRef]:
        return [
            PodRef(p.namespace, p.name, p.uid, p.node, tuple(c for _, c, _ in p.volumes if c))
            for p in self.sources.terminating()
        ]

    def _attached(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for va in list(self.attachments.objects.values()):
            spec = va.get("spec") or {}
            pv = (spec.get("source") or {}).get("persistentVolumeName")
            if isinstance(pv, str) and isinstance(spec.get("nodeName"), str):
                out.setdefault(pv, []).append(spec["nodeName"])
        return out

    def _holder_state(self, block: Block) -> tuple[HolderState, JSON | None]:
        holder = block.holder
        if holder is None:
            return HolderState(), None
        rem = self._remediation(holder)
        status = (rem or {}).get("status") or {}
        node = self.sources.node(holder.node) or {}
        taints = (node.get("spec") or {}).get("taints") or []
        fenced = any((t or {}).get("key") == FENCING_TAINT for t in taints)
        cause = str(status.get("cause") or self.sources.stuck.cause_of(holder.uid) or "")
        plan = tuple(str((s or {}).get("action")) for s in status.get("plan") or [])
        return HolderState(cause, plan, bool(status.get("optedIn")), fenced), rem

    def _remediation(self, holder: PodRef) -> JSON | None:
        for name in records.remediation_names(holder.name, holder.uid):
            rem = records.get_remediation(self.kube, holder.namespace, name)
            if rem is not None and (rem.get("spec") or {}).get(POD_UID) == holder.uid:
                return rem
        return None

    def _announce(self, w: Waiting, pod: JSON, block: Block) -> None:
        state, rem = self._holder_state(block)
        key = (
            block.claim.name,
            block.holder.uid if block.holder else block.attached_node,
            state.cause,
            str(state.fenced),
        )
        if block.holder is not None and not state.cause:
            self._pending = True  # the holder is not diagnosed yet: announce once it is
        elif key not in w.announced:
            w.announced.add(key)
            post_event(
                self.kube, _ref(pod, "Pod"), "BlockedReplacement", block_message(block, state)
            )
            log.info("pod=%s action=blocked-replacement %s", w.ref.key, block_message(block, state))
        if rem is not None:
            self._patch_waiters(rem, w, block, done=False)

    def _end_wait(self, w: Waiting, block: Block) -> None:
        """The waiter no longer waits for this holder: `until` on the holder's record."""
        if block.holder is None:
            return
        rem = self._remediation(block.holder)
        if rem is not None:
            self._patch_waiters(rem, w, block, done=True)

    def _patch_waiters(self, rem: JSON, w: Waiting, block: Block, *, done: bool) -> None:
        now = self.clock()
        entry = waiter_entry(block, rfc3339(w.since), now - w.since)
        if done:
            entry["until"] = rfc3339(now)
        current = [e for e in (rem.get("status") or {}).get("waiters") or [] if isinstance(e, dict)]
        kept = [e for e in current if not (e.get("uid") == w.ref.uid and "until" not in e)]
        if any(e.get("uid") == w.ref.uid and "until" in e for e in kept) and done:
            return
        new = [*kept, entry][-MAX_WAITERS:]
        if new == current:
            return
        try:
            records.patch_status(self.kube, rem, {"waiters": new})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _count_waiters(self) -> None:
        counts: dict[str, int] = {}
        for w in self.waiting.values():
            if w.blocks:
                counts[w.ref.namespace] = counts.get(w.ref.namespace, 0) + 1
        for ns in {*counts, *BLOCKED_SEEN}:
            BLOCKED_REPLACEMENTS.labels(ns).set(counts.get(ns, 0))
        BLOCKED_SEEN.update(counts)

    # -- namespaces -----------------------------------------------------------------------

    def check_namespaces(self) -> None:
        by_ns: dict[str, list[tuple[str, str]]] = {}
        for p in self.sources.terminating():
            cause = self.sources.stuck.cause_of(p.uid)
            if cause:
                by_ns.setdefault(p.namespace, []).append((p.name, cause))
        blocked = 0
        for name, ns in list(self.namespaces.objects.items()):
            if (ns.get("status") or {}).get("phase") != "Terminating" or not by_ns.get(name):
                self.ns_announced.pop(name, None)
                continue
            blocked += 1
            stuck = tuple(sorted(by_ns[name]))
            if self.ns_announced.get(name) != stuck:
                self.ns_announced[name] = stuck
                ref = _ref(ns, "Namespace")
                post_event(
                    self.kube, ref, "NamespaceBlockedByStuckPods", namespace_message(name, stuck)
                )
        BLOCKED_NAMESPACES.set(blocked)
        self.api_blocked.check(list(self.namespaces.objects.values()))


BLOCKED_SEEN: set[str] = set()  # namespaces the gauge has a series for


def _started(pod: JSON) -> bool:
    """The pod got its volumes: a container runs, or it already finished."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    statuses = status.get("containerStatuses") or []
    return any("running" in ((cs or {}).get("state") or {}) for cs in statuses)


def _node(pod: JSON) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _ref(obj: JSON, kind: str) -> JSON:
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": kind,
        "namespace": meta.get("namespace") or "",
        "name": meta.get("name"),
        "uid": meta.get("uid"),
    }
