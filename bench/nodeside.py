"""`python -m bench.nodeside --preset quick|full|tiny|thousand|stuck100`: the node side
(issues #14, #23).

One node with many stuck pods, each with an orphaned CSI mount and a stale volume dir (the
csi-driver-host-path state bug: the driver restarted and forgot its mounts), resolved by
the real `unstick agent` and the real `unstick controller --standalone` (started exactly as
the scale benchmark starts its `unstick` contender, rate limits lifted) on the embedded
control plane (etcd + kube-apiserver, audit log on). The node is the demo's
(`devcluster.demo.node`, here `bench/nodeside_node.py`): real mounts in a private mount
namespace under a temporary kubelet root, the project's CSI plugin registered through
`plugins_registry/`, and a kubelet stand-in that finalises a pod once nothing of it is
left on the node. Two points, each run on a fresh control plane and node:

- `stuck_pods`: the stuck pods alone;
- `many_mounts`: the same with `extra_mounts` tmpfs mounts of no pod on the host.

Each point is run for unstick and (`peers`, issue 23) for its peers in the same
invocation (bench/nodeside_peers.py, under `peers.<name>.<point>`): `naive`, the on-call
script's unmount loop, and `kubelet`, the kubelet's own healthy teardown (the floor).

Prints the result as JSON. Every process, mount and directory it makes is gone when it
ends, also on failure or Ctrl-C (the node's mounts live only in its mount namespace).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from bench import contenders, measure
from bench.nodeside_costs import CpuLedger, requests_per_pod
from bench.nodeside_node import STANDIN_UA
from bench.nodeside_stretches import stretches
from bench.workload import DRIVER_UA, Api, parse_rfc3339
from devcluster import ControlPlane, ControlPlaneSettings, node_manifest
from devcluster.demo.cluster import _node_status
from devcluster.demo.scenarios import CSI_DRIVER
from devcluster.demo.standin import NodeProcess
from devcluster.process import Process, free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "bench-nodeside"
NODE = "bench-node"
AGENT_UA = ("unstick-agent/",)
ACTIONS = ["observe", "replay-unpublish", "unmount", "rmdir-stale"]
Say = Callable[[str], None]


@dataclass(frozen=True)
class NodeSideSettings:
    pods: int  # stuck pods on the one node (the kubelet's default maximum is 110 pods)
    extra_mounts: int  # mounts of no pod on the host, in the `many_mounts` run
    slack_s: int = 5
    resolve_timeout_s: float = 180.0  # from the deletes until every pod is gone
    setup_timeout_s: float = 600.0  # mounts, CSI publishes, the agent up
    standin_interval_s: float = 0.5  # the kubelet stand-in's re-sync period
    logs_dir: Path | None = None  # keep the logs there (default: a temporary dir, removed)
    peers: tuple[str, ...] = ("naive", "kubelet")  # bench/nodeside_peers.py, same points
    points: tuple[str, ...] = ("stuck_pods", "many_mounts")
    naive_interval_s: float = 1.0  # the naive script's loop period
    #: more `unstick controller` flags, e.g. ("--node-round-trip",) (#34: the node path in
    #: one round trip, off by default until it is the only flow)
    controller_args: tuple[str, ...] = ()


PRESETS = {
    "full": NodeSideSettings(pods=100, extra_mounts=5000),
    "quick": NodeSideSettings(pods=20, extra_mounts=1000),
    # more than 10 pods: beyond the agent's default cap on node-step batches per minute
    "tiny": NodeSideSettings(pods=12, extra_mounts=50, resolve_timeout_s=90.0),
    # 1,000 stuck pods on one node (more than a kubelet runs): unstick and the naive loop
    "thousand": NodeSideSettings(
        pods=1000,
        extra_mounts=0,
        resolve_timeout_s=900.0,
        setup_timeout_s=1800.0,
        peers=("naive",),
        points=("stuck_pods",),
    ),
    # the 100 stuck pods alone (~222 host mounts), no peers: the quick comparison of runs
    "stuck100": NodeSideSettings(
        pods=100, extra_mounts=0, resolve_timeout_s=240.0, peers=(), points=("stuck_pods",)
    ),
    # the same with 5,000 host mounts, no peers
    "mounts100": NodeSideSettings(
        pods=100, extra_mounts=5000, resolve_timeout_s=240.0, peers=(), points=("many_mounts",)
    ),
}


@dataclass(frozen=True)
class PodSpec:
    name: str
    uid: str
    pv: str
    handle: str


# -- the cluster -----------------------------------------------------------------------


def policy(slack_s: int) -> dict[str, Any]:
    return {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": "default"},
        "spec": {
            "dryRun": False,
            "actions": ACTIONS,
            "slackSeconds": slack_s,
            "finalizerAllowlist": [],
            "rateLimits": {"clusterPerMinute": 1_000_000, "nodePerMinute": 1_000_000},
        },
    }


def _volume_objects(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    pv, handle, claim = f"pv-{i:03d}", f"vol-{i:03d}", f"data-{i:03d}"
    persistent_volume = {
        "metadata": {"name": pv},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "csi": {"driver": CSI_DRIVER, "volumeHandle": handle},
            "claimRef": {"namespace": NAMESPACE, "name": claim},
        },
    }
    pvc = {
        "metadata": {"name": claim},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "volumeName": pv,
            "storageClassName": "",
        },
    }
    return persistent_volume, pvc


def _pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"db-{i:03d}"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "db", "image": "registry.example/shop/db:1.0"}],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": f"data-{i:03d}"}},
                {"name": "cache", "emptyDir": {}},
            ],
        },
    }


def create_cluster(api: Api, settings: NodeSideSettings) -> list[PodSpec]:
    """The policy, the node (Ready, its CSINode naming the driver), an opted-in namespace,
    and the pods with their PV and claim; returns the pods."""
    api.call("POST", "/apis/unstick.dev/v1alpha1/remediationpolicies", policy(settings.slack_s))
    api.call("POST", "/api/v1/nodes", node_manifest(NODE, kubelet=False))
    status = _node_status(True, datetime.now(UTC))
    api.call("PATCH", f"/api/v1/nodes/{NODE}/status", status, "application/merge-patch+json")
    csinode = {
        "metadata": {"name": NODE},
        "spec": {"drivers": [{"name": CSI_DRIVER, "nodeID": NODE}]},
    }
    api.call("POST", "/apis/storage.k8s.io/v1/csinodes", csinode)
    ns = {"metadata": {"name": NAMESPACE, "labels": {"unstick.dev/remediate": "true"}}}
    api.call("POST", "/api/v1/namespaces", ns)

    def make(i: int) -> PodSpec:
        pv, pvc = _volume_objects(i)
        api.call("POST", "/api/v1/persistentvolumes", pv)
        api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims", pvc)
        pod = api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", _pod(i))
        meta = pod["metadata"]
        return PodSpec(
            meta["name"], meta["uid"], pv["metadata"]["name"], pv["spec"]["csi"]["volumeHandle"]
        )

    return api.each(make, range(settings.pods))


def strike(api: Api, pods: list[PodSpec]) -> dict[str, float]:
    """Delete every pod at once; each pod's deletionTimestamp (epoch seconds)."""

    def delete(pod: PodSpec) -> tuple[str, float]:
        obj = api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod.name}")
        return pod.name, parse_rfc3339(obj["metadata"]["deletionTimestamp"])

    return dict(api.each(delete, pods))


