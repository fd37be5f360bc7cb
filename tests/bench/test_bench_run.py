"""The benchmark machinery end to end at a tiny size (real etcd + kube-apiserver + kwok,
the contenders as real subprocesses). Asserts behaviour, never timings: the result file's
shape, no writes to healthy pods, every NodeGone pod gone, every process stopped."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.run import PRESETS, Progress, run_bench

CONTENDER_KEYS = {
    "lag_p50_s",
    "lag_p99_s",
    "lag_max_s",
    "all_gone_s",
    "rss_peak_mib",
    "cpu_s",
    "requests",
    "writes_to_healthy_pods",
    "requests_per_stuck_pod",
    "requests_per_force_deleted_pod",
    "requests_about_healthy_pods",
    "apiserver_request_p99_s",
    "machine_load",
}
VERBS = {"list", "watch", "get", "patch", "delete", "create"}


def _check_shape(result: dict[str, Any], contenders: tuple[str, ...]) -> None:
    size = result["workload"]
    assert {"nodes", "pods", "stuck"} <= size.keys()
    assert set(result["contenders"]) == set(contenders)
    for name, r in result["contenders"].items():
        assert r.keys() >= CONTENDER_KEYS, name
        assert r["requests"].keys() >= VERBS, name
        assert r["rss_peak_mib"] > 0 and r["cpu_s"] > 0, name
    assert isinstance(result["unstick_rss_by_pods"], dict)
    assert result["commit"] and result["commit"] != "unknown"
    assert len(result["machine"]["load_avg_at_start"]) == 3
    assert result["machine"]["load_during_run"]["load_samples"] >= 1


def _check_behaviour(result: dict[str, Any], contenders: tuple[str, ...]) -> None:
    stuck = result["workload"]["stuck"]
    for name in contenders:
        r = result["contenders"][name]
        assert r["nodegone_left"] == 0, f"{name} left NodeGone pods behind"
        assert r["nodegone_acted"] == stuck, name
        assert r["all_gone_s"] is not None and r["lag_max_s"] is not None, name
    unstick = result["contenders"]["unstick"]
    assert unstick["writes_to_healthy_pods"] == 0
    assert unstick["lists_after_startup_while_quiet"] == 0
    assert unstick["acted_before_eligible"] == 0
    assert unstick["requests"]["delete"] >= stuck
    assert unstick["requests_about_healthy_pods"] == 0
    # the NodeGone pods' handling is a part of all requests after the strike
    assert 0 < unstick["requests_after_strike_nodegone"] <= unstick["requests_after_strike"]
    assert unstick["requests_per_force_deleted_pod"] > 0
    assert unstick["apiserver_request_p99_s"] is not None
    assert unstick["detection_lag_p99_s"] is not None  # from its `action=detect` lines


def _run(name: str, contenders: tuple[str, ...], out: Path) -> dict[str, Any]:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    dirs_before = set(Path(tempfile.gettempdir()).glob(f"unstick-bench-{name}-*"))
    node_side = None if name == "tiny" else name
    result = run_bench(
        name, PRESETS[name], contenders, out, Progress(), node_side, logs_dir=out / "logs"
    )
    # the logs went where they were asked to: nothing of the run is left in /tmp
    assert not set(Path(tempfile.gettempdir()).glob(f"unstick-bench-{name}-*")) - dirs_before
    assert (out / "logs" / "unstick.log").exists()
    left = [p for p in me.children(recursive=True) if p.pid not in before and p.is_running()]
    assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE], left
    assert json.loads((out / f"{name}.json").read_text()) == result
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return result


@pytest.mark.envtest
@pytest.mark.timeout(600)
def test_tiny_benchmark_unstick_and_naive(tmp_path: Path) -> None:
    contenders = ("unstick", "naive")
    result = _run("tiny", contenders, tmp_path)
    _check_shape(result, contenders)
    _check_behaviour(result, contenders)
    assert set(result["unstick_rss_by_pods"]) == {"50"}


@pytest.mark.bench
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", ["quick", "full"])
def test_benchmark(name: str, tmp_path: Path) -> None:
    contenders = ("unstick", "naive", "kopf_native", "podgc")
    result = _run(name, contenders, tmp_path)
    _check_shape(result, contenders)
    _check_behaviour(result, contenders)
    stages = PRESETS[name].rss_stages + PRESETS[name].rss_stages_after_burst
    assert set(result["unstick_rss_by_pods"]) == {str(n) for n in stages}
    assert "error" not in result["node_side"] and "skipped" not in result["node_side"]
