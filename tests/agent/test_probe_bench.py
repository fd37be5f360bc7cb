"""Probe cost on a large host: a generated mountinfo of N pods with M mounts each (text only,
no real mounts: this measures the parse + match part), plus the node-wide orphaned count.
`bench` runs 5,000 mounts / 500 pods; the quick variant runs the same code small."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from unstick.agent.probe.collect import orphaned_mounts, probe_pod
from unstick.agent.probe.mount_file import read_mount_table
from unstick.agent.settings import AgentSettings

ROOT = "/var/lib/kubelet"
SYSTEM = [
    "22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw",
    "23 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw",
    "24 22 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw",
    "26 22 0:24 / /run rw,nosuid shared:5 - tmpfs tmpfs rw,mode=755",
]


def uid_of(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


def generate(pods: int, per_pod: int) -> str:
    """`pods` pods, each with `per_pod` mounts: projected tmpfs, CSI binds, subpaths."""
    lines = list(SYSTEM)
    mount_id = 100
    for p in range(pods):
        base = f"{ROOT}/pods/{uid_of(p)}"
        for m in range(per_pod):
            mount_id += 1
            kind = m % 3
            if kind == 0:
                point = f"{base}/volumes/kubernetes.io~projected/kube-api-access-{m}"
                tail = f"0:{mount_id} / {point} rw,relatime shared:{mount_id} - tmpfs tmpfs rw"
            elif kind == 1:
                point = f"{base}/volumes/kubernetes.io~csi/pvc-{p}-{m}/mount"
                tail = f"253:1 /csi/{p}/{m} {point} rw shared:1 - ext4 /dev/vda1 rw"
            else:
                point = f"{base}/volume-subpaths/data/app/{m}"
                tail = f"253:1 /csi/{p}/{m}/sub {point} rw shared:1 - ext4 /dev/vda1 rw"
            lines.append(f"{mount_id} 22 {tail}")
    return "\n".join(lines) + "\n"


def run_probe_bench(tmp_path: Path, pods: int, per_pod: int) -> dict[str, Any]:
    (tmp_path / "mountinfo").write_text(generate(pods, per_pod))
    (tmp_path / "proc").mkdir()
    settings = AgentSettings(
        node_name="bench-node",
        kubelet_root=ROOT,
        host_proc=str(tmp_path / "proc"),
        mountinfo_path=str(tmp_path / "mountinfo"),
        plugins_registry=str(tmp_path / "registry"),
        kubelet_healthz="http://127.0.0.1:9/healthz",
    )
    target = uid_of(pods // 2)
    started = time.perf_counter()
    probe = probe_pod(settings, target, plugins={})
    probe_s = time.perf_counter() - started
    started = time.perf_counter()
    table = read_mount_table(settings.mountinfo)
    stuck = {uid_of(i) for i in range(0, pods, 10)}
    live = {uid_of(i) for i in range(pods) if i % 5}
    orphaned = orphaned_mounts(table, ROOT, stuck, live)
    summary_s = time.perf_counter() - started
    return {
        "probe": probe,
        "probe_s": probe_s,
        "summary_s": summary_s,
        "orphaned": orphaned,
        "expected_orphaned": per_pod * len(stuck | {uid_of(i) for i in range(pods)} - live),
    }


def _check_and_report(result: dict[str, Any], pods: int, per_pod: int, capsys: Any) -> None:
    lines = result["probe"]["mountinfo"].splitlines()
    assert len(lines) == per_pod
    assert all(f"/pods/{uid_of(pods // 2)}/" in line for line in lines)
    assert result["orphaned"] == result["expected_orphaned"]
    with capsys.disabled():
        print(
            f"\nagent probe on {pods * per_pod} mounts / {pods} pods: "
            f"probe {result['probe_s'] * 1000:.1f} ms, "
            f"node summary {result['summary_s'] * 1000:.1f} ms"
        )


@pytest.mark.bench
def test_probe_bench_5000_mounts_500_pods(tmp_path: Path, capsys: Any) -> None:
    _check_and_report(run_probe_bench(tmp_path, 500, 10), 500, 10, capsys)


def test_probe_bench_quick(tmp_path: Path, capsys: Any) -> None:
    _check_and_report(run_probe_bench(tmp_path, 20, 6), 20, 6, capsys)
