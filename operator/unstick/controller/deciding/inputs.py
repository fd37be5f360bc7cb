"""Diagnosis inputs for ONE stuck pod, fetched on demand and shaped as a snapshot bundle.

The controller builds exactly the bundle of docs/design.md §6 (objects as the API returns them)
and hands it to the core's bundle parser — one code path for `unstick diagnose` and the
controller. Nothing here is fetched for pods that are not stuck.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from unstick.controller.deciding.fencing_records import FencingRecords
from unstick.controller.deciding.owner_leases import bundle_keys
from unstick.core.remediation import API_VERSION, SNAPSHOT_KIND, rfc3339
from unstick.core.rules.fencing import FencingSettings
from unstick.kube.client import JSON, Kube, pod_path

__all__ = [
    "Lookup",
    "NodeInputs",
    "build_bundle",
    "claims_and_volumes",
    "drivers_needed",
    "fetch_pod",
]


def _claim_names(pod: JSON) -> list[str]:
    names = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        claim = (volume or {}).get("persistentVolumeClaim") or {}
        if claim.get("claimName"):
            names.append(claim["claimName"])
    return names


def claims_and_volumes(pod: JSON, get: Lookup) -> tuple[list[JSON], list[JSON]]:
    """The pod's claims and their volumes, each read with `get` (by API path)."""
    namespace = (pod.get("metadata") or {}).get("namespace") or ""
    claims: list[JSON] = []
    volumes: list[JSON] = []
    for claim_name in _claim_names(pod):
        claim = get(
            f"/api/v1/namespaces/{quote(namespace, safe='')}/persistentvolumeclaims/"
            f"{quote(claim_name, safe='')}"
        )
        if claim is None:
            continue
        claims.append(claim)
        pv_name = (claim.get("spec") or {}).get("volumeName")
        if pv_name:
            pv = get(f"/api/v1/persistentvolumes/{quote(pv_name, safe='')}")
            if pv is not None:
                volumes.append(pv)
    return claims, volumes


def drivers_needed(probe: Any) -> bool:
    """Whether a diagnosis of this probe reads a CSI volume's driver — the one thing it
    reads of the pod's claims and volumes (core/model/node_facts.py: of each of the pod's
    mounts, and of each non-empty CSI volume dir): only a probe that shows a mount of the
    pod or a volume dir that is not empty. No probe, or one that shows nothing of the pod
    left (the agent's answer after its steps, as a rule), needs none: their claims and
    volumes are not read (issue 34: 2 GETs per pod). A probe that is not an object is
    read as before (its bundle is refused by the parser anyway)."""
    if probe is None:
        return False
    if not isinstance(probe, dict):
        return True
    mountinfo = probe.get("mountinfo")
    if not isinstance(mountinfo, str) or mountinfo.strip():
        return True
    dirs = probe.get("volumeDirs") or []
    if not isinstance(dirs, list):
        return True
    return any(not isinstance(d, dict) or d.get("empty") is not True for d in dirs)


def _not_ready(node: JSON | None) -> bool:
    """The Node exists and its Ready condition is not True: only then can fencing records
    matter (NodeUnreachable), so only then are they read."""
    if node is None:
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def fetch_pod(kube: Kube, namespace: str, name: str) -> JSON | None:
    return kube.get(pod_path(namespace, name))


Lookup = Callable[[str], "JSON | None"]


@dataclass(frozen=True, slots=True)
class NodeInputs:
    """Where the Node, CSINode and the pod's claims and volumes of a bundle come from
    (default: a GET each). `get` reads any other object by its API path."""

    node: Lookup | None = None
    csi_node: Lookup | None = None
    get: Lookup | None = None  # claims and volumes, by path (controller/deciding/caches.py Bound)
    # the pod's FailedKillPod Events by pod UID, from memory (controller/deciding/kill_events.py)
    events: Callable[[str], list[JSON]] | None = None
    # a FinalizerBlocked pod's finalizer owners, as `OwnerLeases.for_pod` reads them
    leases: Callable[[JSON], list[JSON]] | None = None
    # the node's fencing records, as `FencingRecords.read` (or `peek`) gives them
    fencing: Callable[[str, FencingSettings], JSON] | None = None


def build_bundle(
    kube: Kube,
    pod: JSON,
    probe: Any,
    now: float,
    sources: NodeInputs = NodeInputs(),
    *,
    with_attachments: bool = True,
    fencing: FencingSettings | None = None,
    claims_if_needed: bool = False,
) -> JSON:
    """The snapshot bundle for `pod` as of `now`, with `probe` from its Remediation.

    `with_attachments=False` leaves `volumeAttachments` empty: they are in a snapshot for the
    people reading it, the diagnosis does not use them, and finding a pod's means a LIST
    of every VolumeAttachment in the cluster — too dear for each decision of the controller.
    `fencing`: the policy's fencing settings; the node's FenceAgentsRemediations and
    SelfNodeRemediations are read only for the sources they list (docs/fencing.md).
    `claims_if_needed=True` (the controller's decisions) reads the pod's claims and volumes
    only when the diagnosis of `probe` reads a driver (`drivers_needed`); a snapshot for
    people (`unstick snapshot`) has them always.
    """
    meta = pod.get("metadata") or {}
    node_name = (pod.get("spec") or {}).get("nodeName") or ""
    get_node = sources.node or (lambda n: kube.get(f"/api/v1/nodes/{quote(n, safe='')}"))
    get_csi = sources.csi_node or (
        lambda n: kube.get(f"/apis/storage.k8s.io/v1/csinodes/{quote(n, safe='')}")
    )
    node = get_node(node_name) if node_name else None
    csi_node = get_csi(node_name) if node_name else None
    get = sources.get or (lambda path: kube.get(path))  # noqa: PLW0108 (kube may be None)
    claims: list[JSON] = []
    volumes: list[JSON] = []
    if not claims_if_needed or drivers_needed(probe):
        claims, volumes = claims_and_volumes(pod, get)
    attachments: list[JSON] = []
    if with_attachments and volumes and node_name:
        pv_names = {(pv.get("metadata") or {}).get("name") for pv in volumes}
        for va in kube.list_all("/apis/storage.k8s.io/v1/volumeattachments"):
            spec = va.get("spec") or {}
            source = spec.get("source") or {}
            if spec.get("nodeName") == node_name and source.get("persistentVolumeName") in pv_names:
                attachments.append(va)
    records: JSON = {}
    if fencing is not None and _not_ready(node) and (fencing.reads_far or fencing.reads_snr):
        read = sources.fencing or FencingRecords(kube, ttl_s=0).read
        records = read(node_name, fencing)  # `node` exists: node_name is set
    pod = {"apiVersion": "v1", "kind": "Pod", **pod}
    return {
        "apiVersion": API_VERSION,
        "kind": SNAPSHOT_KIND,
        "capturedAt": rfc3339(now),
        "pod": pod,
        "node": node,
        "csiNode": csi_node,
        "persistentVolumeClaims": claims,
        "persistentVolumes": volumes,
        "volumeAttachments": attachments,
        "events": sources.events(str(meta.get("uid") or "")) if sources.events else [],
        "probe": probe or None,
        # leases, deployments, ownersGoneSince: a FinalizerBlocked pod's finalizer owners
        **bundle_keys(sources.leases(pod) if sources.leases else []),
        # fenceAgentsRemediations, selfNodeRemediations: the node's fencing records
        **records,
    }
