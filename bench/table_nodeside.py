"""The node side of the README's table (bench.table): one row per point and resolver of
the node-side benchmark's result (`node_side`: unstick, and its peers of issue 23 in the
same run — the naive unmount loop and the kubelet's own healthy teardown), and issue 23's
targets for unstick."""

from __future__ import annotations

from typing import Any

from bench import table as t

ALL_GONE_MAX_S = 5.0  # 100 stuck pods, all gone after their eligibility
MANY_MOUNTS_MAX_S = 8.0  # the same with 5,000 host mounts
NAIVE_FACTOR = 1.5  # within 1.5x of the naive loop in the same run
AGENT_RSS_MAX_MIB = 120.0
POINTS = {"stuck_pods": "stuck pods only", "many_mounts": "+ host mounts"}
RESOLVERS = {
    "unstick": "**unstick** (agent + controller)",
    "naive": "naive loop (`umount -l`, `rmdir`, force delete; no check)",
    "kubelet": "kubelet's own teardown, healthy driver (floor)",
}
Json = dict[str, Any]


def _runs(side: Any) -> list[tuple[str, str, Json]]:
    """(point, resolver, run) for every run in the node-side result."""
    if not isinstance(side, dict):
        return []
    out = []
    for point in POINTS:
        if isinstance(side.get(point), dict):
            out.append((point, "unstick", side[point]))
        for peer, runs in (side.get("peers") or {}).items():
            if isinstance(runs, dict) and isinstance(runs.get(point), dict):
                out.append((point, peer, runs[point]))
    return out


def _fresh(run: Json) -> str:
    acts = run.get("acts_and_checks")
    if not isinstance(acts, dict) or not acts.get("acts"):
        return "—"
    return f"{acts.get('after_fresh_checks')} of {acts.get('acts')}"


def _cpu_per_pod(run: Json) -> Any:
    agent = run.get("agent") or {}
    if "cpu_s_per_pod" in agent:
        return agent["cpu_s_per_pod"]
    cpu, pods = agent.get("cpu_s_after_strike"), run.get("pods")
    return cpu / pods if isinstance(cpu, int | float) and pods else None


def _gone(run: Json, key: str) -> str:
    left = run.get("pods_left")
    if isinstance(left, int) and left > 0:
        return f"{left:,} left"
    return t._secs(run.get(key))


def node_side_table(result: Json) -> str | None:
    runs = _runs(result.get("node_side"))
    if not runs:
        return None
    run = t._get(result, "node_side", "run") or {}
    started = str(run.get("started", "?")).replace("T", " ")[:16]
    note = f"; {run['note']}" if run.get("note") else ""
    caption = (
        "Node side (`bench/nodeside.py`, each row its own control plane and node): run of "
        f"commit `{run.get('commit', 'unknown')}`, started {started} UTC{note}."
    )
    rows = [
        caption,
        "",
        "| node side: 1 node, stuck pods with orphaned CSI mounts | resolved by | all gone "
        "after eligibility | … after deletionTimestamp | per pod p50 / p99 (after eligibility) "
        "| resolver CPU per pod | resolver peak RSS | acts right after a fresh check | 1-min "
        "load at strike |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for point, resolver, run in runs:
        gone = run.get("pod_gone_s") or {}
        load = run.get("load_avg_at_strike") or [None]
        rss = (run.get("agent") or {}).get("rss_peak_mib")
        rows.append(
            f"| {t._num(run.get('pods'))} pods, {t._num(run.get('host_mounts'))} host mounts "
            f"({POINTS[point]}) | {RESOLVERS.get(resolver, resolver)} | "
            f"{_gone(run, 'all_resolved_s')} | {_gone(run, 'all_gone_after_deletion_s')} | "
            f"{t._secs(gone.get('p50'))} / {t._secs(gone.get('p99'))} | "
            f"{t._secs(_cpu_per_pod(run))} | {t._num(rss, ' MiB', 0)} | "
            f"{_fresh(run) if resolver == 'unstick' else 'no check'} | {t._num(load[0])} |"
        )
    return "\n".join(rows)


def _vs_naive(run: Json, naive: Json) -> tuple[str, bool | None]:
    mine, theirs = run.get("all_resolved_s"), naive.get("all_resolved_s")
    left = run.get("pods_left")
    if isinstance(left, int) and left > 0:
        return f"{left:,} left at the timeout", False
    if not isinstance(mine, int | float):
        return "—", None
    if not isinstance(theirs, int | float):
        return f"{t._secs(mine)} vs naive —", None
    limit = theirs * NAIVE_FACTOR
    return (
        f"{t._secs(mine)} vs {t._secs(theirs)} ({NAIVE_FACTOR} times: {t._secs(limit)})",
        mine <= limit,
    )


def node_side_targets(result: Json) -> list[t.Target]:
    side = result.get("node_side")
    stuck, many = t._get(side, "stuck_pods") or {}, t._get(side, "many_mounts") or {}
    peers = t._get(side, "peers") or {}
    naive = peers.get("naive") or {} if isinstance(peers, dict) else {}
    pods = t._num(stuck.get("pods")) if stuck.get("pods") else "the"
    mounts = t._num(many.get("host_mounts"))
    out = []
    for run, limit, what in (
        (stuck, ALL_GONE_MAX_S, f"node side: {pods} stuck pods all gone"),
        (many, MANY_MOUNTS_MAX_S, f"node side: … with {mounts} host mounts"),
    ):
        measured, met = t._gone_verdict(run.get("all_resolved_s"), run.get("pods_left"), limit)
        out.append(t.Target(f"{what} ≤ {limit:.0f} s after eligibility", measured, met))
    for point, run in (("stuck_pods", stuck), ("many_mounts", many)):
        measured, met = _vs_naive(run, naive.get(point) or {})
        out.append(
            t.Target(
                f"node side ({POINTS[point]}): within {NAIVE_FACTOR} times the naive loop's time",
                measured,
                met,
            )
        )
    agent = many.get("agent") or {}
    out.append(
        t.Target(
            f"node side: agent peak RSS ≤ {AGENT_RSS_MAX_MIB:.0f} MiB ({mounts} host mounts)",
            t._num(agent.get("rss_peak_mib"), " MiB"),
            t._at_most(agent.get("rss_peak_mib"), AGENT_RSS_MAX_MIB),
        )
    )
    acts = [r.get("acts_and_checks") for r in (stuck, many) if r.get("acts_and_checks")]
    total = sum(a.get("acts", 0) for a in acts)
    fresh = sum(a.get("after_fresh_checks", 0) for a in acts)
    out.append(
        t.Target(
            "node side: every act of the agent right after its own fresh checks",
            f"{fresh} of {total}" if acts else "—",
            (fresh == total and total > 0) if acts else None,
        )
    )
    cpu = agent.get("cpu_s_after_strike")
    per_pod = cpu / many["pods"] if isinstance(cpu, int | float) and many.get("pods") else None
    out.append(
        t.Target(
            "node side: agent CPU per pod (reported)",
            t._secs(per_pod),
            None if per_pod is None else True,
            reported_only=True,
        )
    )
    return out
