"""Who holds a mount (design.md §3 invariant 9): any process, in any mount namespace, that
uses the mount or a copy of it (a bind, a propagated peer or slave, at any path).

Holders are matched by mount identity (device and root, see
`unstick.core.model.mount_identity`), never by comparing path text across namespaces:

- `fd`: an open file whose mount (`mnt_id` in `/proc/<pid>/fdinfo/<fd>`, looked up in that
  process's own mountinfo, or any scanned namespace's: mount ids are unique system-wide)
  is the mount or a copy of it. Only when the mount id is in no table (a detached mount)
  is the link's path resolved in the process's own table, as for cwd;
- `cwd`, `root`: the process's working or root directory lies in such a mount: the path
  is resolved to the mount with the longest mount point in *that process's own*
  mountinfo (paths relative to its root, as its mountinfo shows them), then compared by
  identity;
- `maps`: a memory-mapped file (a binary, a library) lies in such a mount (resolved the
  same way);
- `mountns`: a mount namespace has a copy of the mount (same device, root equal to or
  under the mount's root) at any path that does not go away with the unmount: only the
  mount's propagated copy (the same place on a propagation peer or slave of the mount's
  parent, itself a peer or slave, nothing mounted on it, in a namespace of the host's user
  namespace) is exempt, and so are the propagated copies of the kubelet's own copies in
  the home namespace (below): a CSI volume's staging mount (`globalmount`), which the
  kubelet keeps while the orphaned target is still mounted, shows at its own path in every
  pod that mounts the kubelet root with Bidirectional/HostToContainer propagation.
  One holder is reported per namespace (its lowest pid). In the namespace the mount
  table was read from (recognised by holding the mount itself), the kubelet's own copies
  (under `kubelet_root`: staging mounts, other pods of the volume) are not holders; when
  `kubelet_root` is not given, that namespace is not searched.

Everything comes from `<host-proc>/<pid>/...` with `readlink` and reading text files; no
path inside a mount is ever opened or stat'ed.

The agent's own process is never a holder: its only files under a pod's directory are
its own inspection — the probe's and the executor's `O_PATH` walks of the pod's paths,
closed right after — and with its worker threads one of them may be open while another
thread scans (found by the node-side benchmark: a pod diagnosed MountBusy, held by the
agent itself). Its mount namespace is scanned like any other.

`scan_holders` also says whether the scan was complete. It is *unknown* (never "no
holders") when `host_proc` cannot be listed, lists no process, does not show the agent's
own process (`<host_proc>/self`: a /proc of another PID namespace, e.g. without hostPID),
or an entry of a live process (its fd dir, fdinfo, cwd, root, maps, mount namespace or
mountinfo) cannot be read for lack of permission. Unmounting is refused while the answer
is unknown; `HolderScan.unknown` (None when complete) is the field to report.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from unstick.agent.holders.copies import namespace_copies
from unstick.agent.holders.proc import (
    PARSED,
    Gaps,
    Namespace,
    Process,
    list_pids,
    own_pid,
    read,
    readlink,
)
from unstick.agent.holders.scan_group import current_group
from unstick.core.model.mount_identity import MountTable, Target, overlaps, targets_in, under, uses
from unstick.core.model.mountinfo import Mount, MountinfoError
from unstick.core.model.probe import Holder

_DELETED = " (deleted)"


@dataclass(frozen=True, slots=True)
class HolderScan:
    """The holders found, and why the scan is incomplete (None when it is complete)."""

    holders: list[Holder]
    unknown: str | None = None


def _as_read(table: MountTable, mount: Mount) -> Mount:
    """The mount as this scan read it: its propagation (`shared:N`, `master:N`) from the
    namespace's table read now, not from the caller's table, which may be a text kept
    since an earlier read (`unstick.agent.probe.mount_table`: a propagation change alone is not
    reported by poll)."""
    now = table.by_id.get(mount.mount_id)
    return now if now is not None and now.mount_point == mount.mount_point else mount


class _Scan:
    """One pass over `host_proc`: every process's namespace and mount table first (a
    file's mount id may belong to another namespace), then each process's holds."""

    def __init__(self, host_proc: str, targets: Sequence[Mount], kubelet_root: str | None):
        self.proc = host_proc
        self.targets = list(targets)
        self.devices = frozenset((t.major, t.minor) for t in self.targets)
        self.kubelet_root = kubelet_root
        self.gaps = Gaps()
        self.processes: list[Process] = []
        self.namespaces: dict[str, Namespace] = {}
        self.mounts_by_id: dict[int, Mount] = {}
        self.other_ids: set[int] = set()  # mounts of other devices, in any table
        self.could_hold: dict[str, bool] = {}
        self.by_path: dict[tuple[int, str | None, str], frozenset[str]] = {}

    def path(self, pid: int, *parts: str) -> str:
        return "/".join((self.proc, str(pid), *parts))  # os.path.join was 10 % of a scan

    # --- pass 1: namespaces ----------------------------------------------------------

    def collect(self, pids: Iterable[int]) -> None:
        quiet = Gaps()  # a namespace link that cannot be read: the process's own table
        for pid in pids:
            ns = readlink(self.path(pid, "ns", "mnt"), quiet) or f"pid:{pid}"
            process = Process(pid, "", ns)  # comm: read for the holders found only
            if ns in self.namespaces:
                self.processes.append(process)
                continue
            text = read(self.path(pid, "mountinfo"), self.gaps)
            if text is None:
                continue  # exited (or denied: recorded)
            self.processes.append(process)
            try:
                table: MountTable | None = PARSED.table(ns, text, self.devices)
            except MountinfoError as exc:  # never seen from a kernel: the scan is not complete
                self.gaps.note(
                    "mountinfo-parse", f"cannot parse {self.path(pid, 'mountinfo')}: {exc}"
                )
                table = None
            user_ns = readlink(self.path(pid, "ns", "user"), quiet)  # unknown: not trusted
            self.namespaces[ns] = Namespace(table, process, user_ns)
            if table is not None:
                for m in table.mounts:
                    self.mounts_by_id.setdefault(m.mount_id, m)
                self.other_ids.update(table.other_ids)
                self.could_hold[ns] = self._could_hold(table)

    def home(self) -> tuple[str | None, list[Target]]:
        """The namespace the targets were read from (it holds them, by id and mount point)
        and the targets with their parents from it."""
        wanted = {(m.mount_id, m.mount_point) for m in self.targets}
        for ns, info in self.namespaces.items():
            table = info.table
            if table and any((m.mount_id, m.mount_point) in wanted for m in table.mounts):
                return ns, targets_in(table, [_as_read(table, m) for m in self.targets])
        return None, [Target(m, None) for m in self.targets]

    # --- pass 2: holds ---------------------------------------------------------------

    def _held(self, mounts: Iterable[Mount], path: str | None) -> Iterator[str]:
        for m in mounts:
            for t in self.targets:
                if uses(m, path, t):
                    yield t.mount_point

    def _by_path(self, table: MountTable, root: str | None, path: str) -> frozenset[str]:
        """Targets a path of this process (cwd, root, a mapped file) lies in (the answer
        for a table, root and path is kept for this scan: processes of one namespace map
        the same libraries)."""
        key = (id(table), root, path)
        found = self.by_path.get(key)
        if found is None:
            found = self.by_path[key] = frozenset(self._by_path_now(table, root, path))
        return found

    def _by_path_now(self, table: MountTable, root: str | None, path: str) -> set[str]:
        if path.endswith(_DELETED):
            path = path[: -len(_DELETED)]
        candidates = {path}
        if root not in (None, "/") and under(path, root):  # links are shown from the host's root
            candidates.add(path[len(root.rstrip("/")) :] or "/")
        found: set[str] = set()
        for p in candidates:
            found.update(self._held(table.containing(p), p))
        return found

    def _mnt_id(self, pid: int, fd: str, gaps: Gaps) -> int | None:
        """The `mnt_id:` of the fd's fdinfo (its first lines: `pos`, `flags`, `mnt_id`)."""
        path = self.path(pid, "fdinfo", fd)
        try:
            handle = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                head = os.read(handle, 4096)
            finally:
                os.close(handle)
        except OSError as exc:
            gaps.denied(path, exc)
            return None
        for line in head.split(b"\n"):
            key, _, value = line.partition(b":")
            if key == b"mnt_id" and value.strip().isdigit():
                return int(value.strip())
        return None

    def _fd_mount(self, table: MountTable, mnt_id: int | None) -> Mount | None:
        if mnt_id is None:
            return None
        return table.by_id.get(mnt_id) or self.mounts_by_id.get(mnt_id)

    def _fd_holds(
        self, p: Process, table: MountTable, root: str | None, gaps: Gaps, *, own: bool
    ) -> set[str]:
        """`own`: the process's own table has a mount that can hold (else a path resolved
        in it holds nothing, and only a file of a mount of another table can)."""
        fd_dir = self.path(p.pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError as exc:
            self.gaps.denied(fd_dir, exc)  # no list of open files at all: always unknown
            return set()
        found: set[str] = set()
        for fd in fds:
            link = readlink(f"{fd_dir}/{fd}", gaps)
            if not link or not link.startswith("/"):
                continue  # pipes, sockets, anonymous inodes: no mount of a volume
            mnt_id = self._mnt_id(p.pid, fd, gaps)
            mount = self._fd_mount(table, mnt_id)
            if mount is None and (mnt_id in self.other_ids or not own):
                continue  # a mount of another device (or a path in a table that holds nothing)
            if mount is None:  # a mount in no table (detached): where its path leads
                found.update(self._by_path(table, root, link))
            else:
                path = link[: -len(_DELETED)] if link.endswith(_DELETED) else link
                found.update(self._held([mount], path))
        return found

    def _maps_holds(self, p: Process, table: MountTable, root: str | None, gaps: Gaps) -> set[str]:
        text = read(self.path(p.pid, "maps"), gaps) or ""
        # `address perms offset dev inode   path`: no `/` before the path
        paths = {line[i:] for line in text.split("\n") if (i := line.find("/")) >= 0}
        found: set[str] = set()
        for path in paths:
            found.update(self._by_path(table, root, path))
        return found

    def _could_hold(self, table: MountTable) -> bool:
        """The process's namespace has a mount of a target's filesystem (the same device
        and overlapping root): only then can its unreadable entries hide a hold."""
        return any(overlaps(m, t) for m in table.mounts for t in self.targets)

    def process_holders(self, p: Process) -> list[Holder]:
        table = self.namespaces[p.ns].table
        if table is None:
            return []
        gaps = Gaps()
        own = self.could_hold.get(p.ns, True)
        if not own:  # cwd, root and maps are resolved in this table: none can hold
            fds = self._fd_holds(p, table, None, gaps, own=False)
            return [Holder(mp, p.pid, p.comm, "fd") for mp in sorted(fds)]
        root = readlink(self.path(p.pid, "root"), gaps)
        found = [
            Holder(mp, p.pid, p.comm, "fd")
            for mp in sorted(self._fd_holds(p, table, root, gaps, own=True))
        ]
        for via, link in (("cwd", readlink(self.path(p.pid, "cwd"), gaps)), ("root", root)):
            if link and link.startswith("/"):
                held = sorted(self._by_path(table, root, link))
                found.extend(Holder(mp, p.pid, p.comm, via) for mp in held)
        maps = self._maps_holds(p, table, root, gaps)
        found.extend(Holder(mp, p.pid, p.comm, "maps") for mp in sorted(maps))
        if gaps.first and self._could_hold(table):
            self.gaps.merge(gaps)
        return found

    def namespace_holders(self, home: str | None, targets: Sequence[Target]) -> list[Holder]:
        """One `mountns` holder per namespace with a copy of a target (agent/holders/copies.py)."""
        agent_user = readlink(os.path.join(self.proc, "self", "ns", "user"), Gaps())
        return [
            Holder(target.mount.mount_point, info.first.pid, info.first.comm, "mountns")
            for target, info in namespace_copies(
                self.namespaces, home, targets, self.kubelet_root, agent_user
            )
        ]


def scan_holders(
    host_proc: str, mounts: Iterable[Mount], *, kubelet_root: str | None = None
) -> HolderScan:
    """Every (process, mount) hold on the given mounts, found under `host_proc`, and
    whether the scan could see every process (see the module docstring). `kubelet_root`
    also searches the namespace the mounts were read from for copies outside it.

    Inside `scan_group.shared_scans()` the scan may be one started for several callers at
    once (`scan_group.ScanGroup`), never one that started before this call."""
    targets = list(mounts)
    if not targets:
        return HolderScan([])
    group = current_group()
    if group is not None:
        return group.scan(host_proc, targets, kubelet_root, _scan_now)
    return _scan_now(host_proc, targets, kubelet_root)


def _scan_now(host_proc: str, targets: list[Mount], kubelet_root: str | None) -> HolderScan:
    pids, unknown = list_pids(host_proc)
    scan = _Scan(host_proc, targets, kubelet_root)
    scan.collect(pids)
    home, with_parents = scan.home()
    holders: list[Holder] = []
    own = own_pid(host_proc)
    for process in scan.processes:
        if process.pid != own:  # the agent's own look at the pod is not a use of it
            holders.extend(scan.process_holders(process))
    holders.extend(scan.namespace_holders(home, with_parents))
    comms: dict[int, str] = {}
    for i, h in enumerate(holders):  # the command names of the holders found
        if h.pid not in comms:
            comms[h.pid] = (read(scan.path(h.pid, "comm"), Gaps()) or "").strip()
        holders[i] = Holder(h.mount_point, h.pid, comms[h.pid], h.via)
    gaps = scan.gaps.text()
    reasons = [r for r in (unknown, gaps) if r]
    return HolderScan(holders, "; ".join(reasons) if reasons else None)


def find_holders(
    host_proc: str, mounts: Iterable[Mount], *, kubelet_root: str | None = None
) -> list[Holder]:
    """The holders `scan_holders` finds (for reporting; actions use `scan_holders`)."""
    return scan_holders(host_proc, mounts, kubelet_root=kubelet_root).holders
