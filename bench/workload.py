"""The benchmark's workload on a fresh local control plane: kwok nodes with healthy pods,
kubelet-less nodes whose pods become stuck when the nodes are deleted, and pods held by an
abandoned finalizer.

Objects are created concurrently (a thread pool over one keep-alive connection pool), as
the benchmark driver (User-Agent `unstick-bench-driver`), so its own requests are easy to
tell apart from the contenders' in the audit log.

- healthy pods `h-NNNNN`: bound directly to kwok nodes (`spec.nodeName`, no scheduler
  runs here); kwok makes them Running like a kubelet would;
- doomed pods `d-NNNNN`: bound to kubelet-less nodes `doomed-N` whose Ready condition the
  driver sets to True (nothing else writes it: no node lifecycle controller runs). When
  the event strikes, those nodes are deleted and then the pods: no kubelet finalises them,
  so they stay Terminating with their node gone — cause NodeGone;
- finalizer pods `f-NNNNN`: unscheduled, with the finalizer `bench.unstick.dev/abandoned`
  nobody removes; deleted, they stay with deletionGracePeriodSeconds 0 — cause
  FinalizerBlocked (observe only: the policy's allowlist is empty).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import urllib3

from devcluster import ControlPlane, node_manifest

DRIVER_UA = "unstick-bench-driver/1"
NAMESPACE = "bench"
FINALIZER = "bench.unstick.dev/abandoned"
OPT_IN_LABEL = "unstick.dev/remediate"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class WorkloadSize:
    nodes: int  # kwok nodes (with a simulated kubelet) carrying the healthy pods
    pods: int  # healthy pods
    stuck: int  # pods that get stuck with their node gone (NodeGone)
    finalizer: int  # pods held by an abandoned finalizer (FinalizerBlocked, observe only)
    doomed_nodes: int  # kubelet-less nodes carrying the NodeGone pods

    def healthy_names(self, upto: int | None = None) -> list[str]:
        return [f"h-{i:05d}" for i in range(self.pods if upto is None else upto)]

    def doomed_names(self) -> list[str]:
        return [f"d-{i:05d}" for i in range(self.stuck)]

    def finalizer_names(self) -> list[str]:
        return [f"f-{i:05d}" for i in range(self.finalizer)]


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300]}")
        self.status = status


class Api:
    """A small, fast admin client for building the workload (raw JSON, pooled TLS)."""

    def __init__(self, cp: ControlPlane, threads: int = 16) -> None:
        self.url = cp.url
        self.threads = threads
        self.http = urllib3.PoolManager(
            maxsize=threads * 2,
            ca_certs=str(cp.certs.ca_cert),
            cert_file=str(cp.certs.admin_cert),
            key_file=str(cp.certs.admin_key),
            headers={"User-Agent": DRIVER_UA, "Accept": "application/json"},
            retries=urllib3.Retry(total=5, backoff_factor=0.2, status_forcelist=(429, 500, 503)),
            timeout=urllib3.Timeout(connect=10, read=60),
        )

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        ok_missing: bool = False,
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if data is not None else None
        resp = self.http.request(method, f"{self.url}{path}", body=data, headers=headers)
        if resp.status == 404 and ok_missing:
            return {}
        if not 200 <= resp.status < 300:
            raise ApiError(resp.status, method, path, resp.data.decode(errors="replace"))
        return json.loads(resp.data) if resp.data else {}

    def each(self, fn: Callable[[T], Any], items: Iterable[T], what: str = "") -> list[Any]:
        """`fn` over `items` on the thread pool; prints progress for long runs."""
        items = list(items)
        out: list[Any] = []
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=self.threads) as pool:
            for i, result in enumerate(pool.map(fn, items), 1):
                out.append(result)
                if what and (i % 5000 == 0 or i == len(items)) and len(items) >= 5000:
                    rate = i / max(time.monotonic() - started, 1e-6)
                    print(f"      {what}: {i}/{len(items)} ({rate:.0f}/s)", flush=True)
        return out

    def count_pods(self, label_selector: str, field_selector: str = "") -> int:
        """How many pods match (paginated LIST in pages of 5,000)."""
        total, cont = 0, ""
        while True:
            query = f"labelSelector={label_selector}&limit=5000"
            if field_selector:
                query += f"&fieldSelector={field_selector}"
            if cont:
                query += f"&continue={cont}"
            page = self.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?{query}")
            total += len(page.get("items") or [])
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return total


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(
    name: str, node: str | None, role: str, grace: int, finalizers: list[str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "labels": {"role": role}}
    if finalizers:
        meta["finalizers"] = finalizers
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": "registry.invalid/bench/app:1"}],
        "terminationGracePeriodSeconds": grace,
        "tolerations": [{"operator": "Exists"}],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _ready_condition() -> dict[str, Any]:
    now = _now()
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "set by the benchmark: this node has no kubelet",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


def create_base(api: Api, size: WorkloadSize) -> None:
    """The opted-in namespace, the kwok nodes and the kubelet-less (doomed) nodes."""
    api.call(
        "POST",
        "/api/v1/namespaces",
        {"metadata": {"name": NAMESPACE, "labels": {OPT_IN_LABEL: "true"}}},
    )
    api.each(
        lambda i: api.call("POST", "/api/v1/nodes", node_manifest(f"kwok-{i}", kubelet=True)),
        range(size.nodes),
    )

    def doomed(i: int) -> None:
        name = f"doomed-{i}"
        api.call("POST", "/api/v1/nodes", node_manifest(name, kubelet=False))
        api.call(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {"status": {"conditions": [_ready_condition()]}},
            content_type="application/strategic-merge-patch+json",
        )

    api.each(doomed, range(size.doomed_nodes))


def create_healthy(api: Api, size: WorkloadSize, start: int, stop: int) -> None:
    """Healthy pods h-<start>..h-<stop-1>, spread over the kwok nodes."""

    def make(i: int) -> None:
        pod = _pod(f"h-{i:05d}", f"kwok-{i % size.nodes}", "healthy", 30)
        api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

    api.each(make, range(start, stop), what="healthy pods")


def create_doomed(api: Api, size: WorkloadSize) -> None:
    """The pods that will get stuck: NodeGone ones and abandoned-finalizer ones."""

    def make(name: str) -> None:
        i = int(name[2:])
        if name.startswith("d-"):
            pod = _pod(name, f"doomed-{i % size.doomed_nodes}", "doomed", 1)
        else:
            pod = _pod(name, None, "finalizer", 1, [FINALIZER])
        api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

    api.each(make, size.doomed_names() + size.finalizer_names(), what="doomed pods")


def wait_running(api: Api, want: int, timeout_s: float) -> int:
    """Wait (bounded) until kwok has made `want` healthy pods Running; returns how many."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = api.count_pods("role=healthy", "status.phase=Running")
        if running >= want or time.monotonic() > deadline:
            return running
        time.sleep(2.0)


