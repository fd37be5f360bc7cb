"""The agent's main loop: list+watch the Remediations labelled for this node, hand each
to the Handler, serve /metrics and /healthz, and refresh the node-wide orphaned-mount gauge.

Standalone: no Kopf, no peering. Relists on 410 Gone (resourceVersion too old); after any
other watch error it reconnects with backoff (`unstick.kube.listwatch`).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from unstick import __version__
from unstick.agent.admission_check import AdmissionGate, refusal_message
from unstick.agent.authority import NodeBudget, PolicySources
from unstick.agent.executor import Executor
from unstick.agent.handler import JSON, Handler
from unstick.agent.mounts import read_mount_table
from unstick.agent.orphan_events import OrphanReporter
from unstick.agent.orphans import OrphanPass
from unstick.agent.probe import orphaned_mounts
from unstick.agent.scope import ScopeGate
from unstick.agent.settings import AgentSettings
from unstick.core.aftermath import ORPHAN_MIN_AGE_S
from unstick.core.vocabulary import Refusal
from unstick.kube.client import ClientSettings, Kube, remediation_path
from unstick.kube.listwatch import WatchStream, list_watch

log = logging.getLogger(__name__)

REMEDIATIONS = "/apis/unstick.dev/v1alpha1/remediations"
POLICIES = "/apis/unstick.dev/v1alpha1/remediationpolicies"
NODE_LABEL = "unstick.dev/node"
BUDGET_FILE = "node-budget"  # in the state dir: authority.NodeBudget


@dataclass(frozen=True, slots=True)
class LoopSettings:
    kubeconfig: str | None = None
    metrics_port: int = 9101
    metrics_host: str = "0.0.0.0"  # scraped by Prometheus from outside the pod
    watch_timeout_s: int = 300
    summary_interval_s: float = 30.0
    backoff_max_s: float = 30.0
    node_actions_per_minute: int = 10  # the agent's own cap on node-step batches
    workers: int = 4  # Remediations handled at once (one key's events always in order)
    orphan_min_age_s: float = ORPHAN_MIN_AGE_S  # younger pod dirs are never orphans


class AgentMetrics:
    """The agent's own registry: `unstick_node_orphaned_mounts{node}`,
    `unstick_node_probe_duration_seconds` and `unstick_refusals_total{reason}`."""

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
            "Pod directories on this node whose pod is not in the API (DESIGN §9)",
            ["node"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "unstick_refusals_total",
            "Requests refused by this node's agent (forged, stale, not opted in, policy "
            "forbids, dry-run, unsafe)",
            ["reason"],
            registry=self.registry,
        )


class KeyedWorkers:
    """Runs jobs on `count` threads: all jobs of one key on the same thread, in the order
    they were submitted; jobs of other keys meanwhile on the others. A job that raises is
    logged and the thread goes on."""

    def __init__(self, count: int, name: str = "worker") -> None:
        self._stopping = threading.Event()
        self._queues: list[queue.SimpleQueue[Callable[[], None] | None]] = [
            queue.SimpleQueue() for _ in range(max(1, count))
        ]
        self._threads = [
            threading.Thread(target=self._run, args=(q,), name=f"{name}-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()

    def shard(self, key: str) -> int:
        """The thread a key's jobs run on (stable for the process's life)."""
        return zlib.crc32(key.encode("utf-8", "surrogatepass")) % len(self._queues)

    def submit(self, key: str, job: Callable[[], None]) -> None:
        self._queues[self.shard(key)].put(job)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Let the jobs that run finish (at most `timeout_s` in all); those not started
        are dropped (after a restart the relist hands every Remediation over again)."""
        self._stopping.set()
        for q in self._queues:
            q.put(None)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self, jobs: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while (job := jobs.get()) is not None:
            if self._stopping.is_set():
                continue
            try:
                job()
            except Exception:
                log.exception("worker job failed")


class _HTTPServer6(ThreadingHTTPServer):
    """/metrics on an IPv6 address (a node IP from the downward API may be one)."""

    address_family = socket.AF_INET6


