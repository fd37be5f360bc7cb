"""Namespaces and RemediationPolicies as the agent's own list+watch keeps them (issue 34):
the round trip's re-derivation of the policy in force (design.md §3 invariant 7) reads them
here instead of a GET per pod, under the freshness rule of docs/agent.md ("Namespace and
policy reads from watches"):

- a cache answers only while its watch is live: listed completely, not in a relist, and no
  watch error since the watch last (re)connected — otherwise the caller GETs;
- an object the cache does not hold is read with a GET (never "absent" from a cache);
- a RemediationPolicy is taken from the cache only at the very resourceVersion the
  controller's mandate names (`spec.mandate.policyResourceVersion`): the agent's view is
  then exactly what the controller decided on, never older; at any other version (the
  policy changed meanwhile, or the watch has not delivered the controller's version yet)
  it is read with a GET, as before.

Both watches run on the one watch loop (`unstick.kube.listwatch.ListWatch`); the objects
come from the API server, never from a Remediation, so a forged or replayed record cannot
change what they say.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from unstick.kube.listwatch import ListWatch, WatchSpec

JSON = dict[str, Any]
Getter = Callable[[str], JSON | None]


def namespace_labels(obj: JSON) -> JSON:
    """What the agent keeps of a Namespace: its name, labels and resourceVersion."""
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "labels", "resourceVersion") if k in meta}
    return {"metadata": kept}


class Watched:
    """One collection (cluster-scoped, by name) kept by a list+watch; a `listwatch.Sink`."""

    def __init__(
        self,
        kube: Any,
        path: str,
        what: str,
        *,
        keep: Callable[[JSON], JSON] = lambda obj: obj,
        stop: threading.Event | None = None,
        watch_timeout_s: int = 300,
        backoff_max_s: float = 30.0,
    ) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._objects: dict[str, JSON] = {}
        self._listing: dict[str, JSON] | None = None  # a relist in progress
        self._errors_at_connect = -1  # the loop's error count when the watch last connected
        spec = WatchSpec(
            path, what, watch_timeout_s=watch_timeout_s, backoff_s=1.0, backoff_max_s=backoff_max_s
        )
        self.watch = ListWatch(kube, spec, self, stop=stop, before_watch=self._connecting)

    # --- what the agent reads ------------------------------------------------------------

    def live(self) -> bool:
        """Listed, not relisting, and no watch error since the watch last connected."""
        stats = self.watch.stats
        with self._lock:
            return (
                self.watch.synced.is_set()
                and self._listing is None
                and stats.errors == self._errors_at_connect
            )

    def peek(self, name: str) -> JSON | None:
        """The kept object, or None: not kept, or the watch is not live (then GET it)."""
        if not self.live():
            return None
        with self._lock:
            return self._objects.get(name)

    # --- the watch loop's Sink -----------------------------------------------------------

    def _connecting(self) -> None:
        with self._lock:
            self._errors_at_connect = self.watch.stats.errors

    def relist_begin(self) -> None:
        with self._lock:
            self._listing = {}

    def listed(self, obj: JSON) -> None:
        name = (obj.get("metadata") or {}).get("name")
        with self._lock:
            if isinstance(name, str) and self._listing is not None:
                self._listing[name] = self._keep(obj)

    def relist_end(self) -> None:
        with self._lock:
            if self._listing is not None:
                self._objects, self._listing = self._listing, None
            self._errors_at_connect = self.watch.stats.errors

    def changed(self, kind: str, obj: JSON) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            return
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(name, None)
            else:
                self._objects[name] = self._keep(obj)

    def start(self) -> None:
        self.watch.start()

    def stop(self) -> None:
        self.watch.stop()


def cached_or(get: Getter, cache: Watched) -> Getter:
    """`get` (a GET), answered from `cache` where it holds the object and is live."""

    def read(name: str) -> JSON | None:
        kept = cache.peek(name)
        return kept if kept is not None else get(name)

    return read