def wait_no_pods(api: Api, label_selector: str, timeout_s: float) -> int:
    """Wait (bounded) until no pod matches; returns how many are left."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = api.count_pods(label_selector)
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def release_finalizer_pods(api: Api, size: WorkloadSize) -> None:
    """Remove the abandoned finalizer from every `f-*` pod (deleted: they then go)."""

    def release(name: str) -> None:
        api.call(
            "PATCH",
            f"/api/v1/namespaces/{NAMESPACE}/pods/{name}",
            {"metadata": {"finalizers": None}},
            content_type="application/merge-patch+json",
            ok_missing=True,
        )

    api.each(release, size.finalizer_names())


def strike(api: Api, size: WorkloadSize) -> dict[str, float]:
    """Delete the doomed nodes, then every doomed pod, at once.

    Returns each deleted pod's deletionTimestamp (epoch seconds) as the API server set it.
    """
    api.each(
        lambda i: api.call("DELETE", f"/api/v1/nodes/doomed-{i}", ok_missing=True),
        range(size.doomed_nodes),
    )

    def delete(name: str) -> tuple[str, float | None]:
        obj = api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", ok_missing=True)
        stamp = (obj.get("metadata") or {}).get("deletionTimestamp")
        return name, parse_rfc3339(stamp) if stamp else None

    deleted = api.each(delete, size.doomed_names() + size.finalizer_names())
    return {name: stamp for name, stamp in deleted if stamp is not None}


def parse_rfc3339(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
