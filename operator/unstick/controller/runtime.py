"""The controller's asyncio side: lean watcher → scheduler → reconcile workers.

- The pod watcher thread reports terminating pods; each gets a due time in the scheduler
  (deletionTimestamp + its policy's slack), so the loop wakes exactly when a pod becomes
  stuck. No periodic full scans, no per-pod API timers.
- A due pod is first diagnosed from memory (`Detector.detect`, in a small pool of its
  own: detection never waits behind the actions of a burst), then reconciled in a
  worker thread (the client is blocking), at most one pass at a time per pod and
  `workers` in total; a pass returns the next due time for that pod.
- Lean list+watches of Nodes and CSINodes (one thread each) feed their caches and poke
  the pods of a node whose readiness, taints or CSI drivers changed; the lean Remediation
  watch (records/watch.py, not Kopf's: its per-event work was most of the controller's
  CPU in a burst) feeds the index of pod uids that have a Remediation and the writer's
  copies, and pokes a pod when its agent wrote a probe or finished node steps
  (`remediation_event`).
- `poke(uid)` (the agent answered; a Node changed) makes a pod due now.

The parts it drives are built in wiring.py; what happens before the first pass (policies,
the budget rebuilt, incidents adopted) is startup.py; the check of records that no stuck
pod backs is records/stray_records.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from unstick.controller import retention
from unstick.controller.aftermath.watcher import Aftermath, Sources
from unstick.controller.agent_channel.trust import usable_probe
from unstick.controller.deciding.policies import PolicyBook, opt_in
from unstick.controller.incidents.out_of_service import OutOfService
from unstick.controller.logfilter import log_retried_failure
from unstick.controller.reconciler import ReconcileSettings
from unstick.controller.records import writer as records
from unstick.controller.records.stray_records import RecordChecks
from unstick.controller.records.watch import RemediationWatch
from unstick.controller.scheduler import Scheduler
from unstick.controller.startup import before_first_pass
from unstick.controller.wiring import wire
from unstick.core.remediation import NODE_STEPS_DONE_AT, POD_UID, PROBE, PROBED_AT
from unstick.kube.client import JSON, Kube
from unstick.kube.objectwatch import ObjectWatcher
from unstick.kube.podwatch import PodWatcher, TerminatingPod, WatchSettings

log = logging.getLogger(__name__)

PAUSED_RETRY_S = 5.0  # while this replica does not hold the lease, look again this often
RESOLVE_RETRY_S = 10.0  # a pod gone whose record could not be marked Resolved: again then,
RESOLVE_TRIES = 30  # at most this many times (5 minutes)
DEFAULT_WORKERS = 32
GONE_REMEMBERED = 10_000  # uids of pods seen leaving, so their records are not suspected
DETECT_THREADS = 2  # in-memory diagnosis: CPU only (GIL), a second one for PVC reads


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    workers: int = DEFAULT_WORKERS
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
    watch: WatchSettings = field(default_factory=WatchSettings)
    retention_s: float = 0.0  # finished Remediations removed after this (0: kept for ever)


class Runtime:
    def __init__(
        self,
        kube: Kube,
        policies: PolicyBook,
        settings: RuntimeSettings,
        clock: Callable[[], float] = time.time,
        gate: Callable[[], bool] = lambda: True,
    ) -> None:
        self.kube = kube
        # False while this replica does not hold the leader Lease (controller/leader.py): no
        # pass is dispatched and nothing is resolved; the watches and caches stay warm
        self.gate = gate
        self.policies = policies
        self.settings = settings
        self.clock = clock
        parts = wire(kube, policies, settings.reconcile, clock)
        self.nodes, self.csi_nodes = parts.nodes, parts.csi_nodes
        self.remediations = parts.remediations  # pod uids with a Remediation (the watch)
        self.probes: dict[str, Any] = {}  # pod uid → status.probe of its Remediation
        # pod uid → (probe.probedAt, nodeStepsDoneAt) of its record as last seen: a change
        # is an answer of the agent, which pokes the pod
        self.agent_marks: dict[str, tuple[Any, Any]] = {}
        self.events, self.incidents = parts.events, parts.incidents
        self.detector, self.reconciler = parts.detector, parts.reconciler
        self.kill_events = parts.kill_events
        self.volume_watches = parts.volume_watches  # bound claims and volumes (caches.py)
        self.scheduler = Scheduler()
        self.pods: dict[str, TerminatingPod] = {}
        self._running: set[str] = set()
        self._again: set[str] = set()
        self._resolve_after: dict[str, TerminatingPod] = {}
        self._gone: OrderedDict[str, None] = OrderedDict()  # uids seen leaving, newest last
        self._stopping = False
        self._wake = asyncio.Event()
        self._pool = ThreadPoolExecutor(
            max_workers=settings.workers, thread_name_prefix="reconcile"
        )
        self._slots = asyncio.Semaphore(settings.workers)
        self._detect_pool = ThreadPoolExecutor(
            max_workers=DETECT_THREADS, thread_name_prefix="detect"
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.watchers: list[PodWatcher] = []
        # design.md §9: blocked replacements and namespaces (controller/aftermath/watcher.py).
        self.aftermath = Aftermath(
            kube,
            Sources(
                terminating=lambda: list(self.pods.copy().values()),
                stuck=self.detector.stuck,
                node=self.nodes.peek,
                gate=self.gate,
            ),
        )
        self.record_checks = RecordChecks(
            kube,
            clock,
            self.gate,
            own_record=self._own_record,
            seen_leaving=self._gone.__contains__,
            refuse=self.reconciler.refuse_record,
            spawn=self._spawn,
            loop=lambda: self._loop,
        )
        self.remediation_watch = RemediationWatch(
            kube,
            settings.namespaces,
            self._record_from_thread,
            watch_timeout_s=settings.watch.watch_timeout_s,
            page_size=settings.watch.page_size,
        )
        # taint-out-of-service / untaint-out-of-service (docs/fencing.md), a thread of its own.
        # Its times are compared with server-written ones (a Node's conditions, a taint's
        # timeAdded, an SNR's timeAssumedRebooted): judged by the API server's clock, never
        # later than it reads (kube/server_clock.py), as the NodeGone slack is.
        self.out_of_service = OutOfService(
            kube,
            policies,
            self.nodes.objects,
            self.events,
            clock=lambda: kube.server_clock.server_now(clock()),
            gate=self.gate,
        )
        self.object_watchers = [
            ObjectWatcher(
                kube, "/api/v1/nodes", self.nodes, self._object_from_thread, what="node watch"
            ),
            ObjectWatcher(
                kube,
                "/apis/storage.k8s.io/v1/csinodes",
                self.csi_nodes,
                self._object_from_thread,
                what="csinode watch",
            ),
        ]

    # -- inputs -----------------------------------------------------------------------

    def pod_changed(self, uid: str, record: TerminatingPod | None) -> None:
        """From the watcher thread, via call_soon_threadsafe."""
        if record is None:
            self.probes.pop(uid, None)
            self._gone[uid] = None
            while len(self._gone) > GONE_REMEMBERED:
                self._gone.popitem(last=False)
            gone = self.pods.pop(uid, None)
            self.scheduler.cancel(uid)
            if gone is not None:
                self.aftermath.poke()  # a holder may have gone: its waiters look again
            if gone is not None and uid in self._running:
                self._resolve_after[uid] = gone  # never concurrently with its reconcile
            elif gone is not None and self.gate():
                self._spawn(self._resolve(gone))
            elif gone is not None:  # a standby: a leader marks it (startup.py, left_behind)
                self.reconciler.detector.forget(uid)
            return
        known = self.pods.get(uid)
        if known is not None and known.deletion_timestamp < record.deletion_timestamp:
            # A force delete moves deletionTimestamp to "now"; keep the first one, which
            # time-to-resolution and stuckSince are measured from.
            record = replace(record, deletion_timestamp=known.deletion_timestamp)
        self.pods[uid] = record
        if known == record:  # only a newer resourceVersion (kept for the preconditions)
            return
        slack = self.policies.timing(_policy_name(record.remediate)).slack_s
        due = self.detector.due(record, slack)  # in server time (deciding/detector.py)
        if known is not None:
            due = max(due, self.clock())  # something changed: look again (once stuck)
            self.scheduler.schedule_earliest(uid, due)
        else:
            self.scheduler.schedule(uid, due)
        self._wake.set()

    def poke(self, uid: str) -> None:
        if uid in self.pods:
            self.scheduler.schedule_earliest(uid, self.clock())
            self._wake.set()

    def node_changed(self, name: str, old: JSON | None, new: JSON | None) -> None:
        """A Node or CSINode changed (loop thread): look again at its pods if it matters."""
        if _mark(old) != _mark(new):
            self.poke_node(name)
            self.out_of_service.poke()

    def poke_node(self, node: str) -> None:
        for uid, record in self.pods.items():
            if record.node == node:
                self.poke(uid)

    def remediation_event(self, body: JSON, deleted: bool) -> None:
        """From the Remediation watch (loop thread): a record changed or went. The raw
        object, a plain dict; nothing here changes it (the writer's copies are copies)."""
        uid = (body.get("spec") or {}).get(POD_UID)
        if not uid or not isinstance(uid, str):
            return
        if deleted:
            self.agent_marks.pop(uid, None)
            self.remediation_changed(uid, None)
            return
        self.remediation_changed(uid, body)
        status = body.get("status") or {}
        mark = ((status.get(PROBE) or {}).get(PROBED_AT), status.get(NODE_STEPS_DONE_AT))
        if self.agent_marks.get(uid) != mark:
            self.agent_marks[uid] = mark
            if any(mark):
                self.poke(uid)

    def remediation_changed(self, uid: str, body: Any | None) -> None:
        """A record of pod `uid` (None: gone): index the pod uid, keep the agent's probe."""
        writer = self.reconciler.writer  # a pass reads the record from its copies
        if body is None:
            self.remediations.discard(uid)
            self.probes.pop(uid, None)
            if (known := self.reconciler.known.get(uid)) is not None:
                writer.drop(known[0], known[1])
            return
        self.remediations.add(uid)
        if uid in self.pods:  # offered before the poke below: a poked pass sees this version
            writer.offer(body)
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if uid in self.reconciler.awaiting_agent and (body.get("status") or {}).get(
            NODE_STEPS_DONE_AT
        ):
            self._spawn(self._record_late_answer(uid, *key))
        if self._own_record(uid, key) is False:
            self.record_checks.maybe_check(uid, body)  # a second record: its probe is not used
            return
        probe = (body.get("status") or {}).get(PROBE)
        if probe and uid in self.pods:
            self.probes[uid] = probe
        else:
            self.probes.pop(uid, None)
        self.record_checks.maybe_check(uid, body)

    def _own_record(self, uid: str, key: tuple[str, str]) -> bool | None:
        """Is `key` the Remediation this controller keeps for pod `uid`? None: the pod is
        not one it holds."""
        known = self.reconciler.known.get(uid)
        if known is not None:
            return key == (known[0], known[1])
        record = self.pods.get(uid)
        if record is None:
            return None
        return key[0] == record.namespace and key[1] in records.remediation_names(record.name, uid)

    def synced(self) -> bool:
        """Every pod watcher and the Remediation watch have delivered their first list."""
        return self.remediation_watch.synced() and all(w.synced.is_set() for w in self.watchers)

    def policies_changed(self) -> None:
        """Slack may have changed: recompute every pod's first due time."""
        for uid, record in self.pods.items():
            slack = self.policies.timing(_policy_name(record.remediate)).slack_s
            self.scheduler.schedule_earliest(uid, self.detector.due(record, slack))
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.remediation_watch.start()
        for object_watcher in self.object_watchers:
            object_watcher.start()
        for volume_watch in self.volume_watches:
            volume_watch.start()
        self.aftermath.start()
        self.incidents.start()
        self.kill_events.start()  # the kubelet's FailedKillPod Events, for the bundles
        self.out_of_service.start()
        namespaces = self.settings.namespaces or (None,)
        for ns in namespaces:
            settings = WatchSettings(
                namespace=ns,
                page_size=self.settings.watch.page_size,
                watch_timeout_s=self.settings.watch.watch_timeout_s,
            )
            watcher = PodWatcher(self.kube, settings, self._from_thread)
            self.watchers.append(watcher)
            watcher.start()
        log.info(
            "controller running: watching pods in %s",
            ", ".join(self.settings.namespaces) or "all namespaces",
        )
        await before_first_pass(
            self.kube,
            self.policies,
            self.reconciler,
            self.incidents,
            namespaces=self.settings.namespaces,
            clock=self.clock,
            gate=self.gate,
            synced=self.synced,
            pods=self.pods,
        )
        self._spawn(  # finished records past their retention (retention.py)
            retention.keep_removing(
                self.kube,
                self.settings.namespaces,
                self.settings.retention_s,
                clock=self.clock,
                gate=self.gate,
                terminating=lambda: set(self.pods),
            )
        )
        try:
            while True:
                now = self.clock()
                for uid in self.scheduler.pop_due(now):
                    self._dispatch(uid)
                next_due = self.scheduler.next_due()
                timeout = None if next_due is None else max(0.0, next_due - self.clock())
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=timeout)
                except TimeoutError:
                    pass
        finally:
            self._stopping = True
            stops: list[Callable[[], None]] = [w.stop for w in self.watchers]
            stops += [w.stop for w in self.object_watchers]
            stops += [w.stop for w in self.volume_watches]
            stops.append(self.remediation_watch.stop)
            stops.append(self.aftermath.stop)
            stops.append(self.reconciler.incident_path.stop)  # its senders need the writer
            stops.append(self.incidents.stop)
            stops.append(self.kill_events.stop)
            stops.append(self.out_of_service.stop)
            for stop in stops:
                await asyncio.to_thread(stop)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._detect_pool.shutdown(wait=False, cancel_futures=True)
            await asyncio.to_thread(self.events.close)

    def _from_thread(self, uid: str, record: TerminatingPod | None) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.pod_changed, uid, record)

    def _record_from_thread(self, body: JSON, deleted: bool) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.remediation_event, body, deleted)

    def _object_from_thread(self, name: str, old: JSON | None, new: JSON | None) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.node_changed, name, old, new)

    def _dispatch(self, uid: str) -> None:
        if not self.gate():
            self.scheduler.schedule(uid, self.clock() + PAUSED_RETRY_S)
            return
        if uid in self._running:
            self._again.add(uid)
            return
        record = self.pods.get(uid)
        if record is not None:
            self._running.add(uid)
            self._spawn(self._reconcile(uid, record))

    async def _record_late_answer(self, uid: str, namespace: str, name: str) -> None:
        """The agent's late answer put on record (a thread: blocking API calls); a failure
        is logged, and the pod stays awaited for its record's next event."""
        try:
            await asyncio.to_thread(self.reconciler.record_late_answer, uid, namespace, name)
        except Exception:
            log.exception("late answer of the agent for %s/%s not recorded yet", namespace, name)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        if self._stopping:
            coro.close()
            return
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reconcile(self, uid: str, record: TerminatingPod) -> None:
        next_due: float | None = None
        loop = asyncio.get_running_loop()
        ids = (record.key, uid)
        try:
            # Only a probe bound to this pod and to our own request (trust.usable_probe).
            probe = usable_probe(self.probes.get(uid), record, self.reconciler.requests.first(uid))
            await loop.run_in_executor(
                self._detect_pool, self.detector.detect, record, probe.probe, self.clock()
            )
        except Exception:
            log.exception("pod=%s uid=%s detection failed", record.key, uid)
        try:
            async with self._slots:
                if self._stopping:
                    return  # the pool is shut down: nothing more to do for anyone
                next_due = await loop.run_in_executor(self._pool, self.reconciler.reconcile, record)
        except Exception as exc:  # a transient API answer (429, 5xx) is only a warning
            log_retried_failure(log, exc, "pod=%s uid=%s reconcile failed; retrying in 10s", *ids)
            next_due = self.clock() + 10.0
        finally:
            self._running.discard(uid)
        gone = self._resolve_after.pop(uid, None)
        if gone is not None and not self._stopping:
            await self._resolve(gone)
        if uid not in self.pods:
            return
        if uid in self._again:
            self._again.discard(uid)
            next_due = self.clock()
        if next_due is not None:
            self.scheduler.schedule_earliest(uid, next_due)
        self._wake.set()

    async def _resolve(self, record: TerminatingPod, attempt: int = 1) -> None:
        done = False
        try:
            async with self._slots:
                loop = asyncio.get_running_loop()
                done = await loop.run_in_executor(self._pool, self.reconciler.resolve, record)
        except Exception:
            log.exception("pod=%s uid=%s could not mark Resolved", record.key, record.uid)
        if done or self._stopping or self._loop is None:
            return
        if attempt >= RESOLVE_TRIES:
            log.error(
                "pod=%s uid=%s gone, but its Remediation could not be marked Resolved in %d "
                "tries: it keeps its last phase",
                record.key,
                record.uid,
                attempt,
            )
            return
        # the record kept changing under the write, or the API failed: the pod is gone and
        # its record must still say so
        self._loop.call_later(
            RESOLVE_RETRY_S, lambda: self._spawn(self._resolve(record, attempt + 1))
        )


def _mark(obj: JSON | None) -> tuple[Any, ...]:
    """What of a Node/CSINode can change a diagnosis: existence, Ready, taints, drivers."""
    if obj is None:
        return ("absent",)
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    ready = next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    taints = sorted((t.get("key", ""), t.get("effect", "")) for t in spec.get("taints") or [])
    drivers = sorted(str((d or {}).get("name")) for d in spec.get("drivers") or [])
    return (ready, tuple(taints), tuple(drivers))


def _policy_name(annotation: str | None) -> str:
    """The policy whose timing applies: the one opt-in rule's (`core.mandate.opt_in`, as the
    detector reads it); a namespace label only ever names `default`."""
    return opt_in(annotation, {}).policy_name