# -- the node --------------------------------------------------------------------------


class BenchNodeProcess(NodeProcess):
    """`bench/nodeside_node.py` run as the demo runs its node (demo.standin.NodeProcess):
    its own mount namespace and process group, events from stdout, TERM then KILL."""

    module = "bench.nodeside_node"
    stop_timeout_s = 60.0  # it reports what is left and stops its children first

    def __init__(self, cfg: dict[str, Any], workdir: Path) -> None:
        env = dict(os.environ, PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}".rstrip(":"))
        super().__init__(cfg, workdir, env=env, cwd=REPO)
        self.work = Path(cfg["work"])

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.5):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                self.log.flush()
                tail = Path(self.log.name).read_text(errors="replace").splitlines()[-15:]
                raise RuntimeError("the bench node did not come up:\n" + "\n".join(tail))
        ready = self.event("ready")
        assert ready is not None
        return ready


def agent_metrics(port: int) -> dict[str, float]:
    """The agent's probe count and total probe time, from its own /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        for key in (
            "unstick_node_probe_duration_seconds_count",
            "unstick_node_probe_duration_seconds_sum",
        ):
            if line.startswith(key + " "):
                out[key.rsplit("_", 1)[-1]] = float(line.split()[1])
    return out


# -- one run ---------------------------------------------------------------------------


def _cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(t.user + t.system)


def _both_watching(tail: measure.AuditTail, seen: set[str]) -> bool:
    """The agent watches its Remediations and the controller watches pods (a WATCH is in the
    audit log at ResponseStarted already)."""
    for ev in tail.new_events():
        resource = (ev.get("objectRef") or {}).get("resource")
        if ev.get("verb") != "watch":
            continue
        if resource == "remediations" and measure.made_by(ev, AGENT_UA):
            seen.add("agent")
        if resource == "pods" and measure.made_by(ev, contenders.CONTENDERS["unstick"].agents):
            seen.add("controller")
    return seen >= {"agent", "controller"}


def _stats(values: list[float]) -> dict[str, float | None]:
    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 3)

    return {
        "p50": r(measure.percentile(values, 50)),
        "p99": r(measure.percentile(values, 99)),
        "max": r(max(values) if values else None),
        "n": len(values),
    }


def _node_done_at(rem: dict[str, Any]) -> float | None:
    """When the agent finished the pod's node steps, all succeeded (its own clock)."""
    status = rem.get("status") or {}
    actions = status.get("nodeActions") or []
    done = status.get("nodeStepsDoneAt")
    if not actions or not done or any(a.get("result") != "succeeded" for a in actions):
        return None
    return parse_rfc3339(done)


