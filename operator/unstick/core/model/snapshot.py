"""Read a snapshot bundle (design.md §6) into Facts; errors name the field.

Unknown fields are ignored. The `node` key must be present (null when the Node does not
exist): a bundle that merely lacks it must not read as "node gone", which would permit a
force-delete.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from unstick.core import fields as f
from unstick.core.model.facts import (
    DEPLOYMENT,
    LEASE,
    ContainerStatus,
    DeploymentFacts,
    Disruption,
    Facts,
    FenceAgentsRemediationFacts,
    LeaseFacts,
    NodeFacts,
    PodEvent,
    PodFacts,
    PodVolume,
    ReadyCondition,
    SelfNodeRemediationFacts,
)
from unstick.core.model.probe import Probe

#: medik8s' annotation naming the node a remediation is for (else the object's name)
NODE_NAME_ANNOTATION = "remediation.medik8s.io/node-name"
FENCE_SUCCEEDED = "FenceAgentActionSucceeded"  # FAR v0.7.0 pkg/utils/conditions.go


class BundleError(f.FieldError):
    """The bundle cannot be read; `field` is e.g. `pod.metadata.uid`."""


def _volumes(spec: Mapping[str, object]) -> tuple[PodVolume, ...]:
    out = []
    for i, raw in enumerate(f.opt_list(spec, "volumes", "pod.spec")):
        where = f"pod.spec.volumes[{i}]"
        vol = f.as_object(raw, where)
        claim = f.opt_object(vol, "persistentVolumeClaim", where)
        csi = f.opt_object(vol, "csi", where)
        out.append(
            PodVolume(
                name=f.string(vol, "name", where),
                claim_name=f.opt_string(claim, "claimName", f"{where}.persistentVolumeClaim"),
                csi_driver=f.opt_string(csi, "driver", f"{where}.csi"),
            )
        )
    return tuple(out)


def _statuses(status: Mapping[str, object]) -> tuple[ContainerStatus, ...]:
    out = []
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for i, raw in enumerate(f.opt_list(status, key, "pod.status")):
            where = f"pod.status.{key}[{i}]"
            cs = f.as_object(raw, where)
            state = f.opt_object(cs, "state", where)
            known = [k for k in ("running", "waiting", "terminated") if k in state]
            out.append(
                ContainerStatus(
                    name=f.string(cs, "name", where),
                    state=known[0] if known else "unknown",
                    init=key == "initContainerStatuses",
                    ephemeral=key == "ephemeralContainerStatuses",
                )
            )
    return tuple(out)


def _disruption(status: Mapping[str, object]) -> Disruption | None:
    """The condition DisruptionTarget while True (its reason is required with it)."""
    for i, raw in enumerate(f.opt_list(status, "conditions", "pod.status")):
        where = f"pod.status.conditions[{i}]"
        cond = f.as_object(raw, where)
        if f.opt_string(cond, "type", where) != "DisruptionTarget":
            continue
        if f.opt_string(cond, "status", where) != "True":
            return None
        return Disruption(
            reason=f.opt_string(cond, "reason", where) or "(none)",
            message=f.opt_string(cond, "message", where) or "",
        )
    return None


def parse_pod(obj: object) -> PodFacts:
    pod = f.as_object(obj, "pod")
    meta = f.as_object(f.get(pod, "metadata", "pod"), "pod.metadata")
    spec = f.opt_object(pod, "spec", "pod")
    status = f.opt_object(pod, "status", "pod")
    annotations = f.opt_object(meta, "annotations", "pod.metadata")
    for key, value in annotations.items():
        if not isinstance(value, str):
            raise BundleError(f"pod.metadata.annotations.{key}", "must be a string")
    return PodFacts(
        namespace=f.string(meta, "namespace", "pod.metadata"),
        name=f.string(meta, "name", "pod.metadata"),
        uid=f.string(meta, "uid", "pod.metadata"),
        node_name=f.opt_string(spec, "nodeName", "pod.spec"),
        deletion_timestamp=f.opt_time(meta, "deletionTimestamp", "pod.metadata"),
        deletion_grace_period_seconds=f.opt_int(meta, "deletionGracePeriodSeconds", "pod.metadata"),
        finalizers=f.string_list(meta, "finalizers", "pod.metadata"),
        annotations={k: str(v) for k, v in annotations.items()},
        volumes=_volumes(spec),
        container_statuses=_statuses(status),
        generation=f.opt_int(meta, "generation", "pod.metadata"),
        observed_generation=f.opt_int(status, "observedGeneration", "pod.status"),
        disruption=_disruption(status),
    )


def parse_node(obj: object) -> NodeFacts:
    node = f.as_object(obj, "node")
    meta = f.as_object(f.get(node, "metadata", "node"), "node.metadata")
    spec = f.opt_object(node, "spec", "node")
    status = f.opt_object(node, "status", "node")
    ready = None
    for i, raw in enumerate(f.opt_list(status, "conditions", "node.status")):
        where = f"node.status.conditions[{i}]"
        cond = f.as_object(raw, where)
        if f.opt_string(cond, "type", where) == "Ready":
            ready = ReadyCondition(
                status=f.string(cond, "status", where),
                last_transition=f.opt_time(cond, "lastTransitionTime", where),
                reason=f.opt_string(cond, "reason", where),
                message=f.opt_string(cond, "message", where),
            )
    taints = []
    added = {}
    for i, raw in enumerate(f.opt_list(spec, "taints", "node.spec")):
        where = f"node.spec.taints[{i}]"
        taint = f.as_object(raw, where)
        taints.append(f.string(taint, "key", where))
        at = f.opt_time(taint, "timeAdded", where)
        if at is not None:
            added[taints[-1]] = at
    return NodeFacts(
        name=f.string(meta, "name", "node.metadata"),
        created=f.opt_time(meta, "creationTimestamp", "node.metadata"),
        ready=ready,
        taints=tuple(taints),
        taints_added=added,
    )


def _csi_node_drivers(obj: object) -> tuple[str, ...] | None:
    if obj is None:
        return None
    csi_node = f.as_object(obj, "csiNode")
    spec = f.opt_object(csi_node, "spec", "csiNode")
    names = []
    for i, raw in enumerate(f.opt_list(spec, "drivers", "csiNode.spec")):
        where = f"csiNode.spec.drivers[{i}]"
        names.append(f.string(f.as_object(raw, where), "name", where))
    return tuple(names)


def _claims(bundle: Mapping[str, object], namespace: str) -> dict[str, str | None]:
    claims: dict[str, str | None] = {}
    for i, raw in enumerate(f.opt_list(bundle, "persistentVolumeClaims", "")):
        where = f"persistentVolumeClaims[{i}]"
        pvc = f.as_object(raw, where)
        meta = f.as_object(f.get(pvc, "metadata", where), f"{where}.metadata")
        if (f.opt_string(meta, "namespace", f"{where}.metadata") or namespace) != namespace:
            continue
        spec = f.opt_object(pvc, "spec", where)
        claims[f.string(meta, "name", f"{where}.metadata")] = f.opt_string(
            spec, "volumeName", f"{where}.spec"
        )
    return claims


def _pv_drivers(bundle: Mapping[str, object]) -> dict[str, str | None]:
    drivers: dict[str, str | None] = {}
    for i, raw in enumerate(f.opt_list(bundle, "persistentVolumes", "")):
        where = f"persistentVolumes[{i}]"
        pv = f.as_object(raw, where)
        meta = f.as_object(f.get(pv, "metadata", where), f"{where}.metadata")
        spec = f.opt_object(pv, "spec", where)
        csi = f.opt_object(spec, "csi", f"{where}.spec")
        drivers[f.string(meta, "name", f"{where}.metadata")] = f.opt_string(
            csi, "driver", f"{where}.spec.csi"
        )
    return drivers


def parse_events(bundle: Mapping[str, object], uid: str) -> tuple[PodEvent, ...]:
    """The bundle's `events` about pod `uid` (others are ignored): reason, message, count,
    last time — read as core/v1 or as events.k8s.io/v1."""
    out = []
    for i, raw in enumerate(f.opt_list(bundle, "events", "")):
        where = f"events[{i}]"
        ev = f.as_object(raw, where)
        involved = ev.get("involvedObject") or ev.get("regarding") or {}
        about = f.as_object(involved, f"{where}.involvedObject")
        if f.opt_string(about, "uid", f"{where}.involvedObject") not in (uid, None):
            continue
        series = f.as_object(ev.get("series") or {}, f"{where}.series")
        # core/v1 `count`/`lastTimestamp` are events.k8s.io/v1's `deprecatedCount`/
        # `deprecatedLastTimestamp` (the same Event read as the other version)
        last = (
            f.opt_time(series, "lastObservedTime", f"{where}.series")
            or f.opt_time(ev, "lastTimestamp", where)
            or f.opt_time(ev, "deprecatedLastTimestamp", where)
            or f.opt_time(ev, "eventTime", where)
        )
        count = (
            f.opt_int(series, "count", f"{where}.series")
            or f.opt_int(ev, "count", where)
            or f.opt_int(ev, "deprecatedCount", where)
        )
        out.append(
            PodEvent(
                reason=f.opt_string(ev, "reason", where) or "",
                message=f.opt_string(ev, "message", where) or f.opt_string(ev, "note", where) or "",
                count=count if count and count > 0 else 1,
                last=last,
            )
        )
    return tuple(out)


DEFAULT_LEASE_S = 15.0


def parse_leases(bundle: Mapping[str, object]) -> Mapping[tuple[str, str], LeaseFacts]:
    """The bundle's optional `leases`, by (namespace, name), with the reader's memory of
    each from the optional `leasesObserved`."""
    observed = _leases_observed(bundle)
    out: dict[tuple[str, str], LeaseFacts] = {}
    for i, raw in enumerate(f.opt_list(bundle, "leases", "")):
        where = f"leases[{i}]"
        key, spec = _key_and_spec(raw, where)
        since, changed = observed.get(key, (None, False))
        out[key] = LeaseFacts(
            holder=f.opt_string(spec, "holderIdentity", f"{where}.spec") or "",
            renewed=f.opt_time(spec, "renewTime", f"{where}.spec"),
            duration_s=float(
                f.opt_int(spec, "leaseDurationSeconds", f"{where}.spec") or DEFAULT_LEASE_S
            ),
            unchanged_since=since,
            change_seen=changed,
        )
    return out


def _leases_observed(bundle: Mapping[str, object]) -> dict[tuple[str, str], tuple[datetime, bool]]:
    """The bundle's optional `leasesObserved`: [{namespace, name, unchangedSince,
    changeSeen}] — the reader's memory of a Lease: since when (its own clock) the Lease's
    renewTime and resourceVersion are as read, and whether it saw them change before."""
    out: dict[tuple[str, str], tuple[datetime, bool]] = {}
    for i, raw in enumerate(f.opt_list(bundle, "leasesObserved", "")):
        where = f"leasesObserved[{i}]"
        obj = f.as_object(raw, where)
        key = (f.string(obj, "namespace", where), f.string(obj, "name", where))
        since = f.parse_time(f.get(obj, "unchangedSince", where), f"{where}.unchangedSince")
        out[key] = (since, f.opt_bool(obj, "changeSeen", where) or False)
    return out


def parse_deployments(bundle: Mapping[str, object]) -> Mapping[tuple[str, str], DeploymentFacts]:
    """The bundle's optional `deployments` (apps/v1, as the API returns them)."""
    out: dict[tuple[str, str], DeploymentFacts] = {}
    for i, raw in enumerate(f.opt_list(bundle, "deployments", "")):
        where = f"deployments[{i}]"
        key, spec = _key_and_spec(raw, where)
        status = f.opt_object(f.as_object(raw, where), "status", where)
        since = None
        for j, cond in enumerate(f.opt_list(status, "conditions", f"{where}.status")):
            at = f"{where}.status.conditions[{j}]"
            c = f.as_object(cond, at)
            if c.get("type") == "Available" and c.get("status") == "False":
                since = f.opt_time(c, "lastTransitionTime", at)
        replicas = f.opt_int(spec, "replicas", f"{where}.spec")
        out[key] = DeploymentFacts(
            replicas=1 if replicas is None else replicas,
            available=f.opt_int(status, "availableReplicas", f"{where}.status") or 0,
            unavailable_since=since,
        )
    return out


