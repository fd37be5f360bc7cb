"""What keeps a pod's processes from dying: tasks in uninterruptible sleep (state `D`) and
frozen cgroups. Evidence only — nothing here changes anything.

Both start from the pod's processes as the cgroup scan found them
(`unstick.agent.probe.containers.scan_cgroups`: every process whose cgroup names the pod).

- D tasks: `<host-proc>/<pid>/stat` state `D`, with `comm`, the wait channel
  (`<host-proc>/<pid>/wchan`, the kernel function it sleeps in) and, where readable, the
  first lines of `<host-proc>/<pid>/stack` (function names, addresses dropped).
- Frozen cgroups: for each cgroup of those processes, and their ancestors up to the pod's
  own cgroup, the freezer state — cgroup v1 `freezer.state` (FROZEN / FREEZING; THAWED is
  not reported) with `freezer.self_freezing`, cgroup v2 `cgroup.events` `frozen 1`
  (FROZEN) or `cgroup.freeze` 1 without it (FREEZING). Where a cgroup path is in the
  filesystem comes from a mount table (each cgroup mount's root and mount point): the
  host's, through `<host-proc>/1/root`, where the agent may enter it, else the agent's own;
  a cgroup outside every mount the agent sees is a blind spot, never "not frozen".

The node step `thaw` (agent/steps/thaw.py) thaws one of these cgroups after a fresh scan.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from unstick.agent.probe.containers import Member
from unstick.core.model.mountinfo import MountinfoError, parse_mountinfo
from unstick.core.model.probe import DTask, FrozenCgroup

MAX_TASKS = 16  # the Remediation CRD's bounds (probe.dTasks, probe.frozenCgroups)
MAX_STACK_LINES = 4
MAX_FROZEN = 64
MAX_CHARS = 256
V1, V2 = "v1", "v2"
FROZEN, FREEZING = "FROZEN", "FREEZING"
_STACK_ADDR = re.compile(r"^\[<[0-9a-fx]+>\]\s*")


def read_small(path: str, limit: int = 4096) -> str | None:
    """The first `limit` characters of a small /proc file; None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return None


def stat_state(text: str) -> tuple[str, str] | None:
    """(comm, state) from a /proc/<pid>/stat line: comm is in the last parentheses."""
    start, end = text.find("("), text.rfind(")")
    if start < 0 or end < start:
        return None
    rest = text[end + 1 :].split()
    return (text[start + 1 : end], rest[0]) if rest else None


