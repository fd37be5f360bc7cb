"""The demo's small cluster: nodes, a policy, healthy pods and the pods that get stuck."""

from __future__ import annotations

import datetime as dt
from typing import Any

from unstick.demo.scenarios import (
    ABANDONED_FINALIZER,
    AGENT_NODE,
    CSI_DRIVER,
    GONE_NODE,
    KWOK_NODES,
    NAMESPACE,
    QUIET_NODE,
)
from unstick.devcluster import node_manifest

PV, PVC, HANDLE = "pv-orders", "orders", "vol-orders"


def _ts(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def policy() -> dict[str, Any]:
    return {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "RemediationPolicy",
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
                    "lastHeartbeatTime": _ts(since if not ready else now),
                    "lastTransitionTime": _ts(since),
                }
            ]
        }
    }


def create_nodes(core: Any, storage: Any) -> None:
    for name in KWOK_NODES:
        core.create_node(node_manifest(name, kubelet=True))
    now = dt.datetime.now(dt.UTC)
    for name, ready, since in (
        (AGENT_NODE, True, now),
        (GONE_NODE, True, now),
        (QUIET_NODE, False, now - dt.timedelta(minutes=10)),
    ):
        core.create_node(node_manifest(name, kubelet=False))
        core.patch_node_status(name, _node_status(ready, since))
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


def create_workload(core: Any) -> dict[str, str]:
    """Healthy pods and the scenario pods; returns pod name -> uid."""
    core.create_namespace(
        {"metadata": {"name": NAMESPACE, "labels": {"unstick.dev/remediate": "true"}}}
    )
    for i in range(12):
        core.create_namespaced_pod(NAMESPACE, _pod(f"api-{i}", KWOK_NODES[i % len(KWOK_NODES)]))
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
    pods = [
        _pod("cache-0", GONE_NODE),
        _pod("report-job", KWOK_NODES[0], finalizers=[ABANDONED_FINALIZER]),
        _pod(
            "db-0",
            AGENT_NODE,
            spec={
                "volumes": [{"name": "orders", "persistentVolumeClaim": {"claimName": "orders"}}]
            },
        ),
        _pod("uploader", AGENT_NODE, spec={"volumes": [{"name": "uploads", "emptyDir": {}}]}),
        _pod("web-7", QUIET_NODE),
    ]
    uids = {}
    for pod in pods:
        created = core.create_namespaced_pod(NAMESPACE, pod)
        uids[created.metadata.name] = created.metadata.uid
    return uids
