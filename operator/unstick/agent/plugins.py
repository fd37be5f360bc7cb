"""The CSI drivers registered with the kubelet, learned the way the kubelet learns them:
a Registration.GetInfo call on each socket in `<kubelet-root>/plugins_registry/`.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from typing import Any

import grpc

from unstick.agent.proto import pluginregistration_pb2 as reg_pb2
from unstick.agent.proto import pluginregistration_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

CSI_PLUGIN_TYPE = "CSIPlugin"


@dataclass(frozen=True, slots=True)
class Plugin:
    """A registered plugin: its name and the endpoint (CSI socket) it serves."""

    name: str
    type: str
    endpoint: str
    registration_socket: str


def stub(cls: Any, channel: grpc.Channel) -> Any:
    """A client stub of a generated service class (the generated code is untyped)."""
    return cls(channel)


def unix_target(path: str) -> str:
    """A gRPC target for a unix socket path."""
    return f"unix://{path}" if path.startswith("/") else f"unix:{path}"


def get_info(socket_path: str, timeout_s: float) -> Plugin:
    """Call Registration.GetInfo on one registration socket. Raises grpc.RpcError."""
    with grpc.insecure_channel(unix_target(socket_path)) as channel:
        info = stub(reg_grpc.RegistrationStub, channel).GetInfo(
            reg_pb2.InfoRequest(), timeout=timeout_s
        )
    endpoint = info.endpoint or socket_path  # a plugin without endpoint serves both here
    return Plugin(info.name, info.type, endpoint, socket_path)


def registered_plugins(registry_dir: str, timeout_s: float = 2.0) -> dict[str, Plugin]:
    """name → Plugin for every CSI plugin answering on a `*.sock` in `registry_dir`.

    Sockets that do not answer within `timeout_s` (stale files of a dead driver) are
    skipped: a driver that cannot answer the kubelet is not registered either.
    """
    plugins: dict[str, Plugin] = {}
    try:
        names = sorted(os.listdir(registry_dir))
    except OSError:
        return plugins
    for name in names:
        path = os.path.join(registry_dir, name)
        try:
            if not name.endswith(".sock") or not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
            plugin = get_info(path, timeout_s)
        except (OSError, grpc.RpcError) as exc:
            log.info("plugin socket %s did not answer GetInfo: %s", path, exc)
            continue
        if plugin.type == CSI_PLUGIN_TYPE and plugin.name:
            plugins[plugin.name] = plugin
    return plugins
