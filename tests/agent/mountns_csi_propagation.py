"""A CSI plugin that mounts inside its own mount namespace, run INSIDE a private mount
namespace by conftest (`run_scenario(name, workdir, script=CSI_PROPAGATION)`).

The layout of the real node (tests/node/test_seed_csi_orphaned_mount.py): the node's
directory is an rshared mount and the kubelet root a directory on it; a data tmpfs of the
driver's beside it. Each "pod" that mounts the kubelet root with Bidirectional propagation
is a process in its own mount namespace (`unshare -m --propagation unchanged`) with an
rbind of the kubelet root at `<work>/ctr/<name>/kubelet`, made rshared (a container's
root is a private mount, `<work>/ctr`, as runc makes it). The plugin stages the volume
(a bind of `<data>/vol-seed` on `<kubeletRoot>/plugins/.../globalmount`) and publishes it
(a bind of the staging path on the pod's target) in its namespace; both propagate to the
host and to the agent's namespace. Then the plugin restarts (a new namespace, which gets
the copies by its rbind) and nobody uses the mount: the kubelet keeps the staging mount
(its UnmountDevice refuses while the target is still mounted: "still mounted by other
references"), and the copies of it in the pods' namespaces are at another path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.agent.mountns_scenarios import UID_A, Node, main, scenarios_in, sh
from unstick.agent.holders.scan import scan_holders
from unstick.core.model.mountinfo import parse_mountinfo

STAGING = "plugins/kubernetes.io/csi/seed.csi.unstick.dev/0123abcd/globalmount"


class Csi:
    """The node's layout and the pods' namespaces (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.ctr = node.work / "ctr"
        self.ctr.mkdir()
        sh("mount", "-t", "tmpfs", "ctr", str(self.ctr))  # private: the containers' roots
        sh("mount", "--make-shared", str(node.work))
        self.data = node.work / "csi-seed"
        self.data.mkdir()
        sh("mount", "-t", "tmpfs", "csi-seed", str(self.data))  # shared, under the node dir
        (self.data / "vol-seed").mkdir()
        (self.data / "vol-seed" / "file").write_text("kept\n")
        (node.root / STAGING).mkdir(parents=True)
        self.target = node.csi_volume(UID_A, "seed-pv", "vol-seed", bind=False)
        self.rel = self.target.relative_to(node.root)

    def pod(self, name: str, then: str = "true") -> subprocess.Popen[str]:
        """A pod's namespace with the kubelet root (Bidirectional) at ctr/<name>/kubelet and
        the data dir private (no propagation), which runs `then` with {kr} its kubelet root."""
        kr = self.ctr / name / "kubelet"
        script = (
            f"mkdir -p {kr}; mount --rbind {self.node.root} {kr}; "
            f"mount --make-rshared {kr}; mount --make-rprivate {self.data}; "
            f"{then.format(kr=kr, data=self.data, ctr=self.ctr / name)}"
        )
        return self.node.in_own_namespace(script, f"pod namespace {name}")

    def publish(self, stage: bool) -> None:
        """The plugin stages and publishes in its namespace, then restarts (state lost)."""
        source = f"{{kr}}/{STAGING}" if stage else "{data}/vol-seed"
        steps = f"mount --bind {{data}}/vol-seed {{kr}}/{STAGING}; " if stage else ""
        plugin = self.pod("plugin", f"{steps}mount --bind {source} {{kr}}/{self.rel}")
        self.node.stop(plugin)

    def lines(self, pid: int | str) -> list[str]:
        """The mountinfo lines of `pid` for the data tmpfs and the kubelet root binds."""
        text = Path(f"/proc/{pid}/mountinfo").read_text()
        dev = next(
            f"{m.major}:{m.minor}"
            for m in parse_mountinfo(Path("/proc/self/mountinfo").read_text())
            if m.mount_point == str(self.data)
        )
        keep = (f" {dev} ", f" {self.node.work} ", f" {self.node.root} ", "/kubelet ")
        return [line for line in text.splitlines() if any(k in line for k in keep)]

    def copies(self, pid: int) -> list[str]:
        """Where `pid`'s namespace shows the pod's target (at any kubelet root)."""
        text = Path(f"/proc/{pid}/mountinfo").read_text()
        points = [m.mount_point for m in parse_mountinfo(text)]
        return [p for p in points if p.endswith("/" + str(self.rel))]


def _unmount(node: Node, target: Path) -> dict[str, str]:
    return (
        node.executor()
        .run_step(UID_A, "unmount", str(target), dry_run=False, lazy_unmount=False)
        .to_json()
    )


def _case(node: Node, stage: bool, plugin_then: str = "true") -> dict[str, Any]:
    csi = Csi(node)
    agent = csi.pod("agent")
    csi.publish(stage)
    plugin = csi.pod("plugin2", plugin_then)
    mounts = [
        m
        for m in parse_mountinfo(Path("/proc/self/mountinfo").read_text())
        if m.mount_point == str(csi.target)
    ]
    scan = scan_holders("/proc", mounts, kubelet_root=str(node.root))
    result: dict[str, Any] = {
        "target": str(csi.target),
        "pids": {"agent": agent.pid, "plugin": plugin.pid},
        "mountinfo": {
            "host": csi.lines("self"),
            "agent": csi.lines(agent.pid),
            "plugin": csi.lines(plugin.pid),
        },
        "scan": {"holders": [h.to_json() for h in scan.holders], "unknown": scan.unknown},
        "probe": node.probe(UID_A),
        "copies_before": {"agent": csi.copies(agent.pid), "plugin": csi.copies(plugin.pid)},
        "unmount": _unmount(node, csi.target),
    }
    result["copies_after"] = {
        "host": csi.copies(os.getpid()),
        "agent": csi.copies(agent.pid),
        "plugin": csi.copies(plugin.pid),
    }
    result["staging_after"] = str(node.root / STAGING) in Path("/proc/self/mountinfo").read_text()
    return result


def scenario_orphan_staged(node: Node) -> dict[str, Any]:
    """The real node's case: staged and published by the plugin, nobody uses it."""
    return _case(node, stage=True)


def scenario_orphan_unstaged(node: Node) -> dict[str, Any]:
    """Published straight from the data dir (no staging mount): only same-path copies."""
    return _case(node, stage=False)


def scenario_fd_in_plugin(node: Node) -> dict[str, Any]:
    """(a) the restarted plugin holds a file open under its copy of the target."""
    return _case(node, stage=True, plugin_then="exec 3< {kr}/" + _rel() + "/file")


def scenario_bind_in_plugin(node: Node) -> dict[str, Any]:
    """(b) the restarted plugin binds its copy of the target at another path."""
    then = "mkdir -p {ctr}/backup; mount --bind {kr}/" + _rel() + " {ctr}/backup"
    return _case(node, stage=True, plugin_then=then)


def _rel() -> str:
    return f"pods/{UID_A}/volumes/kubernetes.io~csi/seed-pv/mount"


if __name__ == "__main__":
    sys.exit(main(scenarios_in(globals())))
