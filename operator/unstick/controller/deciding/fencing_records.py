"""Fencing records of a stuck pod's node, for the controller's bundles (docs/fencing.md):
medik8s FenceAgentsRemediations (in the namespaces the policy names) and
SelfNodeRemediations, read only when the pod's policy lists that source in
`fencingEvidence`. The core (`unstick.core.rules.fencing`) decides what they prove.

- Read only for a pod whose node exists and is not Ready (`inputs.build_bundle`): rare, so
  the detection threads read them too (a decision from memory would otherwise never see
  the proof). A LIST per namespace (FARs) or of the cluster (SNRs), shared for `ttl_s` (1 s)
  by the pods decided meanwhile (a node's pods are decided together): no decision, nor the
  re-check right before an act, uses a read older than that — a record kept longer would
  hide a proof that appeared meanwhile until the pod's next decision.
- A record that appears after a pod was observed is seen at its next decision: a change of
  the pod or its Node, the 10 s look at an unproven NodeUnreachable pod whose policy reads
  these records (controller/reconciler.py FENCING_PROOF_POLL_S), or the slow re-check
  (docs/fencing.md).
- The group's CRD missing (404), no RBAC to read (403) or any other API error: no records,
  which is no evidence — never an error of the decision, never proof.
- Only what the diagnosis reads is kept: name, namespace, the node-name annotation, the
  owners' kinds, and status. A FAR's spec may carry fence agent parameters (credentials):
  it is neither kept nor put into a bundle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from kubernetes.client.exceptions import ApiException

from unstick.core.model.snapshot import NODE_NAME_ANNOTATION
from unstick.core.rules.fencing import FencingSettings
from unstick.kube.client import JSON, Kube

log = logging.getLogger(__name__)
TTL_S = 1.0  # a LIST is shared this long (a node's pods at once), never longer
FAR_GROUP = "fence-agents-remediation.medik8s.io"
SNR_GROUP = "self-node-remediation.medik8s.io"
FAR_KEY, SNR_KEY = "fenceAgentsRemediations", "selfNodeRemediations"


def far_path(namespace: str) -> str:
    return (
        f"/apis/{FAR_GROUP}/v1alpha1/namespaces/{quote(namespace, safe='')}/fenceagentsremediations"
    )


SNR_PATH = f"/apis/{SNR_GROUP}/v1alpha1/selfnoderemediations"


def kept(obj: JSON) -> JSON:
    """What the diagnosis reads of a medik8s remediation object (see the module doc)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    out_meta: JSON = {"name": meta.get("name"), "namespace": meta.get("namespace")}
    if NODE_NAME_ANNOTATION in annotations:
        out_meta["annotations"] = {NODE_NAME_ANNOTATION: annotations[NODE_NAME_ANNOTATION]}
    owners = [
        {"kind": r.get("kind"), "name": r.get("name")}
        for r in meta.get("ownerReferences") or []
        if isinstance(r, dict)
    ]
    if owners:
        out_meta["ownerReferences"] = owners
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": out_meta,
        "status": obj.get("status") or {},
    }


def target(obj: JSON) -> str:
    """The node a medik8s remediation object is for: the annotation, else its name."""
    meta = obj.get("metadata") or {}
    return str((meta.get("annotations") or {}).get(NODE_NAME_ANNOTATION) or meta.get("name"))


class FencingRecords:
    """path → (read at, the kept objects), one LIST per path per `ttl_s`."""

    def __init__(
        self,
        kube: Kube,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.ttl_s, self.clock = kube, ttl_s, clock
        self._kept: dict[str, tuple[float, list[JSON]]] = {}
        self._lock = threading.Lock()
        self._path_locks: dict[str, threading.Lock] = {}

    def read(self, node: str, settings: FencingSettings) -> JSON:
        """The bundle's `fenceAgentsRemediations` and `selfNodeRemediations` for `node`
        (only the keys of sources the policy reads)."""
        return self._records(node, settings)

    def _records(self, node: str, settings: FencingSettings) -> JSON:
        get = self._list
        out: JSON = {}
        if not node:
            return out
        if settings.reads_far:
            out[FAR_KEY] = [
                o for ns in settings.far_namespaces for o in get(far_path(ns)) if target(o) == node
            ]
        if settings.reads_snr:
            out[SNR_KEY] = [o for o in get(SNR_PATH) if target(o) == node]
        return out

    def _list(self, path: str) -> list[JSON]:
        with self._lock:
            path_lock = self._path_locks.setdefault(path, threading.Lock())
        with path_lock:  # one LIST in flight per path; the others wait and share it
            with self._lock:
                hit = self._kept.get(path)
            if hit is not None and self.clock() - hit[0] <= self.ttl_s:
                return hit[1]
            started = self.clock()
            objects = [kept(o) for o in self._fetch(path)]
            with self._lock:
                self._kept[path] = (started, objects)
            return objects

    def _fetch(self, path: str) -> list[Any]:
        try:
            return list(self.kube.list_all(path))
        except ApiException as exc:
            # 404: the CRD is not installed; 403: no RBAC. Either way no evidence.
            level = logging.DEBUG if exc.status == 404 else logging.WARNING
            log.log(level, "fencing records %s not read (%s): no evidence", path, exc.status)
            return []
