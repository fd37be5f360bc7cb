"""Holder scenarios with shared/slave propagation, run INSIDE a private mount namespace by
conftest (`run_scenario(name, workdir, script=HOLDERS)`), like mountns_scenarios.py.

The scenario's work tmpfs is made *shared*, so each pod volume mounted under it is shared
too. A second mount namespace (`unshare -m --propagation unchanged`, then `--make-rslave`)
gets the kubelet's pods dir as an rslave copy at `<work>/host_pods` (what a DaemonSet with
`mountPropagation: HostToContainer` sees), and then does one thing with the volume: holds
a file open through the copy, sits in it (cwd), binds it elsewhere, or nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.agent.mountns_scenarios import UID_A, Node, main, mount_points, scenarios_in, sh
from unstick.core.model.mountinfo import parse_mountinfo


def _second_namespace(node: Node, then: str) -> subprocess.Popen[str]:
    """A process in a new mount namespace, an rslave of this one, with the pods dir
    rbind-mounted at <work>/host_pods; it runs `then` (shell), says ready, sleeps."""
    script = (
        "mount --make-rslave /; "
        f"mount --rbind {node.root / 'pods'} {node.work / 'host_pods'}; {then}"
    )
    return node.in_own_namespace(script, "second namespace")


def _points_of(pid: int) -> list[str]:
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as f:
        return [m.mount_point for m in parse_mountinfo(f.read())]


def _unmount(node: Node, vol: Path, lazy: bool) -> dict[str, str]:
    return (
        node.executor()
        .run_step(UID_A, "unmount", str(vol), dry_run=False, lazy_unmount=lazy)
        .to_json()
    )


def _setup(node: Node) -> tuple[Path, Path]:
    """A shared work tmpfs, pod A's projected volume under it, and where the volume shows in
    the second namespace (under host_pods)."""
    sh("mount", "--make-shared", str(node.work))
    (node.work / "host_pods").mkdir()
    (node.work / "backup").mkdir()
    vol = node.projected(UID_A, "kube-api-access-x")
    return vol, node.work / "host_pods" / vol.relative_to(node.root / "pods")


def _held_case(node: Node, then: str) -> dict[str, Any]:
    vol, copy = _setup(node)
    other = _second_namespace(node, then.format(copy=copy, work=node.work))
    return {
        "vol": str(vol),
        "copy": str(copy),
        "pid": other.pid,
        "copy_in_other_ns": str(copy) in _points_of(other.pid),
        "probe": node.probe(UID_A),
        "plain": _unmount(node, vol, lazy=False),
        "lazy": _unmount(node, vol, lazy=True),
        "mounted_after": str(vol) in mount_points(),
    }


def scenario_fd_through_copy(node: Node) -> dict[str, Any]:
    """(a) a file open through the rslave copy at host_pods."""
    return _held_case(node, "exec 3< {copy}/token")


def scenario_cwd_in_copy(node: Node) -> dict[str, Any]:
    """(c) the working directory inside the rslave copy."""
    return _held_case(node, "cd {copy}")


def scenario_maps_through_copy(node: Node) -> dict[str, Any]:
    """(d) the process's own program runs from the rslave copy: mapped, no fd open, its cwd
    elsewhere."""
    return _held_case(node, 'cp "$(command -v sleep)" {copy}/sleep; PATH={copy}:$PATH')


def scenario_bind_elsewhere(node: Node) -> dict[str, Any]:
    """(b) the volume bind-mounted at <work>/backup in the second namespace, nothing open;
    once that namespace is gone, the unmount goes through."""
    result = _held_case(node, "mount --bind {copy} {work}/backup")
    node.cleanup()
    result["after_release"] = _unmount(node, Path(result["vol"]), lazy=False)
    result["mounted_after_release"] = result["vol"] in mount_points()
    return result


def scenario_bind_in_same_namespace(node: Node) -> dict[str, Any]:
    """(e) the volume bind-mounted outside the kubelet root in the namespace the agent reads
    the mount table from: plain umount of the volume would succeed and leave the bind."""
    vol, _ = _setup(node)
    sh("mount", "--bind", str(vol), str(node.work / "backup"))
    try:
        refused = _unmount(node, vol, lazy=False)
        still = str(vol) in mount_points()
    finally:
        sh("umount", str(node.work / "backup"))
    after = _unmount(node, vol, lazy=False)
    return {"refused": refused, "mounted": still, "after": after, "pid": 0}


def scenario_own_look_is_no_holder(node: Node) -> dict[str, Any]:
    """The agent's own process (this one) has the volume open, as a worker's O_PATH walk
    of the pod's paths does while another worker scans: no holder; another process with
    the same open file still is."""
    import os

    vol, copy = _setup(node)
    own = [
        os.open(vol, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
        os.open(vol / "token", os.O_RDONLY | os.O_CLOEXEC),
    ]
    try:
        alone = node.probe(UID_A)
        other = _second_namespace(node, f"exec 3< {copy}/token")
        with_other = node.probe(UID_A)
    finally:
        for fd in own:
            os.close(fd)
    return {
        "own_pid": os.getpid(),
        "other_pid": other.pid,
        "alone": alone["holders"],
        "alone_scan": alone["holderScan"],
        "with_other": with_other["holders"],
    }


def scenario_unused_copy(node: Node) -> dict[str, Any]:
    """(d) the honest case: the propagated copies (at host_pods and at the same path) with
    nobody using them are no holders; the unmount proceeds and takes them along."""
    vol, copy = _setup(node)
    other = _second_namespace(node, "true")
    before = _points_of(other.pid)
    return {
        "vol": str(vol),
        "copy": str(copy),
        "copies_before": [p for p in before if p in (str(vol), str(copy))],
        "probe": node.probe(UID_A),
        "plain": _unmount(node, vol, lazy=False),
        "mounted_after": str(vol) in mount_points(),
        "copies_after": [p for p in _points_of(other.pid) if p in (str(vol), str(copy))],
    }


if __name__ == "__main__":
    sys.exit(main(scenarios_in(globals())))
