"""The controller's status lists stay inside the Remediation's status schema (a pod with
thousands of volumes must not make every status write a 422), and the agent's /metrics
can listen on an IPv6 node IP."""

from __future__ import annotations

import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler

import pytest

from unstick.agent.loop import _HTTPServer6
from unstick.controller.deciding.decision import MAX_LIST_ITEMS, MAX_MESSAGE, _bounded


def test_long_lists_are_cut_and_say_so() -> None:
    items = [{"kind": "mount", "message": f"m{i}"} for i in range(1000)]
    out = _bounded("evidence", items)
    assert len(out) == MAX_LIST_ITEMS["evidence"]
    assert out[0] == items[0]
    assert "745 more not recorded" in out[-1]["message"]


def test_short_lists_are_kept_and_messages_bounded() -> None:
    items = [{"action": "unmount", "target": "/x", "reason": "r" * 5000}]
    (only,) = _bounded("plan", items)
    assert len(only["reason"]) == MAX_MESSAGE and only["target"] == "/x"


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_metrics_server_binds_an_ipv6_address() -> None:
    class Ok(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            return

    server = _HTTPServer6(("::1", 0), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=5) as resp:
            assert resp.read() == b"ok"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
