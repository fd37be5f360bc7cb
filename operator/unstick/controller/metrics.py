"""Prometheus metrics of the controller, names and labels exactly as docs/design.md §7.

No pod names in labels. Served with prometheus-client's own HTTP server on /metrics,
together with the default process/platform collectors.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from unstick import __version__

STUCK_PODS = Gauge(
    "unstick_stuck_pods",
    "Pods stuck in Terminating, by namespace and cause",
    ["namespace", "cause"],
)
REMEDIATIONS = Counter(
    "unstick_remediations_total",
    "Actions decided on stuck pods, by action, cause and result",
    ["action", "cause", "result"],
)
DETECTION_LAG = Histogram(
    "unstick_detection_lag_seconds",
    "From the moment a pod became stuck-eligible (deletionTimestamp + slack) to its diagnosis",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)
TIME_TO_RESOLUTION = Histogram(
    "unstick_time_to_resolution_seconds",
    "From deletionTimestamp to the pod being gone, for pods seen stuck",
    buckets=(10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400),
)
REFUSALS = Counter(
    "unstick_refusals_total",
    "Requests refused by the controller (forged, stale, not opted in, policy forbids, dry-run, "
    "unsafe)",
    ["reason"],
)
BLOCKED_REPLACEMENTS = Gauge(
    "unstick_blocked_replacements",
    "Pods waiting to attach or mount a volume that a stuck or just-removed pod still holds",
    ["namespace"],
)
BLOCKED_NAMESPACES = Gauge(
    "unstick_blocked_namespaces",
    "Namespaces in Terminating whose deletion waits on stuck pods",
)
NODE_FENCED_SECONDS = Gauge(
    "unstick_node_fenced_seconds",
    "How long the out-of-service taint unstick applied has been on the node (docs/fencing.md)",
    ["node"],
)
NODE_FENCED_TOO_LONG = Gauge(
    "unstick_node_fenced_too_long",
    "1 while unstick's out-of-service taint has been on the node longer than the policy's "
    "fencedTaintMaxSeconds (alert UnstickNodeFencedTooLong)",
    ["node"],
)
LEADER = Gauge(
    "unstick_controller_leader",
    "1 while this replica holds the leader Lease and may act, 0 on a standby (docs/controller.md "
    "'Leader election')",
)
BUILD_INFO = Gauge(
    "unstick_build_info",
    "Always 1; the version of unstick this process runs",
    ["version"],
)
BUILD_INFO.labels(__version__).set(1)


class StuckPods:
    """Keeps `unstick_stuck_pods` equal to the count of stuck pods per (namespace, cause).

    Thread-safe: set from the detection and worker threads."""

    def __init__(self) -> None:
        self._by_uid: dict[str, tuple[str, str]] = {}
        self._counts: Tally[tuple[str, str]] = Tally()
        self._lock = threading.Lock()

    def set(self, uid: str, namespace: str, cause: str) -> None:
        with self._lock:
            old = self._by_uid.get(uid)
            if old == (namespace, cause):
                return
            self._forget(uid)
            self._by_uid[uid] = (namespace, cause)
            self._counts[(namespace, cause)] += 1
            STUCK_PODS.labels(namespace, cause).set(self._counts[(namespace, cause)])

    def forget(self, uid: str) -> None:
        with self._lock:
            self._forget(uid)

    def _forget(self, uid: str) -> None:
        old = self._by_uid.pop(uid, None)
        if old is None:
            return
        self._counts[old] -= 1
        STUCK_PODS.labels(*old).set(self._counts[old])

    def cause_of(self, uid: str) -> str | None:
        """The cause a stuck pod was last diagnosed with (None: not stuck)."""
        entry = self._by_uid.get(uid)
        return entry[1] if entry else None

    def __contains__(self, uid: str) -> bool:
        return uid in self._by_uid


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics on `port` in a daemon thread."""
    start_http_server(port, addr=addr)
