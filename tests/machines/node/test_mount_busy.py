"""MountBusy with a real holder: a process on the node keeps a file open in a pod's
memory-backed emptyDir; the pod is deleted. The real kubelet cannot unmount it (`target is
busy`), the agent's probe of the real pod reports the mount and the holder (by its PID on
the node), the controller diagnoses MountBusy and does nothing, and the pod goes by itself
once the holder exits."""

from __future__ import annotations

import contextlib
import subprocess
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
    pod_exists,
    remediation_for,
    wait_gone,
    wait_running,
)

pytestmark = pytest.mark.node


def _holder_pid(node: RealNode, nsenter: subprocess.Popen[bytes]) -> int:
    """The holder's PID on the node (nsenter forks it into the node's PID namespace)."""
    from devcluster.node import children

    host = wait_until(lambda: next(iter(children(nsenter.pid)), 0), timeout=10, what="holder")
    return node.node_pid(host)


def test_mount_busy_with_a_real_holder(
    real_node: RealNode,
    unstick_release: Release,
    node_control_plane: ControlPlane,
    node_images: NodeImages,
    core: Any,
    node_namespace: str,
) -> None:
    ns, image, node_name = node_namespace, node_images.busybox.ref, real_node.settings.name
    bystander = core.create_namespaced_pod(ns, busybox_pod("bystander", image, node_name))
    manifest = busybox_pod(
        "busy", image, node_name, command="echo x > /data/f; sleep 3600", annotations=REMEDIATE
    )
    uid = core.create_namespaced_pod(ns, manifest).metadata.uid
    wait_running(core, ns, "busy")
    wait_running(core, ns, "bystander")
    data = real_node.kubelet_root / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / "data"
    holder = real_node.run(["sh", "-c", f"exec 3<{data}/f; exec sleep 600"])
    try:
        pid = _holder_pid(real_node, holder)
        core.delete_namespaced_pod("busy", ns)

        def diagnosed() -> dict[str, Any] | None:
            rem = remediation_for(node_control_plane, ns, uid)
            return rem if rem and rem.get("status", {}).get("cause") == "MountBusy" else None

        rem = wait_until(diagnosed, timeout=90, what="a Remediation with cause MountBusy")
        wait_until(
            lambda: "target is busy" in real_node.log_text("kubelet"),
            timeout=60,
            what="the kubelet's `target is busy`",
        )
        assert "UnmountVolume.TearDown failed" in real_node.log_text("kubelet")

        status = rem["status"]
        probe = status["probe"]
        # What the real kubelet and containerd made, as the agent saw it from its pod.
        assert probe["kubeletRoot"] == str(real_node.kubelet_root)
        assert probe["kubeletHealthy"] is True
        assert probe["podDirExists"] is True
        assert "cri" in probe["containersSource"]
        assert f"{data} " in probe["mountinfo"]
        assert " - tmpfs " in probe["mountinfo"]
        assert bystander.metadata.uid not in str(probe)
        assert {(h["pid"], h["mountPoint"]) for h in probe["holders"]} == {(pid, str(data))}
        holder_evidence = [e["message"] for e in status["evidence"] if e["kind"] == "holder"]
        assert any(f"pid {pid} (sleep)" in m for m in holder_evidence), status["evidence"]
        # It does nothing: only observed; unmount and force-delete refused.
        assert [a["action"] for a in status.get("actions", [])] == ["observe"]
        refused = {r["action"] for r in status.get("refused", [])}
        assert {"unmount", "force-delete"} <= refused
        assert pod_exists(core, ns, "busy", uid)
        assert data.is_dir()
    finally:
        real_node.kill(holder)
    # Once the holder is gone the kubelet's next retry (exponential back-off) unmounts
    # the emptyDir and the pod goes.
    wait_gone(core, ns, "busy", uid, timeout=150)
    assert not data.exists()
    with contextlib.suppress(Exception):
        core.delete_namespaced_pod("bystander", ns, grace_period_seconds=0)
