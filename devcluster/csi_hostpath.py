"""The project's CSI plugin, for the agent tests, the demo and the real node: real gRPC over
unix sockets, real mounts. It stands in for csi-driver-host-path, which cannot be built here,
and passes csi-sanity (tests/csi) for the capabilities it declares.

Run it inside a private mount namespace::

    python -m devcluster.csi_hostpath --name NAME --csi-socket S --registration-socket R \
        --data-dir D --state-file F [--node-id N]

- Registration.GetInfo on the registration socket (as node-driver-registrar serves it in
  `plugins_registry/`) answers type CSIPlugin, the driver name and the CSI socket.
- Identity: GetPluginInfo, GetPluginCapabilities (CONTROLLER_SERVICE), Probe.
- Controller (csi_controller.py): CreateVolume/DeleteVolume of directories
  `<data-dir>/<volume_id>`, ValidateVolumeCapabilities, ControllerGetCapabilities.
- Node: NodeGetInfo, NodeGetCapabilities (STAGE_UNSTAGE_VOLUME). A volume is a directory
  `<data-dir>/<volume_id>` (made by CreateVolume, or by hand for a static PV); mount access
  only, single-node access modes. NodeStageVolume bind-mounts it on the staging path;
  NodePublishVolume bind-mounts the staging path on the target path (read-only if asked) and
  records the publication in the state file; NodeUnpublishVolume unmounts a recorded target,
  removes it and forgets it; NodeUnstageVolume unmounts the staging path. Repeated calls
  with the same arguments answer OK; a path already mounted from another volume is
  AlreadyExists; an unknown volume NotFound; a missing field InvalidArgument.
- The csi-driver-host-path state bug, kept on purpose (it is the OrphanedMount seed): a
  target missing from the state file (state lost on a restart) makes NodeUnpublishVolume
  answer OK *without unmounting*.

Prints "ready" on stdout once both sockets serve.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import wrappers_pb2

from devcluster.csi_controller import (
    Controller,
    abort,
    capability_problem,
    mount_points,
    volume_dir,
)
from unstick.agent.proto import (
    csi_pb2,
    csi_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT
# the CSI spec's (and csi-sanity's) rule for GetPluginInfo.name
DRIVER_NAME = re.compile(r"^[a-zA-Z][A-Za-z0-9._-]{0,61}[a-zA-Z]$")


class State:
    """Published volumes (volume_id -> [target paths]) kept in a JSON file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.RLock()

    def load(self) -> dict[str, list[str]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data: dict[str, list[str]] = json.load(f)
                return data
        except FileNotFoundError:
            return {}

    def save(self, data: dict[str, list[str]]) -> None:
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump({k: v for k, v in data.items() if v}, f)

    def published(self, volume_id: str) -> bool:
        with self.lock:
            return bool(self.load().get(volume_id))


def kubelet_capability() -> Any:
    """The volume_capability the kubelet sends for a ReadWriteOnce filesystem PV."""
    mode = csi_pb2.VolumeCapability.AccessMode(
        mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
    )
    return csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=mode)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def _umount(path: str) -> None:
    subprocess.run(["umount", path], check=True, capture_output=True)


def _same_dir(a: str | Path, b: str | Path) -> bool:
    sa, sb = Path(a).stat(), Path(b).stat()
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _require(context: grpc.ServicerContext, request: Any, *fields: str) -> None:
    for field in fields:
        if not (
            request.HasField(field) if field == "volume_capability" else getattr(request, field)
        ):
            abort(context, INVALID, f"{field} is required")


class Identity(csi_pb2_grpc.IdentityServicer):
    def __init__(self, name: str) -> None:
        self.name = name

    def GetPluginInfo(self, request: Any, context: Any) -> Any:
        return csi_pb2.GetPluginInfoResponse(name=self.name, vendor_version="0.1.0-test")

    def GetPluginCapabilities(self, request: Any, context: Any) -> Any:
        service = csi_pb2.PluginCapability.Service(
            type=csi_pb2.PluginCapability.Service.CONTROLLER_SERVICE
        )
        return csi_pb2.GetPluginCapabilitiesResponse(
            capabilities=[csi_pb2.PluginCapability(service=service)]
        )

    def Probe(self, request: Any, context: Any) -> Any:
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))