class Agent:
    """Watches this node's Remediations and serves metrics and health."""

    def __init__(self, settings: AgentSettings, loop: LoopSettings) -> None:
        self.settings = settings
        self.loop = loop
        self.kube = Kube(
            ClientSettings(kubeconfig=loop.kubeconfig, user_agent=f"unstick-agent/{__version__}")
        )
        self.metrics = AgentMetrics(settings.node_name)
        executor = Executor(settings)
        # on the host (the state dir): the window survives an agent restart, even mid-batch
        budget = NodeBudget(
            cap=loop.node_actions_per_minute,
            path=os.path.join(settings.state_dir, BUDGET_FILE),
        )
        on_refusal = lambda reason: self.metrics.refusals.labels(str(reason)).inc()  # noqa: E731
        self.handler = Handler(
            settings,
            executor,
            self.patch_status,
            self.get_pod,
            policies=PolicySources(namespace=self.get_namespace, policy=self.get_policy),
            budget=budget,
            on_probe_duration=self.metrics.probe_duration.observe,
            on_refusal=on_refusal,
        )
        self.orphans = OrphanPass(  # the same executor, budget and refusal counter
            settings,
            executor,
            self.list_node_pods,
            self.get_policy,
            budget,
            on_refusal,
            min_age_s=loop.orphan_min_age_s,
        )
        self.scope = ScopeGate(
            settings.namespace_scope, self.patch_status, on_refusal, self.handler.clock
        )
        self.admission = AdmissionGate(settings.admission_policy)  # --admission-policy
        self.orphan_reporter = OrphanReporter(settings.node_name, self.post)
        self.stuck_uids: dict[str, str] = {}  # remediation uid -> pod uid
        self.stop = threading.Event()
        self.last_sync = 0.0
        self._stream = WatchStream()
        self._workers: KeyedWorkers | None = None

    def workers(self) -> KeyedWorkers:
        """The handler's threads (started on first use): a slow Remediation (its API round
        trips, its probe, its node steps) does not hold up the others' (node steps: one batch
        per pod and one CSI call or kubelet restart at a time, `Handler.pod_locks` and
        `Handler.call_lock`)."""
        if self._workers is None:
            self._workers = KeyedWorkers(self.loop.workers, name="remediation")
        return self._workers

    # --- API -----------------------------------------------------------------------

    def patch_status(self, namespace: str, name: str, status: JSON) -> None:
        self.kube.request(
            "PATCH",
            remediation_path(namespace, name) + "/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    def get_pod(self, namespace: str, name: str) -> JSON | None:
        """The pod from the API server (None when it does not exist)."""
        return self.kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def list_node_pods(self) -> list[JSON]:
        """A fresh LIST of this node's pods (never a cache: orphans are judged on it)."""
        return self.kube.list_all(
            "/api/v1/pods", {"fieldSelector": f"spec.nodeName={self.settings.node_name}"}
        )

    def post(self, path: str, body: JSON) -> None:
        self.kube.request("POST", path, body=body)

    def get_namespace(self, name: str) -> JSON | None:
        return self.kube.get(f"/api/v1/namespaces/{quote(name, safe='')}")

    def get_policy(self, name: str) -> JSON | None:
        return self.kube.get(f"{POLICIES}/{quote(name, safe='')}")

    def _query(self) -> dict[str, Any]:
        return {"labelSelector": f"{NODE_LABEL}={self.settings.node_name}"}

    def _dispatch(self, obj: JSON, deleted: bool = False) -> None:
        """Book-keeping here; the handling on the Remediation's worker (in event order)."""
        meta = obj.get("metadata") or {}
        key = meta.get("uid") or ""
        if deleted:
            self.stuck_uids.pop(key, None)
            self.workers().submit(key, lambda: self._forget(key))
            return
        if not self.scope.allows(meta.get("namespace")):
            self.workers().submit(key, lambda: self.scope.refuse(obj))
            return
        problem = self.admission.problem_now(self.kube.get)
        if problem is not None:
            why = refusal_message(problem)
            self.workers().submit(key, lambda: self.scope.refuse(obj, why, Refusal.UNSAFE))
            return
        pod_uid = (obj.get("spec") or {}).get("podUID")
        if isinstance(pod_uid, str):
            self.stuck_uids[key] = pod_uid
        received = datetime.now(UTC)  # a request's age is judged at its arrival
        self.workers().submit(key, lambda: self._handle(obj, received))

    def _forget(self, key: str) -> None:
        self.handler.served_probes.pop(key, None)
        self.handler.served_steps.pop(key, None)
        self.scope.forget(key)

    def _handle(self, obj: JSON, received: datetime) -> None:
        try:
            self.handler.handle(obj, received)
        except Exception:  # one bad object or failed patch never stops the loop
            meta = obj.get("metadata") or {}
            log.exception("handling remediation %s/%s", meta.get("namespace"), meta.get("name"))

    def _relist(self) -> str:
        self.admission.check(self.kube.get)
        version = ""
        seen = set()
        for page in self.kube.list_pages(REMEDIATIONS, self._query()):
            version = (page.get("metadata") or {}).get("resourceVersion") or version
            for obj in page.get("items") or []:
                seen.add((obj.get("metadata") or {}).get("uid"))
                self._dispatch(obj)
        for key in [k for k in self.stuck_uids if k not in seen]:
            self._dispatch({"metadata": {"uid": key}}, deleted=True)
        self.last_sync = time.monotonic()
        return version

    def _watch(self, version: str) -> str:
        self.admission.check(self.kube.get)
        query = {**self._query(), "resourceVersion": version, "allowWatchBookmarks": "true"}
        version = self._stream.follow(
            self.kube,
            REMEDIATIONS,
            query,
            timeout_s=self.loop.watch_timeout_s,
            stop=self.stop,
            apply=self._apply,
        )
        self.last_sync = time.monotonic()  # a watch that timed out quietly is healthy too
        return version

    def _apply(self, event: JSON) -> str | None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        self.last_sync = time.monotonic()
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._dispatch(obj, deleted=kind == "DELETED")
        version: str | None = (obj.get("metadata") or {}).get("resourceVersion")
        return version

    def shutdown(self) -> None:
        """Stop the loop now: also ends a watch that is waiting for the next event."""
        self.stop.set()
        self._stream.shutdown()

    def run_watch(self) -> None:
        """List+watch until stopped; relist on 410, reconnect after errors (with backoff)."""
        list_watch(
            self.stop,
            self._relist,
            self._watch,
            log=log,
            what="watch",
            backoff_s=1.0,
            backoff_max_s=self.loop.backoff_max_s,
        )

    # --- node summary --------------------------------------------------------------

    def _live_pod_uids(self) -> set[str] | None:
        try:
            pods = self.kube.list_all(
                "/api/v1/pods", {"fieldSelector": f"spec.nodeName={self.settings.node_name}"}
            )
        except Exception as exc:
            log.warning("cannot list this node's pods: %s", exc)
            return None
        return {p["metadata"]["uid"] for p in pods if (p.get("metadata") or {}).get("uid")}

    def refresh_summary(self) -> int:
        """Recompute `unstick_node_orphaned_mounts` for this node; returns the count."""
        table = read_mount_table(self.settings.mountinfo)
        count = orphaned_mounts(
            table,
            self.settings.kubelet_root,
            set(self.stuck_uids.copy().values()),  # copy(): atomic vs. the watch thread
            self._live_pod_uids(),
        )
        self.metrics.orphaned.labels(node=self.settings.node_name).set(count)
        return count

    def refresh_orphans(self) -> int | None:
        """One orphaned-pod-dir pass (agent/orphans.py): gauge, Node Event, clean where the
        `default` policy says `clean`; None when the node's pods could not be listed."""
        dirs = self.orphans.run()
        if dirs is None:
            return None
        left = [d for d in dirs if os.path.lexists(d.path)]
        self.metrics.orphaned_dirs.labels(node=self.settings.node_name).set(len(left))
        self.orphan_reporter.report(dirs, self.orphans.mode)
        return len(left)

    def run_summary(self) -> None:
        while not self.stop.is_set():
            try:
                self.refresh_summary()
            except Exception as exc:
                log.warning("node summary failed: %s", exc)
            try:
                self.refresh_orphans()
            except Exception as exc:
                log.warning("orphaned pod dir pass failed: %s", exc)
            self.stop.wait(self.loop.summary_interval_s)

    # --- HTTP ----------------------------------------------------------------------

    def healthy(self) -> bool:
        """Live while the watch thread synced within twice the watch timeout."""
        return time.monotonic() - self.last_sync < 2 * self.loop.watch_timeout_s + 60

    def serve_http(self) -> ThreadingHTTPServer:
        agent = self

        class Endpoints(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    body, ctype, code = (
                        generate_latest(agent.metrics.registry),
                        CONTENT_TYPE_LATEST,
                        200,
                    )
                elif self.path == "/healthz":
                    ok = agent.healthy()
                    body, ctype, code = (
                        (b"ok" if ok else b"stale"),
                        "text/plain",
                        (200 if ok else 500),
                    )
                else:
                    body, ctype, code = b"not found", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        server_class = _HTTPServer6 if ":" in self.loop.metrics_host else ThreadingHTTPServer
        server = server_class((self.loop.metrics_host, self.loop.metrics_port), Endpoints)
        threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
        return server

    def run(self) -> None:
        """Run until `stop` is set (SIGTERM/SIGINT in the command)."""
        self.last_sync = time.monotonic()
        server = self.serve_http()
        threading.Thread(target=self.run_summary, name="summary", daemon=True).start()
        try:
            self.run_watch()
        finally:
            if self._workers is not None:
                self._workers.stop()
            server.shutdown()
            self.kube.close()
