"""The owners of a pod's finalizers (finalizer triage, `unstick.core.rules.finalizer_owners`),
for the controller's bundles: the leader leases of the controllers that remove built-in
finalizers (e.g. `batch.kubernetes.io/job-tracking`), and the Leases and Deployments the
policies' `spec.finalizerOwners` map finalizer prefixes to.

Read only for a pod that rule 1 (FinalizerBlocked) may hold — its final delete issued
(`deletionGracePeriodSeconds: 0`) or on no node — and only the owners of its finalizers;
each is kept `ttl_s` (one GET per owner per 10 s at most, however many pods wait on it).
Without RBAC to read it there is none, and the evidence says whether the owner runs is
not known. An owner read and found gone (missing, a Deployment with no available replica,
a Lease with no holder) is remembered from the first time it was seen so, while this
process runs: the bundle's `ownersGoneSince` (a restart starts counting again — later,
never sooner). Only an unbroken run of reads counts: when the last read that found it gone
is more than `max_gap_s` old (no pod needed the owner meanwhile, or its reads failed), the
owner may have been back and gone again unseen, so the count starts again at this read —
a day-old sighting never makes a finalizer removable at once.

A Lease is judged on this reader's clock, as client-go's leader election does: each read
is compared with the last one (its `spec.renewTime` and `metadata.resourceVersion`), and
the wall time of the read that first showed the present values is kept — the bundle's
`leasesObserved` (`unchangedSince`, and `changeSeen` once a read showed a change). The core
judges from that (`finalizer_owners.lease_state`); the holder's renewTime is never
compared with this clock. An unchanged resourceVersion means nothing wrote the Lease, so a
gap in reading does not break that memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

from kubernetes.client.exceptions import ApiException

from unstick.core.model.facts import LEASE
from unstick.core.remediation import rfc3339
from unstick.core.rules.finalizer_owners import FinalizerOwner, OwnerRef, owner_of
from unstick.kube.client import JSON, Kube

log = logging.getLogger(__name__)
TTL_S = 10.0
#: reads of a waiting pod's owners come at least every re-check (300 s by default; wiring
#: passes 3 re-checks): a longer gap breaks the "gone since" run
MAX_GAP_S = 900.0
_UNREAD: Any = object()  # a GET that failed (no RBAC, API error): not known


def owner_path(ref: OwnerRef) -> str:
    group = "coordination.k8s.io/v1" if ref.kind == LEASE else "apps/v1"
    plural = "leases" if ref.kind == LEASE else "deployments"
    return (
        f"/apis/{group}/namespaces/{quote(ref.namespace, safe='')}/{plural}/"
        f"{quote(ref.name, safe='')}"
    )


def owners_needed(pod: JSON, mapping: Iterable[FinalizerOwner] = ()) -> list[OwnerRef]:
    """The owners rule 1's evidence needs for this pod (built-in leases, mapped owners)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if meta.get("deletionGracePeriodSeconds") != 0 and spec.get("nodeName"):
        return []
    entries = tuple(mapping)
    finalizers = [f for f in meta.get("finalizers") or [] if isinstance(f, str)]
    refs = {owner_of(f, entries) for f in finalizers}
    return sorted((r for r in refs if r is not None), key=str)


def needed(pod: JSON) -> list[tuple[str, str]]:
    """The (namespace, name) of the built-in leases rule 1's evidence needs for this pod."""
    return [(r.namespace, r.name) for r in owners_needed(pod)]


def is_gone(ref: OwnerRef, obj: JSON | None) -> bool:
    """Missing, a Deployment with no available replica, a Lease with no holder."""
    if obj is None:
        return True
    if ref.kind == LEASE:
        return not (obj.get("spec") or {}).get("holderIdentity")
    return int((obj.get("status") or {}).get("availableReplicas") or 0) < 1


