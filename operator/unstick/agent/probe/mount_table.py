"""The host mount table, re-read only when the kernel says it changed.

`poll()` on an open `/proc/<pid>/mountinfo` (or `/proc/<pid>/mounts`) reports
`POLLPRI | POLLERR` when the mount namespace it shows has changed since this open file
last polled: the kernel keeps one event counter per namespace, bumped by every mount,
unmount, move and remount in it (propagated ones included), and each open file remembers
the counter it saw at its last poll (at open, before the first). libmount's monitor and
systemd watch mounts this way.

`MountWatch` keeps one open file per table and, on every call:

1. polls it with a zero timeout, which also *arms* it (the file now remembers the counter
   as it is at this instant);
2. re-reads the whole file from offset 0 (`lseek` + `read`) if the poll reported a change
   or nothing was read yet; otherwise hands out the text read before.

Why an unchanged table is exactly as fresh as a new read: the text kept was read *after*
a poll armed the file (step 1 before 2). Any change that happened after that poll — even
one during the read, which may or may not be in the text — makes every later poll report
a change, so the next call reads again. A poll that reports nothing therefore proves that
no mount or unmount happened since before the kept text was read: a read now would return
the same table. Calls are serialised (one lock per table), so a poll never runs between
another thread's poll and its read.

What the kernel does *not* report, and so what the kept text may not show: a change of
a mount's propagation type alone (`mount --make-private|shared|slave`: the `shared:N`
and `master:N` fields). The agent takes those fields from the holder scan's own read of
every namespace (`unstick.agent.holders.scan`), never from this view.

Where poll cannot report changes — the path is not a procfs mount table (a test's file,
`--mountinfo` pointing at a copy), the file cannot be kept open — every call reads the
file fresh, as before. Only the read and parse are saved: every act still re-checks its
own mount (identity, holders, path) right before acting.

The open file pins its mount namespace: only the agent's own table (the host's PID 1, or
its own) is kept open, never another namespace's (a pinned container namespace would keep
a copy of a volume mounted, a holder no scan could see).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass

from unstick.agent.probe.mount_file import MountTable, pod_lines
from unstick.core.model.kubelet_paths import pod_dir
from unstick.core.model.mountinfo import escape, parse_mountinfo

PROC_SUPER_MAGIC = 0x9FA0
_TABLE_NAMES = ("mountinfo", "mounts")
_CHANGED = select.POLLPRI | select.POLLERR | select.POLLNVAL
_MAX_VIEWS = 512  # derived tables kept per text (one or two per pod being handled)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


class _Statfs(ctypes.Structure):
    # struct statfs starts with `__fsword_t f_type` (a long) on every 64-bit Linux ABI;
    # the rest is room for the remaining fields
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 256)]


def notifies_changes(fd: int, path: str) -> bool:
    """The open file is a procfs mount table, whose poll() reports changes."""
    if os.path.basename(path) not in _TABLE_NAMES:
        return False
    buf = _Statfs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        return False
    return int(buf.f_type) & 0xFFFFFFFF == PROC_SUPER_MAGIC


def _read_all(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)  # a seq_file restarts at 0: the whole table, fresh
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="surrogateescape")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One text of the table and how this call got it."""

    text: str
    generation: int  # how many times the file was read (changes when the text may have)
    read_now: bool  # read by this call (False: the kept text, no change since per poll)


@dataclass
class WatchStats:
    """Counters for the benchmark and the tests: reads, and calls answered by a poll."""

    reads: int = 0
    unchanged: int = 0


