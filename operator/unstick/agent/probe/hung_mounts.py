"""Hung network/FUSE mounts of a pod, found without ever touching the mount.

A hard NFS mount whose server is gone, or a FUSE mount whose daemon stopped answering,
hangs whatever touches it — a `stat()` of its mount point included, so the agent never
stats, opens or lists one. It reads only:

- the mount table (already parsed): which mounts of the pod are of a network or FUSE
  filesystem (`unstick.core.rules.hung_mounts.family`), their source (the server) and device;
- for FUSE, the connection's `waiting` counter in the fusectl filesystem
  (`/sys/fs/fuse/connections/<device>/waiting`, seen through `<host-proc>/1/root` where the
  agent may enter it, else its own): requests the daemon has not answered;
- `/proc/<pid>/{stat,wchan,stack}` of the processes tied to the mount — its holders (by
  mount identity, from `unstick.agent.holders.scan`) and the pod's own processes (from the
  cgroup scan): a process waiting in that filesystem's kernel functions (FUSE's
  `request_wait_answer`, NFS's `rpc_wait_bit_killable`, ...) is blocked on its server;
- any task on the node blocked in a system call on a path through the mount
  (`unstick.agent.probe.waiters`: `/proc/<pid>/task/<tid>/syscall` and the path string in
  its memory), e.g. the kubelet's own `stat` of the mount point: a waiter outside the pod
  holds nothing (via `path`) but is evidence that the mount hangs, for NFS too. A blocked
  task whose path cannot be told makes the mounts it could wait on unsure: the probe lists
  them in `waitersUnknown` and says why in `blindSpots`, and the plan makes no plain
  unmount or CSI unpublish of them (`unstick.core.rules.hung_mounts.waiters_told`).

The node step for such a mount, `lazy-unmount`, is agent/steps/lazy_unmount.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace

from unstick.agent.probe.pod_tasks import read_small, stat_state
from unstick.agent.probe.waiters import Waiter, scan_waiters, waits_in
from unstick.core.model.kubelet_paths import normalise
from unstick.core.model.mountinfo import Mount
from unstick.core.model.probe import BlockedTask, Holder, HungMount
from unstick.core.rules.hung_mounts import family

FUSECTL = "sys/fs/fuse/connections"
MAX_HUNG = 32  # the Remediation CRD's bounds (probe.hungMounts[], .blocked[])
MAX_BLOCKED = 16
MAX_CHARS = 256
POD = "pod"  # `via` of a blocked process of the pod that holds no mount of it
PATH = "path"  # `via` of a process outside the pod blocked on a path of the mount


@dataclass(frozen=True, slots=True)
class HungScan:
    """The pod's hung mounts, and those of its network/FUSE mounts a blocked task may wait
    on whose path could not be read (`unsure`; `unknown`: those tasks, in words)."""

    mounts: list[HungMount]
    unsure: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()

    def blind_spot(self) -> str:
        """The probe's `blindSpots` line for the unsure mounts ("" when none)."""
        if not self.unsure:
            return ""
        why = "; ".join(self.unknown[:2])
        return f"cannot tell whether blocked tasks wait on {', '.join(self.unsure)}: {why}"


def fuse_waiting(host_proc: str, mount: Mount) -> int | None:
    """Requests waiting on the mount's FUSE connection (None: fusectl not visible)."""
    device = mount.minor if mount.major == 0 else (mount.major << 20) | mount.minor
    for top in (os.path.join(host_proc, "1", "root", FUSECTL), "/" + FUSECTL):
        text = read_small(os.path.join(top, str(device), "waiting"), 64)
        if text is not None and text.strip().isdigit():
            return int(text.strip())
    return None


def _task(host_proc: str, pid: int) -> tuple[str, str, str, tuple[str, ...]] | None:
    """(comm, state, wchan, stack functions) of a live process, None if gone."""
    base = os.path.join(host_proc, str(pid))
    parsed = stat_state(read_small(os.path.join(base, "stat")) or "")
    if parsed is None:
        return None
    wchan = (read_small(os.path.join(base, "wchan"), MAX_CHARS) or "").strip()
    stack = tuple(
        line.split("] ", 1)[-1].split("+", 1)[0].strip()
        for line in (read_small(os.path.join(base, "stack")) or "").splitlines()
    )
    return parsed[0], parsed[1], "" if wchan == "0" else wchan, stack


def blocked_in(host_proc: str, fam: str, pids: dict[int, str]) -> list[BlockedTask]:
    """Those of `pids` (pid → via) waiting (state D or S) in the family's wait functions."""
    out = []
    for pid, via in sorted(pids.items()):
        task = _task(host_proc, pid)
        if task is None or task[1] not in ("D", "S"):
            continue
        comm, state, wchan, stack = task
        where = waits_in(fam, wchan, stack)
        if where is None:
            continue
        out.append(BlockedTask(pid, comm[:64], state, (wchan or where)[:MAX_CHARS], via))
        if len(out) >= MAX_BLOCKED:
            break
    return out


def hung_mounts(
    host_proc: str, mounts: Iterable[Mount], holders: Iterable[Holder], pod_pids: Iterable[int]
) -> HungScan:
    """The pod's network/FUSE mounts that something waits on, and those it cannot tell
    (see the module doc)."""
    held: dict[str, dict[int, str]] = {}
    for h in holders:
        held.setdefault(normalise(h.mount_point) or h.mount_point, {}).setdefault(h.pid, h.via)
    pod = set(pod_pids)
    ours = [m for m in mounts if family(m.fstype) is not None]
    scan = scan_waiters(host_proc, ours)
    waiters = scan.waiters
    out = []
    for m in ours:
        fam = family(m.fstype) or ""
        point = normalise(m.mount_point) or m.mount_point
        pids = dict.fromkeys(pod, POD) | held.get(point, {})
        waiting = fuse_waiting(host_proc, m) if fam == "fuse" else None
        blocked = with_waiters(
            blocked_in(host_proc, fam, pids),
            [w for w in waiters if w.mount_point == m.mount_point],
            pod,
        )
        if blocked or (waiting or 0) > 0:
            out.append(HungMount(point, m.fstype, m.source, waiting, tuple(blocked)))
        if len(out) >= MAX_HUNG:
            break
    unsure = tuple(dict.fromkeys(normalise(p) or p for p in scan.unsure))[:MAX_HUNG]
    return HungScan(out, unsure, tuple(scan.unknown))


def with_waiters(
    blocked: list[BlockedTask], waiters: list[Waiter], pod: set[int]
) -> list[BlockedTask]:
    """`blocked` (holders and the pod's processes in the family's wait functions) with the
    tasks blocked on a path of the mount (`mount_waiters`): the path added to one already
    listed, a new entry (via `pod`, else `path`: outside the pod, holding nothing) else."""
    out = {b.pid: b for b in blocked}
    for w in waiters:
        b = out.get(w.pid)
        if b is not None:
            out[w.pid] = replace(b, path=b.path or w.path)
        elif len(out) < MAX_BLOCKED:
            via = POD if w.pid in pod else PATH
            wchan = w.wchan[:MAX_CHARS]
            out[w.pid] = BlockedTask(w.pid, w.comm[:64], w.state, wchan, via, w.path)
    return sorted(out.values(), key=lambda b: b.pid)
