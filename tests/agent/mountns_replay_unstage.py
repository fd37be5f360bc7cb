"""replay-unpublish's NodeUnstageVolume and another pod of the same volume on the node
(#33 finding 8c), run INSIDE a private mount namespace by conftest (`run_scenario(name,
workdir, script=UNSTAGE)`), with the project's CSI driver (devcluster/csi_hostpath.py) as
a process of the namespace, like mountns_scenarios.py's csi scenarios.

Pod A (stuck) has the volume `vol-1` (PV `pvc-1`) staged and published. Pod B, its
replacement on the same node, uses the same volume:
- `published`: B's NodePublishVolume is done (B's target is in the mount table);
- `publishing`: the kubelet's SetUp of B has begun — B's volume dir and vol_data.json are
  written, which the kubelet does right before it calls NodePublishVolume — and the call
  lands after A's replay (the kubelet believes the volume staged: it does not stage again).
In both, A's replay-unpublish runs, then B's publish is completed (or checked) and B's
target must show the volume's data.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import grpc

from devcluster.csi_hostpath import kubelet_capability
from tests.agent.mountns_scenarios import (
    DRIVER,
    UID_A,
    UID_B,
    CSIServer,
    Node,
    main,
    mount_points,
    scenarios_in,
    step,
)
from unstick.agent.proto import csi_pb2, csi_pb2_grpc

PV, HANDLE = "pvc-1", "vol-1"


def _staging(node: Node) -> Path:
    digest = hashlib.sha256(HANDLE.encode()).hexdigest()
    return node.root / "plugins" / "kubernetes.io" / "csi" / DRIVER / digest / "globalmount"


def _node_publish(server: CSIServer, staging: Path, target: Path) -> str:
    """The kubelet's NodePublishVolume for B: 'ok' or the driver's error."""
    with grpc.insecure_channel(f"unix://{server.csi_socket}") as ch:
        try:
            csi_pb2_grpc.NodeStub(ch).NodePublishVolume(
                csi_pb2.NodePublishVolumeRequest(
                    volume_id=HANDLE,
                    staging_target_path=str(staging),
                    target_path=str(target),
                    volume_capability=kubelet_capability(),
                ),
                timeout=10,
            )
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return "ok"


def _scenario(node: Node, b_published: bool) -> dict[str, Any]:
    server = CSIServer(node)
    server.start()
    staging, target_a = server.publish(UID_A, PV, HANDLE)
    (node.data / HANDLE / "file.txt").write_text("user data\n")
    if b_published:
        _, target_b = server.publish(UID_B, PV, HANDLE)
    else:  # the kubelet's SetUp of B: the volume dir and vol_data.json, then the call
        target_b = str(node.csi_volume(UID_B, PV, HANDLE, bind=False))
    replay = step(node.executor(), UID_A, "replay-unpublish", target_a)
    staged_after_replay = staging in mount_points()
    publish_b = (
        "done before" if b_published else _node_publish(server, Path(staging), Path(target_b))
    )
    data_b = Path(target_b, "file.txt")
    return {
        "replay": replay,
        "staged_after_replay": staged_after_replay,
        "a_mounted": target_a in mount_points(),
        "publish_b": publish_b,
        "b_mounted": target_b in mount_points(),
        "b_sees_data": data_b.exists() and data_b.read_text() == "user data\n",
    }


def scenario_published(node: Node) -> dict[str, Any]:
    return _scenario(node, b_published=True)


def scenario_publishing(node: Node) -> dict[str, Any]:
    return _scenario(node, b_published=False)


if __name__ == "__main__":
    sys.exit(main(scenarios_in(globals())))
