"""The kubelet's `FailedKillPod` Events, kept in memory per pod UID (CNI teardown
failing: `unstick.core.rules.cni`), so that each diagnosis of a stuck pod sees them without a
LIST of its own.

One list+watch of Events with `fieldSelector=reason=FailedKillPod` (the controller's RBAC
already allows list/watch of Events; `unstick.kube.events.EventFeed`); for each pod the
latest few are kept, and a pod's entry is dropped once its newest Event is older than
`MAX_AGE_S` (the kubelet repeats the Event while the teardown keeps failing). The bundle
the controller builds gets them as its `events` (`controller/deciding/inputs.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from unstick.core.remediation import parse_time
from unstick.kube.client import JSON, Kube
from unstick.kube.events import EventFeed

REASON = "FailedKillPod"
MAX_AGE_S = 3600.0
PER_POD = 3
MAX_PODS = 10000


def event_time(ev: JSON) -> float | None:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        value = ev.get(key) or ((ev.get("series") or {}).get("lastObservedTime"))
        if isinstance(value, str) and value:
            try:
                return parse_time(value)
            except ValueError:
                continue
    return None


class KillPodEvents:
    def __init__(self, kube: Kube, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._by_uid: dict[str, list[tuple[float, JSON]]] = {}
        self._lock = threading.Lock()
        self.feed = EventFeed(kube, REASON, self.on_event)

    def start(self) -> None:
        self.feed.start()

    def stop(self) -> None:
        self.feed.stop()

    def on_event(self, ev: JSON) -> None:
        obj = ev.get("involvedObject") or {}
        uid = obj.get("uid")
        when = event_time(ev)
        if obj.get("kind") != "Pod" or not isinstance(uid, str) or when is None:
            return
        name = (ev.get("metadata") or {}).get("name")
        with self._lock:
            kept = [
                (t, e)
                for t, e in self._by_uid.get(uid, [])
                if e.get("metadata", {}).get("name") != name
            ]
            kept.append((when, ev))
            self._by_uid[uid] = sorted(kept, key=lambda te: te[0])[-PER_POD:]
            if len(self._by_uid) > MAX_PODS:
                self._prune()

    def _prune(self) -> None:
        cutoff = self.clock() - MAX_AGE_S
        for uid in [u for u, kept in self._by_uid.items() if kept[-1][0] < cutoff]:
            del self._by_uid[uid]

    def events_of(self, uid: str) -> list[JSON]:
        """The pod's recent FailedKillPod Events (oldest first)."""
        cutoff = self.clock() - MAX_AGE_S
        with self._lock:
            return [e for t, e in self._by_uid.get(uid, []) if t >= cutoff]
