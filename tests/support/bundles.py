"""Builders for snapshot bundles (design.md §6) in tests: realistic API objects, small."""

from __future__ import annotations

import copy
from typing import Any

from unstick.core.model.mountinfo import escape
from unstick.core.model.snapshot import parse_bundle
from unstick.core.rules.diagnosis import Diagnosis, diagnose

NOW = "2026-11-20T10:00:00Z"
ROOT = "/var/lib/kubelet"
UID = "6f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"
OTHER_UID = "0c9b8a7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d"
NODE = "node-1"
PV = "pvc-1f2e3d4c-5b6a-4789-8a0b-c1d2e3f4a5b6"
DRIVER = "hostpath.csi.k8s.io"

BASE_MOUNTS = [
    "22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw",
    "23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
    "26 22 0:24 / /run rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,size=806012k,mode=755",
]


def pod(
    *,
    name: str = "app-0",
    namespace: str = "default",
    uid: str = UID,
    node: str | None = NODE,
    deletion: str | None = "2026-11-20T09:45:00Z",
    grace: int | None = 30,
    finalizers: list[str] | None = None,
    opt_in: str | None = "true",
    volumes: list[dict[str, Any]] | None = None,
    statuses: list[tuple[str, str]] | None = None,
    init_statuses: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """A Pod; statuses are (container name, state key: running|waiting|terminated)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "creationTimestamp": "2026-11-19T08:00:00Z",
    }
    if opt_in is not None:
        meta["annotations"] = {"unstick.dev/remediate": opt_in}
    if deletion is not None:
        meta["deletionTimestamp"] = deletion
        meta["deletionGracePeriodSeconds"] = grace
    if finalizers:
        meta["finalizers"] = finalizers

    def status(items: list[tuple[str, str]] | None) -> list[dict[str, Any]]:
        detail = {
            "running": {"startedAt": "2026-11-19T08:00:07Z"},
            "waiting": {},
            "terminated": {"exitCode": 0, "finishedAt": "2026-11-20T09:44:40Z"},
        }
        return [
            {"name": n, "ready": False, "restartCount": 0, "state": {s: detail[s]}}
            for n, s in items or []
        ]

    spec: dict[str, Any] = {
        "containers": [{"name": n, "image": "nginx:1.27"} for n, _ in statuses or [("app", "")]],
        "volumes": volumes or [],
        "terminationGracePeriodSeconds": 30,
    }
    if node:
        spec["nodeName"] = node
    st: dict[str, Any] = {
        "phase": "Running",
        "containerStatuses": status(statuses or [("app", "terminated")]),
    }
    if init_statuses:
        spec["initContainers"] = [{"name": n, "image": "busybox"} for n, _ in init_statuses]
        st["initContainerStatuses"] = status(init_statuses)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": st}


def node(
    *,
    name: str = NODE,
    ready: str | None = "True",
    since: str = "2026-11-01T00:00:00Z",
    created: str = "2026-10-01T00:00:00Z",
    fenced: bool = False,
    reason: str = "KubeletReady",
    taints: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    conditions = [
        {"type": "MemoryPressure", "status": "False", "lastTransitionTime": "2026-11-01T00:00:00Z"}
    ]
    if ready is not None:
        conditions.append(
            {
                "type": "Ready",
                "status": ready,
                "lastTransitionTime": since,
                "lastHeartbeatTime": since,
                "reason": reason,
            }
        )
    spec: dict[str, Any] = {}
    if fenced:
        spec["taints"] = [
            {
                "key": "node.kubernetes.io/out-of-service",
                "value": "nodeshutdown",
                "effect": "NoExecute",
            }
        ]
    if taints:
        spec["taints"] = [*spec.get("taints", []), *taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": spec,
        "status": {"conditions": conditions},
    }


def csi_node(drivers: list[str], name: str = NODE) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": name},
        "spec": {"drivers": [{"name": d, "nodeID": name} for d in drivers]},
    }


def pvc_volume(name: str = "data", claim: str = "data-app-0") -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


def inline_csi_volume(name: str, driver: str = DRIVER) -> dict[str, Any]:
    return {"name": name, "csi": {"driver": driver, "volumeAttributes": {"size": "1Gi"}}}


def pvc(claim: str = "data-app-0", pv: str = PV, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv},
        "status": {"phase": "Bound"},
    }


def pv(name: str = PV, driver: str | None = DRIVER) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}
    if driver:
        spec["csi"] = {"driver": driver, "volumeHandle": f"handle-{name}"}
    else:
        spec["nfs"] = {"server": "nfs.example", "path": "/exports/x"}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": spec,
        "status": {"phase": "Bound"},
    }


def pod_path(rel: str, uid: str = UID, root: str = ROOT) -> str:
    return f"{root}/pods/{uid}/{rel}"


def csi_mount_path(volume: str = PV, uid: str = UID, root: str = ROOT) -> str:
    return pod_path(f"volumes/kubernetes.io~csi/{volume}/mount", uid, root)


def mount_line(mount_id: int, path: str, fstype: str = "ext4", source: str = "/dev/sdb") -> str:
    return (
        f"{mount_id} 22 8:16 / {escape(path)} rw,relatime shared:{mount_id} - "
        f"{fstype} {escape(source)} rw"
    )


def staging_line(mount_id: int = 900, root: str = ROOT) -> str:
    return mount_line(mount_id, f"{root}/plugins/kubernetes.io/csi/{DRIVER}/5b1f3c/globalmount")


def probe(
    *,
    mounts: list[str] | None = None,
    dirs: list[tuple[str, bool]] | None = None,
    holders: list[dict[str, Any]] | None = None,
    containers: list[tuple[str, str]] | None = None,
    plugins: list[str] | None = None,
    probed_at: str = "2026-11-20T09:59:50Z",
    node_name: str = NODE,
    root: str = ROOT,
    healthy: bool | None = True,
    uid: str = UID,
    sight: dict[str, Any] | None = None,
    legacy: bool = False,
) -> dict[str, Any]:
    """A probe; containers are (name, state) of this pod, or None for "runtime unknown".

    It says what the agent could see (design.md §5): by default everything (`SIGHTED`, with
    `runtime` "unanswered" when containers is None); `sight` overrides those keys (a value
    None drops the key); `legacy` leaves them all out, like a probe of an older agent.
    """
    seen: dict[str, Any] = {} if legacy else {**SIGHTED, "podUID": uid}
    if containers is None and not legacy:
        seen["runtime"] = "unanswered"
    for key, value in (sight or {}).items():
        seen.pop(key, None)
        if value is not None:
            seen[key] = value
    return seen | {
        "nodeName": node_name,
        "probedAt": probed_at,
        "kubeletRoot": root,
        "kubeletHealthy": healthy,
        "registeredPlugins": plugins if plugins is not None else [DRIVER],
        "mountinfo": "\n".join(BASE_MOUNTS + (mounts or [])) + "\n",
        "volumeDirs": [{"path": p, "empty": e} for p, e in dirs or []],
        "holders": holders or [],
        "containers": None
        if containers is None
        else [{"podUID": uid, "name": n, "id": f"id-{n}", "state": s} for n, s in containers],
    }


SIGHTED: dict[str, Any] = {
    "podDirExists": True,
    "podDirsSeen": 12,
    "runtime": "cri",
    "holderScan": "complete",
    "blindSpots": [],
}


def holder(
    mount_point: str, pid: int = 4242, comm: str = "sleep", via: str = "cwd"
) -> dict[str, Any]:
    return {"mountPoint": mount_point, "pid": pid, "comm": comm, "via": via}


def hung_mount(point: str, fstype: str, **kw: Any) -> dict[str, Any]:
    """A hungMounts entry of the probe (issue #25); `kw` sets more keys (waiting, blocked)
    or others (source)."""
    return {"mountPoint": point, "fstype": fstype, "source": "", "blocked": []} | kw


def claimed_volume(driver: str | None = DRIVER) -> dict[str, Any]:
    """What stands behind the pod's `pvc_volume()`: its PVC, the PV (a CSI volume of
    `driver`; None: NFS) and the node's CSINode with DRIVER registered. For
    `bundle(**claimed_volume(), ...)`."""
    return {"pvcs": [pvc()], "pvs": [pv(driver=driver)], "the_csi_node": csi_node([DRIVER])}


CLOUD_SHUTDOWN = {"key": "node.cloudprovider.kubernetes.io/shutdown", "effect": "NoSchedule"}
FAR_API = "fence-agents-remediation.medik8s.io/v1alpha1"
SNR_API = "self-node-remediation.medik8s.io/v1alpha1"


def far(
    *,
    name: str = NODE,
    namespace: str = "medik8s",
    succeeded: str | None = "2026-11-20T09:44:00Z",
    status: str = "True",
    node: str | None = None,
) -> dict[str, Any]:
    """A medik8s FenceAgentsRemediation (v0.7.0) for `name` (or the annotation's `node`)
    whose conditions say, at `succeeded`, that the fence action succeeded (`status`)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if node is not None:
        meta["annotations"] = {"remediation.medik8s.io/node-name": node}
    conditions = []
    if succeeded is not None:
        conditions = [
            {
                "type": "Processing",
                "status": "True",
                "reason": "RemediationStarted",
                "message": "FAR CR was found",
                "lastTransitionTime": "2026-11-20T09:41:00Z",
            },
            {
                "type": "FenceAgentActionSucceeded",
                "status": status,
                "reason": "FenceAgentSucceeded" if status == "True" else "FenceAgentFailed",
                "message": "FAR taint was added and the fence agent command has been created "
                "and executed successfully",
                "lastTransitionTime": succeeded,
            },
        ]
    return {
        "apiVersion": FAR_API,
        "kind": "FenceAgentsRemediation",
        "metadata": meta,
        "spec": {"agent": "fence_ipmilan", "remediationStrategy": "ResourceDeletion"},
        "status": {"conditions": conditions},
    }


def snr(
    *, name: str = NODE, namespace: str = "medik8s", rebooted: str | None = "2026-11-20T09:46:00Z"
) -> dict[str, Any]:
    """A medik8s SelfNodeRemediation (v0.13.0) for node `name` that assumes the node
    rebooted by `rebooted`."""
    status: dict[str, Any] = {"phase": "Pre-Reboot-Completed"}
    if rebooted is not None:
        status["timeAssumedRebooted"] = rebooted
    return {
        "apiVersion": SNR_API,
        "kind": "SelfNodeRemediation",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"remediationStrategy": "Automatic"},
        "status": status,
    }


def bundle(
    *,
    the_pod: dict[str, Any] | None = None,
    the_node: dict[str, Any] | str | None = "default",
    the_csi_node: dict[str, Any] | None = None,
    pvcs: list[dict[str, Any]] | None = None,
    pvs: list[dict[str, Any]] | None = None,
    the_probe: dict[str, Any] | None = None,
    now: str = NOW,
    expect: dict[str, Any] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "Snapshot",
        "capturedAt": now,
        "pod": copy.deepcopy(the_pod) if the_pod is not None else pod(),
        "node": node() if the_node == "default" else the_node,
        "csiNode": the_csi_node,
        "persistentVolumeClaims": pvcs or [],
        "persistentVolumes": pvs or [],
        "volumeAttachments": [],
        "events": [],
        "probe": the_probe,
    }
    if expect is not None:
        out["expect"] = expect
    return out


def overdue_pod(uid: str, state: str) -> dict[str, Any]:
    """The pod the agent's tests probe, as small as the diagnosis reads it: web-0 on
    node-1, deleted at 2025-12-31T23:00:00Z (30 s grace), its container `app` in `state`
    (running, terminated)."""
    return {
        "metadata": {
            "namespace": "default",
            "name": "web-0",
            "uid": uid,
            "deletionTimestamp": "2025-12-31T23:00:00Z",
            "deletionGracePeriodSeconds": 30,
        },
        "spec": {"nodeName": "node-1"},
        "status": {"containerStatuses": [{"name": "app", "state": {state: {}}}]},
    }


def diagnose_probe(probe: dict[str, Any], the_pod: dict[str, Any]) -> Diagnosis:
    """The core's diagnosis of `the_pod` from the agent's `probe`, captured at
    2026-01-01T00:00:40Z with node-1 Ready."""
    the_node = {
        "metadata": {"name": "node-1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    captured = {"capturedAt": "2026-01-01T00:00:40Z", "pod": the_pod, "node": the_node}
    return diagnose(parse_bundle({**captured, "probe": probe}))