class MountWatch:
    """A cached parse of one mount table, valid until poll() says it changed (module
    docstring). Thread-safe. `watch=False` never keeps the file open: a fresh read
    every call (the fallback, and the old behaviour)."""

    def __init__(self, path: str, *, watch: bool = True) -> None:
        self.path = path
        self.want_watch = watch
        self.stats = WatchStats()
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._poll: select.poll | None = None
        self._text: str | None = None
        self._generation = 0
        self._views: dict[tuple[str, str], MountTable] = {}
        self._containing: dict[str, str] = {}  # needle -> the text's lines with it
        self._local = threading.local()

    @property
    def watching(self) -> bool:
        """An open file whose poll reports changes is kept (else every call reads)."""
        return self._poll is not None

    def _open(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        if not notifies_changes(fd, self.path):
            os.close(fd)
            self.want_watch = False  # a plain file: read it fresh each time
            return
        poller = select.poll()
        poller.register(fd, select.POLLPRI | select.POLLERR)
        self._fd, self._poll = fd, poller

    def _changed(self) -> bool:
        """Poll (and arm) the open file: True if the table changed since the last poll."""
        assert self._poll is not None
        return any(events & _CHANGED for _fd, events in self._poll.poll(0))

    def last_read_now(self) -> bool:
        """Whether this thread's last call read the file (False: the kept text, unchanged
        since it was read, per poll)."""
        return bool(getattr(self._local, "read_now", True))

    def snapshot(self) -> Snapshot:
        """The table's text, re-read only if the kernel reports a change since the last
        read (or it cannot tell). Raises OSError if the file cannot be read."""
        snap = self._snapshot()
        self._local.read_now = snap.read_now
        return snap

    def _snapshot(self) -> Snapshot:
        with self._lock:
            if self._poll is None and self.want_watch:
                try:
                    self._open()
                except OSError:
                    self.want_watch = False  # fall back to reading fresh (which may raise)
            if self._poll is None or self._fd is None:
                return self._store(self._read_fresh())
            changed = self._changed()  # arm first, then read: see the module docstring
            if not changed and self._text is not None:
                self.stats.unchanged += 1
                return Snapshot(self._text, self._generation, read_now=False)
            try:
                text = self._read(self._fd)
            except OSError:
                self._close()  # reopened (or fallen back) on the next call
                raise
            return self._store(text)

    def _read(self, fd: int) -> str:
        return _read_all(fd)

    def _read_fresh(self) -> str:
        with open(self.path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()

    def _store(self, text: str) -> Snapshot:
        self.stats.reads += 1
        self._generation += 1
        self._text = text
        self._views.clear()
        self._containing.clear()
        return Snapshot(text, self._generation, read_now=True)

    def _lines_containing(self, snap: Snapshot, needle: str) -> str:
        """The lines of the snapshot's text that contain `needle` (in order, each with its
        newline), split out once per text: the pods' views of one text share one pass over
        the whole table (thousands of host mounts) instead of one pass each."""
        with self._lock:
            if snap.generation == self._generation and needle in self._containing:
                return self._containing[needle]
        kept = "".join(f"{line}\n" for line in snap.text.split("\n") if needle in line)
        with self._lock:
            if snap.generation == self._generation:
                if len(self._containing) >= _MAX_VIEWS:
                    self._containing.clear()
                self._containing[needle] = kept
        return kept

    def _view(self, key: tuple[str, str], make: Callable[[Snapshot], MountTable]) -> MountTable:
        """A table derived from the current text, parsed once per text."""
        snap = self.snapshot()
        with self._lock:
            if snap.generation == self._generation and key in self._views:
                return self._views[key]
        table = make(snap)
        with self._lock:
            if snap.generation == self._generation:
                if len(self._views) >= _MAX_VIEWS:
                    self._views.clear()
                self._views[key] = table
        return table

    def table(self) -> MountTable:
        """The whole table, parsed."""
        return self._view(
            ("all", ""), lambda snap: MountTable(snap.text, tuple(parse_mountinfo(snap.text)))
        )

    def pod_table(self, kubelet_root: str, uid: str) -> MountTable:
        """Only the mounts under `<root>/pods/<uid>/` (as `mount_file.read_pod_table`)."""
        pods = pod_dir(kubelet_root, uid).rsplit("/", 1)[0] + "/"  # `<root>/pods/`

        def make(snap: Snapshot) -> MountTable:
            # every line pod_lines keeps contains the escaped `<root>/pods/<uid>/`, so the
            # escaped `<root>/pods/` too (escape() maps each character on its own): the
            # same lines as pod_lines over the whole text
            lines = pod_lines(self._lines_containing(snap, escape(pods)), kubelet_root, uid)
            return MountTable(lines, tuple(parse_mountinfo(lines)))

        return self._view(("pod", f"{kubelet_root}\0{uid}"), make)

    def under(self, top: str) -> MountTable:
        """Only the mounts strictly under `top`."""

        def make(snap: Snapshot) -> MountTable:
            lines = lines_under(snap.text, top)
            return MountTable(lines, tuple(parse_mountinfo(lines)))

        return self._view(("under", top), make)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._poll, self._text = None, None, None

    def close(self) -> None:
        with self._lock:
            self._close()


def lines_under(text: str, top: str) -> str:
    """The lines of a mountinfo text whose mount point is strictly under `top`."""
    prefix = top.rstrip("/") + "/"
    escaped = escape(prefix)
    kept = [
        line
        for line in text.split("\n")  # mountinfo is \n-separated; never splitlines()
        if escaped in line and parse_mountinfo(line)[0].mount_point.startswith(prefix)
    ]
    return "".join(f"{line}\n" for line in kept)


_WATCHES: dict[str, MountWatch] = {}
_WATCHES_LOCK = threading.Lock()


def watch_for(path: str) -> MountWatch:
    """The process's one `MountWatch` of `path` (one open file per table)."""
    with _WATCHES_LOCK:
        watch = _WATCHES.get(path)
        if watch is None:
            watch = _WATCHES[path] = MountWatch(path)
        return watch
