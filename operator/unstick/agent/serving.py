"""What the agent serves: its metrics registry, /metrics and /healthz."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class AgentMetrics:
    """The agent's own registry: `unstick_node_orphaned_mounts{node}`,
    `unstick_node_orphaned_pod_dirs{node}`, `unstick_node_probe_duration_seconds`,
    `unstick_node_cgroup_layout{node,layout}` and `unstick_refusals_total{reason}`."""

    def __init__(self, node: str) -> None:
        self.registry = CollectorRegistry()
        self.node = node
        self.orphaned = Gauge(
            "unstick_node_orphaned_mounts",
            "Volume/subpath mounts of pods on this node that are stuck or unknown to the API",
            ["node"],
            registry=self.registry,
        )
        self.probe_duration = Histogram(
            "unstick_node_probe_duration_seconds",
            "Time to probe one pod on this node",
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.orphaned_dirs = Gauge(
            "unstick_node_orphaned_pod_dirs",
            "Pod directories on this node whose pod is not in the API (design.md §9)",
            ["node"],
            registry=self.registry,
        )
        self.cgroup_layout = Gauge(
            "unstick_node_cgroup_layout",
            "The cgroup freezer this node's agent sees: 1 for the layout (v2, hybrid, v1, none)",
            ["node", "layout"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "unstick_refusals_total",
            "Requests refused by this node's agent (forged, stale, not opted in, policy "
            "forbids, dry-run, unsafe)",
            ["reason"],
            registry=self.registry,
        )


class _HTTPServer6(ThreadingHTTPServer):
    """/metrics on an IPv6 address (a node IP from the downward API may be one)."""

    address_family = socket.AF_INET6


def serve_http(
    metrics: AgentMetrics, healthy: Callable[[], bool], host: str, port: int
) -> ThreadingHTTPServer:
    """/metrics and /healthz (200 "ok" while `healthy()`, else 500 "stale") on a thread."""

    class Endpoints(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                body, ctype, code = generate_latest(metrics.registry), CONTENT_TYPE_LATEST, 200
            elif self.path == "/healthz":
                ok = healthy()
                body, ctype, code = (b"ok" if ok else b"stale"), "text/plain", (200 if ok else 500)
            else:
                body, ctype, code = b"not found", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server_class = _HTTPServer6 if ":" in host else ThreadingHTTPServer
    server = server_class((host, port), Endpoints)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
