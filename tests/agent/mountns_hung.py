"""Hung-mount scenarios (issue #25), run INSIDE a private mount namespace by conftest
(`run_scenario(name, workdir, script=HUNG)`), like mountns_scenarios.py.

A real FUSE daemon (fuse_stub.py, the kernel's raw protocol) serves a pod volume; SIGSTOP
makes it a dead server. fusectl is mounted in this namespace only. Every process started
here is SIGKILLed at the end (the daemon last but one: killing it aborts the connection and
releases whatever still waits on it), and the namespace takes every mount with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from devcluster.process import wait_until
from tests.agent.mountns_scenarios import DRIVER, UID_A, Node, main, mount_points, sh, step
from unstick.agent.proto import csi_pb2, csi_pb2_grpc

STUB = Path(__file__).parent / "fuse_stub.py"
SOURCE = "nfs.example:/exports/data"
FUSECTL = "/sys/fs/fuse/connections"
PIDS = Path("/sys/fs/cgroup/pids")


def _wchan(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/wchan", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def _stopped(pid: int) -> bool:
    """Every thread of `pid` stopped (state T): a SIGSTOP takes effect only when the task is
    next scheduled, and a FUSE daemon woken by a request before that reads it first — the
    request then waits for an answer uninterruptibly, and its process cannot be killed."""
    try:
        states = [
            (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            for task in Path(f"/proc/{pid}/task").iterdir()
        ]
    except OSError:
        return False
    return bool(states) and all(state in ("T", "t") for state in states)


def _stop(daemon: subprocess.Popen[Any]) -> None:
    daemon.send_signal(signal.SIGSTOP)
    wait_until(lambda: _stopped(daemon.pid), timeout=20, what="the FUSE daemon stopped")


def _hung_volume(
    node: Node, vol: Path | None = None, subdirs: str = ""
) -> tuple[Path, subprocess.Popen[str]]:
    """A pod volume served by a FUSE daemon, answering, then stopped (the dead server);
    `subdirs` (comma-separated) are empty directories in it."""
    if not os.path.ismount(FUSECTL):
        sh("mount", "-t", "fusectl", "none", FUSECTL)
    if vol is None:
        vol = node.pod(UID_A) / "volumes" / "kubernetes.io~nfs" / "pv-data"
        vol.mkdir(parents=True)
    daemon = node.start(
        sys.executable, str(STUB), str(vol), SOURCE, subdirs, stdout=subprocess.PIPE, text=True
    )
    assert daemon.stdout is not None
    assert daemon.stdout.readline().strip() == "ready", "the FUSE daemon did not start"
    assert list(vol.iterdir()) == []  # it answers while it runs (readdir lists nothing)
    return vol, daemon


def _blocked(node: Node, *cmd: str, cwd: str = "/") -> subprocess.Popen[str]:
    """A process that touches the stopped mount and waits for its answer."""
    proc = node.start(*cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(
        lambda: _wchan(proc.pid) == "request_wait_answer",
        timeout=20,
        what=f"{cmd[0]} to wait on the FUSE daemon",
    )
    return proc


def _lazily_unmounted(ex: Any, vol: Path, **found: Any) -> dict[str, Any]:
    """A hung scenario's end: the lazy unmount of `vol` (nobody holds it now); its result,
    with what the scenario `found` before, and whether `vol` is still mounted after."""
    done = step(ex, UID_A, "lazy-unmount", str(vol))
    return {
        "vol": str(vol),
        "source": SOURCE,
        **found,
        "done": done,
        "mounted_after": str(vol) in mount_points(),
    }


def scenario_fuse_stopped(node: Node) -> dict[str, Any]:
    vol, daemon = _hung_volume(node)
    projected = node.projected(UID_A, "kube-api-access-x")
    # a process with its working directory in the volume, then the daemon stops: its next
    # read of the volume waits for ever (a container's process on a dead NFS server)
    holder = node.start(
        "sh", "-c", "read x; exec ls -l .", cwd=str(vol), stdin=subprocess.PIPE, text=True
    )
    # the daemon stops idle: a request it has read but not answered would leave the holder
    # unkillable (uninterruptible) until the daemon dies
    wait_until(lambda: "pipe" in _wchan(holder.pid), timeout=20, what="sh to wait on its stdin")
    _stop(daemon)
    assert holder.stdin is not None
    holder.stdin.write("go\n")
    holder.stdin.flush()
    wait_until(
        lambda: _wchan(holder.pid) == "request_wait_answer",
        timeout=20,
        what="ls to wait on the daemon",
    )
    held = node.probe(UID_A)
    ex = node.executor()
    refused_held = step(ex, UID_A, "lazy-unmount", str(vol))
    refused_tmpfs = step(ex, UID_A, "lazy-unmount", str(projected))
    refused_other = step(ex, UID_A, "lazy-unmount", "/etc")
    holder.send_signal(signal.SIGKILL)
    wait_until(lambda: holder.poll() is not None, timeout=20, what="the holder to die")
    # nobody holds it now; the kubelet's own check of the mount point would hang as this does
    checker = _blocked(node, "stat", str(vol))
    unheld = node.probe(UID_A)
    dry = step(ex, UID_A, "lazy-unmount", str(vol), dry=True)
    mounted_after_dry = str(vol) in mount_points()
    result = _lazily_unmounted(
        ex,
        vol,
        holder=holder.pid,
        checker=checker.pid,
        held=held,
        refused_held=refused_held,
        refused_tmpfs=refused_tmpfs,
        refused_other=refused_other,
        unheld=unheld,
        dry=dry,
        mounted_after_dry=mounted_after_dry,
    )
    return {**result, "projected_mounted_after": str(projected) in mount_points()}


def scenario_fuse_answering(node: Node) -> dict[str, Any]:
    """The same volume while its daemon answers: not hung."""
    vol, _ = _hung_volume(node)
    holder = node.start("sleep", "600", cwd=str(vol))
    wait_until(lambda: Path(f"/proc/{holder.pid}/cwd").exists(), timeout=20, what="sleep to start")
    return {"vol": str(vol), "probe": node.probe(UID_A)}


def scenario_fuse_outside_waiter(node: Node) -> dict[str, Any]:
    """Nothing holds the stopped mount; only processes outside the pod wait on it — a
    `stat` of the mount point (the kubelet's check) and a `cat` of a file in it (open).
    fusectl's `waiting` is switched off for the second probe: what it finds comes from
    the tasks' blocked system calls alone (agent/probe/waiters.py)."""
    import unstick.agent.probe.hung_mounts as hung_mounts
    from unstick.agent.probe.waiters import mount_waiters

    vol, daemon = _hung_volume(node)
    _stop(daemon)
    stat = _blocked(node, "stat", str(vol))
    cat = _blocked(node, "cat", f"{vol}/missing.txt")
    table = node.executor().checks.pod_table(UID_A)
    mount = next(m for m in table.mounts if m.mount_point == str(vol))
    waiters = [
        {"pid": w.pid, "comm": w.comm, "wchan": w.wchan, "path": w.path, "words": w.words()}
        for w in mount_waiters("/proc", [mount])
    ]
    probe = node.probe(UID_A)
    hung_mounts.FUSECTL = "nonexistent/fusectl"  # the waiting count: not read
    try:
        probe_no_fusectl = node.probe(UID_A)
    finally:
        hung_mounts.FUSECTL = FUSECTL.lstrip("/")
    ex = node.executor()
    plain = step(ex, UID_A, "unmount", str(vol))
    plain_all = step(ex, UID_A, "unmount", "", dry=True)
    mounted_after_refusals = str(vol) in mount_points()
    return _lazily_unmounted(
        ex,
        vol,
        stat=stat.pid,
        cat=cat.pid,
        waiters=waiters,
        probe=probe,
        probe_no_fusectl=probe_no_fusectl,
        plain=plain,
        plain_all=plain_all,
        mounted_after_refusals=mounted_after_refusals,
    )


def scenario_fuse_unreadable_waiter(node: Node) -> dict[str, Any]:
    """The only waiter looks the mount up through `..` (`stat <vol>/../pv-data`): its path
    is never resolved, so nobody is named — and the plain unmount cannot tell, so refuses."""
    from unstick.agent.probe.waiters import scan_waiters

    vol, daemon = _hung_volume(node)
    _stop(daemon)
    waiter = _blocked(node, "stat", f"{vol}/../{vol.name}")
    table = node.executor().checks.pod_table(UID_A)
    mount = next(m for m in table.mounts if m.mount_point == str(vol))
    scan = scan_waiters("/proc", [mount])
    plain = step(node.executor(), UID_A, "unmount", str(vol))
    return {
        "vol": str(vol),
        "pid": waiter.pid,
        "waiters": [w.pid for w in scan.waiters],
        "unknown": scan.unknown,
        "probe": node.probe(UID_A),
        "plain": plain,
        "mounted_after": str(vol) in mount_points(),
    }


class RecordingDriver(csi_pb2_grpc.NodeServicer):
    """A CSI node service on a real gRPC socket that records every call and answers OK,
    changing nothing: whether the agent called the driver is then a fact, not a guess."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def NodeUnpublishVolume(self, request: Any, context: Any) -> Any:
        self.calls.append(["NodeUnpublishVolume", request.volume_id, request.target_path])
        return csi_pb2.NodeUnpublishVolumeResponse()

    def NodeGetCapabilities(self, request: Any, context: Any) -> Any:
        self.calls.append(["NodeGetCapabilities"])
        return csi_pb2.NodeGetCapabilitiesResponse()


def scenario_fuse_csi_replay_waiter(node: Node) -> dict[str, Any]:
    """A CSI volume whose driver published a FUSE mount (an s3/sshfs-style driver) whose
    daemon stopped; the only waiter is a `stat` of the target outside the pod. The
    driver's NodeUnpublishVolume would be a plain umount: `replay-unpublish` must refuse
    without calling it. With the waiter gone, the same step calls the driver."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from unstick.agent.probe.plugins import Plugin
    from unstick.agent.steps.executor import Executor

    target = node.csi_volume(UID_A, "pv-fuse", "vol-fuse", bind=False)
    vol, daemon = _hung_volume(node, target)
    _stop(daemon)
    waiter = _blocked(node, "stat", str(vol))
    driver = RecordingDriver()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    csi_pb2_grpc.add_NodeServicer_to_server(driver, server)
    socket = node.work / "csi.sock"
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        plugin = Plugin(DRIVER, "CSIPlugin", str(socket), "")
        ex = Executor(node.settings, plugins=lambda: {DRIVER: plugin})
        refused = step(ex, UID_A, "replay-unpublish", str(vol))
        refused_dry = step(ex, UID_A, "replay-unpublish", "", dry=True)
        calls_after_refusals = list(driver.calls)
        node.stop(waiter)
        replayed = step(ex, UID_A, "replay-unpublish", str(vol))
        return {
            "vol": str(vol),
            "stat": waiter.pid,
            "refused": refused,
            "refused_dry": refused_dry,
            "calls_after_refusals": calls_after_refusals,
            "replayed": replayed,
            "calls": driver.calls,
        }
    finally:
        server.stop(None)
        node.stop(daemon)  # the connection goes: nothing waits on the mount any more


def scenario_fuse_held_submount(node: Node) -> dict[str, Any]:
    """A mount stacked below the hung mount (NFSv4 makes such submounts itself where the
    export crosses filesystems), and a process with its working directory in it: the
    process holds the submount, not the hung mount — and MNT_DETACH of the hung mount
    detaches the whole tree, the held submount with it."""
    vol, daemon = _hung_volume(node, subdirs="sub")
    sub = vol / "sub"
    sh("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(sub))
    holder = node.start("sleep", "600", cwd=str(sub))
    wait_until(
        lambda: Path(f"/proc/{holder.pid}/cwd").readlink() == sub, timeout=20, what="sleep to start"
    )
    _stop(daemon)
    ex = node.executor()
    done = step(ex, UID_A, "lazy-unmount", str(vol))
    points = mount_points()
    return {
        "vol": str(vol),
        "sub": str(sub),
        "holder": holder.pid,
        "step": done,
        "vol_mounted_after": str(vol) in points,
        "sub_mounted_after": str(sub) in points,
    }


def _remove_tree(top: Path) -> None:
    for path in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
        if path.is_dir():
            path.rmdir()
    top.rmdir()


def scenario_fuse_pod_process(node: Node) -> dict[str, Any]:
    """A process of the pod (in a pids cgroup named like the pod's container) waits on the
    stopped daemon without holding the mount: blocked `via pod`."""
    top = PIDS / f"unstick-hung-{os.getpid()}"
    cgroup = top / "kubepods" / f"pod{UID_A}" / "cri-containerd-abc123.scope"
    cgroup.mkdir(parents=True)
    vol, daemon = _hung_volume(node)
    waiter = None
    try:
        _stop(daemon)
        waiter = _blocked(
            node, "sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec stat "$0"', str(vol)
        )
        probe = node.probe(UID_A)
        refused = step(node.executor(), UID_A, "lazy-unmount", str(vol))
        return {"vol": str(vol), "pid": waiter.pid, "probe": probe, "refused": refused}
    finally:
        node.stop(daemon)  # first: the connection goes, every waiter is released
        if waiter is not None:
            node.stop(waiter)
        wait_until(
            lambda: not (cgroup / "cgroup.procs").read_text().split(),
            timeout=20,
            what="the pod cgroup to empty",
        )
        _remove_tree(top)


if __name__ == "__main__":
    sys.exit(
        main(
            {
                "fuse_stopped": scenario_fuse_stopped,
                "fuse_answering": scenario_fuse_answering,
                "fuse_pod_process": scenario_fuse_pod_process,
                "fuse_outside_waiter": scenario_fuse_outside_waiter,
                "fuse_unreadable_waiter": scenario_fuse_unreadable_waiter,
                "fuse_csi_replay_waiter": scenario_fuse_csi_replay_waiter,
                "fuse_held_submount": scenario_fuse_held_submount,
            }
        )
    )
