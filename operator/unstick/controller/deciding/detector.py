"""Decide about one terminating pod; detect it stuck from memory, off the action path.

`Detector.decide` is the one decision: opt-in and policy, snapshot bundle, diagnosis,
plan. `Detector.detect` runs it the moment a pod is due, from what the controller holds
in memory (the lean watcher's pod record, watch-fed Node and CSINode caches, the probe
from the Remediation watch), and records the diagnosis at once: the
`unstick_detection_lag_seconds` histogram (first stuck diagnosis of a pod without a
Remediation) and the `unstick_stuck_pods` gauge. It makes no API request (except for a
Node or CSINode the watch has not delivered yet; a pod's claims and volumes only as kept
by `caches.BoundVolumes`, which the pod's first worker pass fills — a diagnosis without a
probe does not use them), so detection does not queue behind the API reads and writes of
a burst: those follow in the worker pool.

Its `now` is this replica's wall clock; what it compares with it in the core —
`metadata.deletionTimestamp` and the slack after it above all — the API server wrote on
its own clock. So the bundle's `capturedAt` is `now` in server time, by this replica's
measured offset from the API server (kube/server_clock.py: never later than the server's
clock), and a controller whose clock is 20 s ahead does not find a pod's slack up 20 s
early (issue #31). The core stays pure: it is handed a corrected `now`, nothing else.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from unstick.controller import metrics
from unstick.controller.deciding.caches import ObjectCache
from unstick.controller.deciding.decision import Decision
from unstick.controller.deciding.inputs import NodeInputs, build_bundle
from unstick.controller.deciding.policies import BUILTIN, NamespaceLabels, PolicyBook, opt_in
from unstick.core.model.snapshot import BundleError, parse_bundle
from unstick.core.policy.planner import plan as make_plan
from unstick.core.remediation import REMEDIATE
from unstick.core.rules.diagnosis import diagnose
from unstick.core.rules.fencing import FencingSettings
from unstick.core.vocabulary import Refusal
from unstick.kube.client import JSON, Kube
from unstick.kube.podwatch import TerminatingPod, pod_json
from unstick.kube.server_clock import ServerClock

log = logging.getLogger("unstick.decisions")


class Detector:
    def __init__(
        self,
        kube: Kube,
        policies: PolicyBook,
        namespaces: NamespaceLabels,
        *,
        nodes: ObjectCache,
        csi_nodes: ObjectCache,
        has_remediation: Callable[[str], bool],
        volumes: Callable[[str], JSON | None] | None = None,
        kept_volumes: Callable[[str], JSON | None] | None = None,
        events: Callable[[str], list[JSON]] | None = None,
        leases: Callable[[JSON], list[JSON]] | None = None,
        fencing: Callable[[str, FencingSettings], JSON] | None = None,
        server_clock: ServerClock | None = None,
    ) -> None:
        self.kube = kube
        # the API server's clock (kube.server_clock); none given: no correction
        self.server_clock = server_clock or ServerClock()
        self.policies = policies
        self.namespaces = namespaces
        self.cached = NodeInputs(
            node=nodes.get,
            csi_node=csi_nodes.get,
            get=volumes,
            events=events,
            leases=leases,
            fencing=fencing,
        )
        # Detection reads claims and volumes only as kept (no GET: a burst's detections
        # must not queue behind 2 threads' reads; the worker pass reads them).
        self.from_memory = NodeInputs(
            node=nodes.get,
            csi_node=csi_nodes.get,
            get=kept_volumes or volumes,
            events=events,
            leases=leases,
            fencing=fencing,  # read only for a NotReady node (deciding/fencing_records.py)
        )
        self.has_remediation = has_remediation
        self.stuck = metrics.StuckPods()
        self._detected: set[str] = set()  # uids whose detection lag was observed
        self._refused: set[str] = set()  # uids whose policy refusal was counted
        self._lock = threading.Lock()

    def decide(self, pod: JSON, probe: Any, now: float, sources: NodeInputs | None) -> Decision:
        """Diagnose and plan `pod` with Node/CSINode from `sources` (default: the caches);
        `now` on this replica's clock, judged in the API server's."""
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace") or ""
        labels = self.namespaces.get(namespace)
        choice = opt_in((meta.get("annotations") or {}).get(REMEDIATE), labels)
        policy, problem = self.policies.lookup(choice.policy_name)
        opted_in, why, refused = choice.opted_in, choice.why, False
        if policy is None:
            policy, opted_in = BUILTIN, False
            why = f"{why}; observe only: {problem}" if choice.opted_in else why
        elif opted_in and not policy.serves(namespace, labels):
            # A tenant naming a permissive policy its namespace may not use (docs/design.md §4):
            # none of its settings is honoured, not even its timing.
            why = f"{why}; observe only: {policy.refusal(namespace)}"
            policy, opted_in, refused = BUILTIN, False, True
        settings = policy.diagnosis_settings
        bundle = build_bundle(
            self.kube,
            pod,
            probe,
            self.server_clock.server_now(now),
            sources or self.cached,
            with_attachments=False,
            fencing=settings.fencing,
            claims_if_needed=True,
        )
        diagnosis = diagnose(parse_bundle(bundle), settings)
        if refused and diagnosis.stuck:
            self._count_refusal(str(meta.get("uid") or ""))
        planned = make_plan(diagnosis, policy.parsed, opted_in=opted_in)
        return Decision(
            diagnosis, tuple(planned.steps), tuple(planned.refused), policy, opted_in, why
        )

    def detect(self, record: TerminatingPod, probe: Any, now: float) -> None:
        """Diagnose from memory; on a stuck diagnosis update the metrics right now."""
        try:
            decision = self.decide(pod_json(record), probe, now, self.from_memory)
        except BundleError:
            return  # the worker pass reports it (Event UnstickCannotDiagnose)
        d = decision.diagnosis
        if not d.stuck:
            return
        self.stuck.set(record.uid, record.namespace, str(d.cause))
        with self._lock:
            first = record.uid not in self._detected
            self._detected.add(record.uid)
        if first and not self.has_remediation(record.uid):
            overdue = self.server_clock.server_now(now) - record.deletion_timestamp
            lag = max(0.0, overdue - decision.policy.slack_s)
            metrics.DETECTION_LAG.observe(lag)
            log.info(
                "pod=%s uid=%s cause=%s action=detect result=stuck detection_lag=%.3fs",
                record.key,
                record.uid,
                d.cause,
                lag,
            )

    def _count_refusal(self, uid: str) -> None:
        """`unstick_refusals_total{reason="policy_forbids"}`, once per pod."""
        with self._lock:
            if uid in self._refused:
                return
            self._refused.add(uid)
        metrics.REFUSALS.labels(str(Refusal.POLICY_FORBIDS)).inc()

    def due(self, record: TerminatingPod, slack_s: float) -> float:
        """When, on this replica's clock, `record` is past its slack on the API server's
        (its deletionTimestamp is the server's): never earlier."""
        return self.server_clock.local_at(record.deletion_timestamp) + slack_s

    def forget(self, uid: str) -> None:
        self.stuck.forget(uid)
        with self._lock:
            self._detected.discard(uid)
            self._refused.discard(uid)
