"""The real node's network: a Linux bridge its pods hang off (the CNI bridge and
host-local plugins, Debian's containernetworking-plugins), and the `kubernetes` Service.

There is no kube-proxy: the Service's ClusterIP (the first address of the API server's
service range, which its serving certificate names) is put on the bridge as a host
address, and a small TCP relay on it forwards to the API server on loopback. Pods reach
it through their default route (the bridge), host-network pods directly.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import socketserver
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class NetworkSettings:
    bridge: str = "unstick-cni0"
    pod_subnet: str = "10.244.0.0/24"
    gateway: str = "10.244.0.1"
    # The `kubernetes` Service's ClusterIP (ControlPlane: --service-cluster-ip-range
    # 10.0.0.0/24); empty: no Service address or relay on this node.
    service_ip: str = "10.0.0.1"
    service_port: int = 443


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def create_bridge(settings: NetworkSettings) -> None:
    """The bridge, up, with the pods' gateway (and the Service address) on it."""
    prefix = settings.pod_subnet.rpartition("/")[2]
    _ip("link", "add", settings.bridge, "type", "bridge")
    _ip("addr", "add", f"{settings.gateway}/{prefix}", "dev", settings.bridge)
    if settings.service_ip:
        _ip("addr", "add", f"{settings.service_ip}/32", "dev", settings.bridge)
    _ip("link", "set", settings.bridge, "up")


def delete_bridge(settings: NetworkSettings) -> None:
    if bridge_exists(settings.bridge):
        _ip("link", "del", settings.bridge)


def bridge_ports(name: str) -> list[str]:
    """The interfaces attached to a bridge (its pods' veths)."""
    return [n for n, master in links().items() if master == name]


def delete_links(names: list[str]) -> None:
    """Delete veths that outlived their pods: a pod's network namespace stays while
    something holds it (a killed process's TCP connections still closing keep it for
    minutes), and with it the veth pair, though its bridge is gone. Deleting our end
    deletes the pair."""
    for name in names:
        _ip("link", "del", "dev", name, check=False)


def bridge_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def links(kind: str = "") -> dict[str, str]:
    """The network interfaces of this (the host's) network namespace: name -> the bridge
    it is attached to ("" if none); only those of one `ip link` type if `kind` is given
    (e.g. "veth")."""
    out = {}
    for line in _ip("-o", "link", "show", *(["type", kind] if kind else [])).stdout.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name = fields[1].rstrip(":").split("@")[0]
        master = fields[fields.index("master") + 1] if "master" in fields else ""
        out[name] = master
    return out


def cni_conflist(settings: NetworkSettings, ipam_dir: Path) -> dict[str, Any]:
    """bridge + host-local (state in `ipam_dir`), no masquerading (no iptables rules)."""
    return {
        "cniVersion": "1.0.0",
        "name": "unstick-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": settings.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": settings.pod_subnet, "gateway": settings.gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }


def write_cni_config(settings: NetworkSettings, conf_dir: Path, ipam_dir: Path) -> None:
    conf_dir.mkdir(parents=True, exist_ok=True)
    ipam_dir.mkdir(parents=True, exist_ok=True)
    path = conf_dir / "10-unstick-node.conflist"
    path.write_text(json.dumps(cni_conflist(settings, ipam_dir), indent=2))


class _Relay(socketserver.BaseRequestHandler):
    server: ServiceRelay

    def handle(self) -> None:
        try:
            upstream = socket.create_connection(self.server.target, timeout=10)
        except OSError:
            return
        with upstream, selectors.DefaultSelector() as sel:
            upstream.settimeout(None)
            sel.register(self.request, selectors.EVENT_READ, upstream)
            sel.register(upstream, selectors.EVENT_READ, self.request)
            while not self.server.closing.is_set():
                for key, _ in sel.select(timeout=0.5):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = src.recv(65536)
                        if not data:
                            return
                        key.data.sendall(data)
                    except OSError:
                        return


class ServiceRelay(socketserver.ThreadingTCPServer):
    """TCP relay from the Service address to the API server (one thread per connection)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]):
        self.target = target
        self.closing = threading.Event()
        super().__init__(listen, _Relay)
        self._thread = threading.Thread(target=self.serve_forever, name="service-relay")
        self._thread.daemon = True

    def start(self) -> ServiceRelay:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.closing.set()
        with contextlib.suppress(Exception):
            self.shutdown()
        self.server_close()
