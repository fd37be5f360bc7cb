"""The CSI drivers registered with the kubelet, learned the way the kubelet learns them:
a Registration.GetInfo call on each socket in `<kubelet-root>/plugins_registry/`.

GetInfo answers are kept (`Registrations`), because every probe and every replay asks
and the set of plugins changes rarely. What depends on the answer: the probe's
`registeredPlugins` (with the CSINode, whether a mount's driver is registered — which
decides between a replay through the driver and a plain unmount) and, right before a
replay, the endpoint its NodeUnpublishVolume goes to. The freshness rule:

- the directory is listed on every call: a socket file removed is gone at once, a new
  one is asked at once;
- an answer is used only while its socket file is the same file (device, inode, ctime,
  taken before the call): a driver that re-registers binds a new socket file, so it is
  asked again at the next call even at the same path (the kubelet itself calls GetInfo
  once per socket file it sees created, and never again);
- an answer is used at most `max_age_s` (2 s, one burst of probes): a driver that died and
  left its socket file behind is known dead within 2 s. Meanwhile it can look registered:
  its replay then fails to connect to its endpoint (no mount touched, the step fails and
  is asked again) — the replay's own checks (the mount's identity, `vol_data.json` for
  the driver and handle) are unchanged;
- a socket that did not answer is not remembered: it is asked again at the next call;
- one GetInfo is in flight per socket: callers meanwhile wait for it and share its answer
  (or its failure: it answered no call made after theirs started).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
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


REGISTRATION_MAX_AGE_S = 2.0  # a GetInfo answer serves the calls of one burst

FileIdentity = tuple[int, int, int]  # st_dev, st_ino, st_ctime_ns of a socket file


class Registrations:
    """GetInfo answers by registration socket, kept by the rule of the module doc."""

    def __init__(
        self,
        max_age_s: float = REGISTRATION_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
        ask: Callable[[str, float], Plugin] = get_info,
    ) -> None:
        self.max_age_s = max_age_s
        self.clock = clock
        self.ask = ask
        self._lock = threading.Lock()
        self._answers: dict[str, tuple[FileIdentity, float, Plugin]] = {}
        self._asking: dict[str, threading.Lock] = {}  # one GetInfo in flight per socket
        self._failed: dict[str, tuple[FileIdentity, int]] = {}  # no answer: file, ticket
        self._failures = 0  # tickets of calls that did not answer

    def plugins(self, registry_dir: str, timeout_s: float) -> dict[str, Plugin]:
        """name → Plugin for every CSI plugin answering on a `*.sock` in `registry_dir`."""
        plugins: dict[str, Plugin] = {}
        try:
            names = sorted(os.listdir(registry_dir))
        except OSError:
            return plugins
        seen: set[str] = set()
        for name in names:
            path = os.path.join(registry_dir, name)
            plugin = self._plugin(path, timeout_s) if name.endswith(".sock") else None
            seen.add(path)
            if plugin is not None and plugin.type == CSI_PLUGIN_TYPE and plugin.name:
                plugins[plugin.name] = plugin
        self._forget(registry_dir, seen)
        return plugins

    def _plugin(self, path: str, timeout_s: float) -> Plugin | None:
        try:
            st = os.lstat(path)
        except OSError as exc:
            log.info("plugin socket %s did not answer GetInfo: %s", path, exc)
            return None
        if not stat.S_ISSOCK(st.st_mode):
            return None
        identity = (st.st_dev, st.st_ino, st.st_ctime_ns)
        with self._lock:
            asking = self._asking.setdefault(path, threading.Lock())
            failures_seen = self._failures
        with asking:  # one GetInfo in flight per socket: callers meanwhile share its answer
            with self._lock:
                kept = self._answers.get(path)
                failed = self._failed.get(path)
            now = self.clock()
            if kept is not None and kept[0] == identity and now - kept[1] <= self.max_age_s:
                return kept[2]
            if failed is not None and failed[0] == identity and failed[1] > failures_seen:
                return None  # it did not answer a call made while this one waited
            try:
                plugin = self.ask(path, timeout_s)  # identity and age from before the call
            except (OSError, grpc.RpcError) as exc:
                log.info("plugin socket %s did not answer GetInfo: %s", path, exc)
                with self._lock:
                    self._answers.pop(path, None)
                    self._failures += 1
                    self._failed[path] = (identity, self._failures)
                return None
            with self._lock:
                self._answers[path] = (identity, now, plugin)
                self._failed.pop(path, None)
            return plugin

    def _forget(self, registry_dir: str, seen: set[str]) -> None:
        prefix = os.path.join(registry_dir, "")
        with self._lock:
            for path in [p for p in self._asking if p.startswith(prefix) and p not in seen]:
                self._answers.pop(path, None)
                self._failed.pop(path, None)
                del self._asking[path]


REGISTRATIONS = Registrations()  # the agent's one view, shared by its probes and steps


def registered_plugins(registry_dir: str, timeout_s: float = 2.0) -> dict[str, Plugin]:
    """name → Plugin for every CSI plugin answering on a `*.sock` in `registry_dir`, by
    the agent's shared `REGISTRATIONS` (answers kept per socket file, at most 2 s).

    Sockets that do not answer within `timeout_s` (stale files of a dead driver) are
    skipped: a driver that cannot answer the kubelet is not registered either.
    """
    return REGISTRATIONS.plugins(registry_dir, timeout_s)
