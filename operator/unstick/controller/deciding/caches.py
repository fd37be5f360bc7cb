"""Nodes and CSINodes in memory, fed by watches, so a stuck pod is diagnosed at once.

- `ObjectCache`: cluster-scoped objects by name, kept by a lean list+watch
  (`unstick.kube.objectwatch`: a relist replaces everything, so deletions missed while
  the watch was down are not kept as live objects). A name the watch has not delivered
  (yet) is fetched once with a GET and remembered, absence included; a watch event always
  wins over such a GET (a GET answered after an event is dropped). Only what the
  diagnosis can use is kept (no managedFields, no node image list).
- `FreshNodes`: the Node read right before an action (docs/design.md §3: every action re-checks
  its preconditions right before acting). One GET serves every pod of the same node for
  `max_age_s` (1 s): concurrent callers for one node wait for the GET in flight instead
  of making their own.

- `BoundVolumes`: a stuck pod's claims and their volumes, which the diagnosis reads for
  one thing only: the CSI driver of each mount (claim → `spec.volumeName` → the volume's
  `spec.csi.driver`). The API server lets neither change for the life of the object (a
  claim's volumeName can be set once; a volume's source is immutable), whatever the
  phase, so a claim with a volumeName and any volume are kept for `ttl_s` (60 s): the
  passes over one pod cost one read of each per minute, not one per decision. The only
  change a kept entry can miss is a delete and re-create under the same name, for at most
  `ttl_s`; no act depends on it (the agent takes the driver of a replay from the node's
  `vol_data.json` and re-checks the mount right before acting; NodeGone's force-delete
  re-reads the Node, not claims). A claim without a volumeName, or absent: read every time.
  The detection threads only `peek` (no request: a pod's first worker pass reads them,
  before any probe needs them; a diagnosis without a probe does not use them).
- `WatchedVolumes`: every bound claim's volumeName and every volume's CSI driver, kept by
  a lean list+watch of each (issue 34): `BoundVolumes` looks there first, so a stuck
  pod's claim and volume cost no request at all (2 GETs per pod in the 100-pod bench,
  ~20 % of every request). Only those two strings are kept per object (a claim without a
  volumeName is not kept: read every time, as above). The immutability argument above
  holds as it is; a watch only narrows the delete-and-re-create window to its delivery
  delay. Not held (the watch not listed yet, or forbidden by an older chart's RBAC): the
  GET as before.

All are thread-safe: read from the detection and worker threads, written from Kopf's
event loop.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

from unstick.kube.client import JSON
from unstick.kube.listwatch import ListWatch, WatchSpec
from unstick.kube.objectwatch import trimmed

SHARED_NODE_READ_S = 1.0  # a Node GET is shared by the pods of that node for this long


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}"


def csi_node_path(name: str) -> str:
    return f"/apis/storage.k8s.io/v1/csinodes/{quote(name, safe='')}"


class ObjectCache:
    """name → object (or None: known absent), from watch events; a GET on a miss."""

    def __init__(self, fetch: Callable[[str], JSON | None]) -> None:
        self._fetch = fetch
        self._lock = threading.Lock()
        self._objects: dict[str, JSON | None] = {}
        self._events = 0  # bumped by every watch event: a GET older than one is dropped

    def put(self, name: str, obj: JSON) -> None:
        with self._lock:
            self._objects[name] = obj
            self._events += 1

    def replace(self, objects: dict[str, JSON]) -> dict[str, JSON | None]:
        """After a complete LIST: exactly these exist, every other name is absent."""
        with self._lock:
            old = self._objects
            self._objects = {**dict.fromkeys(old), **objects}
            self._events += 1
        return old

    def delete(self, name: str) -> None:
        with self._lock:
            self._objects[name] = None
            self._events += 1

    def get(self, name: str) -> JSON | None:
        with self._lock:
            if name in self._objects:
                return self._objects[name]
            seen = self._events
        obj = self._fetch(name)
        with self._lock:
            if name in self._objects:  # a watch event came meanwhile: it is newer
                return self._objects[name]
            if self._events == seen:
                self._objects[name] = trimmed(obj) if obj is not None else None
        return obj

    def peek(self, name: str) -> JSON | None:
        """What the cache holds (None: absent or unknown); never fetches."""
        with self._lock:
            return self._objects.get(name)

    def objects(self) -> list[JSON]:
        """Every object the cache holds (never fetches)."""
        with self._lock:
            return [o for o in self._objects.values() if o is not None]

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)


class FreshNodes:
    """Node GETs right before acting, one per node per `max_age_s`, shared."""

    def __init__(
        self,
        fetch: Callable[[str], JSON | None],
        max_age_s: float = SHARED_NODE_READ_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self.max_age_s = max_age_s
        self.clock = clock
        self._lock = threading.Lock()
        self._node_locks: dict[str, threading.Lock] = {}
        self._reads: dict[str, tuple[float, JSON | None]] = {}

    def get(self, name: str) -> JSON | None:
        """The Node as the API server returned it at most `max_age_s` ago (None: absent)."""
        with self._lock:
            node_lock = self._node_locks.setdefault(name, threading.Lock())
        with node_lock:  # one GET in flight per node; the others wait and share it
            with self._lock:
                hit = self._reads.get(name)
            if hit is not None and self.clock() - hit[0] <= self.max_age_s:
                return hit[1]
            started = self.clock()  # age counts from before the request was sent
            node = self._fetch(name)
            with self._lock:
                self._reads[name] = (started, node)
                self._forget_old(started)
            return node

    def _forget_old(self, now: float) -> None:
        if len(self._reads) > 64:
            for key in [k for k, (t, _) in self._reads.items() if now - t > self.max_age_s]:
                del self._reads[key]
                self._node_locks.pop(key, None)


BOUND_TTL_S = 60.0
BOUND_MAX = 20_000


class BoundVolumes:
    """API path → claim or volume, kept `ttl_s` when it is bound (see the module doc)."""

    def __init__(
        self,
        fetch: Callable[[str], JSON | None],
        ttl_s: float = BOUND_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        watched: Callable[[str], JSON | None] = lambda _path: None,
    ) -> None:
        self._fetch = fetch
        self.ttl_s = ttl_s
        self.clock = clock
        self._watched = watched  # WatchedVolumes.peek of claims and volumes, by path
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[float, JSON]] = {}

    def peek(self, path: str) -> JSON | None:
        """The watched or kept object, or None when neither holds it: never a request
        (the detection threads read this way; the worker pass reads with `get`)."""
        watched = self._watched(path)
        if watched is not None:
            return watched
        with self._lock:
            hit = self._kept.get(path)
        if hit is not None and self.clock() - hit[0] <= self.ttl_s:
            return hit[1]
        return None

    def get(self, path: str) -> JSON | None:
        hit = self.peek(path)
        if hit is not None:
            return hit
        now = self.clock()
        obj = self._fetch(path)
        if obj is not None and _bound(path, obj):
            with self._lock:
                self._kept[path] = (now, trimmed(obj))
                if len(self._kept) > BOUND_MAX:  # the oldest first
                    for old in sorted(self._kept, key=lambda k: self._kept[k][0])[
                        : BOUND_MAX // 10
                    ]:
                        del self._kept[old]
        return obj


def _bound(path: str, obj: JSON) -> bool:
    """What the diagnosis reads of it is fixed for the object's life: a volume (its source
    is immutable) or a claim whose volumeName is set (settable once). The phase does not
    matter: a Bound claim can turn Lost, its volumeName stays."""
    if "/persistentvolumeclaims/" not in path:
        return True
    return bool((obj.get("spec") or {}).get("volumeName"))


CLAIMS = "/api/v1/persistentvolumeclaims"
VOLUMES = "/api/v1/persistentvolumes"


def volume_path(obj: JSON) -> str | None:
    """The API path a claim or volume is read at (as `inputs.claims_and_volumes` reads it)."""
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str):
        return None
    if isinstance(namespace, str):
        return (
            f"/api/v1/namespaces/{quote(namespace, safe='')}/persistentvolumeclaims/"
            f"{quote(name, safe='')}"
        )
    return f"{VOLUMES}/{quote(name, safe='')}"


def volume_fact(obj: JSON) -> str | None:
    """What the diagnosis reads of a claim (its volumeName; None without one: not kept) or
    of a volume (its CSI driver; "" for a volume of another kind)."""
    spec = obj.get("spec") or {}
    if isinstance((obj.get("metadata") or {}).get("namespace"), str):
        volume = spec.get("volumeName")
        return volume if isinstance(volume, str) and volume else None
    driver = (spec.get("csi") or {}).get("driver")
    return sys.intern(driver) if isinstance(driver, str) else ""  # a few drivers, shared


def volume_object(path: str, fact: str) -> JSON:
    """The claim or volume at `path` as the bundle parser reads it, from its kept fact."""
    parts = path.split("/")  # ['', api, v1, namespaces, <ns>, persistentvolumeclaims, <name>]
    name = unquote(parts[-1])
    if len(parts) == 7:
        return {"metadata": {"name": name, "namespace": unquote(parts[4])},
                "spec": {"volumeName": fact}}  # fmt: skip
    return {"metadata": {"name": name}, "spec": {"csi": {"driver": fact}} if fact else {}}


class WatchedVolumes:
    """Every bound claim (`CLAIMS`) or every volume (`VOLUMES`) by API path, reduced to
    one string (`volume_fact`: ~0.2 KB per object with its path), kept by a lean
    list+watch (a `listwatch.Sink`; see the module doc)."""

    def __init__(self, kube: Any, path: str, what: str, *, watch_timeout_s: int = 300) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, str] = {}
        self._fresh: dict[str, str] = {}
        self.loop = ListWatch(kube, WatchSpec(path, what, watch_timeout_s=watch_timeout_s), self)

    def peek(self, path: str) -> JSON | None:
        with self._lock:
            fact = self._kept.get(path)
        return None if fact is None else volume_object(path, fact)

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()

    # -- the Sink ---------------------------------------------------------------------

    def relist_begin(self) -> None:
        self._fresh = {}

    def listed(self, obj: JSON) -> None:
        path, fact = volume_path(obj), volume_fact(obj)
        if path is not None and fact is not None:
            self._fresh[path] = fact

    def relist_end(self) -> None:
        with self._lock:
            self._kept, self._fresh = self._fresh, {}

    def changed(self, kind: str, obj: JSON) -> None:
        path = volume_path(obj)
        if path is None:
            return
        fact = None if kind == "DELETED" else volume_fact(obj)
        with self._lock:
            if fact is None:
                self._kept.pop(path, None)
            else:
                self._kept[path] = fact
