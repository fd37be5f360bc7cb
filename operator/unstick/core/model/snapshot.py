"""Read a snapshot bundle (design.md §6) into Facts; errors name the field.

Unknown fields are ignored. The `node` key must be present (null when the Node does not
exist): a bundle that merely lacks it must not read as "node gone", which would permit a
force-delete.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from unstick.core import fields as f
from unstick.core.model.facts import (
    HOLDER_SCAN_COMPLETE,
    HOLDER_SCAN_INCOMPLETE,
    RUNTIME_ANSWERED,
    RUNTIME_UNANSWERED,
    Container,
    ContainerStatus,
    Facts,
    Holder,
    NodeFacts,
    PodFacts,
    PodVolume,
    Probe,
    ReadyCondition,
    VolumeDir,
)
from unstick.core.model.mountinfo import MountinfoError, parse_mountinfo
from unstick.core.remediation import NODE_NAME, POD_UID, PROBED_AT
from unstick.core.rules.cni import parse_events
from unstick.core.rules.finalizer_owners import parse_deployments, parse_gone_since, parse_leases
from unstick.core.rules.hung_mounts import parse_hung_mounts, parse_waiters_unknown
from unstick.core.rules.pod_tasks import parse_d_tasks, parse_frozen_cgroups

CONTAINER_STATES = ("running", "exited", "created", "unknown")
HOLDER_VIA = ("cwd", "root", "fd", "maps", "mountns")


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


def _volume_dirs(p: Mapping[str, object]) -> tuple[VolumeDir, ...]:
    dirs = []
    for i, raw in enumerate(f.opt_list(p, "volumeDirs", "probe")):
        where = f"probe.volumeDirs[{i}]"
        d = f.as_object(raw, where)
        empty = f.opt_bool(d, "empty", where)
        if empty is None:
            raise f.FieldError(f"{where}.empty", "missing")
        dirs.append(VolumeDir(path=f.string(d, "path", where), empty=empty))
    return tuple(dirs)


def _holders(p: Mapping[str, object]) -> tuple[Holder, ...]:
    holders = []
    for i, raw in enumerate(f.opt_list(p, "holders", "probe")):
        where = f"probe.holders[{i}]"
        h = f.as_object(raw, where)
        pid = f.opt_int(h, "pid", where)
        if pid is None:
            raise f.FieldError(f"{where}.pid", "missing")
        via = f.string(h, "via", where)
        if via not in HOLDER_VIA:
            raise f.FieldError(f"{where}.via", f"{via!r} is not one of {', '.join(HOLDER_VIA)}")
        holders.append(
            Holder(
                mount_point=f.string(h, "mountPoint", where),
                pid=pid,
                comm=f.string(h, "comm", where, nonempty=False),
                via=via,
            )
        )
    return tuple(holders)


def _containers(p: Mapping[str, object]) -> tuple[Container, ...] | None:
    if p.get("containers") is None:
        return None
    containers = []
    for i, raw in enumerate(f.opt_list(p, "containers", "probe")):
        where = f"probe.containers[{i}]"
        c = f.as_object(raw, where)
        state = f.string(c, "state", where)
        if state not in CONTAINER_STATES:
            raise f.FieldError(
                f"{where}.state", f"{state!r} is not one of {', '.join(CONTAINER_STATES)}"
            )
        containers.append(
            Container(
                pod_uid=f.string(c, "podUID", where),
                name=f.string(c, "name", where),
                id=f.string(c, "id", where, nonempty=False),
                state=state,
                created_at=f.opt_time(c, "createdAt", where),
                runtime_state=f.opt_string(c, "runtimeState", where) or "",
            )
        )
    return tuple(containers)


def _one_of(p: Mapping[str, object], key: str, allowed: tuple[str, ...]) -> str | None:
    value = p.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or value not in allowed:
        raise f.FieldError(f"probe.{key}", f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _with_visibility(probe: Probe, p: Mapping[str, object]) -> Probe:
    """`probe` plus the optional keys saying which pod was probed and what was seen."""
    if p.get(POD_UID) is not None:
        f.string(p, POD_UID, "probe")  # present: a non-empty string
    seen = f.opt_int(p, "podDirsSeen", "probe")
    if seen is not None and seen < 0:
        raise f.FieldError("probe.podDirsSeen", f"{seen} must be >= 0")
    return replace(
        probe,
        pod_uid=f.opt_string(p, POD_UID, "probe"),
        pod_dir_exists=f.opt_bool(p, "podDirExists", "probe"),
        pod_dirs_seen=seen,
        runtime=_one_of(p, "runtime", (*RUNTIME_ANSWERED, RUNTIME_UNANSWERED)),
        holder_scan=_one_of(p, "holderScan", (HOLDER_SCAN_COMPLETE, HOLDER_SCAN_INCOMPLETE)),
        blind_spots=f.string_list(p, "blindSpots", "probe"),
        d_tasks=parse_d_tasks(p),
        frozen_cgroups=parse_frozen_cgroups(p),
        hung_mounts=parse_hung_mounts(p),
        waiters_unknown=parse_waiters_unknown(p),
    )


def _probe(obj: object) -> Probe:
    p = f.as_object(obj, "probe")
    kubelet_root = f.string(p, "kubeletRoot", "probe")
    if not kubelet_root.startswith("/"):
        raise f.FieldError("probe.kubeletRoot", f"{kubelet_root!r} must be an absolute path")
    try:
        mounts = parse_mountinfo(f.string(p, "mountinfo", "probe", nonempty=False))
    except MountinfoError as err:
        raise f.FieldError("probe.mountinfo", str(err)) from None
    probe = Probe(
        node_name=f.string(p, NODE_NAME, "probe"),
        probed_at=f.parse_time(f.get(p, PROBED_AT, "probe"), f"probe.{PROBED_AT}"),
        kubelet_root=kubelet_root,
        kubelet_healthy=f.opt_bool(p, "kubeletHealthy", "probe"),
        registered_plugins=f.string_list(p, "registeredPlugins", "probe"),
        mounts=tuple(mounts),
        volume_dirs=_volume_dirs(p),
        holders=_holders(p),
        containers=_containers(p),
    )
    return _with_visibility(probe, p)


def parse_probe(obj: object) -> Probe:
    """Read the `probe` object of design.md §6 (also what the agent writes to a Remediation)."""
    try:
        return _probe(obj)
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
            probe=None if probe_obj is None else _probe(probe_obj),
            events=parse_events(bundle, pod.uid),
            leases=parse_leases(bundle),
            deployments=parse_deployments(bundle),
            owners_gone_since=parse_gone_since(bundle),
        )
    except BundleError:
        raise
    except f.FieldError as err:
        raise BundleError(err.field or "bundle", err.message) from None