def parse_gone_since(bundle: Mapping[str, object]) -> Mapping[tuple[str, str, str], datetime]:
    """The bundle's optional `ownersGoneSince`: [{kind, namespace, name, since}] — owners the
    reader saw gone (missing, or no replica available) without a break since `since`."""
    out: dict[tuple[str, str, str], datetime] = {}
    for i, raw in enumerate(f.opt_list(bundle, "ownersGoneSince", "")):
        where = f"ownersGoneSince[{i}]"
        obj = f.as_object(raw, where)
        kind = f.string(obj, "kind", where)
        if kind not in (LEASE, DEPLOYMENT):
            raise f.FieldError(f"{where}.kind", f"must be {LEASE} or {DEPLOYMENT}, got {kind!r}")
        key = (kind, f.string(obj, "namespace", where), f.string(obj, "name", where))
        out[key] = f.parse_time(f.get(obj, "since", where), f"{where}.since")
    return out


def _remediation_target(obj: Mapping[str, object], where: str) -> tuple[str, str, str]:
    """(namespace, name, node) of a medik8s remediation object: its node is the annotation
    remediation.medik8s.io/node-name, else its name (medik8s' GetNodeName)."""
    meta = f.as_object(f.get(obj, "metadata", where), f"{where}.metadata")
    annotations = f.opt_object(meta, "annotations", f"{where}.metadata")
    name = f.string(meta, "name", f"{where}.metadata")
    node = f.opt_string(annotations, NODE_NAME_ANNOTATION, f"{where}.metadata.annotations")
    return f.opt_string(meta, "namespace", f"{where}.metadata") or "", name, node or name


