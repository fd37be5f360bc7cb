"""The live reads of the out-of-service taint's decisions (docs/fencing.md): every one a
request to the API server without a resourceVersion — a consistent read, never a watch
cache or an informer's copy (the taint cache race of kubernetes#142331: a controller that
trusted its cache removed a taint whose node still held volumes).

- the Nodes (all: the guards count them) and one Node right before its write;
- the medik8s records for a node: FenceAgentsRemediations in the namespaces the policy
  names, SelfNodeRemediations of the cluster — as proof (core/rules/fencing.py) and as
  "FAR or SNR manage this node" (they taint or delete its pods themselves: unstick does
  not race them); a CRD not installed (404) or no RBAC (403) is no record;
- what is left of a node before its taint is removed: its pods that are Terminating (and,
  for those the taint manager evicted, when), and the VolumeAttachments that name it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from urllib.parse import quote

from kubernetes.client.exceptions import ApiException

from unstick.controller.deciding.fencing_records import SNR_PATH, far_path, kept, target
from unstick.core.model.facts import FenceAgentsRemediationFacts, SelfNodeRemediationFacts
from unstick.core.model.snapshot import (
    parse_fence_agents_remediations,
    parse_self_node_remediations,
)
from unstick.core.policy.out_of_service import Leftovers, Manager
from unstick.core.remediation import parse_datetime
from unstick.core.rules.fencing import FencingSettings
from unstick.kube.client import JSON, Kube

log = logging.getLogger("unstick.decisions")

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
VOLUME_ATTACHMENTS = "/apis/storage.k8s.io/v1/volumeattachments"


def node_path(name: str) -> str:
    return f"{NODES}/{quote(name, safe='')}"


def nodes(kube: Kube) -> list[JSON]:
    return kube.list_all(NODES)


def node(kube: Kube, name: str) -> JSON | None:
    return kube.get(node_path(name))


def _list(kube: Kube, path: str) -> list[JSON]:
    try:
        return kube.list_all(path)
    except ApiException as exc:
        if exc.status not in (403, 404):
            raise
        level = logging.DEBUG if exc.status == 404 else logging.WARNING
        log.log(level, "%s not read (%s): no record", path, exc.status)
        return []


def _created(obj: JSON) -> datetime | None:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    try:
        return parse_datetime(stamp) if isinstance(stamp, str) and stamp else None
    except ValueError:
        return None


Medik8s = tuple[
    tuple[FenceAgentsRemediationFacts, ...],
    tuple[SelfNodeRemediationFacts, ...],
    tuple[Manager, ...],
]


def medik8s_records(kube: Kube, settings: FencingSettings) -> tuple[list[JSON], list[JSON]]:
    """Every FAR of the named namespaces and every SNR of the cluster (a LIST each)."""
    fars = [o for ns in settings.far_namespaces for o in _list(kube, far_path(ns))]
    return fars, _list(kube, SNR_PATH)


def medik8s_of(fars: list[JSON], snrs: list[JSON], name: str) -> Medik8s:
    """The node's FARs and SNRs among those read, as facts and as managers."""
    fars = [o for o in fars if target(o) == name]
    snrs = [o for o in snrs if target(o) == name]
    managers = tuple(
        Manager(f"{kind} {meta.get('namespace')}/{meta.get('name')}", _created(o))
        for kind, objs in (("FenceAgentsRemediation", fars), ("SelfNodeRemediation", snrs))
        for o in objs
        for meta in [o.get("metadata") or {}]
    )
    far_facts = parse_fence_agents_remediations(
        {"fenceAgentsRemediations": [kept(o) for o in fars]}
    )
    snr_facts = parse_self_node_remediations({"selfNodeRemediations": [kept(o) for o in snrs]})
    return far_facts, snr_facts, managers


def _deletion_asked(meta: JSON) -> datetime | None:
    """When a pod's deletion was asked for: its deletionTimestamp less its grace period
    (both the API server's); None when unreadable."""
    stamp, grace = meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds") or 0
    try:
        at = parse_datetime(stamp) if isinstance(stamp, str) and stamp else None
    except ValueError:
        return None
    if at is None or not isinstance(grace, int):
        return None
    return at - timedelta(seconds=grace)


def _evicted_by_taint(pod: JSON) -> bool:
    """The taint manager's eviction: it sets a True DisruptionTarget condition with reason
    DeletionByTaintManager before it deletes the pod."""
    return any(
        c.get("type") == "DisruptionTarget"
        and c.get("status") == "True"
        and c.get("reason") == "DeletionByTaintManager"
        for c in (pod.get("status") or {}).get("conditions") or []
        if isinstance(c, dict)
    )


def leftovers(kube: Kube, name: str) -> Leftovers:
    """The node's Terminating pods (with when the taint manager evicted those it did)
    and its VolumeAttachments, read live."""
    terminating, evicted_at = [], {}
    for pod in kube.list_all(PODS, {"fieldSelector": f"spec.nodeName={name}"}):
        meta = pod.get("metadata") or {}
        if not meta.get("deletionTimestamp"):
            continue
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        terminating.append(key)
        asked = _deletion_asked(meta) if _evicted_by_taint(pod) else None
        if asked is not None:
            evicted_at[key] = asked
    attachments = tuple(
        str((va.get("metadata") or {}).get("name"))
        for va in kube.list_all(VOLUME_ATTACHMENTS)
        if (va.get("spec") or {}).get("nodeName") == name
    )
    return Leftovers(tuple(terminating), attachments, evicted_at)