@dataclass
class Measured:
    """What one run collected before everything was stopped."""

    eligible: dict[str, float]  # pod name -> deletionTimestamp + slack
    remediations: list[dict[str, Any]]
    pods_left: int
    window: measure.Window
    agent: measure.Sampler
    controller: measure.Sampler
    agent_cpu_at_strike: float
    controller_cpu_at_strike: float
    agent_metrics: dict[str, float]
    ready: dict[str, Any]
    final: dict[str, Any] | None = None
    slack_s: float = 0.0
    load_at_strike: list[float] | None = None
    cpu: dict[str, Any] | None = None  # strike -> all gone, per process (nodeside_costs)
    all_gone_at: float | None = None  # the bench saw the stand-in finalise the last pod


def _requests(cp: ControlPlane, m: Measured, agents: tuple[str, ...], pods: int) -> dict[str, Any]:
    req = measure.read_requests(cp.audit_events(), agents, m.window)
    return {
        "requests": measure.verb_counts(req.by_verb),
        "requests_after_strike": req.after_strike,
        "requests_after_strike_per_pod": round(req.after_strike / max(pods, 1), 2),
        "requests_after_strike_by_kind": dict(req.after_strike_by_kind.most_common()),
    }


_ACTS = re.compile(r"\[acts (\d+), (?:each right after|only (\d+) right after)[^:]*: ([^\]]*)\]")


def act_checks(remediations: list[dict[str, Any]]) -> dict[str, int]:
    """The agent's own tally of its acts (umount2, NodeUnpublishVolume, rmdir) and the
    checks right before each, from the node steps' messages (executor.ActLog)."""
    out = {"acts": 0, "after_fresh_checks": 0, "table_re_read": 0, "table_unchanged": 0}
    for r in remediations:
        for a in (r.get("status") or {}).get("nodeActions") or []:
            found = _ACTS.search(str(a.get("message") or ""))
            if not found:
                continue
            acts, fresh_only, tables = found.groups()
            out["acts"] += int(acts)
            out["after_fresh_checks"] += int(fresh_only) if fresh_only else int(acts)
            for part in tables.split(", "):
                kind, _, count = part.removeprefix("table ").rpartition(" ")
                key = {"re-read": "table_re_read", "unchanged": "table_unchanged"}.get(kind)
                if key and count.isdigit():
                    out[key] += int(count)
    return out


