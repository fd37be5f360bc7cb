"""Who holds a mount: processes whose cwd, root, open files or mapped files are inside it,
and processes in other mount namespaces that have their own copy of it.

Everything comes from `<host-proc>/<pid>/...` with `readlink` and reading text files; no
path inside a mount is ever opened or stat'ed.

`via` is one of:
- `cwd`, `root`: the process's working or root directory is in the mount;
- `fd`: an open file descriptor points into it;
- `maps`: a memory-mapped file (e.g. a binary or library) lives in it;
- `mountns`: the process's mount namespace has a mount of the same filesystem and root
  (at or below the mount's root) that is not a propagation peer or slave of it, so
  unmounting on the host would leave that copy (and the filesystem) alive. One holder is
  reported per namespace (its lowest pid). The namespace the mount table was read from is
  recognised by containing the mount's own id (mount ids are unique system-wide) and skipped.

`scan_holders` also says whether the scan was complete. It is *unknown* (never "no
holders") when `host_proc` cannot be listed, lists no process, does not show the agent's
own process (`<host_proc>/self`: a /proc of another PID namespace, e.g. without hostPID),
or a process's fd directory cannot be read for lack of permission. Unmounting is refused
while the answer is unknown.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from unstick.core.mountinfo import Mount, MountinfoError, parse_mountinfo

_DELETED = " (deleted)"


@dataclass(frozen=True, slots=True)
class Holder:
    """One process holding one mount."""

    mount_point: str
    pid: int
    comm: str
    via: str

    def to_json(self) -> dict[str, object]:
        return {"mountPoint": self.mount_point, "pid": self.pid, "comm": self.comm, "via": self.via}


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        return None


def _inside(path: str, mount_point: str) -> bool:
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def _matching(path: str | None, mounts: Sequence[Mount]) -> list[str]:
    if not path or not path.startswith("/"):
        return []
    if path.endswith(_DELETED):
        path = path[: -len(_DELETED)]
    return [m.mount_point for m in mounts if _inside(path, m.mount_point)]


def _maps_paths(text: str) -> set[str]:
    paths = set()
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            paths.add(fields[5])
    return paths


def _peer_groups(mount: Mount) -> set[str]:
    return {o.split(":", 1)[1] for o in mount.optional if o.startswith("shared:")}


def _is_copy(other: Mount, mount: Mount) -> bool:
    """`other` (in another namespace) keeps `mount`'s filesystem alive after a host unmount."""
    if (other.major, other.minor) != (mount.major, mount.minor):
        return False
    if not _inside(other.root, mount.root):
        return False
    groups = _peer_groups(mount)
    for opt in other.optional:
        kind, _, group = opt.partition(":")
        if kind in ("shared", "master") and group in groups:
            return False  # a peer or slave: the host's unmount propagates to it
    return True


@dataclass(frozen=True, slots=True)
class HolderScan:
    """The holders found, and why the scan is incomplete (None when it is complete)."""

    holders: list[Holder]
    unknown: str | None = None


def _process_holders(
    proc_dir: str, pid: int, comm: str, mounts: Sequence[Mount], gaps: list[str]
) -> list[Holder]:
    found: list[Holder] = []
    for via in ("cwd", "root"):
        for mp in _matching(_readlink(os.path.join(proc_dir, via)), mounts):
            found.append(Holder(mp, pid, comm, via))
    fd_dir = os.path.join(proc_dir, "fd")
    try:
        fds = os.listdir(fd_dir)
    except PermissionError as exc:
        gaps.append(f"cannot read {fd_dir}: {exc.strerror}")
        fds = []
    except OSError:  # the process exited meanwhile
        fds = []
    fd_points: set[str] = set()
    for fd in fds:
        fd_points.update(_matching(_readlink(os.path.join(fd_dir, fd)), mounts))
    found.extend(Holder(mp, pid, comm, "fd") for mp in sorted(fd_points))
    maps = _read(os.path.join(proc_dir, "maps")) or ""
    map_points: set[str] = set()
    for path in _maps_paths(maps):
        map_points.update(_matching(path, mounts))
    found.extend(Holder(mp, pid, comm, "maps") for mp in sorted(map_points))
    return found


def _namespace_holders(
    mountinfo: str, pid: int, comm: str, mounts: Sequence[Mount]
) -> list[Holder]:
    try:
        others = parse_mountinfo(mountinfo)
    except MountinfoError:
        return []
    own_ids = {(o.mount_id, o.mount_point) for o in others}
    found = []
    for mount in mounts:
        if (mount.mount_id, mount.mount_point) in own_ids:
            continue  # this is the namespace the mount table came from
        if any(_is_copy(o, mount) for o in others):
            found.append(Holder(mount.mount_point, pid, comm, "mountns"))
    return found


def _pids(host_proc: str) -> tuple[list[int], str | None]:
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


def scan_holders(host_proc: str, mounts: Iterable[Mount]) -> HolderScan:
    """Every (process, mount) hold on the given mounts, found under `host_proc`, and
    whether the scan could see every process (see the module docstring)."""
    targets = list(mounts)
    if not targets:
        return HolderScan([])
    pids, unknown = _pids(host_proc)
    gaps = [unknown] if unknown else []
    holders: list[Holder] = []
    seen_ns: set[str] = set()
    for pid in pids:
        proc_dir = os.path.join(host_proc, str(pid))
        comm = (_read(os.path.join(proc_dir, "comm")) or "").strip()
        holders.extend(_process_holders(proc_dir, pid, comm, targets, gaps))
        ns = _readlink(os.path.join(proc_dir, "ns", "mnt"))
        if ns is None or ns in seen_ns:
            continue
        seen_ns.add(ns)
        text = _read(os.path.join(proc_dir, "mountinfo"))
        if text is not None:
            holders.extend(_namespace_holders(text, pid, comm, targets))
    if len(gaps) > 3:
        gaps = [*gaps[:3], f"and {len(gaps) - 3} more"]
    return HolderScan(holders, "; ".join(gaps) if gaps else None)


def find_holders(host_proc: str, mounts: Iterable[Mount]) -> list[Holder]:
    """The holders `scan_holders` finds (for reporting; actions use `scan_holders`)."""
    return scan_holders(host_proc, mounts).holders