def bundle_keys(objects: list[JSON]) -> JSON:
    """Split what `OwnerLeases.for_pod` returns into the bundle's keys: `leases`,
    `deployments`, `ownersGoneSince`, `leasesObserved` (each optional for older readers)."""
    out: JSON = {"leases": [o for o in objects if o.get("kind") == LEASE]}
    deployments = [o for o in objects if o.get("kind") == "Deployment"]
    gone = [o["ownerGoneSince"] for o in objects if "ownerGoneSince" in o]
    observed = [o["leaseObserved"] for o in objects if "leaseObserved" in o]
    if deployments:
        out["deployments"] = deployments
    if gone:
        out["ownersGoneSince"] = gone
    if observed:
        out["leasesObserved"] = observed
    return out


class OwnerLeases:
    def __init__(
        self,
        kube: Kube,
        mappings: Callable[[], Iterable[FinalizerOwner]] = tuple,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        *,
        max_gap_s: float = MAX_GAP_S,
    ) -> None:
        self.kube, self.mappings, self.ttl_s = kube, mappings, ttl_s
        self.clock, self.wall, self.max_gap_s = clock, wall, max_gap_s
        self._kept: dict[OwnerRef, tuple[float, Any]] = {}
        self._gone_since: dict[OwnerRef, float] = {}  # wall time of the run's first gone read
        self._gone_read: dict[OwnerRef, float] = {}  # clock time of its latest gone read
        # a Lease's (renewTime, resourceVersion) as last read, the wall time of the read that
        # first showed them, and whether a read showed them change
        self._lease_seen: dict[OwnerRef, tuple[tuple[Any, Any], float, bool]] = {}
        self._lock = threading.Lock()

    def for_pod(self, pod: JSON) -> list[JSON]:
        """The pod's finalizer owners as read (Leases, Deployments) plus, for one seen gone,
        `{"ownerGoneSince": {kind, namespace, name, since}}` (see `bundle_keys`)."""
        out: list[JSON] = []
        for ref in owners_needed(pod, self.mappings()):
            obj = self._get(ref)
            if obj is _UNREAD:
                continue
            if obj is not None:
                out.append(obj)
            with self._lock:
                since = self._gone_since.get(ref)
                seen = self._lease_seen.get(ref) if obj is not None else None
            if seen is not None:
                entry = {"namespace": ref.namespace, "name": ref.name, "changeSeen": seen[2]}
                out.append({"leaseObserved": entry | {"unchangedSince": rfc3339(seen[1])}})
            if since is not None:
                entry = {"kind": ref.kind, "namespace": ref.namespace, "name": ref.name}
                out.append({"ownerGoneSince": entry | {"since": rfc3339(since)}})
        return out

    def _get(self, ref: OwnerRef) -> Any:
        now = self.clock()
        with self._lock:
            hit = self._kept.get(ref)
        if hit is not None and now - hit[0] <= self.ttl_s:
            return hit[1]
        try:
            obj: Any = self.kube.get(owner_path(ref))
        except ApiException as exc:
            log.debug("cannot read %s: %s", ref, exc.status)
            obj = _UNREAD
        with self._lock:
            self._kept[ref] = (now, obj)
            if ref.kind == LEASE and obj is not _UNREAD:
                self._observe_lease(ref, obj)
            if obj is not _UNREAD and is_gone(ref, obj):
                last = self._gone_read.get(ref)
                if ref not in self._gone_since or last is None or now - last > self.max_gap_s:
                    self._gone_since[ref] = self.wall()  # a new run (see the module doc)
                self._gone_read[ref] = now
            elif obj is not _UNREAD:
                self._gone_since.pop(ref, None)
                self._gone_read.pop(ref, None)
        return obj

    def _observe_lease(self, ref: OwnerRef, obj: JSON | None) -> None:
        """Remember when this reader first saw the Lease as it is now (under the lock)."""
        if obj is None:  # missing: a Lease made again later is a change anyway
            self._lease_seen.pop(ref, None)
            return
        values = (
            (obj.get("spec") or {}).get("renewTime"),
            (obj.get("metadata") or {}).get("resourceVersion"),
        )
        last = self._lease_seen.get(ref)
        if last is None:
            self._lease_seen[ref] = (values, self.wall(), False)
        elif last[0] != values:
            self._lease_seen[ref] = (values, self.wall(), True)
