"""`python -m bench.run --name quick|full`: the scale benchmark (GitHub issue #7).

unstick against three other ways of getting rid of pods stuck in Terminating, one at a
time, each on its own fresh local control plane (etcd + kube-apiserver + kwok) with the
same workload: kwok nodes with healthy pods, then pods on kubelet-less nodes that are
deleted together with their nodes (NodeGone) plus pods held by an abandoned finalizer.
Writes bench/results/<name>.json and <name>.png. See docs/benchmark.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from bench import contenders, plot
from bench.scenario import Outcome, ScenarioSettings, run_contender
from bench.workload import WorkloadSize

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Preset:
    size: WorkloadSize
    quiet_s: float
    gone_timeout_s: float
    running_timeout_s: float
    rss_stages: tuple[int, ...]
    naive_interval_s: float = 30.0


PRESETS = {
    "full": Preset(WorkloadSize(200, 20_000, 2_000, 500, 20), 20.0, 240.0, 300.0,
                   (5_000, 10_000, 20_000)),
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


def run_bench(
    name: str, preset: Preset, chosen: tuple[str, ...], out_dir: Path, say: Progress
) -> dict[str, Any]:
    logs = Path(tempfile.mkdtemp(prefix=f"unstick-bench-{name}-"))
    say(f"benchmark {name!r}: {preset.size}; contenders {', '.join(chosen)}; logs in {logs}")
    settings = ScenarioSettings(
        size=preset.size,
        quiet_s=preset.quiet_s,
        gone_timeout_s=preset.gone_timeout_s,
        running_timeout_s=preset.running_timeout_s,
        rss_stages=preset.rss_stages,
        naive_interval_s=preset.naive_interval_s,
        logs=logs,
    )
    started = datetime.now(UTC)
    outcomes: dict[str, Outcome] = {}
    for contender in chosen:
        say(f"contender {contender}")
        outcomes[contender] = run_contender(contender, settings, say)
        say(f"  [{contender}] {_summary(outcomes[contender].result)}")
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
        "machine": machine(),
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
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot.draw(
        out_dir / f"{name}.png",
        f"unstick benchmark {name!r}: {size.nodes} nodes, {size.pods} healthy pods, "
        f"{size.stuck} NodeGone + {size.finalizer} finalizer pods stuck",
        {c: o.lags for c, o in outcomes.items()},
        {c: o.rss_series for c, o in outcomes.items()},
    )
    say(f"wrote {out_dir / f'{name}.json'} and {out_dir / f'{name}.png'}")
    return result


def _summary(r: dict[str, Any]) -> str:
    return (
        f"lag p50 {r['lag_p50_s']}s p99 {r['lag_p99_s']}s max {r['lag_max_s']}s; "
        f"all gone {r['all_gone_s']}s; RSS peak {r['rss_peak_mib']} MiB; CPU {r['cpu_s']}s; "
        f"requests {r['requests']}; writes to healthy pods {r['writes_to_healthy_pods']}; "
        f"LISTs while quiet {r['lists_after_startup_while_quiet']}"
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
    args = parser.parse_args(argv)
    chosen = tuple(c.strip() for c in args.contenders.split(",") if c.strip())
    unknown = [c for c in chosen if c not in contenders.ALL + contenders.EXTRA]
    if unknown or not chosen:
        parser.error(f"--contenders: unknown {unknown}; choose from {', '.join(contenders.ALL)}")
    preset = PRESETS[args.name]
    if args.pods:
        size = replace(preset.size, pods=args.pods)
        stages = tuple(sorted({args.pods // 4, args.pods // 2, args.pods}))
        preset = replace(preset, size=size, rss_stages=stages)
    try:
        run_bench(args.name, preset, chosen, args.out, Progress())
    except KeyboardInterrupt:
        print("interrupted: every process was stopped", file=sys.stderr)
        return 130
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
