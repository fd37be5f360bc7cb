"""`python -m bench.run --name quick|full`: the scale benchmark (GitHub issue #7).

unstick against three other ways of getting rid of pods stuck in Terminating, one at a
time, each on its own fresh local control plane (etcd + kube-apiserver + kwok) with the
same workload: kwok nodes with healthy pods, then pods on kubelet-less nodes that are
deleted together with their nodes (NodeGone) plus pods held by an abandoned finalizer.
Then (quick and full) the node-side benchmark (bench/nodeside.py), when it is there.
Writes bench/results/<name>.json and <name>.png (an earlier <name>.json/png there is kept
as <date>-<name>[-<commit>].json/png). See docs/benchmark.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from bench import contenders, measure, plot
from bench.scenario import Outcome, ScenarioSettings, run_contender
from bench.workload import WorkloadSize

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
NODE_SIDE_PRESET = {"full": "full", "quick": "quick"}  # bench.run name → bench.nodeside preset


@dataclass(frozen=True)
class Preset:
    size: WorkloadSize
    quiet_s: float
    gone_timeout_s: float
    running_timeout_s: float
    rss_stages: tuple[int, ...]
    naive_interval_s: float = 30.0
    rss_stages_after_burst: tuple[int, ...] = ()  # unstick only, after its burst


PRESETS = {
    "full": Preset(WorkloadSize(200, 20_000, 2_000, 500, 20), 20.0, 240.0, 300.0,
                   (5_000, 10_000, 20_000), rss_stages_after_burst=(50_000,)),
    "quick": Preset(WorkloadSize(50, 2_000, 200, 50, 4), 5.0, 100.0, 60.0, (500, 1_000, 2_000)),
    "tiny": Preset(WorkloadSize(5, 50, 10, 5, 1), 3.0, 90.0, 30.0, (50,), naive_interval_s=5.0),
}  # fmt: skip


class Progress:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {message}", flush=True)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def git_commit(repo: Path = REPO) -> str:
    """`git rev-parse --short HEAD`, plus `-dirty` when tracked files differ from HEAD or
    there are untracked files outside bench/results/ (results being written are no code)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        ).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        status = git("status", "--porcelain", "--", ".", ":(exclude)bench/results")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if status.strip() else head


def archive_previous(out_dir: Path, name: str) -> list[Path]:
    """An earlier `<name>.json`/`.png` is kept as `<date>-<name>[-<commit>].json/.png`."""
    old = out_dir / f"{name}.json"
    if not old.exists():
        return []
    try:
        data = json.loads(old.read_text())
    except ValueError:
        data = {}
    date = str(data.get("started") or "")[:10] or datetime.fromtimestamp(
        old.stat().st_mtime, UTC
    ).strftime("%Y-%m-%d")
    stem = "-".join(filter(None, (date, name, data.get("commit"))))
    for n in range(1, 100):
        base = stem if n == 1 else f"{stem}-{n}"
        if not (out_dir / f"{base}.json").exists():
            break
    moved = []
    for ext in ("json", "png"):
        src = out_dir / f"{name}.{ext}"
        if src.exists():
            moved.append(src.rename(out_dir / f"{base}.{ext}"))
    return moved


