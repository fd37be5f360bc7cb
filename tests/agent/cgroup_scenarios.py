"""The agent on REAL cgroup hierarchies: run by tests/agent/test_cgroups_real.py as PID 1 of
a new PID namespace (its own /proc) inside a private mount namespace:

    unshare -m --propagation private  unshare -p --fork --mount-proc \\
        python cgroup_scenarios.py LAYOUT DRIVER WORKDIR TOP

As PID 1 with its own /proc, this process is the "host" the agent sees through
`--host-proc=/proc`: the agent finds the cgroup mounts in /proc/1/mountinfo (this mount
namespace's table) and reaches them through /proc/1/root, as on a node.

LAYOUT `v2`: /sys/fs/cgroup is replaced, in this mount namespace only, by one real cgroup2
mount (`mount -t cgroup2`): a cgroup-v2-only node's layout. The freeze needs no controller
(`cgroup.freeze` is core). LAYOUT `hybrid`: this machine's own tree (v1 controllers with
the freezer, cgroup2 at /sys/fs/cgroup/unified), the pods in the v1 freezer.
DRIVER `systemd` / `cgroupfs`: the pods' cgroups named as that kubelet cgroup driver names
them (containerd's `cri-containerd-<id>.scope` and CRI-O's `crio-<id>.scope` under
systemd; a bare `<id>` under cgroupfs), all below `<cgroup root>/TOP/`.

Pods: A (a container and its sandbox, each with a real process; the container frozen),
B (a container with a real process, frozen), C (its cgroups, no process). Prints one JSON
line. Whatever happens: every cgroup is thawed, every process killed by its pid, every
cgroup removed (deepest first) and the cgroup2 mount undone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tests.support.agent import node_under
from unstick.agent.probe.collect import probe_pod
from unstick.agent.probe.containers import pod_component, scan_cgroups, still_running
from unstick.agent.probe.pod_tasks import cgroup_driver, cgroup_layout, cgroup_mounts
from unstick.agent.steps.executor import Executor

UID_A = "aaaaaaaa-3737-4737-8737-aaaaaaaaaaaa"
UID_B = "bbbbbbbb-3737-4737-8737-bbbbbbbbbbbb"
UID_C = "cccccccc-3737-4737-8737-cccccccccccc"
CGROUP = Path("/sys/fs/cgroup")


def pod_cgroup(top: str, driver: str, uid: str) -> str:
    """The pod's cgroup path (burstable QoS) as the driver names it, below /TOP."""
    if driver == "systemd":
        u = uid.replace("-", "_")
        return f"/{top}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"
    return f"/{top}/kubepods/burstable/pod{uid}"


def container_cgroup(pod: str, driver: str, cid: str, runtime: str = "cri-containerd") -> str:
    return f"{pod}/{runtime}-{cid}.scope" if driver == "systemd" else f"{pod}/{cid}"


