"""Who waits on a mount without holding it: a task blocked in a system call on
a path through the mount — typically the kubelet's own `stat` or `umount` of a hung NFS
mount point. It has no file open there and its working directory is elsewhere, so the
holder scan (`unstick.agent.holders.scan`) does not see it, yet a plain umount of that mount
would hang with it.

Found from `<host-proc>` only, never touching the mount:

1. every task (thread) of every process whose `stat` state is `D`, or `S` waiting in a
   FUSE client function (`WAIT_FUNCTIONS`, below: FUSE's request wait is interruptible
   at first) — the latter only when one of the mounts asked about is FUSE;
2. its current system call, `<task>/syscall` (number and arguments while it is blocked):
   only the calls that look a path up (`stat`, `openat`, `statx`, `umount2`, `rename`'s
   two, ...), from this machine's table (`unstick.agent.probe.syscall_paths`: x86_64, aarch64;
   on any other machine every blocked task's path cannot be told: below);
3. each path string, read from `<pid>/mem` at the argument's address — at most PATH_MAX
   bytes, only from an anonymous mapping or a file mapping on a device that the process's
   mount table shows mounted with a local filesystem (a page of a file on a hung mount
   would hang the read itself; a device it does not show — a mount detached since, say —
   is not read either), and only when the task's `syscall` line is the same after the
   read (else it moved on: not counted);
4. a relative path is joined to the task's cwd (or the dirfd's link, read relative to
   the process's root; one outside it, or a root that cannot be read, is not told)
   lexically, an empty one is the dirfd itself (`fstatat(fd, "", AT_EMPTY_PATH)`); a
   path with `..` is not counted (a symlink before it could lead anywhere: never
   resolved);
5. the path is looked up in the process's own mount table (`/proc/<pid>/mountinfo`, paths
   relative to its root as the path is) and compared by mount identity (device and root,
   `unstick.core.model.mount_identity.uses`), never as text across namespaces.

A task that exits or changes meanwhile is simply not counted. One in a path lookup whose
path cannot be told (unreadable, in an unsafe mapping, with `..`) is not named either, but
`scan_waiters` lists it as unknown, with the targets whose filesystem its namespace has a
mount of: an unmount's check then cannot tell, and refuses (agent/steps/checks.py), and the
probe lists those mounts in `waitersUnknown` (agent/probe/hung_mounts.py).

One pass over the node's tasks serves every check that asked before it started
(`unstick.agent.probe.waiter_pass`, by the rule of the shared holder scans: a check never gets a
pass that started before it asked); which of its blocked tasks wait on a check's own
mounts is worked out per check, as above.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from unstick.agent.holders.proc import PARSED
from unstick.agent.probe.waiter_pass import (
    WAIT_FUNCTIONS,
    Blocked,
    _Reader,
    lexical,
    parse_syscall,
    readable,
    safe_devices,
    signed,
    task_pass,
    waits_in,
)
from unstick.core.model.mount_identity import MountTable, overlaps, uses
from unstick.core.model.mountinfo import Mount, MountinfoError
from unstick.core.rules.hung_mounts import family

__all__ = [
    "WAIT_FUNCTIONS",
    "Waiter",
    "WaiterScan",
    "_Reader",
    "lexical",
    "mount_waiters",
    "parse_syscall",
    "readable",
    "safe_devices",
    "scan_waiters",
    "signed",
    "waits_in",
]

MAX_WAITERS = 16


@dataclass(frozen=True, slots=True)
class Waiter:
    """A task blocked in a path lookup through one of the mounts."""

    pid: int  # the process (thread group)
    tid: int
    comm: str
    state: str  # D | S
    wchan: str
    path: str  # the path it looks up, as the process names it (from its root)
    mount_point: str  # the mount it waits on (the target's mount point, as asked)

    def words(self) -> str:
        """`pid 812 (kubelet) waits in request_wait_answer on /var/lib/...`."""
        return f"pid {self.pid} ({self.comm}) waits in {self.wchan or 'D state'} on {self.path}"


@dataclass(frozen=True, slots=True)
class WaiterScan:
    waiters: list[Waiter]
    unknown: list[str]  # blocked tasks that could reach a target, their path unread
    unsure: tuple[str, ...] = ()  # the targets those could wait on (mount points, as asked)


class _Match:
    """One check's targets, matched against the blocked tasks of a pass."""

    def __init__(self, targets: Sequence[Mount]) -> None:
        self.targets = list(targets)
        self.devices = frozenset((t.major, t.minor) for t in self.targets)

    def table(self, task: Blocked) -> MountTable | None:
        """The task's namespace's table as the pass read it (the targets' devices in full)."""
        if not task.table:
            return None
        try:
            return PARSED.table(task.ns, task.table, self.devices)
        except MountinfoError:
            return None

    def mounts_of(self, task: Blocked, path: str) -> list[str]:
        """The targets `path` (in the task's namespace) lies in, by mount identity."""
        table = self.table(task)
        mounts = table.containing(path) if table else ()
        return [t.mount_point for t in self.targets if any(uses(m, path, t) for m in mounts)]

    def reach(self, task: Blocked) -> list[str]:
        """The targets whose filesystem the task's namespace has a mount of (all when its
        table is unreadable): only a path it looks up there can lie in one."""
        table = self.table(task)
        if table is None:
            return [t.mount_point for t in self.targets]
        return [t.mount_point for t in self.targets if any(overlaps(m, t) for m in table.mounts)]

    def named(self, found: list[Waiter], task: Blocked, path: str) -> list[Waiter]:
        """The waiters one task is, one per target its path lies in (at most MAX_WAITERS per
        target, one per process and target, counting those `found`)."""
        out: list[Waiter] = []
        for point in self.mounts_of(task, path):
            same = [w for w in (*found, *out) if w.mount_point == point]
            if len(same) >= MAX_WAITERS or any(w.pid == task.pid for w in same):
                continue
            out.append(Waiter(task.pid, task.tid, task.name, task.state, task.wchan, path, point))
        return out


def mount_waiters(host_proc: str, targets: Iterable[Mount]) -> list[Waiter]:
    """The tasks blocked looking up a path through one of `targets` (see `scan_waiters`)."""
    return scan_waiters(host_proc, targets).waiters


def scan_waiters(host_proc: str, targets: Iterable[Mount]) -> WaiterScan:
    """The tasks blocked looking up a path through one of `targets` (at most MAX_WAITERS
    per mount, one per process and mount), by pid (see the module doc); and the blocked
    tasks in a path lookup whose path could not be read, in a namespace that has a mount
    of a target's filesystem (an unmount's check counts them: it cannot tell), with those
    targets. A `host_proc` that does not show every process makes every target unsure.
    The tasks are read by a pass that started after this call began (`waiter_pass`)."""
    match = _Match(list(targets))
    if not match.targets:
        return WaiterScan([], [])
    fuse = any(family(t.fstype) == "fuse" for t in match.targets)
    found = task_pass(host_proc, fuse)
    if found.blind:
        return WaiterScan([], [found.blind], tuple(t.mount_point for t in match.targets))
    out: list[Waiter] = []
    unknown: list[str] = []
    unsure: dict[str, None] = {}
    for task in found.tasks:
        if task.why:
            reach = match.reach(task)
            if reach and len(unknown) < MAX_WAITERS:
                unknown.append(
                    f"pid {task.pid} ({task.comm}) in {task.wchan or 'D state'}: {task.why}"
                )
            unsure |= dict.fromkeys(reach)
            continue
        for path in task.paths:
            out.extend(match.named(out, task, path))
    return WaiterScan(out, unknown, tuple(unsure))
