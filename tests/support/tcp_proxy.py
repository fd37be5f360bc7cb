"""A TCP proxy a test puts between a process and the API server, and cuts: `close()`
closes every connection and the listening socket (new connections are refused)."""

from __future__ import annotations

import contextlib
import socket
import threading

from devcluster.process import free_port


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> TcpProxy:
        threading.Thread(target=self._accept, name="tcp proxy", daemon=True).start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                downstream.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._closed:
                    downstream.close()
                    upstream.close()
                    return
                self._sockets.update((downstream, upstream))
            for a, b in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = list(self._sockets), set()
        with contextlib.suppress(OSError):
            self._listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
