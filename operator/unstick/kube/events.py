"""Events: the one `post_event` of the controller (records and blocked), and `EventFeed`,
the Events of one reason followed by the one watch loop.

- The message is trimmed to `MESSAGE_LIMIT` characters (an Event is read by people in
  `kubectl describe`; a long evidence list ends in "…").
- Deduplicated like client-go's event recorder: the same Event (object, reason, type,
  message) again within `DEDUP_WINDOW_S` is not a new object, it raises the first one's
  `count` and `lastTimestamp` (a merge patch). If that Event is gone (expired, deleted),
  a new one is created.
- Best effort: an Event is informative only, a failure is logged and never raised.
- Events about cluster-scoped objects (a Namespace) go to namespace `default`: a
  Terminating namespace takes no new objects.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.core.remediation import rfc3339
from unstick.kube.client import JSON, Kube
from unstick.kube.listwatch import ListWatch, WatchSpec

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 1000
DEDUP_WINDOW_S = 600.0
DEDUP_KEYS = 4096  # Events remembered for deduplication (least recently posted dropped)
COMPONENT = "unstick-controller"

Key = tuple[str, ...]


def trim(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """`message`, cut to `limit` characters with a trailing "…" when it was longer."""
    return message if len(message) <= limit else message[: limit - 1] + "…"


@dataclass
class _Posted:
    namespace: str
    name: str
    count: int
    at: float


class EventRecorder:
    """Posts Events through one Kube, remembering the recent ones to deduplicate them."""

    def __init__(
        self,
        kube: Kube,
        *,
        component: str = COMPONENT,
        window_s: float = DEDUP_WINDOW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube, self.component, self.window_s, self.clock = kube, component, window_s, clock
        self._recent: OrderedDict[Key, _Posted] = OrderedDict()
        self._lock = threading.Lock()

    def post(
        self, ref: JSON, reason: str, message: str, *, event_type: str = "Warning", stamp: str = ""
    ) -> None:
        """Post (or count again) the Event; `stamp` is its time when the caller has one."""
        namespace = ref.get("namespace") or "default"
        message = trim(message)
        key: Key = (
            namespace,
            str(ref.get("kind")),
            str(ref.get("name")),
            str(ref.get("uid")),
            reason,
            event_type,
            message,
        )
        now = self.clock()
        try:
            if not self._repeat(key, now, stamp):
                self._create(key, ref, (namespace, reason, message, event_type), now, stamp)
        except Exception as exc:  # an Event is informative only
            log.warning(
                "could not post Event %s on %s %s/%s: %s",
                reason,
                ref.get("kind"),
                namespace,
                ref.get("name"),
                exc,
            )

    def _repeat(self, key: Key, now: float, stamp: str) -> bool:
        """Count a repeat on the Event already posted; False when there is none to count on."""
        with self._lock:
            seen = self._recent.get(key)
            if seen is None or now - seen.at > self.window_s:
                return False
            seen.count += 1
            seen.at = now
            self._recent.move_to_end(key)
            patch = {"count": seen.count, "lastTimestamp": stamp or rfc3339(now)}
            path = f"/api/v1/namespaces/{seen.namespace}/events/{seen.name}"
        try:
            self.kube.request(
                "PATCH", path, body=patch, content_type="application/merge-patch+json"
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            with self._lock:
                self._recent.pop(key, None)
            return False
        return True

    def _create(
        self,
        key: Key,
        ref: JSON,
        what: tuple[str, str, str, str],
        now: float,
        stamp: str,
    ) -> None:
        namespace, reason, message, event_type = what
        name = f"{ref.get('name') or 'object'}.{uuid.uuid4().hex[:12]}"
        stamp = stamp or rfc3339(now)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": ref,
            "reason": reason,
            "message": message,
            "type": event_type,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self.kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        with self._lock:
            self._recent[key] = _Posted(namespace, name, 1, now)
            self._recent.move_to_end(key)
            while len(self._recent) > DEDUP_KEYS:
                self._recent.popitem(last=False)


_RECORDERS: weakref.WeakKeyDictionary[Kube, EventRecorder] = weakref.WeakKeyDictionary()
_RECORDERS_LOCK = threading.Lock()


def recorder(kube: Kube) -> EventRecorder:
    """The one EventRecorder of `kube` (so every poster through it shares the dedup)."""
    with _RECORDERS_LOCK:
        found = _RECORDERS.get(kube)
        if found is None:
            found = _RECORDERS[kube] = EventRecorder(kube)
        return found


def post_event(
    kube: Kube,
    ref: JSON,
    reason: str,
    message: str,
    *,
    event_type: str = "Warning",
    stamp: str = "",
) -> None:
    """A core/v1 Event about the object `ref` (an object reference): trimmed,
    deduplicated, best effort (see the module docstring)."""
    recorder(kube).post(ref, reason, message, event_type=event_type, stamp=stamp)


class EventFeed:
    """Events with one `reason` (a field selector), from the one watch loop, in a thread of
    its own; each listed, added or changed Event goes to `on_event`."""

    def __init__(self, kube: Kube, reason: str, on_event: Callable[[JSON], None]) -> None:
        self.reason, self.on_event = reason, on_event
        spec = WatchSpec(
            "/api/v1/events", f"{reason} events", {"fieldSelector": f"reason={reason}"}
        )
        self.loop = ListWatch(kube, spec, self)
        self.synced = self.loop.synced

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()

    def relist_begin(self) -> None:
        pass

    def listed(self, obj: JSON) -> None:
        self.on_event(obj)

    def relist_end(self) -> None:
        pass

    def changed(self, kind: str, obj: JSON) -> None:
        if kind != "DELETED":
            self.on_event(obj)
