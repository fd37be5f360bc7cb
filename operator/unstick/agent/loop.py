"""The agent's main loop: watch the Remediations labelled for this node (on the one watch
loop, `unstick.kube.listwatch.ListWatch`), hand each to the Handler on its worker thread,
serve /metrics and /healthz, and refresh the node-wide orphaned-mount gauge.

Standalone: no Kopf, no peering. The watch loop lists, watches, resumes, relists on 410
Gone and reconnects after errors with backoff; this module is its `Sink`: every object of
a (re)list and every event is dispatched, and a Remediation that a relist no longer shows
(deleted while the watch was down) is forgotten. The admission policy's verdict is read
at every relist and at the start of every watch cycle (`agent/authority/admission.py`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from urllib.parse import quote

from unstick import __version__
from unstick.agent.authority.admission import AdmissionGate, refusal_message
from unstick.agent.authority.rederive import NodeBudget, PolicySources
from unstick.agent.authority.scope import ScopeGate
from unstick.agent.authority.watched import Watched, namespace_labels
from unstick.agent.handler import JSON, Handler
from unstick.agent.holders.scan_group import NextPass
from unstick.agent.orphans.cleanup import OrphanPass
from unstick.agent.orphans.events import OrphanReporter
from unstick.agent.probe.collect import orphaned_mounts
from unstick.agent.probe.mount_file import read_mount_table
from unstick.agent.probe.pod_tasks import cgroup_layout, cgroup_mounts
from unstick.agent.serving import AgentMetrics, _HTTPServer6, serve_http
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import Executor
from unstick.agent.workers import KeyedWorkers
from unstick.core.model.probe import CGROUP_LAYOUTS
from unstick.core.remediation import (
    ALL_REMEDIATIONS,
    NODE_LABEL,
    NODE_STEPS_REQUESTED_AT,
    POD_UID,
    POLICIES,
    steps_answered,
)
from unstick.core.rules.aftermath import ORPHAN_MIN_AGE_S
from unstick.core.vocabulary import Refusal
from unstick.kube.client import ClientSettings, Kube, remediation_path
from unstick.kube.listwatch import ListWatch, WatchSpec

__all__ = ["Agent", "AgentMetrics", "KeyedWorkers", "LoopSettings", "_HTTPServer6"]

log = logging.getLogger(__name__)

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
    # Remediations handled at once (one key's events always in order); 16, not 4: a job mostly
    # waits (API, CSI, scans), and with 4 a burst of 100 pods waited in the queue
    # (measured: docs/benchmark.md, the node side's second round of runs)
    workers: int = 16
    orphan_min_age_s: float = ORPHAN_MIN_AGE_S  # younger pod dirs are never orphans


def _steps_due(obj: JSON) -> bool:
    """Whether the Remediation carries a node-steps request not answered yet."""
    spec, status = obj.get("spec"), obj.get("status")
    spec = spec if isinstance(spec, dict) else {}
    status = status if isinstance(status, dict) else {}
    return spec.get(NODE_STEPS_REQUESTED_AT) is not None and not steps_answered(spec, status)


class Agent:
    """Watches this node's Remediations and serves metrics and health."""

    def __init__(self, settings: AgentSettings, loop: LoopSettings) -> None:
        self.settings = settings
        self.loop = loop
        self.kube = Kube(
            ClientSettings(kubeconfig=loop.kubeconfig, user_agent=f"unstick-agent/{__version__}")
        )
        self.metrics = AgentMetrics(settings.node_name)
        # namespace and policy GETs shared by the checks asking at the same moment, each
        # read after its caller asked (docs/agent.md, "Namespace and policy reads shared")
        self._reads: NextPass[JSON | None] = NextPass()
        # ... and, for a mandate, from the agent's own list+watch of them (docs/agent.md,
        # "Namespace and policy reads from watches"; a GET where they do not answer)
        self.stop = threading.Event()
        self.namespaces = Watched(
            self.kube, "/api/v1/namespaces", "namespace-watch", keep=namespace_labels,
            stop=self.stop, watch_timeout_s=loop.watch_timeout_s,
            backoff_max_s=loop.backoff_max_s,
        )  # fmt: skip
        self.policies = Watched(
            self.kube, POLICIES, "policy-watch", stop=self.stop,
            watch_timeout_s=loop.watch_timeout_s, backoff_max_s=loop.backoff_max_s,
        )  # fmt: skip
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
            policies=PolicySources(
                namespace=self.get_namespace,
                policy=self.get_policy,
                watched_namespace=self.namespaces.peek,
                watched_policy=self.policies.peek,
            ),
            budget=budget,
            on_probe_duration=self.metrics.probe_duration.observe,
            on_refusal=on_refusal,
            server_time=self.server_time,
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
        self._started = 0.0  # time.monotonic() of run(): healthy until the first list
        self._listed: set[str] = set()  # uids of the relist in progress
        self._workers: KeyedWorkers | None = None
        self._cgroup_layout = ""  # the last one logged
        spec = WatchSpec(
            ALL_REMEDIATIONS,
            "remediation-watch",
            query={"labelSelector": f"{NODE_LABEL}={settings.node_name}"},
            watch_timeout_s=loop.watch_timeout_s,
            backoff_s=1.0,
            backoff_max_s=loop.backoff_max_s,
        )
        self.watch = ListWatch(self.kube, spec, self, stop=self.stop, before_watch=self._recheck)

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

    def server_time(self, now: datetime) -> datetime:
        """`now` in the API server's time, never later (kube/server_clock.py)."""
        return datetime.fromtimestamp(self.kube.server_clock.server_now(now.timestamp()), UTC)

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

    def _shared_get(self, path: str) -> JSON | None:
        """GET `path`, the one GET started after this call began that the callers asking
        for the same path meanwhile share (`scan_group.NextPass`: never one already
        running, never one that ended). The object is shared: read it, never change it."""
        return self._reads.run(path, lambda: self.kube.get(path))

    def get_namespace(self, name: str) -> JSON | None:
        return self._shared_get(f"/api/v1/namespaces/{quote(name, safe='')}")

    def get_policy(self, name: str) -> JSON | None:
        return self._shared_get(f"{POLICIES}/{quote(name, safe='')}")

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
        pod_uid = (obj.get("spec") or {}).get(POD_UID)
        if isinstance(pod_uid, str):
            self.stuck_uids[key] = pod_uid
        received = datetime.now(UTC)  # a request's age is judged at its arrival
        # node steps due finish a pod: before the probes on its worker (agent/workers.py)
        self.workers().submit(key, lambda: self._handle(obj, received), urgent=_steps_due(obj))

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

    # --- the watch loop's Sink (called from the watch thread, in order) ----------------

    def _recheck(self) -> None:
        """The admission verdict, read again at every relist and watch cycle."""
        self.admission.check(self.kube.get)

    def relist_begin(self) -> None:
        self._recheck()
        self._listed = set()

    def listed(self, obj: JSON) -> None:
        self._listed.add((obj.get("metadata") or {}).get("uid") or "")
        self._dispatch(obj)

    def relist_end(self) -> None:
        """A Remediation known before but not in the list was deleted meanwhile."""
        listed, self._listed = self._listed, set()
        for key in [k for k in self.stuck_uids if k not in listed]:
            self._dispatch({"metadata": {"uid": key}}, deleted=True)

    def changed(self, kind: str, obj: JSON) -> None:
        self._dispatch(obj, deleted=kind == "DELETED")

    def shutdown(self) -> None:
        """Stop the loop now: also ends a watch that is waiting for the next event."""
        self.watch.stop()

    def run_watch(self) -> None:
        """List+watch until stopped (`ListWatch.run`, in the calling thread)."""
        self.watch.run()

    # --- node summary --------------------------------------------------------------

    def _live_pod_uids(self) -> set[str] | None:
        try:
            pods = self.list_node_pods()
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
        """One orphaned-pod-dir pass (agent/orphans/cleanup.py): gauge, Node Event, clean where the
        `default` policy says `clean`; None when the node's pods could not be listed."""
        dirs = self.orphans.run()
        if dirs is None:
            return None
        left = [d for d in dirs if os.path.lexists(d.path)]
        self.metrics.orphaned_dirs.labels(node=self.settings.node_name).set(len(left))
        self.orphan_reporter.report(dirs, self.orphans.mode)
        return len(left)

    def refresh_cgroup_layout(self) -> str:
        """Set `unstick_node_cgroup_layout` (1 for the layout seen, 0 for the others) and log
        a change; returns the layout."""
        mounts = cgroup_mounts(self.settings.host_proc)
        layout = cgroup_layout(mounts)
        node = self.settings.node_name
        for each in CGROUP_LAYOUTS:
            self.metrics.cgroup_layout.labels(node=node, layout=each).set(int(each == layout))
        if layout != self._cgroup_layout:
            where = ", ".join(f"{m.version} at {m.mount_point}" for m in mounts) or "no mount"
            log.info("cgroup layout %s (%s)", layout, where)
            self._cgroup_layout = layout
        return layout

    def run_summary(self) -> None:
        while not self.stop.is_set():
            try:
                self.refresh_summary()
                self.refresh_cgroup_layout()
            except Exception as exc:
                log.warning("node summary failed: %s", exc)
            try:
                self.refresh_orphans()
            except Exception as exc:
                log.warning("orphaned pod dir pass failed: %s", exc)
            self.stop.wait(self.loop.summary_interval_s)

    # --- HTTP ----------------------------------------------------------------------

    @property
    def last_sync(self) -> float:
        """time.monotonic() of the watch's last list, event or quiet end (or of the start)."""
        return max(self._started, self.watch.stats.last_activity)

    def healthy(self) -> bool:
        """Live while the watch thread synced within twice the watch timeout."""
        return time.monotonic() - self.last_sync < 2 * self.loop.watch_timeout_s + 60

    def serve_http(self) -> ThreadingHTTPServer:
        return serve_http(
            self.metrics, self.healthy, self.loop.metrics_host, self.loop.metrics_port
        )

    def run(self) -> None:
        """Run until `stop` is set (SIGTERM/SIGINT in the command)."""
        self._started = time.monotonic()
        server = self.serve_http()
        threading.Thread(target=self.run_summary, name="summary", daemon=True).start()
        self.namespaces.start()
        self.policies.start()
        try:
            self.run_watch()
        finally:
            self.namespaces.stop()
            self.policies.stop()
            if self._workers is not None:
                self._workers.stop()
            server.shutdown()
            self.kube.close()
