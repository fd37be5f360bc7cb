"""Who waits on a mount without holding it (issue #25): a task blocked in a system call on
a path through the mount — typically the kubelet's own `stat` or `umount` of a hung NFS
mount point. It has no file open there and its working directory is elsewhere, so the
holder scan (`unstick.agent.holders`) does not see it, yet a plain umount of that mount
would hang with it.

Found from `<host-proc>` only, never touching the mount:

1. every task (thread) of every process whose `stat` state is `D`, or `S` waiting in a
   FUSE client function (`WAIT_FUNCTIONS`, below: FUSE's request wait is interruptible
   at first) — the latter only when one of the mounts asked about is FUSE;
2. its current system call, `<task>/syscall` (number and arguments while it is blocked):
   only the calls that look a path up (`stat`, `openat`, `statx`, `umount2`, `rename`'s
   two, ...), from this machine's table (`unstick.agent.syscall_paths`: x86_64, aarch64;
   any other machine: nothing is found);
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
   `unstick.core.mount_identity.uses`), never as text across namespaces.

A task that exits or changes meanwhile is simply not counted. One in a path lookup whose
path cannot be told (unreadable, in an unsafe mapping, with `..`) is not named either, but
`scan_waiters` lists it as unknown, with the targets whose filesystem its namespace has a
mount of: an unmount's check then cannot tell, and refuses (agent/stepchecks.py), and the
probe lists those mounts in `waitersUnknown` (agent/hung_mounts.py).
"""

from __future__ import annotations

import contextlib
import os
import platform
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from unstick.agent.holders_proc import PARSED, list_pids, own_pid
from unstick.agent.pod_tasks import read_small
from unstick.agent.syscall_paths import PATH_CALLS
from unstick.core.hung_mounts import family
from unstick.core.mount_identity import MountTable, overlaps, relative, uses
from unstick.core.mountinfo import Mount, MountinfoError

PATH_MAX = 4096
AT_FDCWD = -100
MAX_WAITERS = 16

#: Kernel functions a task waits in for its filesystem's server, per family (wchan, or a
#: line of /proc/<pid>/stack): a prefix match.
WAIT_FUNCTIONS: dict[str, tuple[str, ...]] = {
    # the client side only: a FUSE daemon idle in fuse_dev_do_read (a sidecar of the pod,
    # say) waits for requests, not for an answer
    "fuse": ("request_wait_answer", "fuse_get_req", "fuse_wait_on_", "__fuse_simple_request"),
    "nfs": ("rpc_wait_bit_killable", "nfs", "rpc_", "__rpc_", "xprt_"),
    "cifs": ("wait_for_response", "cifs_", "smb2_", "compound_send_recv"),
    "ceph": ("ceph_", "ceph_mdsc_", "__ceph_"),
    "9p": ("p9_",),
}


def waits_in(fam: str, wchan: str, stack: tuple[str, ...]) -> str | None:
    """The kernel function (wait channel, else a stack line) where a sleeping task waits for
    the family's server, None when it does not."""
    prefixes = WAIT_FUNCTIONS.get(fam, ())
    return next((fn for fn in (wchan, *stack) if fn and fn.startswith(prefixes)), None)


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


def parse_syscall(text: str) -> tuple[int, tuple[int, ...]] | None:
    """(number, six arguments) of a `<task>/syscall` line; None when it runs or is blocked
    outside a system call."""
    parts = text.split()
    if len(parts) < 7 or not parts[0].isdigit():
        return None
    try:
        return int(parts[0]), tuple(int(a, 16) for a in parts[1:7])
    except ValueError:
        return None


def signed(value: int) -> int:
    """A 64-bit register as a signed int (the dirfd AT_FDCWD is -100)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def lexical(path: str) -> str | None:
    """`path` with `.` and repeated `/` removed; None when it has `..` (never resolved)."""
    if not path.startswith("/") or ".." in path.split("/"):
        return None
    return posixpath.normpath(path).replace("//", "/")


def safe_devices(mountinfo: str) -> set[str]:
    """`major:minor` of the local filesystems of a mount table: only a file mapped from one
    of them is read (a page of a network/FUSE file may have to come from a dead server; a
    device the table does not show may be a hung mount detached since)."""
    local: set[str] = set()
    remote: set[str] = set()
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        parts = fields.split()
        if len(parts) > 2 and tail:
            is_remote = family(tail.split(" ", 1)[0]) is not None
            (remote if is_remote else local).add(parts[2])
    return local - remote


def readable(maps: str, address: int, safe: set[str]) -> int:
    """How many bytes from `address` may be read: up to the end of its mapping (at most
    PATH_MAX), if that is anonymous or a file on a device in `safe` (0 otherwise)."""
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5 or "-" not in parts[0]:
            continue
        start, end = (int(x, 16) for x in parts[0].split("-", 1))
        if not start <= address < end:
            continue
        device = ":".join(str(int(x, 16)) for x in parts[3].split(":"))
        if parts[4] != "0" and device not in safe:
            return 0
        return min(end - address, PATH_MAX)
    return 0


def raw(path: str, limit: int = 1024) -> bytes:
    """The first bytes of a /proc file, b"" when unreadable (one open and read: every task
    of the node is looked at, most only for its state)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, limit)
        finally:
            os.close(fd)
    except OSError:
        return b""


