"""A node leaves nothing behind: after a pod with real mounts, a netns, veth and cgroups
ran on it, stopping it removes every mount, process, cgroup, interface and directory.

Uses a second, short-lived node (its own names, ports, bridge and subnet) so the check
sees only what that node made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.node import (
    NodeSettings,
    RealNode,
    cgroup_dirs,
    cgroup_mounts,
    processes_in,
)
from devcluster.node_images import NodeImages
from devcluster.node_network import NetworkSettings, bridge_exists, links

from .support import busybox_pod, pod_mounts, wait_running

pytestmark = pytest.mark.node

SETTINGS = NodeSettings(
    name="unstick-node-cleanup",
    network=NetworkSettings(
        bridge="unstick-cni1", pod_subnet="10.245.0.0/24", gateway="10.245.0.1", service_ip=""
    ),
    kubelet_port=10260,
    healthz_port=10258,
)


def test_stopping_a_node_leaves_nothing_behind(
    node_control_plane: ControlPlane, node_images: NodeImages, core: Any, node_namespace: str
) -> None:
    node = RealNode(node_control_plane, node_images, SETTINGS).start()
    stopped = False
    try:
        manifest = busybox_pod("bb", node_images.busybox.ref, SETTINGS.name)
        uid = core.create_namespaced_pod(node_namespace, manifest).metadata.uid
        wait_running(core, node_namespace, "bb")
        # What the pod made, as seen while it runs.
        workdir, pid_ns = node.workdir, node.pid_namespace()
        assert pod_mounts(node, uid)
        assert processes_in(pid_ns)
        veths = [n for n, master in links().items() if master == SETTINGS.network.bridge]
        assert veths
        cgroups = [m / SETTINGS.name.lstrip("/") for m in cgroup_mounts()]
        assert any((c / "kubepods").exists() for c in cgroups)
        # The machine's own mount table never had any of it.
        assert str(workdir) not in Path("/proc/self/mountinfo").read_text()

        node.stop()
        stopped = True
    finally:
        if not stopped:
            node.stop()

    assert node.leftovers() == []
    assert processes_in(pid_ns) == []
    assert str(workdir) not in Path("/proc/self/mountinfo").read_text()
    assert not workdir.exists()
    assert cgroup_dirs(SETTINGS.cgroup_root) == []
    assert not bridge_exists(SETTINGS.network.bridge)
    assert not set(veths) & set(links())
