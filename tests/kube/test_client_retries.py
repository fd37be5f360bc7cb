"""The API client's retries are the project's (tenacity, `Kube`) and no one else's: urllib3
makes none of its own underneath. Against a real socket that hangs up on every request,
a GET with N attempts opens exactly N connections (urllib3's default would have made each
attempt four)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from unstick.kube.client import ClientSettings, Kube, load_configuration

SENTINEL = b"END-OF-TEST"


class HangUp:
    """A TCP server that reads each request and closes the connection without an answer,
    counting connections until the test's own sentinel connection arrives (connections are
    accepted in the order they were made, so every earlier one is counted by then)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            with conn:
                data = conn.recv(65536)
            if data == SENTINEL:
                return
            self.connections += 1

    def count(self) -> int:
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            s.sendall(SENTINEL)
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        self.sock.close()
        return self.connections


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[HangUp, Path]]:
    srv = HangUp()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{srv.port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    try:
        yield srv, path
    finally:
        if srv.thread.is_alive():
            srv.count()


@pytest.mark.parametrize("attempts", [1, 3])
def test_a_get_is_tried_exactly_as_often_as_tenacity_says(
    server: tuple[HangUp, Path], attempts: int
) -> None:
    srv, kubeconfig = server
    kube = Kube(
        ClientSettings(kubeconfig=str(kubeconfig), retry_attempts=attempts, retry_max_wait_s=0.01)
    )
    try:
        with pytest.raises(Exception) as failed:
            kube.get("/api/v1/namespaces/default")
    finally:
        kube.close()
    assert srv.count() == attempts
    assert "MaxRetryError" not in type(failed.value).__name__


def test_the_configuration_turns_urllib3_retries_off(server: tuple[HangUp, Path]) -> None:
    config = load_configuration(str(server[1]))
    assert config.retries is False
    assert config.client_go_retries is False
