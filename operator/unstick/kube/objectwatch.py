"""A lean LIST+WATCH of one cluster-scoped kind (Nodes, CSINodes) into an in-memory store.

The one watch loop (`listwatch.ListWatch`): LIST in pages, WATCH from the list's
resourceVersion with bookmarks, relist on 410 Gone, reconnect with backoff. A relist
replaces the whole store, so an object deleted while the watch was down is known
absent afterwards (Kopf's watch does not report such deletions). Objects are trimmed to
what the diagnosis reads (no managedFields, no node image list).

Runs in its own thread; `on_change(name, old, new)` is called from that thread for every
object whose stored value changed (None: absent).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from unstick.kube.client import JSON, Kube
from unstick.kube.listwatch import ListWatch, WatchSpec

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


class DictStore:
    """A `Store` as a plain dict (thread-safe enough: the GIL)."""

    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}

    def peek(self, name: str) -> JSON | None:
        return self.objects.get(name)

    def put(self, name: str, obj: JSON) -> None:
        self.objects[name] = obj

    def delete(self, name: str) -> None:
        self.objects.pop(name, None)

    def replace(self, objects: dict[str, JSON]) -> dict[str, JSON | None]:
        old: dict[str, JSON | None] = dict(self.objects)
        self.objects = dict(objects)
        return old


class ObjectWatcher:
    """A `Store` kept up to date by the one watch loop (`listwatch.ListWatch`)."""

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
        self.store = store
        self.on_change = on_change
        self._fresh: dict[str, JSON] = {}
        self.loop = ListWatch(kube, WatchSpec(path, what, watch_timeout_s=watch_timeout_s), self)
        self.synced = self.loop.synced

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()

    # -- the Sink ---------------------------------------------------------------------

    def relist_begin(self) -> None:
        self._fresh = {}

    def listed(self, obj: JSON) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if name:
            self._fresh[name] = trimmed(obj)

    def relist_end(self) -> None:
        fresh, self._fresh = self._fresh, {}
        old = self.store.replace(fresh)
        for name in set(old) | set(fresh):
            if old.get(name) != fresh.get(name):
                self.on_change(name, old.get(name), fresh.get(name))

    def changed(self, kind: str, obj: JSON) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        old = self.store.peek(name)
        new = None if kind == "DELETED" else trimmed(obj)
        if new is None:
            self.store.delete(name)
        else:
            self.store.put(name, new)
        self.on_change(name, old, new)
