"""The Pods (and the claims they mount) the envtests create on a real API server: one
builder of their bodies. (The pure core's tests build whole snapshot bundles instead:
tests/support/bundles.py.)"""

from __future__ import annotations

from typing import Any

from unstick.kube.podwatch import TerminatingPod

IMAGE = "registry.example/app:1"  # never pulled: no kubelet runs these pods


def pod_body(
    name: str,
    node: str | None,
    *,
    remediate: str | None = None,
    finalizers: list[str] | None = None,
    grace: int = 1,
    claim: str | None = None,
) -> dict[str, Any]:
    """A Pod `name` bound to `node` (none: unscheduled), one container; `remediate` is its
    opt-in annotation, `claim` a PersistentVolumeClaim it mounts as volume `data`."""
    meta: dict[str, Any] = {"name": name}
    if remediate is not None:
        meta["annotations"] = {"unstick.dev/remediate": remediate}
    if finalizers:
        meta["finalizers"] = finalizers
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": grace,
        "containers": [{"name": "app", "image": IMAGE}],
    }
    if node:
        spec["nodeName"] = node
    if claim is not None:
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return {"metadata": meta, "spec": spec}


def claim_body(name: str, pv: str) -> dict[str, Any]:
    """A PersistentVolumeClaim `name` bound to the PersistentVolume `pv` (1Gi, RWO)."""
    return {
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "volumeName": pv,
            "storageClassName": "",
        },
    }


def remembered_pod(
    namespace: str, name: str, uid: str, node: str, *, deleted_at: float, running: bool
) -> TerminatingPod:
    """What the controller remembers of a pod opted in (remediate "true"), without
    finalizers, deleted at `deleted_at` (epoch seconds) with 30 s of grace; `running`: its
    containers still run."""
    return TerminatingPod(
        namespace=namespace,
        name=name,
        uid=uid,
        node=node,
        deletion_timestamp=deleted_at,
        deletion_grace_period_s=30,
        finalizers=(),
        remediate="true",
        containers_running=running,
    )
