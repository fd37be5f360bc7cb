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
    Facts,
    LeaseFacts,
    NodeFacts,
    PodEvent,
    PodFacts,
    PodVolume,
    ReadyCondition,
)
from unstick.core.model.probe import Probe


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
    for i, raw in enumerate(f.opt_list(spec, "taints", "node.spec")):
        where = f"node.spec.taints[{i}]"
        taints.append(f.string(f.as_object(raw, where), "key", where))
    return NodeFacts(
        name=f.string(meta, "name", "node.metadata"),
        created=f.opt_time(meta, "creationTimestamp", "node.metadata"),
        ready=ready,
        taints=tuple(taints),
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
    """The bundle's optional `leases`, by (namespace, name)."""
    out: dict[tuple[str, str], LeaseFacts] = {}
    for i, raw in enumerate(f.opt_list(bundle, "leases", "")):
        where = f"leases[{i}]"
        key, spec = _key_and_spec(raw, where)
        out[key] = LeaseFacts(
            holder=f.opt_string(spec, "holderIdentity", f"{where}.spec") or "",
            renewed=f.opt_time(spec, "renewTime", f"{where}.spec"),
            duration_s=float(
                f.opt_int(spec, "leaseDurationSeconds", f"{where}.spec") or DEFAULT_LEASE_S
            ),
        )
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
        )
    except BundleError:
        raise
    except f.FieldError as err:
        raise BundleError(err.field or "bundle", err.message) from None