def _stretches(cp: ControlPlane, m: Measured) -> dict[str, dict[str, float | None]]:
    """Per pod, where its time went (bench/nodeside_stretches.py)."""
    rem_of_pod = {
        str((r.get("spec") or {}).get("podName")): str((r.get("metadata") or {}).get("name"))
        for r in m.remediations
    }
    who = {
        "controller": contenders.CONTENDERS["unstick"].agents,
        "agent": AGENT_UA,
        "standin": (STANDIN_UA,),
    }
    return stretches(cp.audit_events(), rem_of_pod, who, m.window.strike)


WHO: dict[str, tuple[str, ...]] = {
    "controller": ("unstick-controller/",),
    "kopf": (contenders.KOPF_UA,),
    "agent": AGENT_UA,
    "standin": (STANDIN_UA,),
    "bench": (DRIVER_UA,),
}


def summarise(cp: ControlPlane, m: Measured) -> dict[str, Any]:
    """The run's figures from what was measured and the audit log."""
    n = len(m.eligible)
    until = m.all_gone_at if m.all_gone_at is not None else m.window.end
    gone = measure.read_requests(cp.audit_events(), (STANDIN_UA,), m.window).first_delete
    by_pod = {(r.get("spec") or {}).get("podName"): r for r in m.remediations}
    node_done = [
        done - m.eligible[name]
        for name, rem in by_pod.items()
        if name in m.eligible and (done := _node_done_at(rem)) is not None
    ]
    gone_s = [t - m.eligible[name] for name, t in gone.items() if name in m.eligible]
    actions: Counter[str] = Counter(
        f"{a.get('action')} {a.get('result')}"
        for r in m.remediations
        for a in (r.get("status") or {}).get("nodeActions") or []
    )
    probes = m.agent_metrics.get("count", 0.0)
    agent_cpu, controller_cpu = m.agent.cpu_s, m.controller.cpu_s
    agent_burst = agent_cpu - m.agent_cpu_at_strike
    final = m.final or {}
    return {
        "pods": n,
        "host_mounts": m.ready.get("mounts"),
        "pods_gone": len(gone_s),
        "pods_left": m.pods_left,
        "node_actions_done_s": _stats(node_done),
        "pod_gone_s": _stats(gone_s),
        "all_resolved_s": round(max(gone_s), 3) if gone_s and len(gone_s) == n else None,
        "pod_gone_after_deletion_s": _stats([g + m.slack_s for g in gone_s]),
        "all_gone_after_deletion_s": round(max(gone_s) + m.slack_s, 3)
        if gone_s and len(gone_s) == n
        else None,
        "acts_and_checks": act_checks(m.remediations),
        "stretches": _stretches(cp, m),
        "load_avg_at_strike": m.load_at_strike,
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        "staging_mounts_left": final.get("staging_mounts_left"),
        "node_actions": dict(sorted(actions.items())),
        "remediation_phases": dict(
            Counter((r.get("status") or {}).get("phase") for r in m.remediations)
        ),
        "leftovers_on_node": final.get("leftovers"),
        "volumes_data_kept": final.get("data_kept"),
        "agent": {
            "rss_peak_mib": round(m.agent.peak_rss_mib, 1),
            "cpu_s": round(agent_cpu, 2),
            "cpu_s_after_strike": round(agent_burst, 2),
            "probes": int(probes),
            "probe_wall_s_mean": round(m.agent_metrics.get("sum", 0.0) / probes, 4)
            if probes
            else None,
            "cpu_s_per_probe_in_run": round(agent_burst / probes, 4) if probes else None,
            **_requests(cp, m, AGENT_UA, n),
        },
        "controller": {
            "rss_peak_mib": round(m.controller.peak_rss_mib, 1),
            "cpu_s": round(controller_cpu, 2),
            "cpu_s_after_strike": round(controller_cpu - m.controller_cpu_at_strike, 2),
            **_requests(cp, m, contenders.CONTENDERS["unstick"].agents, n),
        },
        "direct_probe": m.ready.get("direct_probe"),
        "remediation_json_bytes": _stats([len(json.dumps(r)) for r in m.remediations]),
        "cpu_strike_to_all_gone": m.cpu,
        "requests_strike_to_all_gone": requests_per_pod(
            cp.audit_events(), WHO, m.window.strike, until, n
        ),
    }


