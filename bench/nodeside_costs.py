"""What a node-side run cost, from the strike until every pod is gone (issue 23, fifth
round): the CPU time of every process taking part, and the API requests per pod.

- `CpuLedger`: CPU seconds (user + system, psutil) of each named process between two
  snapshots — kube-apiserver, etcd, the controller, the agent, the kubelet stand-in (the
  node process itself; its children other than the agent are the CSI driver), the bench
  (this process) — and of the whole machine (every core's busy time), so that the run's
  share of two shared cores can be told apart from other users' work. A child that exits
  between the snapshots counts what it had used at the last snapshot it was seen in
  (none does in a run: the node's children live as long as the node).
- `requests_per_pod`: every API request the audit log holds between the two moments, by
  client (User-Agent), verb and resource, divided by the pods.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

from bench import measure


def _own_cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _tree_cpu(pid: int, skip: frozenset[int] = frozenset(), *, itself: bool = True) -> float:
    """The process's CPU (unless not `itself`) and that of its descendants (not those
    under a pid in `skip`)."""
    try:
        root = psutil.Process(pid)
        total = _own_cpu(root) if itself else 0.0
        for child in root.children(recursive=False):
            if child.pid not in skip:
                total += _tree_cpu(child.pid, skip)
    except psutil.NoSuchProcess:
        return 0.0
    return total


def _child_pids(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=False)]
    except psutil.NoSuchProcess:
        return []


def _machine_busy_s() -> float:
    """Busy CPU seconds of every core since boot (everything but idle and iowait)."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    return float(sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0))


@dataclass
class CpuLedger:
    """Named process trees; `take()` snapshots them, `spent(a, b)` the difference."""

    trees: dict[str, int]  # name -> pid: the process and its descendants
    alone: dict[str, int] = field(default_factory=dict)  # name -> pid: the process only
    # name -> (pid, children to leave out): the process's descendants but not itself, e.g.
    # the node process's children other than the agent
    children: dict[str, tuple[int, frozenset[int]]] = field(default_factory=dict)

    def take(self) -> dict[str, float]:
        snap = {name: _tree_cpu(pid) for name, pid in self.trees.items()}
        for name, pid in self.alone.items():
            snap[name] = _tree_cpu(pid, frozenset(_child_pids(pid)))
        for name, (pid, skip) in self.children.items():
            snap[name] = _tree_cpu(pid, skip, itself=False)
        snap["machine"] = _machine_busy_s()
        return snap

    @staticmethod
    def spent(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, Any]:
        """CPU seconds per process between the two snapshots, their sum, the machine's busy
        time, what others used, and the run's share of the cores over the wall time."""
        ours = {k: round(after[k] - before.get(k, 0.0), 2) for k in after if k != "machine"}
        total = round(sum(ours.values()), 2)
        machine = round(after["machine"] - before["machine"], 2)
        cores = psutil.cpu_count() or 1
        return {
            "wall_s": round(wall_s, 2),
            "cores": cores,
            "cpu_s": dict(sorted(ours.items(), key=lambda kv: -kv[1])),
            "cpu_s_ours": total,
            "cpu_s_machine": machine,
            "cpu_s_others": round(machine - total, 2),
            "ours_of_capacity": round(total / (cores * wall_s), 3) if wall_s > 0 else None,
            "machine_of_capacity": round(machine / (cores * wall_s), 3) if wall_s > 0 else None,
        }


def _client(ev: dict[str, Any], who: dict[str, tuple[str, ...]]) -> str:
    for name, prefixes in who.items():
        if measure.made_by(ev, prefixes):
            return name
    return (ev.get("userAgent") or "?").split("/")[0]


def requests_per_pod(
    events: Iterable[dict[str, Any]],
    who: dict[str, tuple[str, ...]],
    since: float,
    until: float,
    pods: int,
) -> dict[str, Any]:
    """Requests received in [since, until] (WATCHes left out: one each, long-lived), per
    client and `verb resource[/subresource]`, per pod; the client named by `who` (name ->
    User-Agent prefixes), else the User-Agent's first part."""
    counts: Counter[tuple[str, str]] = Counter()
    for ev in events:
        if ev.get("stage") != "ResponseComplete" or ev.get("verb") == "watch":
            continue
        when = measure.audit_time(ev.get("requestReceivedTimestamp") or ev["stageTimestamp"])
        if not since <= when <= until:
            continue
        ref = ev.get("objectRef") or {}
        kind = "/".join(filter(None, (ref.get("resource"), ref.get("subresource"))))
        counts[(_client(ev, who), f"{ev.get('verb')} {kind or ev.get('requestURI', '?')}")] += 1
    per_client: dict[str, dict[str, float]] = {}
    for (client, kind), n in sorted(counts.items(), key=lambda kv: (kv[0][0], -kv[1])):
        per_client.setdefault(client, {})[kind] = round(n / max(pods, 1), 2)
    totals = Counter[str]()
    for (client, _), n in counts.items():
        totals[client] += n
    return {
        "per_pod": per_client,
        "per_pod_by_client": {c: round(n / max(pods, 1), 2) for c, n in totals.most_common()},
        "per_pod_all": round(sum(totals.values()) / max(pods, 1), 2),
    }