def parse_fence_agents_remediations(
    bundle: Mapping[str, object],
) -> tuple[FenceAgentsRemediationFacts, ...]:
    """The bundle's optional `fenceAgentsRemediations` (medik8s FAR v1alpha1, as the API
    returns them): each one's node and when its fence action succeeded, if it did."""
    out = []
    for i, raw in enumerate(f.opt_list(bundle, "fenceAgentsRemediations", "")):
        where = f"fenceAgentsRemediations[{i}]"
        obj = f.as_object(raw, where)
        namespace, name, node = _remediation_target(obj, where)
        status = f.opt_object(obj, "status", where)
        succeeded_at, reason = None, None
        for j, cond in enumerate(f.opt_list(status, "conditions", f"{where}.status")):
            at = f"{where}.status.conditions[{j}]"
            c = f.as_object(cond, at)
            if c.get("type") == FENCE_SUCCEEDED and c.get("status") == "True":
                succeeded_at = f.opt_time(c, "lastTransitionTime", at)
                reason = f.opt_string(c, "reason", at)
        out.append(FenceAgentsRemediationFacts(namespace, name, node, succeeded_at, reason))
    return tuple(out)


def _owned_by(meta: Mapping[str, object], kind: str, where: str) -> bool:
    refs = f.opt_list(meta, "ownerReferences", where)
    return any(f.as_object(r, f"{where}.ownerReferences").get("kind") == kind for r in refs)


