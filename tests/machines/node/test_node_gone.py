"""NodeGone on the real node: the node's kubelet is down and its Node object deleted
(what a cloud's node controller does with a dead machine); a pod of it, deleted, stays
Terminating. unstick force-deletes it. The kubelet, started again, registers the node
anew and cleans up the pod's containers and mounts itself."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.node import RealNode
from devcluster.node_images import NodeImages
from devcluster.process import wait_until

from .support import (
    REMEDIATE,
    Release,
    busybox_pod,
    incident_entry,
    pod_mounts,
    remediation_for,
    wait_gone,
    wait_running,
)

pytestmark = pytest.mark.node


def test_node_gone_pod_is_force_deleted(
    real_node: RealNode,
    unstick_release: Release,
    node_control_plane: ControlPlane,
    node_images: NodeImages,
    core: Any,
    node_namespace: str,
) -> None:
    ns, node_name = node_namespace, real_node.settings.name
    manifest = busybox_pod("orphan", node_images.busybox.ref, node_name, annotations=REMEDIATE)
    uid = core.create_namespaced_pod(ns, manifest).metadata.uid
    wait_running(core, ns, "orphan")

    real_node.stop_kubelet()
    try:
        core.delete_node(node_name)
        core.delete_namespaced_pod("orphan", ns)
        # Nothing finishes it now but unstick.
        wait_gone(core, ns, "orphan", uid, timeout=90)

        def recorded() -> dict[str, Any] | None:
            # The node incident lists the pod (docs/incidents.md); its status is written
            # after the delete it records.
            found = incident_entry(node_control_plane, ns, uid) or {}
            entry = found.get("entry") or {}
            return found if entry.get("action") == "force-delete" and entry.get("goneAt") else None

        found = wait_until(recorded, timeout=30, what="the force-delete in the node incident")
        assert found["incident"]["status"]["cause"] == "NodeGone"
        assert found["incident"]["spec"] == {
            "nodeName": node_name,
            "incident": "NodeGone",
            "dryRun": False,
        }
        assert found["entry"]["result"] == "succeeded", found
        assert remediation_for(node_control_plane, ns, uid) is None  # no per-pod record
    finally:
        real_node.start_kubelet()
        real_node.wait_ready()
    # The kubelet, back, removes what was left of the pod on the node.
    wait_until(lambda: not pod_mounts(real_node, uid), timeout=60, what="the pod's mounts gone")
    unstick_release.wait_ready(real_node)
