"""Safety scenarios with real mounts, run INSIDE a private mount namespace by conftest
(`run_scenario(name, workdir, script=SAFETY)`), like mountns_scenarios.py:

- `lazy`: when MNT_DETACH may follow an EBUSY (only after a complete holder scan that finds
  nobody), and that an incomplete scan refuses both plain and lazy unmount;
- `requests`: stale requests and requests for a pod that is not overdue-Terminating never
  unmount anything (the pod lookup is a callable here: no API server in a mount namespace).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import unstick.agent.steps.unmount as unmount_module
from devcluster.process import wait_until
from tests.agent.mountns_scenarios import (
    UID_A,
    Node,
    main,
    mount_points,
    recording_handler,
    scenarios_in,
    steps_request,
    terminating_pod,
)
from unstick.agent.steps.executor import Executor

# Holds a file of the mount without any process having it open: the fd is in flight in a
# unix socket's queue (SCM_RIGHTS). No cwd/root/fd/maps/mountns of any process shows it.
IN_FLIGHT = """
import os, socket, sys, time
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
fd = os.open(sys.argv[1], os.O_RDONLY)
socket.send_fds(a, [b"x"], [fd])
os.close(fd)
print("ready", flush=True)
time.sleep(600)
"""


def _cwd_in(pid: int, path: Path) -> bool:
    try:
        return Path(f"/proc/{pid}/cwd").readlink() == path
    except OSError:
        return False


def _hold_in_flight(node: Node, mount: Path) -> None:
    """A file of `mount` held by no process: its fd in flight in a unix socket (IN_FLIGHT)."""
    holder = node.start(
        sys.executable,
        "-c",
        IN_FLIGHT,
        str(mount / "token"),
        cwd=node.work,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"


@contextmanager
def _umount2_hooked(hook: Callable[[Callable[..., None], str, int], None]) -> Iterator[None]:
    """The unmount step's umount2 replaced by `hook(real_umount2, path, flags)` meanwhile."""
    real = unmount_module.umount2

    def hooked(path: str, flags: int = 0) -> None:
        hook(real, path, flags)

    unmount_module.umount2 = hooked  # type: ignore[assignment]
    try:
        yield
    finally:
        unmount_module.umount2 = real


def _a_user_appears_first(node: Node, cwd: Path) -> Callable[[Callable[..., None], str, int], None]:
    """A hook (`_umount2_hooked`): before the first umount2, a process starts in `cwd`
    (between the agent's checks and its act)."""
    users: list[int] = []

    def hook(real: Callable[..., None], path: str, flags: int) -> None:
        if not users:
            proc = node.start("sleep", "600", cwd=cwd)
            users.append(proc.pid)
            wait_until(lambda: _cwd_in(proc.pid, cwd), timeout=20, what=f"a process in {cwd}")
        real(path, flags)

    return hook


def scenario_lazy(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ex = node.executor()

    def unmount(executor: Executor, vol: Path, lazy: bool) -> dict[str, str]:
        return executor.run_step(
            UID_A, "unmount", str(vol), dry_run=False, lazy_unmount=lazy
        ).to_json()

    # 1. A process holds the mount, but the agent's /proc is blind (an empty dir here,
    #    a /proc without the agent in it without hostPID): unknown -> refused, plain and lazy.
    blind = node.work / "empty-proc"
    blind.mkdir()
    blind_ex = Executor(replace(node.settings, host_proc=str(blind)))
    held = node.projected(UID_A, "held")
    sleeper = node.start("sleep", "600", cwd=held)
    wait_until(lambda: _cwd_in(sleeper.pid, held), timeout=20, what="the holder's cwd")
    out["blind_plain"] = unmount(blind_ex, held, False)
    out["blind_lazy"] = unmount(blind_ex, held, True)
    out["held_still_mounted"] = str(held) in mount_points()

    # 2. EBUSY from a hold that is not a process (an fd in flight); the scan is complete
    #    and finds nobody: plain unmount fails with EBUSY, lazy detaches.
    inflight = node.projected(UID_A, "inflight")
    _hold_in_flight(node, inflight)
    out["inflight_plain"] = unmount(ex, inflight, False)
    out["inflight_mounted_after_plain"] = str(inflight) in mount_points()
    out["inflight_lazy"] = unmount(ex, inflight, True)
    out["inflight_mounted_after_lazy"] = str(inflight) in mount_points()

    # 3. A holder that appears between the agent's checks and its umount (started from a
    #    hook around umount2): EBUSY, the re-scan finds it, nothing is detached.
    racy = node.projected(UID_A, "racy")
    with _umount2_hooked(_a_user_appears_first(node, racy)):
        out["racy_lazy"] = unmount(ex, racy, True)
    out["racy_still_mounted"] = str(racy) in mount_points()

    # 4. EBUSY from an fd in flight, and between it and MNT_DETACH another mount is stacked
    #    on the same point (from a hook around the plain umount2): the detach would hit
    #    the new top mount, not the planned one; the mount is re-read first and refused.
    stacked = node.projected(UID_A, "stacked")
    _hold_in_flight(node, stacked)

    def then_a_mount_on_top(real: Callable[..., None], path: str, flags: int) -> None:
        try:
            real(path, flags)
        finally:
            if flags == 0:
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", "size=1m", "foreign", path], check=True
                )

    with _umount2_hooked(then_a_mount_on_top):
        out["stacked_lazy"] = unmount(ex, stacked, True)
    out["stacked_sources"] = [
        line.split(" - ")[1].split()[1]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4] == str(stacked)
    ]

    # 5. The unmount of one volume (target: that mount point) with a mount inside it: the
    #    plain umount2 fails with EBUSY (the submount), and a process starts using the
    #    submount between the checks and the umount2 (a hook, as in 3): MNT_DETACH would
    #    detach the whole subtree, the held submount with it: the re-scan counts it.
    outer = node.projected(UID_A, "outer")
    inner = outer / "inner"
    inner.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "inner", str(inner)], check=True)
    with _umount2_hooked(_a_user_appears_first(node, inner)):
        out["submount_lazy"] = unmount(ex, outer, True)
    out["submount_points"] = [p for p in mount_points() if p.startswith(str(outer))]
    return out


def scenario_requests(node: Node) -> dict[str, Any]:
    """unmount + rmdir-stale on a real mount: (a) requested 10 minutes ago, as after an
    agent restart; (b) fresh, for a pod in ContainerCreating (no deletionTimestamp);
    (c) fresh for the overdue Terminating pod: runs."""
    vol = node.projected(UID_A, "kube-api-access-x")
    answer: dict[str, Any] = {}

    def lookup(ns: str, name: str) -> dict[str, Any]:
        return answer["pod"]  # type: ignore[no-any-return]

    handler, patches = recording_handler(node, lookup)

    def request(key: str, requested: datetime) -> dict[str, Any]:
        handler.handle(steps_request(UID_A, ["unmount", "rmdir-stale"], requested, key))
        return {"patch": patches[-1], "mounted": str(vol) in mount_points(), "dir": vol.is_dir()}

    now = datetime.now(UTC)
    answer["pod"] = terminating_pod("default", "web-0")
    stale = request("r1", now - timedelta(minutes=10))
    creating = terminating_pod("default", "web-0")
    del creating["metadata"]["deletionTimestamp"]
    answer["pod"] = creating
    not_terminating = request("r2", now)
    answer["pod"] = terminating_pod("default", "web-0")
    fresh = request("r3", datetime.now(UTC))
    return {"stale": stale, "not_terminating": not_terminating, "fresh": fresh}


if __name__ == "__main__":
    sys.exit(main(scenarios_in(globals())))
