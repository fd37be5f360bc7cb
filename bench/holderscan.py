"""`python -m bench.holderscan [--processes 2000] [--fds 10]`: the holder scan's cost with
many processes (issue 23): `processes` idle processes holding `fds` open files each (none
of them a holder), one real tmpfs mount of a pod in a private mount namespace; times

- one `scan_holders` of the pod's mount (what a node step does right before its act), and
- the probes of `pods` pods asked at once, each scanning alone vs sharing one scan
  (`unstick.agent.holders.scan_group`, what the agent's handler does for probes).

Run as root. It re-runs itself under `unshare -m --propagation private`; every process it
starts is killed (by pid) and its mounts live only in that namespace. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from unstick.agent.holders.scan import scan_holders
from unstick.agent.holders.scan_group import ScanGroup, shared_scans
from unstick.core.model.mountinfo import Mount, parse_mountinfo

UID = "eeeeeeee-5555-4555-8555-eeeeeeeeeeee"


def _spawn_idle(n: int, fds: int, files: Path) -> list[int]:
    """`n` forked children, each holding `fds` open files (no holder of any mount under
    test) and waiting for a signal."""
    opened = [os.open(files / f"f{i}", os.O_RDONLY | os.O_CREAT, 0o600) for i in range(fds)]
    pids = []
    try:
        for _ in range(n):
            pid = os.fork()
            if pid == 0:  # the child: its fds are the parent's copies; it just waits
                try:
                    signal.pause()
                finally:
                    os._exit(0)
            pids.append(pid)
    finally:
        for fd in opened:
            os.close(fd)
    return pids


def _pod_mounts(base: Path, pods: int) -> list[Mount]:
    points = []
    for i in range(pods):
        vol = base / "kubelet/pods" / f"{UID[:-3]}{i:03d}" / "volumes/kubernetes.io~empty-dir/v"
        vol.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "pod", str(vol)], check=True)
        points.append(str(vol))
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        mounts = parse_mountinfo(f.read())
    return [m for m in mounts if m.mount_point in points]


def _timed(fn: Any) -> tuple[float, float, Any]:
    cpu0, wall0 = time.process_time(), time.monotonic()
    result = fn()
    return time.monotonic() - wall0, time.process_time() - cpu0, result


def _probes(mounts: list[Mount], root: str, group: ScanGroup | None) -> None:
    def one(mount: Mount) -> None:
        if group is None:
            scan_holders("/proc", [mount], kubelet_root=root)
        else:
            with shared_scans(group):
                scan_holders("/proc", [mount], kubelet_root=root)

    threads = [threading.Thread(target=one, args=(m,)) for m in mounts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def measure(processes: int, fds: int, pods: int, repeat: int) -> dict[str, Any]:
    """Inside a private mount namespace: the figures of the module docstring."""
    base = Path(tempfile.mkdtemp(prefix="ubh-", dir="/tmp"))
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "bench", str(base)], check=True)
    pids: list[int] = []
    try:
        mounts = _pod_mounts(base, pods)
        root = str(base / "kubelet")
        (base / "files").mkdir()
        pids = _spawn_idle(processes, fds, base / "files")
        seen = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit())
        single = [_timed(lambda: scan_holders("/proc", [mounts[0]], kubelet_root=root))]
        single += [
            _timed(lambda: scan_holders("/proc", [mounts[0]], kubelet_root=root))
            for _ in range(repeat - 1)
        ]
        alone = _timed(lambda: _probes(mounts, root, None))
        group = ScanGroup()
        shared = _timed(lambda: _probes(mounts, root, group))
        held = [h for _, _, r in single for h in r.holders]
        return {
            "processes_started": processes,
            "fds_each": fds,
            "processes_in_proc": seen,
            "holders_found": len(held),
            "scan_complete": all(r.unknown is None for _, _, r in single),
            "one_scan_wall_s": sorted(round(w, 4) for w, _, _ in single),
            "one_scan_cpu_s": sorted(round(c, 4) for _, c, _ in single),
            "probes_at_once": pods,
            "probes_each_alone_wall_s": round(alone[0], 3),
            "probes_each_alone_cpu_s": round(alone[1], 3),
            "probes_shared_wall_s": round(shared[0], 3),
            "probes_shared_cpu_s": round(shared[1], 3),
            "probes_shared_scans": group.scans,
            "load_avg": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)
        subprocess.run(["umount", "-R", "-l", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def run(processes: int = 2000, fds: int = 10, pods: int = 20, repeat: int = 5) -> dict[str, Any]:
    """`measure` in a private mount namespace (a child process); its JSON result."""
    if os.geteuid() != 0:
        raise PermissionError("the holder-scan benchmark needs root (mounts, unshare -m)")
    cmd = [
        "unshare", "-m", "--propagation", "private", sys.executable, "-m", "bench.holderscan",
        "--inside", "--processes", str(processes), "--fds", str(fds), "--pods", str(pods),
        "--repeat", str(repeat),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=900)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.holderscan")
    parser.add_argument("--processes", type=int, default=2000)
    parser.add_argument("--fds", type=int, default=10)
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        result = measure(args.processes, args.fds, args.pods, args.repeat)
    else:
        try:
            result = run(args.processes, args.fds, args.pods, args.repeat)
        except PermissionError as e:
            print(f"bench.holderscan: {e}", file=sys.stderr)
            return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
