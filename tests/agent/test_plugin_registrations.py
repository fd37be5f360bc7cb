"""The agent keeps GetInfo answers (agent/probe/plugins.py Registrations) per registration socket
file, at most 2 s: over real gRPC registration sockets, a burst of lookups asks each plugin
once, and a driver that re-registers at the same socket path, a new socket, a removed
socket and a dead driver's leftover socket are all seen by the rule of the module doc."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from unstick.agent.probe.plugins import Registrations
from unstick.agent.proto import pluginregistration_pb2, pluginregistration_pb2_grpc

DRIVER = "a.csi.example.com"


class _Registration(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, name: str, endpoint: str) -> None:
        self.calls = 0
        self.info = pluginregistration_pb2.PluginInfo(
            type="CSIPlugin", name=name, endpoint=endpoint, supported_versions=["1.0.0"]
        )

    def GetInfo(self, request: Any, context: Any) -> Any:
        self.calls += 1
        return self.info


class Driver:
    """A registration server on a real unix socket; stop() leaves no socket file."""

    def __init__(
        self, path: Path, name: str, endpoint: str, servicer: _Registration | None = None
    ) -> None:
        self.path = path
        self.servicer = servicer or _Registration(name, endpoint)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.servicer, self.server)
        self.server.add_insecure_port(f"unix://{path}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(None).wait()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def registry(short_tmp: Path) -> Path:
    """The plugin registry: a dir of registration sockets."""
    return short_tmp


@pytest.fixture
def drivers() -> Iterator[list[Driver]]:
    started: list[Driver] = []
    try:
        yield started
    finally:
        for d in started:
            d.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_lookups_asks_each_plugin_once(registry: Path, drivers: list[Driver]) -> None:
    drivers.append(Driver(registry / f"{DRIVER}-reg.sock", DRIVER, "/plugins/a/csi.sock"))
    clock = Clock()
    view = Registrations(max_age_s=2.0, clock=clock)
    for _ in range(20):
        plugins = view.plugins(str(registry), timeout_s=2)
        assert plugins[DRIVER].endpoint == "/plugins/a/csi.sock"
    assert drivers[0].servicer.calls == 1
    clock.now += 2.5  # older than max_age_s: asked again
    assert DRIVER in view.plugins(str(registry), timeout_s=2)
    assert drivers[0].servicer.calls == 2


def test_a_driver_re_registered_at_the_same_path_is_asked_again(
    registry: Path, drivers: list[Driver]
) -> None:
    path = registry / f"{DRIVER}-reg.sock"
    first = Driver(path, DRIVER, "/plugins/a/old.sock")
    view = Registrations(max_age_s=3600.0, clock=Clock())  # only the socket file can tell
    assert view.plugins(str(registry), timeout_s=2)[DRIVER].endpoint == "/plugins/a/old.sock"
    first.stop()
    drivers.append(Driver(path, DRIVER, "/plugins/a/new.sock"))
    assert view.plugins(str(registry), timeout_s=2)[DRIVER].endpoint == "/plugins/a/new.sock"
    assert drivers[0].servicer.calls == 1


def test_added_and_removed_sockets_are_seen_at_the_next_lookup(
    registry: Path, drivers: list[Driver]
) -> None:
    view = Registrations(max_age_s=3600.0, clock=Clock())
    assert view.plugins(str(registry), timeout_s=2) == {}
    a = Driver(registry / f"{DRIVER}-reg.sock", DRIVER, "/plugins/a/csi.sock")
    assert list(view.plugins(str(registry), timeout_s=2)) == [DRIVER]
    drivers.append(Driver(registry / "b-reg.sock", "b.csi.example.com", "/plugins/b/csi.sock"))
    assert sorted(view.plugins(str(registry), timeout_s=2)) == [DRIVER, "b.csi.example.com"]
    a.stop()
    assert list(view.plugins(str(registry), timeout_s=2)) == ["b.csi.example.com"]


def test_a_dead_drivers_leftover_socket_is_dropped_after_max_age(
    registry: Path, drivers: list[Driver]
) -> None:
    path = registry / f"{DRIVER}-reg.sock"
    driver = Driver(path, DRIVER, "/plugins/a/csi.sock")
    clock = Clock()
    view = Registrations(max_age_s=2.0, clock=clock)
    assert DRIVER in view.plugins(str(registry), timeout_s=2)
    driver.stop()
    leftover = socket.socket(socket.AF_UNIX)  # the file stays, nobody listens
    leftover.bind(str(path))
    leftover.close()
    clock.now += 2.5
    assert view.plugins(str(registry), timeout_s=2) == {}


def test_a_socket_that_did_not_answer_is_asked_again(registry: Path, drivers: list[Driver]) -> None:
    path = registry / f"{DRIVER}-reg.sock"
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(path))
    leftover.close()
    view = Registrations(max_age_s=3600.0, clock=Clock())
    assert view.plugins(str(registry), timeout_s=2) == {}
    path.unlink()
    drivers.append(Driver(path, DRIVER, "/plugins/a/csi.sock"))
    assert DRIVER in view.plugins(str(registry), timeout_s=2)


class _Slow(_Registration):
    """Answers only once released: the callers that come meanwhile must wait for it."""

    def __init__(self, name: str, endpoint: str) -> None:
        super().__init__(name, endpoint)
        self.asked = threading.Event()
        self.release = threading.Event()

    def GetInfo(self, request: Any, context: Any) -> Any:
        self.calls += 1
        self.asked.set()
        self.release.wait(30)
        return self.info


def test_callers_during_a_getinfo_in_flight_share_its_answer(
    registry: Path, drivers: list[Driver]
) -> None:
    slow = _Slow(DRIVER, "/plugins/a/csi.sock")
    drivers.append(Driver(registry / f"{DRIVER}-reg.sock", DRIVER, slow.info.endpoint, slow))
    view = Registrations(max_age_s=3600.0, clock=Clock())
    with futures.ThreadPoolExecutor(max_workers=16) as pool:
        first = pool.submit(view.plugins, str(registry), 5)
        assert slow.asked.wait(30)
        rest = [pool.submit(view.plugins, str(registry), 5) for _ in range(15)]
        slow.release.set()
        answers = [first.result(30), *(f.result(30) for f in rest)]
    assert all(DRIVER in a for a in answers)
    assert slow.calls == 1
