"""What a holder scan reads of `<host-proc>` (`unstick.agent.holders.scan`): each process's
mount namespace and table, and what could not be read.

- `Gaps`: the entries of live processes that could not be read for lack of permission
  (an exited process is no gap: it holds nothing), reported as the scan's `unknown`;
- the reads themselves (`readlink`, `read`), the pids and the agent's own pid as the
  scanned /proc numbers them (a /proc of another PID namespace is a gap);
- `PARSED`: each namespace's table, parsed again only when its text changed since the
  last scan (the text is always read fresh: only the parse is saved).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Collection
from dataclasses import dataclass, field

from unstick.core.model.mount_identity import MountTable
from unstick.core.model.mountinfo import Mount, MountStub, _stub, parse_line

_DENIED = (errno.EACCES, errno.EPERM)


@dataclass
class Gaps:
    """What could not be read (for lack of permission) in live processes: the first path
    of each kind of entry (`fd`, `ns/mnt`, ...) and how many more of that kind."""

    first: dict[str, str] = field(default_factory=dict)
    more: dict[str, int] = field(default_factory=dict)

    def denied(self, path: str, exc: OSError) -> None:
        if exc.errno not in _DENIED:
            return  # gone meanwhile: an exited process holds nothing
        kind = (
            path.rsplit("/", 2)[-2]
            if path.rsplit("/", 1)[-1].isdigit()
            else path.rsplit("/", 1)[-1]
        )
        if kind in self.first:
            self.more[kind] = self.more.get(kind, 0) + 1
        else:
            self.first[kind] = f"cannot read {path}: {exc.strerror}"

    def note(self, kind: str, text: str) -> None:
        """Something other than a denied read left the scan incomplete."""
        if kind in self.first:
            self.more[kind] = self.more.get(kind, 0) + 1
        else:
            self.first[kind] = text

    def merge(self, other: Gaps) -> None:
        for kind, text in other.first.items():
            if kind in self.first:
                self.more[kind] = self.more.get(kind, 0) + 1 + other.more.get(kind, 0)
            else:
                self.first[kind] = text
                if kind in other.more:
                    self.more[kind] = other.more[kind]

    def text(self) -> str | None:
        parts = [
            text + (f" (and {self.more[kind]} more like it)" if kind in self.more else "")
            for kind, text in self.first.items()
        ]
        return "; ".join(parts) if parts else None


@dataclass(frozen=True, slots=True)
class Process:
    pid: int
    comm: str
    ns: str


@dataclass
class Namespace:
    table: MountTable | None
    first: Process
    user_ns: str | None


def readlink(path: str, gaps: Gaps) -> str | None:
    try:
        return os.readlink(path)
    except OSError as exc:
        gaps.denied(path, exc)
        return None


def read(path: str, gaps: Gaps) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError as exc:
        gaps.denied(path, exc)
        return None


def list_pids(host_proc: str) -> tuple[list[int], str | None]:
    """The pids under `host_proc`, or why they cannot be trusted to be all of them."""
    try:
        pids = sorted(int(n) for n in os.listdir(host_proc) if n.isdigit())
    except OSError as exc:
        return [], f"cannot list {host_proc}: {exc.strerror}"
    if not pids:
        return [], f"{host_proc} lists no process (not a mounted /proc?)"
    if not os.path.exists(os.path.join(host_proc, "self")):
        return pids, (
            f"{host_proc} does not show the agent's own process: it is the /proc of another "
            "PID namespace (run the agent with hostPID)"
        )
    return pids, None


def own_pid(host_proc: str) -> int | None:
    """The agent's own pid as `host_proc` numbers it (None: not shown there)."""
    try:
        return int(os.readlink(os.path.join(host_proc, "self")))
    except (OSError, ValueError):
        return None


Rows = dict[str, tuple[MountStub, str]]  # a table's lines -> (stub, `major:minor`)


def table_of(
    text: str, devices: Collection[tuple[int, int]], known: Rows | None = None
) -> tuple[MountTable, Rows]:
    """The namespace's table, in full only for the targets' devices and their parents: no
    other mount can be a target or a copy of one, hold one or be a copy's parent, and the
    stubs still stop path lookups and count as children (`MountTable`); and the stub of
    each of its lines. `known`: stubs of lines parsed before (the same line gives the same
    stub: only the new lines are split). The same as `parse_relevant`; raises
    MountinfoError as it does."""
    wanted = {f"{major}:{minor}" for major, minor in devices}
    rows: list[tuple[int, MountStub, str]] = []
    seen: Rows = {}
    keep: set[int] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        line = raw.rstrip("\r")
        hit = known.get(line) if known else None
        if hit is None:
            hit = _stub(line, number)
        seen[line] = hit
        stub, device = hit
        rows.append((number, stub, line))
        if device in wanted:
            keep.update((stub.mount_id, stub.parent_id))
    full: list[Mount] = []
    stubs: list[MountStub] = []
    for number, stub, line in rows:
        if stub.mount_id in keep:
            full.append(parse_line(line, number))
        else:
            stubs.append(stub)
    return MountTable.of(full, stubs), seen


class ParsedTables:
    """The last parse of each namespace's table text (for the devices asked about): a scan
    reads every table fresh, and parses it again only when the text differs from the one
    parsed before — the same text gives the same table (MountTable is immutable), so this
    saves the parse, never the read. Most of a node's namespaces do not change between two
    scans a moment apart. A text that changed (the host's, after each unmount) is parsed
    again, splitting only its lines that the namespace's last parse did not have: with
    5,000 host mounts a scan after one unmount parses one line's worth, not 5,000."""

    MAX = 512

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[tuple[str, frozenset[tuple[int, int]]], tuple[str, MountTable]] = {}
        self._rows: dict[str, Rows] = {}  # each namespace's last parse, line by line

    def table(self, ns: str, text: str, devices: frozenset[tuple[int, int]]) -> MountTable:
        key = (ns, devices)
        with self._lock:
            last = self._last.get(key)
            known = self._rows.get(ns)
        if last is not None and last[0] == text:
            return last[1]
        table, rows = table_of(text, devices, known)  # MountinfoError: nothing kept
        with self._lock:
            if len(self._last) >= self.MAX:
                self._last.clear()
            if len(self._rows) >= self.MAX:
                self._rows.clear()
            self._last[key] = (text, table)
            self._rows[ns] = rows
        return table


PARSED = ParsedTables()
