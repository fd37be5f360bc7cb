"""The node-side benchmark's peers (issue 23), each run like unstick's run — a fresh
control plane and node, the same pods, the same strike — but resolved by someone else:

- `naive`: the on-call script on the node (`bench.naive_unmount`: `umount -l`, `rmdir`,
  force delete; no safety check), no unstick controller or agent;
- `kubelet`: the floor — a driver that did not lose its state and the kubelet stand-in's
  own teardown (NodeUnpublishVolume + NodeUnstageVolume, volume dirs removed, final
  delete), starting as soon as the pod's grace period is over (not after unstick's slack).

A pod is gone at its first successful DELETE with grace 0 (the naive script's or the
stand-in's), from the audit log. Times are given after eligibility (deletionTimestamp +
slack, as for unstick: the floor's are negative, it does not wait for the slack) and after
the deletionTimestamp. "agent" CPU and RSS are the resolver's: the naive script's
process, or the node process itself for the floor (its stand-in does the teardown).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench import measure
from bench.naive_unmount import NAIVE_UA
from bench.nodeside import (
    NAMESPACE,
    NodeSideSettings,
    Say,
    _cpu_s,
    _start_node,
    _stats,
    _wait_resolved,
    create_cluster,
    strike,
)
from bench.nodeside_node import STANDIN_UA
from bench.workload import Api
from devcluster import ControlPlane, ControlPlaneSettings

RESOLVERS = {"naive": (NAIVE_UA, STANDIN_UA), "kubelet": (STANDIN_UA,)}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def gone_stats(
    cp: ControlPlane, window: measure.Window, agents: tuple[str, ...], deleted: dict[str, float],
    slack_s: float,
) -> dict[str, Any]:  # fmt: skip
    """When each pod went (its first successful DELETE by one of `agents`), after its
    eligibility and after its deletionTimestamp."""
    gone = measure.read_requests(cp.audit_events(), agents, window).first_delete
    after_dts = [t - deleted[name] for name, t in gone.items() if name in deleted]
    after_eligible = [s - slack_s for s in after_dts]
    n = len(deleted)
    return {
        "pods_gone": len(after_dts),
        "pod_gone_s": _stats(after_eligible),
        "pod_gone_after_deletion_s": _stats(after_dts),
        "all_resolved_s": round(max(after_eligible), 3) if len(after_dts) == n else None,
        "all_gone_after_deletion_s": round(max(after_dts), 3) if len(after_dts) == n else None,
    }


def run_peer(
    settings: NodeSideSettings, extra: int, logs: Path, say: Say, mode: str
) -> dict[str, Any]:
    """One run of the `naive` or `kubelet` peer (module docstring)."""
    logs.mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        cp = ControlPlane(ControlPlaneSettings(workdir=logs / "cp")).start()
        stack.callback(cp.stop)
        cp.install_crds()
        api = Api(cp)
        stack.callback(api.http.clear)
        pods = create_cluster(api, settings)
        say(f"{mode}: {len(pods)} pods; laying out their mounts and {extra} other mounts")
        started = time.time()
        node = _start_node(cp, settings, pods, extra, logs, mode=mode)
        stack.callback(shutil.rmtree, node.work, True)
        stack.callback(node.stop)
        ready = node.wait_ready(settings.setup_timeout_s)
        worker = measure.Sampler(int(ready["agent_pid"])).start()
        stack.callback(worker.stop)
        ready_at = time.time()
        load_at_strike = load()
        cpu0 = _cpu_s(worker.pid)
        strike_at = time.time()
        deleted = strike(api, pods)
        say(f"{mode}: deleted {len(deleted)} pods; waiting")
        left = _wait_resolved(api, node, None, len(pods), settings.resolve_timeout_s)
        end = time.time()
        cpu = _cpu_s(worker.pid) - cpu0
        worker.stop()
        node.stop()
        final = node.event("final") or {}
        window = measure.Window(start=started, ready=ready_at, strike=strike_at, end=end)
        n = len(pods)
        return {
            "peer": mode,
            "pods": n,
            "host_mounts": ready.get("mounts"),
            "pods_left": left,
            **gone_stats(cp, window, RESOLVERS[mode], deleted, settings.slack_s),
            "leftovers_on_node": len(final.get("leftovers") or []),
            "staging_mounts_left": final.get("staging_mounts_left"),
            "volumes_data_kept": final.get("data_kept"),
            "agent": {
                "what": "the naive script" if mode == "naive" else "the kubelet stand-in",
                "rss_peak_mib": round(worker.peak_rss_mib, 1),
                "cpu_s_after_strike": round(cpu, 2),
                "cpu_s_per_pod": round(cpu / max(n, 1), 4),
            },
            "load_avg_at_strike": load_at_strike,
            "load_avg_at_end": load(),
        }
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["NAMESPACE", "RESOLVERS", "gone_stats", "load", "run_peer"]
