"""A small CSI node plugin for the agent tests and the demo: real gRPC over unix sockets,
real mounts. It stands in for csi-driver-host-path, which cannot be run here.

Run it inside a private mount namespace::

    python -m unstick.devcluster.csi_hostpath --name NAME --csi-socket S --registration-socket R \
        --data-dir D --state-file F

- Registration.GetInfo on the registration socket (as node-driver-registrar serves it in
  `plugins_registry/`) answers type CSIPlugin, the driver name and the CSI socket.
- Identity.GetPluginInfo, Node.NodeGetInfo, Node.NodeGetCapabilities (STAGE_UNSTAGE_VOLUME).
- NodeStageVolume bind-mounts `<data-dir>/<volume_id>` on the staging path;
  NodePublishVolume bind-mounts the staging path (or the data dir) on the target path and
  records the publication in the state file; NodeUnpublishVolume unmounts it and forgets it;
  NodeUnstageVolume unmounts the staging path.
- The csi-driver-host-path state bug: a volume missing from the state file (state lost on a
  restart) makes NodeUnpublishVolume answer OK *without unmounting*.

Prints "ready" on stdout once both sockets serve.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from unstick.agent.proto import (
    csi_pb2,
    csi_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)


class State:
    """Published volumes (volume_id -> [target paths]) kept in a JSON file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def load(self) -> dict[str, list[str]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data: dict[str, list[str]] = json.load(f)
                return data
        except FileNotFoundError:
            return {}

    def save(self, data: dict[str, list[str]]) -> None:
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(data, f)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def _umount(path: str) -> None:
    subprocess.run(["umount", path], check=True, capture_output=True)


class Identity(csi_pb2_grpc.IdentityServicer):
    def __init__(self, name: str) -> None:
        self.name = name

    def GetPluginInfo(self, request: Any, context: Any) -> Any:
        return csi_pb2.GetPluginInfoResponse(name=self.name, vendor_version="0.1.0-test")


class Node(csi_pb2_grpc.NodeServicer):
    def __init__(self, data_dir: str, state: State) -> None:
        self.data_dir = data_dir
        self.state = state

    def NodeGetInfo(self, request: Any, context: Any) -> Any:
        return csi_pb2.NodeGetInfoResponse(node_id="test-node")

    def NodeGetCapabilities(self, request: Any, context: Any) -> Any:
        rpc = csi_pb2.NodeServiceCapability.RPC(
            type=csi_pb2.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME
        )
        return csi_pb2.NodeGetCapabilitiesResponse(
            capabilities=[csi_pb2.NodeServiceCapability(rpc=rpc)]
        )

    def NodeStageVolume(self, request: Any, context: Any) -> Any:
        source = str(Path(self.data_dir) / request.volume_id)
        Path(source).mkdir(parents=True, exist_ok=True)
        Path(request.staging_target_path).mkdir(parents=True, exist_ok=True)
        _mount("--bind", source, request.staging_target_path)
        return csi_pb2.NodeStageVolumeResponse()

    def NodeUnstageVolume(self, request: Any, context: Any) -> Any:
        _umount(request.staging_target_path)
        return csi_pb2.NodeUnstageVolumeResponse()

    def NodePublishVolume(self, request: Any, context: Any) -> Any:
        source = request.staging_target_path or str(Path(self.data_dir) / request.volume_id)
        Path(request.target_path).mkdir(parents=True, exist_ok=True)
        _mount("--bind", source, request.target_path)
        with self.state.lock:
            data = self.state.load()
            data.setdefault(request.volume_id, []).append(request.target_path)
            self.state.save(data)
        return csi_pb2.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request: Any, context: Any) -> Any:
        with self.state.lock:
            data = self.state.load()
            targets = data.get(request.volume_id, [])
            if request.target_path not in targets:
                # The bug under test: state lost, so "not published" -> OK, mount left behind.
                return csi_pb2.NodeUnpublishVolumeResponse()
            _umount(request.target_path)
            targets.remove(request.target_path)
            self.state.save(data)
        return csi_pb2.NodeUnpublishVolumeResponse()


class Registration(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, name: str, endpoint: str) -> None:
        self.name = name
        self.endpoint = endpoint

    def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.PluginInfo(
            type="CSIPlugin", name=self.name, endpoint=self.endpoint, supported_versions=["1.0.0"]
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.RegistrationStatusResponse()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--name", required=True)
    p.add_argument("--csi-socket", required=True)
    p.add_argument("--registration-socket", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--state-file", required=True)
    args = p.parse_args()
    for sock in (args.csi_socket, args.registration_socket):
        Path(sock).unlink(missing_ok=True)
    csi = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    csi_pb2_grpc.add_IdentityServicer_to_server(Identity(args.name), csi)
    csi_pb2_grpc.add_NodeServicer_to_server(Node(args.data_dir, State(args.state_file)), csi)
    csi.add_insecure_port(f"unix://{args.csi_socket}")
    reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
        Registration(args.name, args.csi_socket), reg
    )
    reg.add_insecure_port(f"unix://{args.registration_socket}")
    csi.start()
    reg.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    csi.stop(0)
    reg.stop(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
