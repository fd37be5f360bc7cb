"""The leader leases of the controllers that remove a pod's built-in finalizers (issue #25,
finalizer triage, `unstick.core.finalizer_owners`), for the controller's bundles.

Read only for a pod that rule 1 (FinalizerBlocked) may hold — its final delete issued
(`deletionGracePeriodSeconds: 0`) or on no node — and that carries a built-in finalizer
(e.g. `batch.kubernetes.io/job-tracking`); each Lease is kept `ttl_s` (one GET per lease
per 10 s at most, however many pods wait on it). Without RBAC to read it (or when it does
not exist) there is none, and the evidence says whether the owner runs is not known.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from urllib.parse import quote

from kubernetes.client.exceptions import ApiException

from unstick.core.finalizer_owners import BUILT_IN
from unstick.kube.client import JSON, Kube

log = logging.getLogger(__name__)
TTL_S = 10.0


def _lease_path(namespace: str, name: str) -> str:
    return (
        f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases/"
        f"{quote(name, safe='')}"
    )


def needed(pod: JSON) -> list[tuple[str, str]]:
    """The (namespace, name) of the leases rule 1's evidence needs for this pod."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if meta.get("deletionGracePeriodSeconds") != 0 and spec.get("nodeName"):
        return []
    finalizers = meta.get("finalizers") or []
    return sorted({BUILT_IN[f][1] for f in finalizers if isinstance(f, str) and f in BUILT_IN})


class OwnerLeases:
    def __init__(
        self, kube: Kube, ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.kube, self.ttl_s, self.clock = kube, ttl_s, clock
        self._kept: dict[tuple[str, str], tuple[float, JSON | None]] = {}
        self._lock = threading.Lock()

    def for_pod(self, pod: JSON) -> list[JSON]:
        out = []
        for key in needed(pod):
            lease = self._get(key)
            if lease is not None:
                out.append(lease)
        return out

    def _get(self, key: tuple[str, str]) -> JSON | None:
        now = self.clock()
        with self._lock:
            hit = self._kept.get(key)
        if hit is not None and now - hit[0] <= self.ttl_s:
            return hit[1]
        try:
            lease = self.kube.get(_lease_path(*key))
        except ApiException as exc:
            log.debug("cannot read lease %s/%s: %s", key[0], key[1], exc.status)
            lease = None
        with self._lock:
            self._kept[key] = (now, lease)
        return lease
