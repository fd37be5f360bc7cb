"""The controller's Remediation watch: the project's one list+watch loop
(kube/listwatch.py: LIST in pages, WATCH with bookmarks from the list's resourceVersion,
resume from the last version seen, relist on 410 Gone, reconnect with backoff), not Kopf's.

Kopf's per-event work on Remediations (its body views, patch machinery, per-object
bookkeeping) was ~80 % of the controller's GIL in the 100-pod node-side burst
(docs/benchmark.md, "fifth round"); here an event costs its JSON decode, a trim and one
hand-over to the event loop.

One loop per namespace of the controller's scope (one for all namespaces when it has
none), in every replica — a standby keeps it warm and writes nothing (its runtime's gate).
`on_change(obj, deleted)` is called from the loop's thread for every record that changed:
each ADDED/MODIFIED/DELETED event, each record of a (re)list whose version is new to this
watch, and at the end of a relist each record known before but not listed again (deleted
while the watch was down: Kopf's watch never said so; handed over as a stub with its
name and pod uid). Objects are handed over without
`metadata.managedFields` (nothing of the controller reads it; it is a fifth of a record).
"""

from __future__ import annotations

from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from unstick.controller import failpoints
from unstick.core.remediation import ALL_REMEDIATIONS, POD_UID
from unstick.kube.client import JSON, Kube, remediation_path
from unstick.kube.listwatch import ListWatch, WatchSpec

OnRecord = Callable[[JSON, bool], None]  # (the record, deleted?)
Key = tuple[str, str]  # (namespace, name)


def _expire_here() -> None:
    """Fail point `remediation-watch` (controller/failpoints.py), reached before every
    watch of the loop: `fail@N` makes the Nth watch answer 410 Gone as an expired
    resourceVersion does, so a test sees the real controller relist."""
    try:
        failpoints.reached("remediation-watch")
    except failpoints.FailPointError as exc:
        raise ApiException(status=410, reason=f"{exc}: resourceVersion expired") from None


def trimmed(obj: JSON) -> JSON:
    """`obj` without `metadata.managedFields` (a shallow copy where it had them)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _key(obj: JSON) -> Key | None:
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    if isinstance(namespace, str) and isinstance(name, str) and namespace and name:
        return namespace, name
    return None


def _version(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _stub(obj: JSON) -> JSON:
    """What the sink keeps of a record: its name, version and pod uid (enough to say it
    went), not the record itself (the writer keeps copies of the records it needs)."""
    meta = obj.get("metadata") or {}
    kept = {k: meta.get(k) for k in ("namespace", "name", "resourceVersion")}
    return {"metadata": kept, "spec": {POD_UID: (obj.get("spec") or {}).get(POD_UID)}}


class RecordSink:
    """The `listwatch.Sink` of one Remediation loop: which records it knows (a stub of
    each: its last version, and its pod uid for a deletion seen only by a relist) and what
    changed."""

    def __init__(self, on_change: OnRecord) -> None:
        self.on_change = on_change
        self.known: dict[Key, JSON] = {}
        self._fresh: dict[Key, JSON] = {}

    def relist_begin(self) -> None:
        self._fresh = {}

    def listed(self, obj: JSON) -> None:
        key = _key(obj)
        if key is None:
            return
        self._fresh[key] = _stub(obj)
        before = self.known.get(key)
        if before is None or _version(before) != _version(obj):
            self.on_change(trimmed(obj), False)

    def relist_end(self) -> None:
        fresh, self._fresh = self._fresh, {}
        old, self.known = self.known, fresh
        for key, stub in old.items():
            if key not in fresh:
                self.on_change(stub, True)

    def changed(self, kind: str, obj: JSON) -> None:
        key = _key(obj)
        if key is None:
            return
        if kind == "DELETED":
            self.known.pop(key, None)
        else:
            self.known[key] = _stub(obj)
        self.on_change(trimmed(obj), kind == "DELETED")

    def size(self) -> int:
        return len(self.known)


class RemediationWatch:
    """The Remediations of `namespaces` (empty: every namespace), one loop each."""

    def __init__(
        self,
        kube: Kube,
        namespaces: tuple[str, ...],
        on_change: OnRecord,
        *,
        watch_timeout_s: int = 300,
        page_size: int = 500,
    ) -> None:
        paths = [remediation_path(ns) for ns in namespaces] or [ALL_REMEDIATIONS]
        self.sinks = [RecordSink(on_change) for _ in paths]
        self.loops = [
            ListWatch(
                kube,
                WatchSpec(
                    path,
                    "remediation watch",
                    page_size=page_size,
                    watch_timeout_s=watch_timeout_s,
                ),
                sink,
                before_watch=_expire_here,
            )
            for path, sink in zip(paths, self.sinks, strict=True)
        ]

    def start(self) -> None:
        for loop in self.loops:
            loop.start()

    def stop(self) -> None:
        for loop in self.loops:
            loop.stop()

    def synced(self) -> bool:
        """Every loop has delivered its first complete list."""
        return all(loop.synced.is_set() for loop in self.loops)

    def size(self) -> int:
        """How many records the watch holds (for the liveness body)."""
        return sum(sink.size() for sink in self.sinks)