def _node_side(preset: str, say: Progress) -> dict[str, Any]:
    """bench/nodeside.py's `run_node_side` (another module; skipped while it is absent)."""
    try:
        from bench import nodeside
    except ImportError as exc:
        say(f"node side skipped: bench.nodeside cannot be imported ({exc})")
        return {"skipped": f"bench.nodeside cannot be imported: {exc}"}
    say(f"node side, preset {preset!r}")
    try:
        return dict(nodeside.run_node_side(nodeside.PRESETS[preset], say))
    except Exception as exc:
        say(f"node side failed: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_bench(  # noqa: PLR0917 (the run's few inputs)
    name: str,
    preset: Preset,
    chosen: tuple[str, ...],
    out_dir: Path,
    say: Progress,
    node_side: str | None = None,
    *,
    logs_dir: Path | None = None,
) -> dict[str, Any]:
    """Every chosen contender, one after the other, then (with `node_side`, a
    bench.nodeside preset) the node side; writes `<out_dir>/<name>.json` and `.png`. The
    processes' logs go to `logs_dir`, else to a new directory in /tmp that is kept (its
    path is said)."""
    logs = logs_dir or Path(tempfile.mkdtemp(prefix=f"unstick-bench-{name}-"))
    logs.mkdir(parents=True, exist_ok=True)
    say(f"benchmark {name!r}: {preset.size}; contenders {', '.join(chosen)}; logs in {logs}")
    settings = ScenarioSettings(
        size=preset.size,
        quiet_s=preset.quiet_s,
        gone_timeout_s=preset.gone_timeout_s,
        running_timeout_s=preset.running_timeout_s,
        rss_stages=preset.rss_stages,
        rss_stages_after_burst=preset.rss_stages_after_burst,
        naive_interval_s=preset.naive_interval_s,
        logs=logs,
    )
    started = datetime.now(UTC)
    commit = git_commit()
    host = machine()
    load = measure.LoadSampler().start()
    outcomes: dict[str, Outcome] = {}
    try:
        for contender in chosen:
            say(f"contender {contender}")
            t_start = time.time()
            outcomes[contender] = run_contender(contender, settings, say)
            outcomes[contender].result["machine_load"] = load.stats(t_start, time.time())
            say(f"  [{contender}] {_summary(outcomes[contender].result)}")
        side = _node_side(node_side, say) if node_side else None
    finally:
        load.stop()
    host["load_during_run"] = load.stats()
    size = preset.size
    result: dict[str, Any] = {
        "workload": {
            "nodes": size.nodes,
            "pods": size.pods,
            "stuck": size.stuck,
            "finalizer_pods": size.finalizer,
            "kubeletless_nodes": size.doomed_nodes,
            "slack_s": settings.slack_s,
            "naive_interval_s": settings.naive_interval_s,
        },
        "contenders": {c: o.result for c, o in outcomes.items()},
        "unstick_rss_by_pods": {},
        "unstick_rss_stages_after_burst": list(preset.rss_stages_after_burst),
        "machine": host,
        "commit": commit,
        "started": started.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - say.t0, 1),
        "method": (
            "each contender on its own fresh control plane with the same workload, one at "
            "a time; the machine is shared with other engineers' test runs"
        ),
    }
    if "unstick" in outcomes:
        by_pods = outcomes["unstick"].rss_by_pods
        result["unstick_rss_by_pods"] = {str(k): round(v, 1) for k, v in sorted(by_pods.items())}
        if len(by_pods) >= 2:
            lo, hi = min(by_pods), max(by_pods)
            slope = (by_pods[hi] - by_pods[lo]) * 1024 / (hi - lo)
            result["unstick_rss_slope_kib_per_pod"] = round(slope, 4)
    # The raw samples behind the picture (lags of the NodeGone pods; RSS every 0.5 s).
    result["lag_samples_s"] = {c: [round(x, 3) for x in o.lags] for c, o in outcomes.items()}
    result["rss_series_mib"] = {
        c: [[round(t, 1), round(m, 1)] for t, m in o.rss_series] for c, o in outcomes.items()
    }
    if side is not None:
        result["node_side"] = side
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in archive_previous(out_dir, name):
        say(f"the earlier result is kept as {path}")
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot.draw(
        out_dir / f"{name}.png",
        f"unstick benchmark {name!r} ({commit}, {result['started'][:16]} UTC): {size.nodes} "
        f"nodes, {size.pods} healthy pods, {size.stuck} NodeGone + {size.finalizer} "
        f"finalizer pods stuck",
        {c: o.lags for c, o in outcomes.items()},
        {c: o.rss_series for c, o in outcomes.items()},
    )
    say(f"wrote {out_dir / f'{name}.json'} and {out_dir / f'{name}.png'}")
    if name == "full":
        say(f"the README's table: python -m bench.table {out_dir / 'full.json'}")
    return result


def _summary(r: dict[str, Any]) -> str:
    return (
        f"lag p50 {r['lag_p50_s']}s p99 {r['lag_p99_s']}s max {r['lag_max_s']}s; "
        f"all gone {r['all_gone_s']}s; RSS peak {r['rss_peak_mib']} MiB; CPU {r['cpu_s']}s; "
        f"requests {r['requests']}; per force-deleted pod "
        f"{r['requests_per_force_deleted_pod']}; API server p99 {r['apiserver_request_p99_s']}s"
        f"; writes to healthy pods {r['writes_to_healthy_pods']}; "
        f"LISTs while quiet {r['lists_after_startup_while_quiet']}; "
        f"load max {r['machine_load']['load_1min_max']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--name", choices=sorted(PRESETS), default="quick", help="workload size")
    parser.add_argument(
        "--contenders",
        default=",".join(contenders.ALL),
        help=f"comma-separated subset of {','.join(contenders.ALL + contenders.EXTRA)} "
        f"(default: {','.join(contenders.ALL)})",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--pods", type=int, help="override the number of healthy pods")
    parser.add_argument(
        "--no-node-side",
        action="store_true",
        help="skip the node-side benchmark (bench/nodeside.py; run for quick and full)",
    )
    args = parser.parse_args(argv)
    chosen = tuple(c.strip() for c in args.contenders.split(",") if c.strip())
    unknown = [c for c in chosen if c not in contenders.ALL + contenders.EXTRA]
    if unknown or not chosen:
        parser.error(f"--contenders: unknown {unknown}; choose from {', '.join(contenders.ALL)}")
    preset = PRESETS[args.name]
    if args.pods:
        size = replace(preset.size, pods=args.pods)
        stages = tuple(sorted({args.pods // 4, args.pods // 2, args.pods}))
        preset = replace(preset, size=size, rss_stages=stages, rss_stages_after_burst=())
    node_side = None if args.no_node_side else NODE_SIDE_PRESET.get(args.name)
    try:
        run_bench(args.name, preset, chosen, args.out, Progress(), node_side)
    except KeyboardInterrupt:
        print("interrupted: every process was stopped", file=sys.stderr)
        return 130
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
