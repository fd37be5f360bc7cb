"""A lean LIST+WATCH of one cluster-scoped kind (Nodes, CSINodes) into an in-memory store.

Same loop as the pod watcher (`listwatch.list_watch`): LIST in pages, WATCH from the
list's resourceVersion with bookmarks, relist on 410 Gone, reconnect with backoff. A
relist replaces the whole store, so an object deleted while the watch was down is known
absent afterwards (Kopf's watch does not report such deletions). Objects are trimmed to
what the diagnosis reads (no managedFields, no node image list).

Runs in its own thread; `on_change(name, old, new)` is called from that thread for every
object whose stored value changed (None: absent).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from unstick.kube.client import JSON, Kube
from unstick.kube.listwatch import WatchStream, list_watch

log = logging.getLogger(__name__)

OnObjectChange = Callable[[str, "JSON | None", "JSON | None"], None]


class Store(Protocol):
    def peek(self, name: str) -> JSON | None: ...
    def put(self, name: str, obj: JSON) -> None: ...
    def delete(self, name: str) -> None: ...
    def replace(self, objects: dict[str, JSON]) -> dict[str, JSON | None]: ...


def trimmed(body: Any) -> JSON:
    """A plain copy of what the diagnosis reads: no managedFields, no image list."""
    obj = {k: v for k, v in dict(body).items() if k in ("apiVersion", "kind", "spec", "status")}
    meta = dict(body.get("metadata") or {})
    meta.pop("managedFields", None)
    obj["metadata"] = meta
    status = obj.get("status")
    if isinstance(status, dict) and "images" in status:
        obj["status"] = {k: v for k, v in status.items() if k != "images"}
    return obj


class ObjectWatcher:
    def __init__(
        self,
        kube: Kube,
        path: str,
        store: Store,
        on_change: OnObjectChange,
        *,
        what: str,
        watch_timeout_s: int = 300,
    ) -> None:
        self.kube = kube
        self.path = path
        self.store = store
        self.on_change = on_change
        self.what = what
        self.watch_timeout_s = watch_timeout_s
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._stream = WatchStream()
        self._thread = threading.Thread(target=self._run, name=what, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._stream.shutdown()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        list_watch(self._stop, self._relist, self._watch, log=log, what=self.what)

    def _relist(self) -> str:
        fresh: dict[str, JSON] = {}
        version = ""
        for page in self.kube.list_pages(self.path):
            version = (page.get("metadata") or {}).get("resourceVersion") or version
            for item in page.get("items") or []:
                name = (item.get("metadata") or {}).get("name")
                if name:
                    fresh[name] = trimmed(item)
        old = self.store.replace(fresh)
        for name in set(old) | set(fresh):
            if old.get(name) != fresh.get(name):
                self.on_change(name, old.get(name), fresh.get(name))
        self.synced.set()
        return version

    def _watch(self, version: str) -> str:
        query = {"resourceVersion": version, "allowWatchBookmarks": "true"}
        return self._stream.follow(
            self.kube,
            self.path,
            query,
            timeout_s=self.watch_timeout_s,
            stop=self._stop,
            apply=self._apply,
        )

    def _apply(self, event: JSON) -> str | None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            raise ApiException(status=obj.get("code"), reason=obj.get("message") or "watch error")
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if kind != "BOOKMARK" and name:
            old = self.store.peek(name)
            if kind == "DELETED":
                self.store.delete(name)
                new = None
            else:
                new = trimmed(obj)
                self.store.put(name, new)
            self.on_change(name, old, new)
        version: str | None = meta.get("resourceVersion")
        return version
