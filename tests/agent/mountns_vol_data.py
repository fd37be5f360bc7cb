"""rmdir-stale and the kubelet's own vol_data.json, against real mounts and a real CSI
driver process, run INSIDE a private mount namespace by conftest
(`run_scenario(name, workdir, script=VOL_DATA)`), like mountns_scenarios.py:

- `driver_missing`: pod A's CSI volume is published by the project's driver, then the
  driver is killed (uninstalled: its sockets stay, nobody answers). The core diagnoses the
  live probe and the node steps it plans for CSIDriverMissing run (unmount, rmdir-stale of
  the mount dir, the volume dir and `kubernetes.io~csi`); the core looks again; then the
  driver comes back and rmdir-stale is asked again (what the next plan asks for the dirs
  left); then the kubelet's own teardown of the volume is done the way the kubelet does it
  (vol_data.json read, NodeUnpublishVolume of the target).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import grpc

from tests.agent.mountns_scenarios import (
    UID_A,
    CSIServer,
    Node,
    _bundle,
    main,
    mount_points,
    scenarios_in,
    step,
    tree,
)
from unstick.agent.proto import csi_pb2, csi_pb2_grpc
from unstick.core.model.snapshot import parse_bundle
from unstick.core.policy.planner import plan
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import NODE_ACTIONS


def _kubelet_teardown(server: CSIServer, target: Path) -> dict[str, Any]:
    """What the kubelet's TearDownAt does first: NewUnmounter reads vol_data.json beside the
    target, then NodeUnpublishVolume(volume_id, target)."""
    data = json.loads((target.parent / "vol_data.json").read_text())
    with grpc.insecure_channel(f"unix://{server.csi_socket}") as ch:
        csi_pb2_grpc.NodeStub(ch).NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(
                volume_id=data["volumeHandle"], target_path=str(target)
            ),
            timeout=10,
        )
    return data


def _core(node: Node) -> dict[str, Any]:
    """The core's diagnosis and plan from a live probe, with the driver uninstalled (not in
    CSINode either)."""
    bundle = _bundle(node.probe(UID_A))
    bundle["csiNode"]["spec"]["drivers"] = []
    d = diagnose(parse_bundle(bundle))
    p = plan(d, None)
    return {
        "cause": str(d.cause),
        "steps": [(str(s.action), s.target) for s in p.steps if s.action in NODE_ACTIONS],
        "actions": [str(s.action) for s in p.steps],
    }


def scenario_driver_missing(node: Node) -> dict[str, Any]:
    server = CSIServer(node)
    try:
        server.start()
        _, target_s = server.publish(UID_A, "pvc-1", "vol-1")
        target = Path(target_s)
        vol_data = (target.parent / "vol_data.json").read_text()
        assert server.proc is not None
        node.stop(server.proc)  # the driver uninstalled: its sockets stay, nobody answers
        ex = node.executor()
        pv_dir, csi_dir = target.parent, target.parent.parent
        before = _core(node)  # the core's plan for CSIDriverMissing, run as planned
        missing = [step(ex, UID_A, action, t) for action, t in before["steps"]]
        after_missing = {
            "mounted": target_s in mount_points(),
            "tree": tree(node.pod(UID_A)),
            "vol_data": (pv_dir / "vol_data.json").read_text(),
        }
        after = _core(node)  # what the core makes of what is left
        server.start()  # the driver reinstalled: registered again
        back = step(ex, UID_A, "rmdir-stale")  # the next plan: the dirs that are left
        tree_back = tree(node.pod(UID_A))
        teardown = _kubelet_teardown(server, target)
        return {
            "target": target_s,
            "pv_dir": str(pv_dir),
            "csi_dir": str(csi_dir),
            "vol_data_before": vol_data,
            "core_before": before,
            "core_after": after,
            "missing": missing,
            "after_missing": after_missing,
            "back": back,
            "tree_back": tree_back,
            "teardown": teardown,
        }
    finally:
        node.cleanup()


if __name__ == "__main__":
    sys.exit(main(scenarios_in(globals())))
