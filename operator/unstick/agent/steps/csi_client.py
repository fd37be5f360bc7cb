"""Calls to a CSI driver's Node service over its unix socket, as the kubelet makes them."""

from __future__ import annotations

import hashlib
import os

import grpc

from unstick.agent.probe.plugins import stub, unix_target
from unstick.agent.proto import csi_pb2, csi_pb2_grpc


def node_unpublish(endpoint: str, volume_id: str, target_path: str, timeout_s: float) -> None:
    """NodeUnpublishVolume. Raises grpc.RpcError."""
    with grpc.insecure_channel(unix_target(endpoint)) as channel:
        stub(csi_pb2_grpc.NodeStub, channel).NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target_path),
            timeout=timeout_s,
        )


def node_unstage(endpoint: str, volume_id: str, staging_path: str, timeout_s: float) -> None:
    """NodeUnstageVolume. Raises grpc.RpcError."""
    with grpc.insecure_channel(unix_target(endpoint)) as channel:
        stub(csi_pb2_grpc.NodeStub, channel).NodeUnstageVolume(
            csi_pb2.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=staging_path),
            timeout=timeout_s,
        )


def supports_staging(endpoint: str, timeout_s: float) -> bool:
    """Whether the driver has the STAGE_UNSTAGE_VOLUME node capability. Raises grpc.RpcError."""
    with grpc.insecure_channel(unix_target(endpoint)) as channel:
        reply = stub(csi_pb2_grpc.NodeStub, channel).NodeGetCapabilities(
            csi_pb2.NodeGetCapabilitiesRequest(), timeout=timeout_s
        )
    stage = csi_pb2.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME
    return any(c.rpc.type == stage for c in reply.capabilities)


def staging_paths(kubelet_root: str, driver: str, volume_handle: str, pv_name: str) -> list[str]:
    """Where the kubelet stages a CSI volume: the current layout (sha256 of the handle under
    the driver's dir) and the older one (by PV name)."""
    digest = hashlib.sha256(volume_handle.encode()).hexdigest()
    base = os.path.join(kubelet_root, "plugins", "kubernetes.io", "csi")
    return [
        os.path.join(base, driver, digest, "globalmount"),
        os.path.join(base, "pv", pv_name, "globalmount"),
    ]
