"""The real node runs pods: a busybox pod gets an address, its volumes are real mounts in
the node's mount table, and deleting it leaves none of them."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster.node import RealNode
from devcluster.node_images import NodeImages
from devcluster.process import wait_until

from .support import busybox_pod, pod_mounts, wait_gone, wait_running

pytestmark = pytest.mark.node


def test_busybox_pod_runs_and_is_deleted_cleanly(
    real_node: RealNode, node_images: NodeImages, core: Any, node_namespace: str
) -> None:
    manifest = busybox_pod("bb", node_images.busybox.ref, real_node.settings.name)
    created = core.create_namespaced_pod(node_namespace, manifest)
    uid = created.metadata.uid
    pod = wait_running(core, node_namespace, "bb")
    assert pod.status.pod_ip.startswith("10.244.0.")

    mounts = pod_mounts(real_node, uid)
    # The memory emptyDir and the projected service-account token: both tmpfs.
    points = {line.split()[4].split(f"/pods/{uid}/volumes/")[-1]: line for line in mounts}
    assert "kubernetes.io~empty-dir/data" in points, mounts
    assert any(p.startswith("kubernetes.io~projected/kube-api-access-") for p in points), mounts
    assert all(" - tmpfs " in line for line in points.values())

    core.delete_namespaced_pod("bb", node_namespace)
    wait_gone(core, node_namespace, "bb", uid)
    assert pod_mounts(real_node, uid) == []
    # The kubelet's housekeeping removes the pod's directory soon after.
    pod_dir = real_node.kubelet_root / "pods" / uid
    wait_until(lambda: not pod_dir.exists(), timeout=30, what=f"{pod_dir} removed")