def task_state(path: str) -> tuple[str, str]:
    """(comm, state letter) of a `stat` file, ("", "") when unreadable."""
    data = raw(path)
    start, end = data.find(b"("), data.rfind(b")")
    if start < 0 or end < start:
        return "", ""
    return data[start + 1 : end].decode(errors="replace"), data[end + 2 : end + 3].decode()


class _Reader:
    """One pass over `<host-proc>` for waiters on `targets`."""

    def __init__(self, host_proc: str, targets: Sequence[Mount]) -> None:
        self.proc = host_proc
        self.targets = list(targets)
        self.devices = frozenset((t.major, t.minor) for t in self.targets)
        self.fuse = any(family(t.fstype) == "fuse" for t in self.targets)
        self.calls = PATH_CALLS.get(platform.machine(), {})

    def candidate(self, pid: int, tid: int) -> tuple[str, str, str] | None:
        """(comm, state, wchan) of a task in D, or in S in a FUSE client wait."""
        base = f"{self.proc}/{pid}/task/{tid}"
        comm, state = task_state(f"{base}/stat")
        if state not in ("D", "S") or (state == "S" and not self.fuse):
            return None
        wchan = raw(f"{base}/wchan", 256).decode(errors="replace").strip()
        wchan = "" if wchan == "0" else wchan
        if state == "S" and waits_in("fuse", wchan, ()) is None:
            return None
        return comm, state, wchan

    def paths_of(self, pid: int, tid: int) -> tuple[tuple[str, ...], str]:
        """(the paths the task's current system call looks up, as the process names them,
        "") or ((), why they cannot be told — "" when the task is in no path lookup, or
        moved on meanwhile: then it is simply not counted)."""
        base = f"{self.proc}/{pid}/task/{tid}"
        line = read_small(f"{base}/syscall", 512)
        if line is None:  # gone, or not ours to read (no CAP_SYS_PTRACE): cannot tell
            return (), "" if not os.path.isdir(base) else "its system call could not be read"
        call = parse_syscall(line)
        where = self.calls.get(call[0]) if call else None
        if call is None or where is None:
            return (), ""
        safe = safe_devices(read_small(f"{self.proc}/{pid}/mountinfo", 1 << 24) or "")
        texts = [self.string(pid, call[1][at], safe) for _, at in where]
        if read_small(f"{base}/syscall", 512) != line:
            return (), ""  # it moved on (or exited) meanwhile
        paths = []
        for (dirfd_at, _), text in zip(where, texts, strict=True):
            if text is None:
                return (), f"system call {call[0]}: its path could not be read"
            dirfd = AT_FDCWD if dirfd_at is None else signed(call[1][dirfd_at])
            path, why = self.absolute(f"{pid}/task/{tid}", text, dirfd)
            if path is None:
                return (), why
            paths.append(path)
        return tuple(paths), ""

    def absolute(self, task: str, text: str, dirfd: int) -> tuple[str | None, str]:
        """A path argument from the process's root, lexically (a relative one from its cwd or
        dirfd, an empty one the dirfd itself); else (None, why it cannot be told)."""
        if not text.startswith("/"):
            pid = task.split("/", 1)[0]
            at = f"{task}/cwd" if dirfd == AT_FDCWD else f"{pid}/fd/{dirfd}"
            start = self.link(int(pid), f"{self.proc}/{at}")
            if start is None:
                return None, f"the directory its relative path {text!r} starts from is unknown"
            text = posixpath.join(start, text) if text else start
        path = lexical(text)
        return (path, "") if path else (None, f"its path {text!r} is not resolved (`..`)")

    def link(self, pid: int, link: str) -> str | None:
        """A cwd/fd link of the process, from its root as its own paths are (None when the
        root cannot be read or the link lies outside it: then it cannot be told)."""
        try:
            start, root = os.readlink(link), os.readlink(f"{self.proc}/{pid}/root")
        except OSError:
            return None
        return relative(start, root) if root.startswith("/") else None

    def string(self, pid: int, address: int, safe: set[str]) -> str | None:
        """The NUL-terminated string at `address` in the process (see the module doc)."""
        size = readable(read_small(f"{self.proc}/{pid}/maps", 1 << 24) or "", address, safe)
        if size <= 0:
            return None
        try:
            fd = os.open(f"{self.proc}/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = os.pread(fd, size, address)
            finally:
                os.close(fd)
        except (OSError, OverflowError):
            return None
        end = data.find(b"\0")
        return None if end < 0 else os.fsdecode(data[:end])  # "": the dirfd itself

    def table(self, pid: int) -> MountTable | None:
        """The process's own mount table (its targets' devices parsed in full)."""
        ns = f"pid:{pid}"
        with contextlib.suppress(OSError):
            ns = os.readlink(f"{self.proc}/{pid}/ns/mnt")
        text = read_small(f"{self.proc}/{pid}/mountinfo", 1 << 24)
        if not text:
            return None
        try:
            return PARSED.table(ns, text, self.devices)
        except MountinfoError:
            return None

    def mounts_of(self, pid: int, path: str) -> list[str]:
        """The targets `path` (in the process's namespace) lies in, by mount identity."""
        table = self.table(pid)
        mounts = table.containing(path) if table else ()
        return [t.mount_point for t in self.targets if any(uses(m, path, t) for m in mounts)]

    def reach(self, pid: int) -> list[str]:
        """The targets whose filesystem the process's namespace has a mount of (all when its
        table is unreadable): only a path it looks up there can lie in one."""
        table = self.table(pid)
        if table is None:
            return [t.mount_point for t in self.targets]
        return [t.mount_point for t in self.targets if any(overlaps(m, t) for m in table.mounts)]

    def named(
        self, found: list[Waiter], pid: int, tid: int, task: tuple[str, str, str], path: str
    ) -> list[Waiter]:
        """The waiters one task is, one per target its path lies in (at most MAX_WAITERS per
        target, one per process and target, counting those `found`)."""
        out: list[Waiter] = []
        for point in self.mounts_of(pid, path):
            same = [w for w in (*found, *out) if w.mount_point == point]
            if len(same) >= MAX_WAITERS or any(w.pid == pid for w in same):
                continue
            comm = (read_small(f"{self.proc}/{pid}/comm", 64) or task[0]).strip()
            out.append(Waiter(pid, tid, comm, task[1], task[2], path, point))
        return out

    def tasks(self, pid: int) -> list[int]:
        try:
            return sorted(int(t) for t in os.listdir(f"{self.proc}/{pid}/task") if t.isdigit())
        except OSError:
            return []


@dataclass(frozen=True, slots=True)
class WaiterScan:
    waiters: list[Waiter]
    unknown: list[str]  # blocked tasks that could reach a target, their path unread
    unsure: tuple[str, ...] = ()  # the targets those could wait on (mount points, as asked)


def mount_waiters(host_proc: str, targets: Iterable[Mount]) -> list[Waiter]:
    """The tasks blocked looking up a path through one of `targets` (see `scan_waiters`)."""
    return scan_waiters(host_proc, targets).waiters


def scan_waiters(host_proc: str, targets: Iterable[Mount]) -> WaiterScan:
    """The tasks blocked looking up a path through one of `targets` (at most MAX_WAITERS
    per mount, one per process and mount), by pid (see the module doc); and the blocked
    tasks in a path lookup whose path could not be read, in a namespace that has a mount
    of a target's filesystem (an unmount's check counts them: it cannot tell), with those
    targets. A `host_proc` that does not show every process makes every target unsure."""
    reader = _Reader(host_proc, list(targets))
    if not reader.targets or not reader.calls:
        return WaiterScan([], [])
    pids, blind = list_pids(host_proc)
    if blind:
        return WaiterScan([], [blind], tuple(t.mount_point for t in reader.targets))
    own = own_pid(host_proc)
    out: list[Waiter] = []
    unknown: list[str] = []
    unsure: dict[str, None] = {}
    for pid in pids:
        for tid in reader.tasks(pid) if pid != own else ():
            task = reader.candidate(pid, tid)
            paths, why = reader.paths_of(pid, tid) if task else ((), "")
            if task is None or not (paths or why):
                continue
            if why:
                reach = reader.reach(pid)
                if reach and len(unknown) < MAX_WAITERS:
                    unknown.append(f"pid {pid} ({task[0]}) in {task[2] or 'D state'}: {why}")
                unsure |= dict.fromkeys(reach)
                continue
            for path in paths:
                out.extend(reader.named(out, pid, tid, task, path))
    return WaiterScan(out, unknown, tuple(unsure))
