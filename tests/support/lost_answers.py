"""A proxy between a client (the controller, or a `Kube`) and the test's real API server
that can lose an answer: the request is carried out by the API server, the answer never
reaches the client (its connection is closed instead) — what a read timeout, a 5xx from a
load balancer or a connection reset does to a client behind an overloaded API server.

The client speaks plain HTTP/1.1 to the proxy (`kubeconfig()`: a kubeconfig naming it);
the proxy speaks TLS to the API server as the control plane's admin (its client
certificate), so it sees each request and answer. `lose_answer(method, paths)` arms it: the
next request of that method to one of those paths is forwarded, its answer read in full
from the API server (so it was carried out) and dropped, and the client's connection
closed. Every other request and answer (watches included) is relayed as it is."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import yaml

from devcluster import ControlPlane


class LostAnswers:
    def __init__(self, cp: ControlPlane) -> None:
        url = urlsplit(cp.url)
        self.upstream = (url.hostname or "127.0.0.1", int(url.port or 443))
        self.tls = cp.ssl_context()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.armed: tuple[str, frozenset[str]] | None = None
        self.lost: list[tuple[str, str, int]] = []  # (method, path, the answer's code)
        self.open: set[socket.socket] = set()
        self.closed = False
        threading.Thread(target=self._accept, name="lost-answers", daemon=True).start()

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for the proxy (plain HTTP, no credentials: the proxy has them)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
            "current-context": "proxy",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def lose_answer(self, method: str, paths: Iterable[str]) -> None:
        """The answer of the next `method` request to one of `paths` is lost (once);
        `lost` lists it then (and only it)."""
        with self.lock:
            self.armed = (method.upper(), frozenset(paths))
            self.lost = []

    def close(self) -> None:
        with self.lock:
            self.closed = True
            conns = list(self.open)
        self.sock.close()
        for conn in conns:
            _close(conn)

    # -- relaying ---------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _take(self, method: str, path: str) -> bool:
        with self.lock:
            if self.armed and self.armed[0] == method and path in self.armed[1]:
                self.armed = None
                return True
            return False

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        with self.lock:
            if self.closed:
                _close(client)
                return
            self.open.add(client)
        try:
            from_client = client.makefile("rb")
            up_in: BinaryIO | None = None
            while True:
                head = _read_head(from_client)
                if not head:
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _version = lines[0].split(" ", 2)
                headers = [h for h in lines[1:] if h and not h.lower().startswith("authorization:")]
                body = _read_body(from_client, headers, relay=None)
                if upstream is None:
                    raw = socket.create_connection(self.upstream)
                    upstream = self.tls.wrap_socket(raw, server_hostname=self.upstream[0])
                    with self.lock:
                        self.open.add(upstream)
                    up_in = upstream.makefile("rb")
                assert up_in is not None
                request = "\r\n".join([lines[0], *headers, "", ""]).encode("latin-1")
                upstream.sendall(request + body)
                lose = self._take(method, target.split("?", 1)[0])
                answer = _read_head(up_in)
                if not answer:
                    return
                status = answer.decode("latin-1").split("\r\n")
                code = int(status[0].split(" ", 2)[1])
                if lose:  # carried out; the answer read in full and dropped
                    _read_body(up_in, status[1:], relay=None, response=True, method=method)
                    with self.lock:
                        self.lost.append((method, target, code))
                    return
                client.sendall(answer)
                _read_body(up_in, status[1:], relay=client, response=True, method=method)
                if _header(status[1:], "connection").lower() == "close":
                    return
        except (OSError, ValueError):
            return
        finally:
            with self.lock:
                self.open.discard(client)
                if upstream is not None:
                    self.open.discard(upstream)
            _close(client)
            if upstream is not None:
                _close(upstream)


def _close(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()


def _read_head(stream: BinaryIO) -> bytes:
    """A request's or answer's start line and headers, with the blank line (b"" at EOF)."""
    head = b""
    while True:
        line = stream.readline(65536)
        if not line:
            return b""
        head += line
        if line in (b"\r\n", b"\n"):
            return head


def _header(headers: list[str], name: str) -> str:
    for h in headers:
        key, _, value = h.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return ""


def _read_body(
    stream: BinaryIO,
    headers: list[str],
    *,
    relay: socket.socket | None,
    response: bool = False,
    method: str = "",
) -> bytes:
    """The body after `headers` (Content-Length, chunked, or an answer until EOF), relayed
    to `relay` as it comes (a watch's chunks at once) or returned."""
    out = b""

    def take(data: bytes) -> None:
        nonlocal out
        if relay is not None:
            relay.sendall(data)
        else:
            out += data

    if _header(headers, "transfer-encoding").lower() == "chunked":
        while True:
            size_line = stream.readline(65536)
            if not size_line:
                raise ValueError("connection closed within a chunked body")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            chunk = stream.read(size + 2) if size else b""
            take(size_line + chunk)
            if size == 0:
                while True:  # trailers, then the blank line
                    line = stream.readline(65536)
                    take(line)
                    if line in (b"\r\n", b"\n", b""):
                        return out
    length = _header(headers, "content-length")
    if length:
        take(stream.read(int(length)))
        return out
    if response and method != "HEAD" and _header(headers, "connection").lower() == "close":
        while data := stream.read1(65536):  # an answer that ends with its connection
            take(data)
    return out