def _start_node(
    cp: ControlPlane,
    settings: NodeSideSettings,
    pods: list[PodSpec],
    extra: int,
    logs: Path,
    *,
    mode: str = "unstick",
) -> BenchNodeProcess:
    # the kubelet root: a short path (a unix socket path has at most 107 bytes), a mount
    # point in the node's namespace only, empty on the host
    work = Path(tempfile.mkdtemp(prefix="ubn-", dir="/tmp"))
    cfg = {
        "work": str(work),
        "kubeconfig": str(cp.kubeconfig),
        "node": NODE,
        "pods": [asdict(p) for p in pods],
        "extra_mounts": extra,
        "agent_metrics_port": free_port(),
        "standin_interval_s": settings.standin_interval_s,
        "mode": mode,
        "slack_s": settings.slack_s,
        "naive_interval_s": settings.naive_interval_s,
    }
    return BenchNodeProcess(cfg, logs)


def _wait_resolved(
    api: Api,
    node: BenchNodeProcess,
    controller: Process | None,
    n: int,
    timeout_s: float,
    *,
    on_gone: Callable[[], None] = lambda: None,
) -> int:
    """Until the stand-in finalised every pod (or the timeout), then `on_gone()`; the pods
    still there."""
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: len(node.finalised()) >= n, timeout=timeout_s,
                   what="every stuck pod gone", process=controller)  # fmt: skip
    on_gone()
    left = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    return len(left)


def _remediations(api: Api) -> list[dict[str, Any]]:
    path = f"/apis/unstick.dev/v1alpha1/namespaces/{NAMESPACE}/remediations"
    items: list[dict[str, Any]] = api.call("GET", path)["items"]
    return items


def _all_resolved(api: Api, n: int) -> bool:
    rems = _remediations(api)
    return len(rems) >= n and all((r.get("status") or {}).get("phase") == "Resolved" for r in rems)


def _profile_agent(pid: int, logs: Path) -> Process | None:
    """With $BENCH_PYSPY_DIR: py-spy attached to the agent (`agent-<run>.txt` there,
    collapsed stacks with idle samples and threads; with $BENCH_PYSPY_GIL set, only the
    thread holding the GIL: where the agent's Python CPU goes), as bench.contenders does
    for the controllers; with $BENCH_PYSPY_ACTIVE, the threads running, in Python or in a
    system call, e.g. reading /proc: where its CPU time goes, the kernel's included.
    Profiling runs only: sampling costs the agent some CPU."""
    out_dir = os.environ.get("BENCH_PYSPY_DIR")
    if not out_dir:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(out_dir) / f"agent-{logs.name}.txt"
    which = ["--gil"] if os.environ.get("BENCH_PYSPY_GIL") else ["--idle"]
    if os.environ.get("BENCH_PYSPY_ACTIVE"):  # threads on a CPU, in Python or a system call
        which = []
    argv = [spy, "record", *which, "--threads", "--format", "raw", "-o", str(out)]
    return Process("py-spy agent", [*argv, "--pid", str(pid)], logs / "py-spy-agent.log").start()


def _ledger(
    cp: ControlPlane, node: BenchNodeProcess, agent: int, controller: int | None
) -> CpuLedger:
    """Every process of a run (nodeside_costs): the control plane, the controller, the
    agent, the node process alone (the kubelet stand-in), its other children (the CSI
    driver), and this process (the bench: the strike's DELETEs, its samplers)."""
    trees = {"agent": agent}
    for name, proc in (("kube-apiserver", cp.apiserver), ("etcd", cp.etcd)):
        if proc is not None and proc.pid is not None:
            trees[name] = proc.pid
    if controller is not None:
        trees["controller"] = controller
    return CpuLedger(
        trees=trees,
        alone={"kubelet-standin": node.popen.pid, "bench": os.getpid()},
        children={"csi-driver": (node.popen.pid, frozenset({agent}))},
    )