class Node(csi_pb2_grpc.NodeServicer):
    def __init__(self, data_dir: str, state: State, node_id: str = "test-node") -> None:
        self.data_dir = data_dir
        self.state = state
        self.node_id = node_id

    def NodeGetInfo(self, request: Any, context: Any) -> Any:
        return csi_pb2.NodeGetInfoResponse(node_id=self.node_id)

    def NodeGetCapabilities(self, request: Any, context: Any) -> Any:
        rpc = csi_pb2.NodeServiceCapability.RPC(
            type=csi_pb2.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME
        )
        return csi_pb2.NodeGetCapabilitiesResponse(
            capabilities=[csi_pb2.NodeServiceCapability(rpc=rpc)]
        )

    def _volume(self, context: grpc.ServicerContext, request: Any) -> Path:
        """The volume's directory after checking its capability: NotFound if there is none."""
        problem = capability_problem(request.volume_capability, "volume_capability")
        if problem:
            abort(context, INVALID, problem)
        path = volume_dir(self.data_dir, request.volume_id)
        if path is None or not path.is_dir():
            abort(context, grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id} not found")
        return path

    def NodeStageVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        _require(context, request, "volume_id", "staging_target_path", "volume_capability")
        source = self._volume(context, request)
        staging = request.staging_target_path
        with self.state.lock:
            if staging in mount_points():
                if not _same_dir(staging, source):
                    abort(
                        context,
                        grpc.StatusCode.ALREADY_EXISTS,
                        f"{staging} is already staged from another volume",
                    )
                return csi_pb2.NodeStageVolumeResponse()
            Path(staging).mkdir(parents=True, exist_ok=True)
            _mount("--bind", str(source), staging)
        return csi_pb2.NodeStageVolumeResponse()

    def NodeUnstageVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        _require(context, request, "volume_id", "staging_target_path")
        with self.state.lock:
            if request.staging_target_path in mount_points():
                _umount(request.staging_target_path)
        return csi_pb2.NodeUnstageVolumeResponse()

    def NodePublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        _require(
            context, request, "volume_id", "staging_target_path", "target_path", "volume_capability"
        )
        self._volume(context, request)
        staging, target = request.staging_target_path, request.target_path
        with self.state.lock:
            points = mount_points()
            if staging not in points:
                abort(
                    context,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"volume {request.volume_id} is not staged at {staging}",
                )
            if target in points and not _same_dir(target, staging):
                abort(
                    context,
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"{target} is already published from another volume",
                )
            if target not in points:
                self._bind(staging, target, request)
            data = self.state.load()
            targets = data.setdefault(request.volume_id, [])
            if target not in targets:
                targets.append(target)
            self.state.save(data)
        return csi_pb2.NodePublishVolumeResponse()

    @staticmethod
    def _bind(staging: str, target: str, request: Any) -> None:
        Path(target).mkdir(parents=True, exist_ok=True)
        _mount("--bind", staging, target)
        mode = request.volume_capability.access_mode.mode
        if request.readonly or mode == csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY:
            _mount("-o", "remount,bind,ro", target)

    def NodeUnpublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        _require(context, request, "volume_id", "target_path")
        with self.state.lock:
            data = self.state.load()
            targets = data.get(request.volume_id, [])
            if request.target_path not in targets:
                # The bug under test: state lost, so "not published" -> OK, mount left behind.
                return csi_pb2.NodeUnpublishVolumeResponse()
            if request.target_path in mount_points():
                _umount(request.target_path)
            with contextlib.suppress(FileNotFoundError):
                Path(request.target_path).rmdir()  # the spec: the SP removes what it created
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
    p.add_argument("--node-id", default="test-node", help="NodeGetInfo's node_id")
    args = p.parse_args()
    if not DRIVER_NAME.match(args.name):
        p.error(
            f"--name {args.name!r}: a CSI driver name is 2-63 letters, digits, ., - or _, "
            "starting and ending with a letter"
        )
    for sock in (args.csi_socket, args.registration_socket):
        Path(sock).unlink(missing_ok=True)
    csi = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    csi_pb2_grpc.add_IdentityServicer_to_server(Identity(args.name), csi)
    state = State(args.state_file)
    csi_pb2_grpc.add_NodeServicer_to_server(Node(args.data_dir, state, args.node_id), csi)
    csi_pb2_grpc.add_ControllerServicer_to_server(Controller(args.data_dir, state.published), csi)
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
