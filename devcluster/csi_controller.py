"""The Controller service of the project's CSI plugin (see csi_hostpath.py): volumes are
directories `<data-dir>/<volume_id>`, as in csi-driver-host-path. Only CREATE_DELETE_VOLUME is
declared; ValidateVolumeCapabilities and ControllerGetCapabilities are always served.

- CreateVolume is idempotent by name: the volume id is derived from the name, so the same name
  gives the same volume (also after a restart); an existing name whose capacity does not fit
  the new range is AlreadyExists. No snapshots, no clones, no block volumes, no topology.
- Capacity is bookkeeping only (a directory has no size): required_bytes, else 1 GiB (or
  limit_bytes if smaller); more than 1 TiB is OutOfRange.
- DeleteVolume of an unknown id is OK (the spec's idempotency); a volume still published, or
  with anything mounted inside, is FailedPrecondition and nothing is deleted.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc

from unstick.agent.proto import csi_pb2, csi_pb2_grpc
from unstick.core.model.mountinfo import parse_mountinfo

GIB = 1 << 30
DEFAULT_CAPACITY = GIB
MAX_CAPACITY = 1 << 40

_MODE = csi_pb2.VolumeCapability.AccessMode
# A directory on one node: writers on that node, readers anywhere it is mounted.
SUPPORTED_MODES = frozenset({_MODE.SINGLE_NODE_WRITER, _MODE.SINGLE_NODE_READER_ONLY})


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def capability_problem(cap: Any, field: str) -> str | None:
    """Why this plugin cannot serve the VolumeCapability `cap` (None: it can)."""
    if cap.HasField("block"):
        return f"{field}: block volumes are not supported (mount only)"
    if not cap.HasField("mount"):
        return f"{field}: access_type must be mount"
    mode = cap.access_mode.mode
    if mode not in SUPPORTED_MODES:
        supported = ", ".join(sorted(_MODE.Mode.Name(m) for m in SUPPORTED_MODES))
        return f"{field}: access mode {_MODE.Mode.Name(mode)} is not supported ({supported})"
    return None


def capabilities_problem(caps: Iterable[Any], field: str) -> str | None:
    problems = (capability_problem(c, f"{field}[{i}]") for i, c in enumerate(caps))
    return next((p for p in problems if p), None)


def volume_dir(data_dir: str, volume_id: str) -> Path | None:
    """The directory of `volume_id`, or None when the id cannot name one (a path, `.`...)."""
    if not volume_id or "/" in volume_id or volume_id.startswith(".") or "\0" in volume_id:
        return None
    return Path(data_dir) / volume_id


def volume_id_for(name: str) -> str:
    return "vol-" + hashlib.sha256(name.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Volume:
    name: str
    volume_id: str
    capacity: int


def capacity_for(context: grpc.ServicerContext, rng: Any) -> int:
    required, limit = rng.required_bytes, rng.limit_bytes
    if required < 0 or limit < 0:
        abort(context, grpc.StatusCode.INVALID_ARGUMENT, "capacity_range: negative bytes")
    if limit and required > limit:
        abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            f"capacity_range: required_bytes {required} > limit_bytes {limit}",
        )
    if required > MAX_CAPACITY:
        abort(
            context,
            grpc.StatusCode.OUT_OF_RANGE,
            f"capacity_range.required_bytes {required} exceeds the maximum {MAX_CAPACITY}",
        )
    if required:
        return int(required)
    return int(min(DEFAULT_CAPACITY, limit) if limit else DEFAULT_CAPACITY)


def fits(capacity: int, rng: Any) -> bool:
    return capacity >= rng.required_bytes and (not rng.limit_bytes or capacity <= rng.limit_bytes)


class Controller(csi_pb2_grpc.ControllerServicer):
    """`in_use(volume_id)`: whether the node side has the volume published (or staged)."""

    def __init__(self, data_dir: str, in_use: Callable[[str], bool]) -> None:
        self.data_dir = data_dir
        self.in_use = in_use
        self.lock = threading.Lock()
        self.volumes: dict[str, Volume] = {}  # by name, in memory

    def ControllerGetCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        rpc = csi_pb2.ControllerServiceCapability.RPC(
            type=csi_pb2.ControllerServiceCapability.RPC.CREATE_DELETE_VOLUME
        )
        return csi_pb2.ControllerGetCapabilitiesResponse(
            capabilities=[csi_pb2.ControllerServiceCapability(rpc=rpc)]
        )

    def CreateVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._check_create(request, context)
        capacity = capacity_for(context, request.capacity_range)
        with self.lock:
            vol = self.volumes.get(request.name)
            if vol is not None and not fits(vol.capacity, request.capacity_range):
                abort(
                    context,
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"volume {request.name!r} exists with capacity {vol.capacity} bytes, "
                    "outside the requested capacity_range",
                )
            if vol is None:
                vol = Volume(request.name, volume_id_for(request.name), capacity)
            path = volume_dir(self.data_dir, vol.volume_id)
            assert path is not None
            path.mkdir(parents=True, exist_ok=True)
            self.volumes[request.name] = vol
        return csi_pb2.CreateVolumeResponse(
            volume=csi_pb2.Volume(volume_id=vol.volume_id, capacity_bytes=vol.capacity)
        )

    def _check_create(self, request: Any, context: grpc.ServicerContext) -> None:
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        if not request.name:
            abort(context, invalid, "name is required")
        if not request.volume_capabilities:
            abort(context, invalid, "volume_capabilities is required")
        problem = capabilities_problem(request.volume_capabilities, "volume_capabilities")
        if problem:
            abort(context, invalid, problem)
        if request.HasField("volume_content_source"):
            abort(context, invalid, "volume_content_source: snapshots and clones not supported")

    def DeleteVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        if not request.volume_id:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, "volume_id is required")
        path = volume_dir(self.data_dir, request.volume_id)
        with self.lock:
            if path is None or not path.is_dir() or path.is_symlink():
                return csi_pb2.DeleteVolumeResponse()  # unknown: nothing to delete
            if self.in_use(request.volume_id):
                abort(
                    context,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"volume {request.volume_id} is still published on this node",
                )
            if _has_mounts(path):
                abort(
                    context,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"volume {request.volume_id} has mounts inside it: not deleting",
                )
            shutil.rmtree(path)
            for name in [n for n, v in self.volumes.items() if v.volume_id == request.volume_id]:
                del self.volumes[name]
        return csi_pb2.DeleteVolumeResponse()

    def ValidateVolumeCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        if not request.volume_id:
            abort(context, invalid, "volume_id is required")
        if not request.volume_capabilities:
            abort(context, invalid, "volume_capabilities is required")
        path = volume_dir(self.data_dir, request.volume_id)
        if path is None or not path.is_dir():
            abort(context, grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id} not found")
        problem = capabilities_problem(request.volume_capabilities, "volume_capabilities")
        if problem:
            return csi_pb2.ValidateVolumeCapabilitiesResponse(message=problem)
        confirmed = csi_pb2.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_context=request.volume_context,
            volume_capabilities=request.volume_capabilities,
            parameters=request.parameters,
        )
        return csi_pb2.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)


def mount_points() -> set[str]:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        return {m.mount_point for m in parse_mountinfo(f.read())}


def _has_mounts(path: Path) -> bool:
    real = str(path.resolve())
    return any(p == real or p.startswith(real + "/") for p in mount_points())