def _profile_apiserver(cp: ControlPlane, logs: Path) -> threading.Thread | None:
    """With $BENCH_APISERVER_PPROF=<seconds>: the API server's own CPU profile (Go pprof,
    /debug/pprof/profile) from the strike on, for that long, into
    `kube-apiserver-<run>.pprof` in $BENCH_PYSPY_DIR or the logs; read it with
    `go tool pprof -top bin/kube-apiserver <file>`."""
    seconds = os.environ.get("BENCH_APISERVER_PPROF")
    if not seconds:
        return None
    out = Path(os.environ.get("BENCH_PYSPY_DIR") or logs) / f"kube-apiserver-{logs.name}.pprof"

    def fetch() -> None:
        url = f"{cp.url}/debug/pprof/profile?seconds={int(seconds)}"
        with urllib.request.urlopen(url, context=cp.ssl_context(), timeout=int(seconds) + 30) as r:
            out.write_bytes(r.read())

    thread = threading.Thread(target=fetch, name="apiserver-pprof", daemon=True)
    thread.start()
    return thread


class _Costs:
    """The run's CPU per process from the strike until every pod is gone, and the API
    server's profile over the same time (when asked for)."""

    def __init__(self, ledger: CpuLedger) -> None:
        self.ledger = ledger
        self.before: dict[str, float] = {}
        self.strike_at = 0.0
        self.gone_at: float | None = None
        self.spent: dict[str, Any] | None = None
        self.pprof: threading.Thread | None = None

    def strike(self, cp: ControlPlane, logs: Path) -> float:
        self.before, self.strike_at = self.ledger.take(), time.time()
        self.pprof = _profile_apiserver(cp, logs)
        return self.strike_at

    def gone(self) -> None:
        self.gone_at = time.time()
        after = self.ledger.take()
        self.spent = CpuLedger.spent(self.before, after, self.gone_at - self.strike_at)

    def finish(self) -> None:
        if self.pprof is not None:
            self.pprof.join()


def run_once(settings: NodeSideSettings, extra: int, logs: Path, say: Say) -> dict[str, Any]:
    """One run on a fresh control plane and node: set up, strike, measure, stop everything."""
    logs.mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        cp = ControlPlane(ControlPlaneSettings(workdir=logs / "cp")).start()
        stack.callback(cp.stop)
        cp.install_crds()
        api = Api(cp)
        stack.callback(api.http.clear)
        pods = create_cluster(api, settings)
        say(f"{len(pods)} pods on {NODE}; laying out their mounts and {extra} other mounts")
        started = time.time()
        node = _start_node(cp, settings, pods, extra, logs)
        stack.callback(shutil.rmtree, node.work, True)  # once the node stopped (below)
        stack.callback(node.stop)
        ready = node.wait_ready(settings.setup_timeout_s)
        agent = measure.Sampler(int(ready["agent_pid"])).start()
        stack.callback(agent.stop)
        spy = _profile_agent(int(ready["agent_pid"]), logs)
        if spy is not None:
            stack.callback(contenders.finish_profiler, spy)
        say(f"node ready ({ready['mounts']} mounts); starting the controller")
        controller = contenders.start(
            "unstick",
            cp,
            contenders.StartSettings(
                slack_s=settings.slack_s, unstick_args=settings.controller_args
            ),
            logs / "controller.log",
        )
        stack.callback(controller.stop)
        ctl = measure.Sampler(controller.pid or 0).start()
        stack.callback(ctl.stop)
        tail, seen = measure.AuditTail(cp.audit_log), set[str]()
        wait_until(
            lambda: _both_watching(tail, seen),
            timeout=120,
            what="agent and controller watching",
            process=controller,
        )
        ready_at = time.time()
        cpu_agent, cpu_ctl = _cpu_s(agent.pid), _cpu_s(controller.pid)
        costs = _Costs(_ledger(cp, node, agent.pid, controller.pid))
        load_at_strike = [round(x, 2) for x in os.getloadavg()]
        strike_at = costs.strike(cp, logs)
        deleted = strike(api, pods)
        say(f"deleted {len(deleted)} pods; waiting for unstick")
        left = _wait_resolved(
            api, node, controller, len(pods), settings.resolve_timeout_s, on_gone=costs.gone
        )
        with contextlib.suppress(TimeoutError):
            wait_until(
                lambda: _all_resolved(api, len(pods)), timeout=30, what="Remediations Resolved"
            )
        costs.finish()
        metrics = agent_metrics(node.agent_metrics_port)
        agent.stop()
        ctl.stop()
        m = Measured(
            eligible={name: t + settings.slack_s for name, t in deleted.items()},
            remediations=_remediations(api),
            pods_left=left,
            window=measure.Window(start=started, ready=ready_at, strike=strike_at, end=time.time()),
            agent=agent,
            controller=ctl,
            agent_cpu_at_strike=cpu_agent,
            controller_cpu_at_strike=cpu_ctl,
            agent_metrics=metrics,
            ready=ready,
            slack_s=settings.slack_s,
            load_at_strike=load_at_strike,
            all_gone_at=costs.gone_at,
            cpu=costs.spent,
        )
        (logs / "remediations.json").write_text(json.dumps(m.remediations))  # as they ended
        controller.stop()
        node.stop()
        m.final = node.event("final")
        return summarise(cp, m)
    raise AssertionError("unreachable")  # pragma: no cover


