"""The lean pod watcher: paginated LIST + WATCH that keeps only terminating pods.

Why not Kopf's pod watch: it LISTs everything in one response and keeps per-object state;
at 100k pods that is the difference between megabytes and an OOM (DESIGN §5). Here:

- LIST in pages of 500 (limit + continue), each page parsed and dropped;
- WATCH from the list's resourceVersion with allowWatchBookmarks=true;
- 410 Gone (resourceVersion too old) → relist; any other error → reconnect with backoff;
- raw JSON only (no client model objects); from each pod only a small `TerminatingPod`
  record is kept, and only while the pod has `metadata.deletionTimestamp`.

The watcher runs in its own thread (the `kubernetes` client is blocking) and reports every
change through `on_change(uid, record_or_None)`; the controller hands that to its asyncio
loop with `call_soon_threadsafe`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.kube.client import JSON, Kube
from unstick.kube.listwatch import list_watch, watch_lines

log = logging.getLogger(__name__)

REMEDIATE_ANNOTATION = "unstick.dev/remediate"


@dataclass(frozen=True, slots=True)
class TerminatingPod:
    """What the controller remembers of a pod that has a deletionTimestamp."""

    namespace: str
    name: str
    uid: str
    node: str
    deletion_timestamp: float  # epoch seconds
    deletion_grace_period_s: int | None
    finalizers: tuple[str, ...]
    remediate: str | None  # value of the unstick.dev/remediate annotation
    containers_running: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_time(value: str) -> float:
    """RFC3339 from the API server (always UTC, 'Z') → epoch seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def terminating_record(pod: JSON) -> TerminatingPod | None:
    """The small record of a pod, or None when it is not terminating (or malformed)."""
    meta = pod.get("metadata") or {}
    stamp = meta.get("deletionTimestamp")
    if not stamp or not meta.get("uid"):
        return None
    try:
        deletion = parse_time(stamp)
    except (TypeError, ValueError):
        log.warning(
            "pod %s/%s: unreadable metadata.deletionTimestamp %r",
            meta.get("namespace"),
            meta.get("name"),
            stamp,
        )
        return None
    status = pod.get("status") or {}
    statuses = (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or [])
    running = any("running" in ((cs or {}).get("state") or {}) for cs in statuses)
    grace = meta.get("deletionGracePeriodSeconds")
    return TerminatingPod(
        namespace=meta.get("namespace") or "",
        name=meta.get("name") or "",
        uid=meta["uid"],
        node=(pod.get("spec") or {}).get("nodeName") or "",
        deletion_timestamp=deletion,
        deletion_grace_period_s=grace if isinstance(grace, int) else None,
        finalizers=tuple(meta.get("finalizers") or ()),
        remediate=(meta.get("annotations") or {}).get(REMEDIATE_ANNOTATION),
        containers_running=running,
    )


OnChange = Callable[[str, "TerminatingPod | None"], None]


@dataclass(frozen=True, slots=True)
class WatchSettings:
    namespace: str | None = None  # None: all namespaces
    page_size: int = 500
    watch_timeout_s: int = 300
    backoff_max_s: float = 30.0


class PodWatcher:
    """LIST+WATCH of pods in one thread; keeps `pods` = the terminating ones, by uid."""

    def __init__(self, kube: Kube, settings: WatchSettings, on_change: OnChange) -> None:
        self.kube = kube
        self.settings = settings
        self.on_change = on_change
        self.pods: dict[str, TerminatingPod] = {}
        self.synced = threading.Event()  # set after the first complete LIST
        self.lists = 0  # how many (re)lists were done: visible to tests and logs
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name="pod-watcher", daemon=True)

    @property
    def path(self) -> str:
        ns = self.settings.namespace
        return f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # unblocks a read in progress (urllib3 >= 2.3)
            except Exception:
                pass
        self._thread.join(timeout=5)

    # -- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        list_watch(
            self._stop,
            self._relist,
            self._watch,
            log=log,
            what="pod watch",
            backoff_max_s=self.settings.backoff_max_s,
        )

    def _relist(self) -> str:
        seen: dict[str, TerminatingPod] = {}
        version = ""
        for page in self.kube.list_pages(self.path, limit=self.settings.page_size):
            version = (page.get("metadata") or {}).get("resourceVersion") or version
            for pod in page.get("items") or []:
                record = terminating_record(pod)
                if record is not None:
                    seen[record.uid] = record
        for uid in [u for u in self.pods if u not in seen]:
            del self.pods[uid]
            self.on_change(uid, None)
        for uid, record in seen.items():
            if self.pods.get(uid) != record:
                self.pods[uid] = record
                self.on_change(uid, record)
        self.lists += 1
        self.synced.set()
        log.info("pod list: %d terminating pods, resourceVersion %s", len(seen), version)
        return version

    def _watch(self, version: str) -> str:
        query = {"resourceVersion": version, "allowWatchBookmarks": "true"}
        response = self.kube.watch_stream(self.path, query, self.settings.watch_timeout_s)
        self._response = response
        try:
            for line in watch_lines(response):
                if self._stop.is_set():
                    break
                event = json.loads(line)
                version = self._apply(event) or version
        finally:
            self._response = None
            response.release_conn()
        return version

    def _apply(self, event: JSON) -> str | None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            raise ApiException(status=code, reason=obj.get("message") or "watch error")
        meta = obj.get("metadata") or {}
        version: str | None = meta.get("resourceVersion")
        if kind == "BOOKMARK":
            return version
        uid = meta.get("uid")
        if not uid:
            return version
        record = None if kind == "DELETED" else terminating_record(obj)
        if record is None:
            if self.pods.pop(uid, None) is not None:
                self.on_change(uid, None)
        elif self.pods.get(uid) != record:
            self.pods[uid] = record
            self.on_change(uid, record)
        return version