def parse_self_node_remediations(
    bundle: Mapping[str, object],
) -> tuple[SelfNodeRemediationFacts, ...]:
    """The bundle's optional `selfNodeRemediations` (medik8s SNR v1alpha1): each one's node
    (None when a Machine owns it and no NodeHealthCheck does) and timeAssumedRebooted."""
    out = []
    for i, raw in enumerate(f.opt_list(bundle, "selfNodeRemediations", "")):
        where = f"selfNodeRemediations[{i}]"
        obj = f.as_object(raw, where)
        namespace, name, node = _remediation_target(obj, where)
        meta = f.as_object(f.get(obj, "metadata", where), f"{where}.metadata")
        by_machine = _owned_by(meta, "Machine", f"{where}.metadata") and not _owned_by(
            meta, "NodeHealthCheck", f"{where}.metadata"
        )
        status = f.opt_object(obj, "status", where)
        rebooted = f.opt_time(status, "timeAssumedRebooted", f"{where}.status")
        out.append(
            SelfNodeRemediationFacts(namespace, name, None if by_machine else node, rebooted)
        )
    return tuple(out)


def _key_and_spec(raw: object, where: str) -> tuple[tuple[str, str], Mapping[str, object]]:
    obj = f.as_object(raw, where)
    meta = f.as_object(obj.get("metadata") or {}, f"{where}.metadata")
    spec = f.as_object(obj.get("spec") or {}, f"{where}.spec")
    key = (
        f.opt_string(meta, "namespace", f"{where}.metadata") or "",
        f.string(meta, "name", f"{where}.metadata"),
    )
    return key, spec


def parse_probe(obj: object) -> Probe:
    """Read the `probe` object of design.md §6 (also what the agent writes to a Remediation)."""
    try:
        return Probe.from_json(obj)
    except BundleError:
        raise
    except f.FieldError as err:
        raise BundleError(err.field, err.message) from None


def parse_bundle(obj: object) -> Facts:
    """Read a whole snapshot bundle; raises BundleError naming the field."""
    try:
        bundle = f.as_object(obj, "")
        if "node" not in bundle:
            raise f.FieldError("node", "missing (use null when the Node does not exist)")
        pod = parse_pod(f.get(bundle, "pod", ""))
        node_obj = bundle["node"]
        probe_obj = bundle.get("probe")
        return Facts(
            now=f.parse_time(f.get(bundle, "capturedAt", ""), "capturedAt"),
            pod=pod,
            node=None if node_obj is None else parse_node(node_obj),
            csi_node_drivers=_csi_node_drivers(bundle.get("csiNode")),
            claims=_claims(bundle, pod.namespace),
            pv_drivers=_pv_drivers(bundle),
            probe=None if probe_obj is None else Probe.from_json(probe_obj),
            events=parse_events(bundle, pod.uid),
            leases=parse_leases(bundle),
            deployments=parse_deployments(bundle),
            owners_gone_since=parse_gone_since(bundle),
            fence_agents_remediations=parse_fence_agents_remediations(bundle),
            self_node_remediations=parse_self_node_remediations(bundle),
        )
    except BundleError:
        raise
    except f.FieldError as err:
        raise BundleError(err.field or "bundle", err.message) from None