def run_node_side(settings: NodeSideSettings, say: Say) -> dict[str, Any]:
    """Both runs (`stuck_pods`, `many_mounts`); see the module docstring."""
    if os.geteuid() != 0:
        raise PermissionError(
            "the node-side benchmark needs root: real mounts in a private mount namespace "
            "(unshare -m)"
        )
    logs = settings.logs_dir or Path(tempfile.mkdtemp(prefix="unstick-bench-nodeside-"))
    try:
        from bench.run import git_commit  # bench.run imports this module lazily too

        result: dict[str, Any] = {
            "settings": {
                k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()
            },
            "run": {
                "commit": git_commit(),
                "started": datetime.now(UTC).isoformat(timespec="seconds"),
                "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
            },
        }
        from bench.nodeside_peers import run_peer  # it imports this module

        extras = {"stuck_pods": 0, "many_mounts": settings.extra_mounts}
        peers: dict[str, dict[str, Any]] = {p: {} for p in settings.peers}
        for name in settings.points:
            extra = extras[name]
            say(f"node side, {name}: {settings.pods} stuck pods, {extra} extra mounts")
            result[name] = run_once(settings, extra, logs / name, say)
            r = result[name]
            say(f"  all resolved in {r['all_resolved_s']} s after eligibility; agent peak RSS "
                f"{r['agent']['rss_peak_mib']} MiB")  # fmt: skip
            say("  per pod (p50 / p90 s): " + ", ".join(
                f"{k} {v['p50']} / {v['p90']}" for k, v in r["stretches"].items()))  # fmt: skip
            for peer in settings.peers:
                peers[peer][name] = run_peer(settings, extra, logs / f"{name}-{peer}", say, peer)
                say(f"  {peer}: all gone {peers[peer][name]['all_resolved_s']} s after "
                    "eligibility")  # fmt: skip
        if peers:
            result["peers"] = peers
        return result
    finally:
        if settings.logs_dir is None:
            shutil.rmtree(logs, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.nodeside", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument(
        "--logs", type=Path, default=None, help="keep the logs in this (new) directory"
    )
    parser.add_argument(
        "--controller-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more flag for unstick's controller (repeatable), e.g. "
        "--controller-arg=--node-round-trip",
    )
    args = parser.parse_args(argv)
    settings = replace(
        PRESETS[args.preset], logs_dir=args.logs, controller_args=tuple(args.controller_arg)
    )
    t0 = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {message}", file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: everything stopped
    try:
        result = run_node_side(settings, say)
    except PermissionError as e:
        print(f"bench.nodeside: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