def _stack(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    lines = [_STACK_ADDR.sub("", line).strip()[:MAX_CHARS] for line in text.splitlines()]
    return tuple(line for line in lines if line)[:MAX_STACK_LINES]


def d_tasks(host_proc: str, members: Iterable[Member]) -> list[DTask]:
    """The pod's processes in uninterruptible sleep (at most MAX_TASKS), by pid."""
    out: list[DTask] = []
    for m in sorted(members, key=lambda m: m.pid):
        base = os.path.join(host_proc, str(m.pid))
        parsed = stat_state(read_small(os.path.join(base, "stat")) or "")
        if parsed is None or parsed[1] != "D":
            continue
        wchan = (read_small(os.path.join(base, "wchan"), MAX_CHARS) or "").strip()
        stack = _stack(read_small(os.path.join(base, "stack")))
        out.append(DTask(m.pid, parsed[0], m.container, wchan if wchan != "0" else "", stack))
        if len(out) >= MAX_TASKS:
            break
    return out


@dataclass(frozen=True, slots=True)
class CgroupMount:
    version: str
    root: str  # the cgroup path mounted there
    mount_point: str


def _cgroup_mounts(mountinfo_path: str, prefix: str) -> list[CgroupMount]:
    text = read_small(mountinfo_path, 1 << 24) or ""
    # only the cgroup lines are parsed: a node's table can hold thousands of mounts
    lines = [line for line in text.splitlines() if " - cgroup" in line]
    try:
        mounts = parse_mountinfo("\n".join(lines))
    except MountinfoError:
        return []
    out = []
    for m in mounts:
        where = prefix + m.mount_point
        if m.fstype == "cgroup2":
            out.append(CgroupMount(V2, m.root, where))
        elif m.fstype == "cgroup" and "freezer" in m.super_options:
            out.append(CgroupMount(V1, m.root, where))
    return [m for m in out if os.path.isdir(m.mount_point)]


def cgroup_mounts(host_proc: str) -> list[CgroupMount]:
    """The v1 freezer and v2 mounts: the host's (PID 1's mount table, reached through
    `<host-proc>/1/root`) where the agent can enter them, else the agent's own."""
    host = os.path.join(host_proc, "1")
    return _cgroup_mounts(os.path.join(host, "mountinfo"), os.path.join(host, "root")) or (
        _cgroup_mounts("/proc/self/mountinfo", "")
    )


HYBRID, NO_FREEZER = "hybrid", "none"  # with V1, V2: the probe's CGROUP_LAYOUTS


def cgroup_layout(mounts: list[CgroupMount]) -> str:
    """What the freezer the agent sees is: `v2` (cgroup2 only: the unified hierarchy of a
    cgroup v2 node), `hybrid` (the v1 freezer and a cgroup2 mount, as systemd's hybrid
    mode), `v1`, or `none` (neither mounted where the agent looks: every freezer state is a
    blind spot)."""
    versions = {m.version for m in mounts}
    if versions == {V1, V2}:
        return HYBRID
    return versions.pop() if versions else NO_FREEZER


def cgroup_driver(members: Iterable[Member], pod: re.Pattern[str]) -> str | None:
    """How the pod's cgroups are named: `systemd` (`kubepods-…-pod<uid>.slice`), `cgroupfs`
    (`pod<uid>`), or None when no process of the pod was seen."""
    for m in members:
        for line in m.cgroups:
            for part in line.split(":", 2)[-1].split("/"):
                if pod.match(part):
                    return "systemd" if part.endswith(".slice") else "cgroupfs"
    return None


def cgroup_dir(path: str, version: str, mounts: list[CgroupMount]) -> str | None:
    for m in mounts:
        root = m.root.rstrip("/")
        if m.version == version and (path == m.root or path.startswith(root + "/")):
            return m.mount_point.rstrip("/") + path[len(root) :]
    return None


def _pod_paths(members: Iterable[Member], pod: re.Pattern[str]) -> dict[tuple[str, str], str]:
    """(version, cgroup path) → container id: each member's freezer/v2 cgroup and its
    ancestors up to the pod's own cgroup."""
    out: dict[tuple[str, str], str] = {}
    for m in members:
        for line in m.cgroups:
            hid, controllers, path = [*line.split(":", 2), "", ""][:3]
            version = V2 if hid == "0" and controllers == "" else V1
            if version == V1 and "freezer" not in controllers.split(","):
                continue
            parts = path.split("/")
            top = next((i for i, p in enumerate(parts) if pod.match(p)), None)
            if top is None:
                continue
            for i in range(top + 1, len(parts) + 1):
                out.setdefault((version, "/".join(parts[:i])), m.container if i > top + 1 else "")
    return out


def _normal(path: str) -> bool:
    """An absolute cgroup path with no empty, `.` or `..` component (a process in another
    cgroup namespace than the agent's shows `..` components: never followed)."""
    parts = path.split("/")
    return parts[0] == "" and all(p not in ("", ".", "..") for p in parts[1:])


def _v1_state(directory: str) -> tuple[str | None, bool | None]:
    state = read_small(os.path.join(directory, "freezer.state"), 64)
    own = read_small(os.path.join(directory, "freezer.self_freezing"), 8)
    return (state.strip() if state else None), (None if own is None else own.strip() == "1")


def _v2_state(directory: str) -> tuple[str | None, bool | None]:
    events = read_small(os.path.join(directory, "cgroup.events"), 256)
    own = read_small(os.path.join(directory, "cgroup.freeze"), 8)
    if events is None:
        return None, None
    self_frozen = None if own is None else own.strip() == "1"
    if "frozen 1" in events.splitlines():
        return FROZEN, self_frozen
    return (FREEZING if self_frozen else "THAWED"), self_frozen


def frozen_cgroups(
    members: Iterable[Member], pod: re.Pattern[str], mounts: list[CgroupMount]
) -> tuple[list[FrozenCgroup], list[str]]:
    """(the pod's FROZEN/FREEZING cgroups, what could not be read)."""
    frozen: list[FrozenCgroup] = []
    blind: list[str] = []
    for (version, path), container in sorted(_pod_paths(members, pod).items()):
        if not _normal(path):  # e.g. "/../../kubepods/…" from another cgroup namespace
            blind.append(f"cgroup path {path} ({version}) is not a plain path from the root")
            continue
        directory = cgroup_dir(path, version, mounts)
        if directory is None:
            blind.append(f"freezer state of cgroup {path} ({version}): not under a cgroup mount")
            continue
        state, own = (_v1_state if version == V1 else _v2_state)(directory)
        if state is None:
            blind.append(f"freezer state of cgroup {path} ({version}): unreadable")
        elif state in (FROZEN, FREEZING):
            frozen.append(FrozenCgroup(path, state, version, container, own))
    return frozen[:MAX_FROZEN], blind
