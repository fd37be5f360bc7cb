"""The newest copy this controller has of each pod's Remediation, so a pass need not GET it.

Fed by the Remediation watch (records/watch.py: `offer`, from the runtime, before that
event pokes the pod) and by the answers of this controller's own writes (every PATCH and
the POST answer the whole object). A copy may lag behind the API server — an agent's write the
watch has not delivered yet — and that is made safe by the writes, not by the copy: every
write a pass makes from a copy carries the copy's `metadata.resourceVersion`
(optimistic concurrency), so a pass that decided from an older version than the server
holds gets `409 Conflict`, changes nothing, drops the copy and decides again from a GET
(docs/controller.md, "The Remediation from the watch").

Keyed by (namespace, name), not by pod uid: a record at another name that claims the same
pod (a forgery, a leftover) never replaces the pod's own copy. Between two copies of
one record the newer resourceVersion wins (compared as numbers: etcd's revisions; where
one is not a number, the one offered last); the older is dropped.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from unstick.kube.client import JSON

MAX_COPIES = 20_000  # records kept (the oldest offered are dropped first)

Key = tuple[str, str]


def _key(obj: Mapping[str, Any]) -> Key | None:
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str) or not namespace or not name:
        return None
    return namespace, name


def version(obj: Mapping[str, Any] | None) -> str:
    """The object's resourceVersion, "" when it has none."""
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def _newer(offered: str, kept: str) -> bool:
    if offered.isdigit() and kept.isdigit():
        return int(offered) > int(kept)
    return True


def _copy(obj: JSON) -> JSON:
    """A deep copy of a JSON object (a few times faster than copy.deepcopy)."""
    copied: JSON = json.loads(json.dumps(obj))
    return copied


class RemediationCopies:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._copies: dict[Key, JSON] = {}

    def offer(self, obj: Mapping[str, Any]) -> None:
        """Keep `obj` (a Remediation as the API server answered or the watch delivered it)
        unless an equal or newer version of it is kept already."""
        key = _key(obj)
        if key is None or not version(obj):
            return
        with self._lock:  # most offers are of a version kept already: no copy for those
            current = self._copies.get(key)
            if current is not None and not _newer(version(obj), version(current)):
                return
        kept = _copy(dict(obj))
        with self._lock:
            current = self._copies.get(key)
            if current is not None and not _newer(version(kept), version(current)):
                return
            self._copies.pop(key, None)  # re-inserted: the newest offered last
            self._copies[key] = kept
            while len(self._copies) > MAX_COPIES:
                self._copies.pop(next(iter(self._copies)))

    def get(self, namespace: str, name: str) -> JSON | None:
        """A copy of the record's newest version known here (the caller may change it)."""
        with self._lock:
            kept = self._copies.get((namespace, name))
        return None if kept is None else _copy(kept)

    def drop(self, namespace: str, name: str) -> None:
        """Forget the record (deleted, or a write from its copy met a conflict)."""
        with self._lock:
            self._copies.pop((namespace, name), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._copies)
