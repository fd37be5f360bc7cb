"""`python -m bench.table bench/results/full.json`: the README's results table, from ONE
benchmark result file, written between `<!-- bench:full -->` and `<!-- /bench:full -->`
in README.md (so the table can only show one run). `--check` only prints it.

The table: the run (commit, date, machine and its load), one row per contender, the node
side's rows (bench/table_nodeside.py: unstick and its peers, per point), and the targets of
issues 14 and 23 with met / missed (or "not measured" when the file lacks the figure).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import table_nodeside

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "bench:full"
ALL_GONE_MAX_S = 15.0
REQUESTS_PER_POD_MAX = 1.5
DETECTION_P99_MAX_S = 0.2
RSS_MAX_MIB = 120.0
RSS_FLAT_TOP_PODS = 50_000
RSS_FLAT_TOLERANCE = 0.10  # "flat": the largest stage's RSS within 10 % of the smallest's
NAMES = {
    "unstick": "**unstick**",
    "unstick_w32": "unstick `--workers 32`",
    "naive": "naive reaper (LIST all every 30 s, force-delete; no safety check)",
    "kopf_native": "unstick's logic on Kopf's pod watch",
    "podgc": "PodGC (kube-controller-manager `--controllers=podgc`)",
}
Json = dict[str, Any]


class TableError(ValueError):
    """The result file cannot be turned into a table (the message says why)."""


@dataclass(frozen=True)
class Target:
    what: str
    measured: str
    met: bool | None  # None: not measured
    reported_only: bool = False  # a figure to report, no threshold

    @property
    def verdict(self) -> str:
        if self.met is None:
            return "not measured"
        if self.reported_only:
            return "reported"
        return "met" if self.met else "**missed**"


def _num(value: Any, unit: str = "", digits: int | None = None) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    text = f"{value:,.{digits}f}" if digits is not None else f"{value:,}"
    return f"{text}{unit}"


def _secs(value: Any) -> str:
    """Seconds: 3 decimals below 1 s (detection, API server), 1 above (lags)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "—"
    return _num(value, " s", 3 if abs(value) < 1 else 1)


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _at_most(value: Any, limit: float) -> bool | None:
    return None if not isinstance(value, int | float) else value <= limit


def header(result: Json, source: str) -> str:
    size, host = result.get("workload") or {}, result.get("machine") or {}
    during = host.get("load_during_run") or {}
    at_start = host.get("load_avg_at_start") or [None]
    minutes = _num((result.get("duration_s") or 0) / 60 or None, " min", 0)
    return (
        f"One run: commit `{result.get('commit', 'unknown')}`, started "
        f"{str(result.get('started', '?')).replace('T', ' ')[:16]} UTC, {minutes}; machine "
        f"{_num(host.get('cpus'))} CPUs, {_num(host.get('memory_gib'))} GiB; 1-min load "
        f"average {_num(at_start[0])} at the start, mean {_num(during.get('load_1min_mean'))}"
        f" / max {_num(during.get('load_1min_max'))} during the run. Workload: "
        f"{_num(size.get('nodes'))} kwok nodes, {_num(size.get('pods'))} healthy pods, "
        f"{_num(size.get('stuck'))} NodeGone + {_num(size.get('finalizer_pods'))} "
        f"finalizer-held pods stuck at once. Generated from `{source}` by "
        f"`python -m bench.table {source}`; method: [docs/benchmark.md](docs/benchmark.md)."
    )


COLUMNS: tuple[tuple[str, Callable[[Json], str]], ...] = (
    ("detection p99", lambda r: _secs(r.get("detection_lag_p99_s"))),
    ("DELETE lag p50 / p99", lambda r: f"{_secs(r.get('lag_p50_s'))} / "
                                       f"{_secs(r.get('lag_p99_s'))}"),
    ("all NodeGone gone", lambda r: _secs(r.get("all_gone_s")) if r.get("all_gone_s")
     is not None else f"{_num(r.get('nodegone_left'))} left"),
    ("requests per force-deleted pod", lambda r: _num(r.get("requests_per_force_deleted_pod"))),
    ("requests per stuck pod", lambda r: _num(r.get("requests_per_stuck_pod"))),
    ("API server p99 (all clients)", lambda r: _secs(r.get("apiserver_request_p99_s"))),
    ("peak RSS", lambda r: _num(r.get("rss_peak_mib"), " MiB", 0)),
    ("CPU", lambda r: _num(r.get("cpu_s"), " s", 1)),
    ("writes to healthy pods", lambda r: _num(r.get("writes_to_healthy_pods"))),
    ("LISTs while quiet", lambda r: _num(r.get("lists_after_startup_while_quiet"))),
    ("1-min load max", lambda r: _num(_get(r, "machine_load", "load_1min_max"))),
)  # fmt: skip


