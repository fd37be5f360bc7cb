"""One pass over a node's tasks for the waiter checks (agent/probe/waiters.py): every task
blocked in a path lookup, with the paths it looks up (or why they cannot be told) and its
mount namespace's table, read once for every check that asked before the pass started.

What a pass reads is what a check's own scan read before, in the same order and with the
same rules (see mount_waiters' module doc): the task's `stat` state (and `wchan`), its
`syscall` line, the path strings from `<pid>/mem` only in anonymous memory or a file
mapping on a local device of its own table, the `syscall` line again (moved on: not
counted), then its namespace's table. Nothing here depends on the mounts asked about,
except whether a FUSE mount is among them (then tasks sleeping in a FUSE client wait are
read too: a pass of its own kind, `fuse=True`). Which of the blocked tasks wait on which
mount is worked out per check, from the pass, by mount identity (`mount_waiters`).

Shared by the rule of `scan_group.NextPass`: a check joins the next pass to start, never one
already running, so the pass it gets read every task after the check asked — as fresh as
a scan of its own. A pass is never reused once it ended.
"""

from __future__ import annotations

import contextlib
import os
import platform
import posixpath
from dataclasses import dataclass

from unstick.agent.holders.proc import list_pids, own_pid
from unstick.agent.holders.scan_group import NextPass
from unstick.agent.probe.pod_tasks import read_small
from unstick.agent.probe.syscall_paths import PATH_CALLS
from unstick.core.model.mount_identity import relative
from unstick.core.rules.hung_mounts import family

PATH_MAX = 4096
AT_FDCWD = -100

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


@dataclass(frozen=True, slots=True)
class Blocked:
    """A task blocked in a path lookup, as one pass read it."""

    pid: int
    tid: int
    comm: str  # the task's (from its stat)
    state: str  # D | S (S: in a FUSE client wait)
    wchan: str
    name: str  # the process's comm, as a waiter is named
    paths: tuple[str, ...]  # from the process's root, lexical; () when `why`
    why: str  # why its paths cannot be told ("" when they can)
    ns: str  # its mount namespace (the key of its parsed table)
    table: str | None  # its mountinfo text, read after its paths (None: unreadable)


@dataclass(frozen=True, slots=True)
class TaskPass:
    """Every blocked task of one pass, in pid and tid order; `blind`: why the pass cannot
    be trusted to have seen every process (then nothing else is read)."""

    tasks: tuple[Blocked, ...]
    blind: str | None = None


class _Reader:
    """The reads of one pass over `<host-proc>` (targets play no part in them)."""

    def __init__(self, host_proc: str, fuse: bool = True) -> None:
        self.proc = host_proc
        self.fuse = fuse
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
        if not self.calls:  # no table for this machine: any blocked task may be in a lookup
            return (), f"no system call table for {platform.machine()}: its path cannot be told"
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

    def tasks(self, pid: int) -> list[int]:
        try:
            return sorted(int(t) for t in os.listdir(f"{self.proc}/{pid}/task") if t.isdigit())
        except OSError:
            return []

    def blocked(self, pid: int, tid: int) -> Blocked | None:
        """The task, when it is blocked in a path lookup (told or not)."""
        task = self.candidate(pid, tid)
        paths, why = self.paths_of(pid, tid) if task else ((), "")
        if task is None or not (paths or why):
            return None
        ns = f"pid:{pid}"
        with contextlib.suppress(OSError):
            ns = os.readlink(f"{self.proc}/{pid}/ns/mnt")
        table = read_small(f"{self.proc}/{pid}/mountinfo", 1 << 24) or None
        name = (read_small(f"{self.proc}/{pid}/comm", 64) or task[0]).strip()
        return Blocked(pid, tid, task[0], task[1], task[2], name, paths, why, ns, table)


def read_pass(host_proc: str, fuse: bool) -> TaskPass:
    """One pass over every task under `host_proc` but the agent's own (module doc)."""
    reader = _Reader(host_proc, fuse)
    pids, blind = list_pids(host_proc)
    if blind:
        return TaskPass((), blind)
    own = own_pid(host_proc)
    found = (reader.blocked(pid, tid) for pid in pids if pid != own for tid in reader.tasks(pid))
    return TaskPass(tuple(b for b in found if b is not None))


PASSES: NextPass[TaskPass] = NextPass()


def task_pass(host_proc: str, fuse: bool) -> TaskPass:
    """A pass that started after this call began, shared with the checks waiting for the
    same kind of pass (module doc)."""
    return PASSES.run(f"{'fuse' if fuse else 'd'}:{host_proc}", lambda: read_pass(host_proc, fuse))