class Hierarchy:
    """The freezer of LAYOUT: where a cgroup path is, how to freeze and read it."""

    def __init__(self, layout: str) -> None:
        self.layout = layout
        self.root = CGROUP if layout == "v2" else CGROUP / "freezer"
        self.mounted = False

    def mount(self) -> None:
        if self.layout == "v2":
            # this mount namespace only (private): the host keeps its tree
            subprocess.run(["umount", "-R", str(CGROUP)], check=True)
            subprocess.run(["mount", "-t", "cgroup2", "none", str(CGROUP)], check=True)
            self.mounted = True

    def umount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(CGROUP)], check=True)
            self.mounted = False

    def dir(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def freeze(self, path: str, frozen: bool) -> None:
        if self.layout == "v2":
            (self.dir(path) / "cgroup.freeze").write_text("1" if frozen else "0")
        else:
            (self.dir(path) / "freezer.state").write_text("FROZEN" if frozen else "THAWED")

    def is_frozen(self, path: str) -> bool:
        if self.layout == "v2":
            events = (self.dir(path) / "cgroup.events").read_text().splitlines()
            return "frozen 1" in events
        return (self.dir(path) / "freezer.state").read_text().strip() == "FROZEN"

    def is_thawed(self, path: str) -> bool:
        if self.layout == "v2":
            events = (self.dir(path) / "cgroup.events").read_text().splitlines()
            return "frozen 0" in events
        return (self.dir(path) / "freezer.state").read_text().strip() == "THAWED"


def _empty(cgroup: Path) -> bool:
    return not (cgroup / "cgroup.procs").read_text().strip()


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll until `check()` is true (the state asserted next), else fail naming it."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def run(layout: str, driver: str, work: Path, top: str) -> dict[str, Any]:
    h = Hierarchy(layout)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    made: list[Path] = []
    pods = {uid: pod_cgroup(top, driver, uid) for uid in (UID_A, UID_B, UID_C)}
    a_app = container_cgroup(pods[UID_A], driver, "a1a1a1")
    a_pause = container_cgroup(pods[UID_A], driver, "a0a0a0")
    b_app = container_cgroup(pods[UID_B], driver, "b1b1b1", runtime="crio")
    c_app = container_cgroup(pods[UID_C], driver, "c1c1c1")
    try:
        h.mount()
        for path in (a_app, a_pause, b_app, c_app):
            h.dir(path).mkdir(parents=True)
        made.append(h.dir(f"/{top}"))
        for name, path in (("a_app", a_app), ("a_pause", a_pause), ("b_app", b_app)):
            proc = subprocess.Popen(["sleep", "600"])
            procs[name] = proc
            (h.dir(path) / "cgroup.procs").write_text(str(proc.pid))
        settings = node_under(work, pods=tuple(pods), grpc_timeout_s=2)
        mounts = cgroup_mounts("/proc")
        out: dict[str, Any] = {
            "layout": cgroup_layout(mounts),
            "mounts": [[m.version, m.root, m.mount_point] for m in mounts],
            "paths": {"a_app": a_app, "a_pause": a_pause, "b_app": b_app, "c_app": c_app},
            "pids": {name: p.pid for name, p in procs.items()},
            "running": {uid: still_running("/proc", uid, None) for uid in pods},
        }
        scan = scan_cgroups("/proc", UID_A)
        out["driver"] = cgroup_driver(scan.members, pod_component(UID_A))
        out["scan_a"] = sorted(c.id for c in scan.containers)
        out["scan_b"] = sorted(c.id for c in scan_cgroups("/proc", UID_B).containers)
        out["probe_before"] = probe_pod(settings, UID_A, plugins={})["frozenCgroups"]

        for path in (a_app, b_app):
            h.freeze(path, True)
        for path in (a_app, b_app):
            wait_for(partial(h.is_frozen, path), f"{path} frozen")
        probe = probe_pod(settings, UID_A, plugins={})
        keys = ("frozenCgroups", "runtime", "blindSpots", "cgroupLayout", "cgroupDriver")
        out["probe_a"] = {k: probe[k] for k in keys}
        out["probe_a_containers"] = sorted(c["id"] for c in probe["containers"])
        out["probe_b"] = probe_pod(settings, UID_B, plugins={})["frozenCgroups"]

        ex = Executor(settings)
        steps = {}
        steps["dry_run"] = ex.run_step(UID_A, "thaw", a_app, dry_run=True, lazy_unmount=False)
        out["a_frozen_after_dry_run"] = h.is_frozen(a_app)
        steps["other_pods"] = ex.run_step(UID_A, "thaw", b_app, dry_run=False, lazy_unmount=False)
        steps["not_frozen"] = ex.run_step(UID_A, "thaw", a_pause, dry_run=False, lazy_unmount=False)
        steps["thaw"] = ex.run_step(UID_A, "thaw", a_app, dry_run=False, lazy_unmount=False)
        out["steps"] = {k: {"result": r.result, "message": r.message} for k, r in steps.items()}
        wait_for(lambda: h.is_thawed(a_app), f"{a_app} thawed")
        out["after"] = {
            name: h.is_frozen(path)
            for name, path in (
                ("a_app", a_app),
                ("a_pause", a_pause),
                ("a_pod", pods[UID_A]),
                ("b_app", b_app),
            )
        }
        # the thawed process runs again: a SIGTERM (the runtime's kill) ends it
        procs["a_app"].terminate()
        out["a_app_exit"] = procs["a_app"].wait(timeout=30)
        out["probe_a_after"] = probe_pod(settings, UID_A, plugins={})["frozenCgroups"]
        return out
    finally:
        for path in (a_app, b_app):
            if h.dir(path).is_dir():
                h.freeze(path, False)
        for proc in procs.values():
            proc.kill()
            proc.wait()
        for top_dir in made:
            dirs = [d for d in top_dir.rglob("*") if d.is_dir()]
            for d in sorted(dirs, key=lambda d: -len(d.parts)):
                wait_for(partial(_empty, d), f"{d} empty")
                d.rmdir()
            top_dir.rmdir()
        h.umount()


def main() -> int:
    layout, driver, work, top = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    assert os.getpid() == 1, "run as PID 1 of a PID namespace of its own (unshare -p --fork)"
    print(json.dumps(run(layout, driver, work, top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
