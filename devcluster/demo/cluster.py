"""The demo's small cluster: nodes, a policy, healthy pods and the pods that get stuck."""

from __future__ import annotations

import datetime as dt
from typing import Any

from devcluster import node_manifest
from devcluster.demo.scenarios import (
    ABANDONED_FINALIZER,
    AGENT_NODE,
    CSI_DRIVER,
    GONE_NODE,
    KWOK_NODES,
    NAMESPACE,
    QUIET_NODE,
)
from unstick.core.remediation import API_VERSION, POLICY_KIND, REMEDIATE, rfc3339

PV, PVC, HANDLE = "pv-orders", "orders", "vol-orders"


def policy() -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": POLICY_KIND,
        "metadata": {"name": "default"},
        "spec": {
            "dryRun": False,
            "actions": [
                "observe", "replay-unpublish", "unmount", "rmdir-stale",
                "force-delete", "remove-finalizer",
            ],
            "slackSeconds": 3,
            "nodeLostAfterSeconds": 60,
            "probeMaxAgeSeconds": 60,
            "finalizerAllowlist": [ABANDONED_FINALIZER],
            "rateLimits": {"clusterPerMinute": 60, "nodePerMinute": 20},
        },
    }  # fmt: skip


def _node_status(ready: bool, since: dt.datetime) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC)
    return {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "Unknown",
                    "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                    "message": "kubelet is posting ready status"
                    if ready
                    else "Kubelet stopped posting node status.",
                    "lastHeartbeatTime": rfc3339(since if not ready else now),
                    "lastTransitionTime": rfc3339(since),
                }
            ]
        }
    }


def create_nodes(core: Any, storage: Any, *, stand_in: bool) -> None:
    """kwok's nodes, the kubelet-less nodes of the API-only scenarios and, for the stand-in,
    node-storage (the real node registers itself)."""
    for name in KWOK_NODES:
        core.create_node(node_manifest(name, kubelet=True))
    now = dt.datetime.now(dt.UTC)
    kubeletless = [(GONE_NODE, True, now), (QUIET_NODE, False, now - dt.timedelta(minutes=10))]
    if stand_in:
        kubeletless.insert(0, (AGENT_NODE, True, now))
    for name, ready, since in kubeletless:
        core.create_node(node_manifest(name, kubelet=False))
        core.patch_node_status(name, _node_status(ready, since))
    if not stand_in:
        return
    storage.create_csi_node(
        {
            "metadata": {"name": AGENT_NODE},
            "spec": {"drivers": [{"name": CSI_DRIVER, "nodeID": AGENT_NODE}]},
        }
    )


def _pod(name: str, node: str, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node,
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "app", "image": "registry.example/shop/app:1.4"}],
    }
    spec.update(extra.pop("spec", {}))
    return {"metadata": {"name": name, **extra}, "spec": spec}


SESSIONS_PV = "pv-sessions"
SESSIONS_VOLUME = {"name": "sessions", "persistentVolumeClaim": {"claimName": "sessions"}}
REPLACEMENT = "web-7-replacement"  # waits for web-7's volume (a blocked replacement)


def _sessions_volume(core: Any) -> None:
    core.create_persistent_volume(
        {
            "metadata": {"name": SESSIONS_PV},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "disk.csi.example.com", "volumeHandle": "vol-sessions"},
                "claimRef": {"namespace": NAMESPACE, "name": "sessions"},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        NAMESPACE,
        {
            "metadata": {"name": "sessions"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "volumeName": SESSIONS_PV,
                "storageClassName": "",
            },
        },
    )


def block_replacement(core: Any, storage: Any, node: str) -> None:
    """web-7's volume stays attached to its silent node; its replacement (on `node`: the
    stand-in's node-storage, where no kubelet starts it, or the real node, whose kubelet
    waits for the attachment) cannot attach it. The demo plays the attach/detach
    controller: the VolumeAttachment and its Multi-Attach Event."""
    storage.create_volume_attachment(
        {
            "metadata": {"name": "csi-sessions-node-silent"},
            "spec": {
                "attacher": "disk.csi.example.com",
                "nodeName": QUIET_NODE,
                "source": {"persistentVolumeName": SESSIONS_PV},
            },
        }
    )
    pod = core.create_namespaced_pod(
        NAMESPACE, _pod(REPLACEMENT, node, spec={"volumes": [SESSIONS_VOLUME]})
    )
    now = rfc3339(dt.datetime.now(dt.UTC))
    core.create_namespaced_event(
        NAMESPACE,
        {
            "metadata": {"name": f"{REPLACEMENT}.multi-attach"},
            "involvedObject": {
                "kind": "Pod", "namespace": NAMESPACE, "name": REPLACEMENT,
                "uid": pod.metadata.uid,
            },
            "reason": "FailedAttachVolume",
            "message": f'Multi-Attach error for volume "{SESSIONS_PV}" Volume is already '
            "exclusively attached to one node and can't be attached to another",
            "type": "Warning",
            "source": {"component": "attachdetach-controller"},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        },
    )  # fmt: skip


def create_namespace(core: Any) -> None:
    core.create_namespace({"metadata": {"name": NAMESPACE, "labels": {REMEDIATE: "true"}}})


def create_workload(core: Any, *, stand_in: bool) -> dict[str, str]:
    """Healthy pods and the scenario pods (db-0 and uploader only for the stand-in: on the
    real node they are made by devcluster.demo.real); returns pod name -> uid."""
    for i in range(12):
        core.create_namespaced_pod(NAMESPACE, _pod(f"api-{i}", KWOK_NODES[i % len(KWOK_NODES)]))
    _sessions_volume(core)
    pods = [
        _pod("cache-0", GONE_NODE),
        _pod("report-job", KWOK_NODES[0], finalizers=[ABANDONED_FINALIZER]),
        _pod("web-7", QUIET_NODE, spec={"volumes": [SESSIONS_VOLUME]}),
    ]
    if stand_in:
        pods += _stand_in_pods(core)
    uids = {}
    for pod in pods:
        created = core.create_namespaced_pod(NAMESPACE, pod)
        uids[created.metadata.name] = created.metadata.uid
    return uids


def _stand_in_pods(core: Any) -> list[dict[str, Any]]:
    core.create_persistent_volume(
        {
            "metadata": {"name": PV},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "csi": {"driver": CSI_DRIVER, "volumeHandle": HANDLE},
                "claimRef": {"namespace": NAMESPACE, "name": "orders"},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        NAMESPACE,
        {
            "metadata": {"name": "orders"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "volumeName": PV,
                "storageClassName": "",
            },
        },
    )
    return [
        _pod(
            "db-0",
            AGENT_NODE,
            spec={
                "volumes": [{"name": "orders", "persistentVolumeClaim": {"claimName": "orders"}}]
            },
        ),
        _pod("uploader", AGENT_NODE, spec={"volumes": [{"name": "uploads", "emptyDir": {}}]}),
    ]
