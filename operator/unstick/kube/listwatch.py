"""The one watch loop of unstick, in the spirit of Kopf's `infinite_watch`: LIST (in
pages) → WATCH from the list's resourceVersion (with bookmarks) → resume the watch from the
last version seen when it ends → relist on 410 Gone (also when it comes as an `ERROR` event)
→ reconnect after any other error with a doubling backoff. Its logs and counters
(`WatchStats`) are here and nowhere else.

`ListWatch` runs it for one collection and hands what it sees to a `Sink`: the objects of
a (re)list one by one between `relist_begin` and `relist_end` (a watcher that keeps a store
replaces it at the end, so an object deleted while the watch was down is known gone), and
each ADDED / MODIFIED / DELETED event. Every watcher runs on it: the lean pod watcher
(`kube/podwatch.py`), the Node/CSINode/VolumeAttachment/Namespace watchers
(`kube/objectwatch.py`), the attach-failure Event feeds (`kube/events.py`) and the agent's
Remediation watch (`agent/loop.py`). `list_watch` and `WatchStream` are its parts.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

_log = logging.getLogger(__name__)


@dataclass
class WatchStats:
    """What one watch loop did (read by tests, health checks and logs)."""

    lists: int = 0  # complete (re)lists
    events: int = 0  # ADDED/MODIFIED/DELETED events applied
    expired: int = 0  # relists because the resourceVersion expired (410 Gone)
    errors: int = 0  # reconnects after any other error
    last_activity: float = 0.0  # time.monotonic() of the last list, event or quiet watch end

    def touch(self) -> None:
        self.last_activity = time.monotonic()


def list_watch(
    stop: threading.Event,
    relist: Callable[[], str],
    watch: Callable[[str], str],
    *,
    log: logging.Logger,
    what: str,
    backoff_s: float = 0.5,
    backoff_max_s: float = 30.0,
    stats: WatchStats | None = None,
) -> None:
    """Until `stop` is set: `relist()` → a resourceVersion, then `watch(version)` → the last
    version seen, again and again. 410 Gone (the version expired) → relist; any other
    error → reconnect from the last version after a doubling backoff."""
    stats = stats or WatchStats()
    version: str | None = None
    backoff = backoff_s
    while not stop.is_set():
        try:
            if version is None:
                version = relist()
            version = watch(version)
            backoff = backoff_s
            continue
        except ApiException as exc:
            if exc.status == 410:
                log.info("%s: resourceVersion expired (410 Gone), relisting", what)
                stats.expired += 1
                version = None
                continue
            stats.errors += 1
            log.warning("%s: API error %s, reconnecting in %.1fs", what, exc.status, backoff)
        except Exception as exc:  # connection refused/reset, timeouts, bad JSON ...
            if stop.is_set():
                return
            stats.errors += 1
            log.warning("%s: %s: %s, reconnecting in %.1fs", what, type(exc).__name__, exc, backoff)
        stop.wait(backoff)
        backoff = min(backoff * 2, backoff_max_s)


def watch_lines(response: Any) -> Iterator[bytes]:
    """The non-empty lines (one JSON watch event each) of a raw streaming response."""
    buffer = bytearray()
    for chunk in response.stream(amt=None, decode_content=False):
        buffer.extend(chunk)
        while (cut := buffer.find(b"\n")) != -1:
            line = bytes(buffer[:cut])
            del buffer[: cut + 1]
            if line.strip():
                yield line
    if buffer.strip():
        yield bytes(buffer)


class WatchStream:
    """One watch connection at a time: follows it event by event, and can be shut from
    another thread (which ends a read waiting for the next event)."""

    def __init__(self) -> None:
        self._response: Any = None

    def follow(
        self,
        kube: Any,
        path: str,
        query: dict[str, str],
        *,
        timeout_s: float,
        stop: threading.Event,
        apply: Callable[[dict[str, Any]], str | None],
    ) -> str:
        """Watch `path` from `query["resourceVersion"]`; `apply(event)` returns the event's
        resourceVersion (or None). Returns the last version seen."""
        version = query["resourceVersion"]
        response = kube.watch_stream(path, query, timeout_s)
        self._response = response
        try:
            for line in watch_lines(response):
                if stop.is_set():
                    break
                version = apply(json.loads(line)) or version
        finally:
            self._response = None
            response.release_conn()
        return version

    def shutdown(self) -> None:
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # unblocks a read in progress (urllib3 >= 2.3)
            except Exception:  # already closed, or an older urllib3
                pass


class Sink(Protocol):
    """What a ListWatch hands its objects to (called from the loop's thread, in order)."""

    def relist_begin(self) -> None: ...
    def listed(self, obj: dict[str, Any]) -> None: ...
    def relist_end(self) -> None: ...
    def changed(self, kind: str, obj: dict[str, Any]) -> None: ...  # ADDED|MODIFIED|DELETED


@dataclass(frozen=True, slots=True)
class WatchSpec:
    """Which collection to list+watch, and how."""

    path: str  # e.g. /api/v1/nodes, /api/v1/events
    what: str  # names the loop in logs and its thread
    query: Mapping[str, str] = field(default_factory=dict)  # label/field selectors
    page_size: int = 500
    watch_timeout_s: int = 300
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0


class ListWatch:
    """`list_watch` over one collection into a `Sink`; `run()` in the calling thread, or
    `start()` a thread of its own and `stop()` it (which also ends a watch in progress).

    `stop`: an event of the caller's that ends the loop when set (default: its own);
    `before_watch`: called at the start of every watch cycle (the agent re-reads its
    admission verdict there), in the loop's thread; an exception from it counts as a
    failed watch (reconnect with backoff)."""

    def __init__(
        self,
        kube: Any,
        spec: WatchSpec,
        sink: Sink,
        *,
        stop: threading.Event | None = None,
        before_watch: Callable[[], None] | None = None,
    ) -> None:
        self.kube, self.spec, self.sink = kube, spec, sink
        self.stats = WatchStats()
        self.synced = threading.Event()  # set after the first complete list
        self._stop = stop if stop is not None else threading.Event()
        self._before_watch = before_watch
        self._stream = WatchStream()
        self._thread = threading.Thread(target=self.run, name=spec.what, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._stream.shutdown()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def run(self) -> None:
        list_watch(
            self._stop,
            self._relist,
            self._watch,
            log=_log,
            what=self.spec.what,
            backoff_s=self.spec.backoff_s,
            backoff_max_s=self.spec.backoff_max_s,
            stats=self.stats,
        )

    def _relist(self) -> str:
        version, count = "", 0
        self.sink.relist_begin()
        pages = self.kube.list_pages(self.spec.path, dict(self.spec.query), self.spec.page_size)
        for page in pages:
            version = (page.get("metadata") or {}).get("resourceVersion") or version
            for obj in page.get("items") or []:
                self.sink.listed(obj)
                count += 1
        self.sink.relist_end()
        self.stats.lists += 1
        self.stats.touch()
        self.synced.set()
        _log.debug("%s: listed %d, resourceVersion %s", self.spec.what, count, version)
        return version

    def _watch(self, version: str) -> str:
        if self._before_watch is not None:
            self._before_watch()
        query = {**self.spec.query, "resourceVersion": version, "allowWatchBookmarks": "true"}
        version = self._stream.follow(
            self.kube,
            self.spec.path,
            query,
            timeout_s=self.spec.watch_timeout_s,
            stop=self._stop,
            apply=self._apply,
        )
        self.stats.touch()  # a watch that timed out quietly is healthy too
        return version

    def _apply(self, event: dict[str, Any]) -> str | None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":  # a Status: 410 Gone relists, anything else reconnects
            raise ApiException(status=obj.get("code"), reason=obj.get("message") or "watch error")
        self.stats.touch()
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.stats.events += 1
            self.sink.changed(str(kind), obj)
        version: str | None = (obj.get("metadata") or {}).get("resourceVersion")
        return version