def contenders_table(result: Json) -> str:
    rows = [
        "| contender | " + " | ".join(title for title, _ in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for name, r in (result.get("contenders") or {}).items():
        cells = [cell(r if isinstance(r, dict) else {}) for _, cell in COLUMNS]
        rows.append(f"| {NAMES.get(name, name)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _rss_flat(result: Json) -> Target:
    stages = {int(k): v for k, v in (result.get("unstick_rss_by_pods") or {}).items()}
    what = (
        f"unstick's RSS flat from 5,000 to {RSS_FLAT_TOP_PODS:,} healthy pods "
        f"(largest stage within {RSS_FLAT_TOLERANCE:.0%} of the smallest)"
    )
    if len(stages) < 2:
        return Target(what, "—", None)
    lo, hi = min(stages), max(stages)
    shown = " / ".join(f"{stages[n]:.1f}" for n in sorted(stages))
    measured = f"{shown} MiB at {' / '.join(f'{n:,}' for n in sorted(stages))} pods"
    if hi < RSS_FLAT_TOP_PODS:
        return Target(what, measured + f" (no {RSS_FLAT_TOP_PODS:,} point)", None)
    return Target(what, measured, stages[hi] <= stages[lo] * (1 + RSS_FLAT_TOLERANCE))


def _gone_verdict(gone: Any, left: Any, limit: float) -> tuple[str, bool | None]:
    """`all_gone_s` against `limit`; pods left at the timeout are a miss, not a gap."""
    if isinstance(left, int) and left > 0:
        return f"{left:,} left at the timeout", False
    return _secs(gone), _at_most(gone, limit)


def _all_gone(u: Json, naive: Json, stuck: str) -> list[Target]:
    gone, naive_gone = u.get("all_gone_s"), naive.get("all_gone_s")
    measured, met = _gone_verdict(gone, u.get("nodegone_left"), ALL_GONE_MAX_S)
    vs = None
    if met is False and not isinstance(gone, int | float):
        vs = False  # unstick left pods behind
    elif isinstance(gone, int | float) and isinstance(naive_gone, int | float):
        vs = gone <= naive_gone
    elif naive and naive_gone is None and isinstance(gone, int | float):
        vs = True  # the naive reaper did not get them all
    return [
        Target(
            f"all {stuck} NodeGone pods gone ≤ {ALL_GONE_MAX_S:.0f} s after eligibility",
            measured,
            met,
        ),
        Target(
            "… and no later than the naive reaper in the same run",
            f"{measured} vs {_secs(naive_gone)}",
            vs,
        ),
    ]


def targets(result: Json) -> list[Target]:
    cs = result.get("contenders") or {}
    u, naive = cs.get("unstick") or {}, cs.get("naive") or {}
    stuck = _num(_get(result, "workload", "stuck"))
    pods = _num(_get(result, "workload", "pods"))
    per_pod = u.get("requests_per_force_deleted_pod")
    healthy = u.get("requests_about_healthy_pods")
    quiet = u.get("lists_after_startup_while_quiet")
    return [
        *_all_gone(u, naive, stuck),
        Target(
            f"≤ {REQUESTS_PER_POD_MAX} API requests per force-deleted pod",
            _num(per_pod),
            _at_most(per_pod, REQUESTS_PER_POD_MAX),
        ),
        Target("0 requests about healthy pods", _num(healthy), _at_most(healthy, 0)),
        Target(
            f"detection p99 ≤ {DETECTION_P99_MAX_S} s",
            _secs(u.get("detection_lag_p99_s")),
            _at_most(u.get("detection_lag_p99_s"), DETECTION_P99_MAX_S),
        ),
        Target(
            f"peak RSS ≤ {RSS_MAX_MIB:.0f} MiB at {pods} pods (the burst)",
            _num(u.get("rss_peak_mib"), " MiB"),
            _at_most(u.get("rss_peak_mib"), RSS_MAX_MIB),
        ),
        _rss_flat(result),
        Target("0 LIST while quiet", _num(quiet), _at_most(quiet, 0)),
        *table_nodeside.node_side_targets(result),
    ]


def targets_table(result: Json) -> str:
    rows = ["| target (issues 14 and 23), for unstick | measured | |", "|---|---|---|"]
    rows += [f"| {t.what} | {t.measured} | {t.verdict} |" for t in targets(result)]
    return "\n".join(rows)


def render(result: Json, source: str) -> str:
    """The markdown block (without the markers)."""
    if not isinstance(result.get("contenders"), dict) or not result["contenders"]:
        raise TableError("no `contenders` in the result: is this a bench.run result file?")
    node_side = table_nodeside.node_side_table(result)
    parts = (header(result, source), contenders_table(result), node_side, targets_table(result))
    return "\n\n".join(p for p in parts if p)


def replace_block(text: str, block: str, marker: str = MARKER) -> str:
    """`text` with what lies between `<!-- marker -->` and `<!-- /marker -->` replaced."""
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise TableError(f"expected one `{start}` followed by one `{end}`")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{block}\n{end}{tail}"


def load(path: Path) -> Json:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TableError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise TableError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise TableError(f"{path}: expected a JSON object")
    return data


def _shown(path: Path) -> str:
    """The result file as the README names it: relative to the repository when inside."""
    try:
        return path.resolve().relative_to(README.parent).as_posix()
    except ValueError:
        return path.as_posix()


def _write(readme: Path, block: str) -> None:
    try:
        text = readme.read_text()
    except OSError as exc:
        raise TableError(f"cannot read {readme}: {exc.strerror or exc}") from exc
    try:
        readme.write_text(replace_block(text, block))
    except TableError as exc:
        raise TableError(f"{readme}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.table", description=__doc__)
    parser.add_argument("result", type=Path, help="one result file, e.g. bench/results/full.json")
    parser.add_argument("--readme", type=Path, default=README, help="the file to write into")
    parser.add_argument("--check", action="store_true", help="print the table, write nothing")
    args = parser.parse_args(argv)
    try:
        block = render(load(args.result), _shown(args.result))
        if not args.check:
            _write(args.readme, block)
    except TableError as exc:
        print(f"bench.table: {exc}", file=sys.stderr)
        return 2
    print(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
