"""The checks the node steps share (design.md §3 safety invariants), re-run right before
each act: `Checks`, the collaborator the executor holds and hands to each step (a module
per node action beside this one; agent/steps/executor.py dispatches to them), and
`Refused`, what a check raises when its precondition does not hold.

Every path is derived by the agent from the pod UID and its own kubelet root; a step's
`target` from the Remediation only *selects* among those derived paths (it must equal one
of them, or be empty / the pod directory meaning "all of this pod's"). Right before each
individual unmount, unpublish or rmdir the step re-checks the mount table and checks:
the path is strictly under this pod's volumes/ or volume-subpaths/, has no symlink
component, a complete holder scan finds no holder of the mount (an incomplete scan
refuses), no container of the pod runs, and — before an unmount or unpublish — no task is
blocked in a path lookup through the mount (`Checks.check_no_waiters`); and, after the
holder scan and immediately before each umount2 (plain or MNT_DETACH), the mount on top at
the path and the mounts below it are re-read and must be the ones scanned
(`Checks.check_unchanged`).

The mount table comes from `unstick.agent.probe.mount_table.MountWatch`: re-read when poll() on
the open table says it changed since it was last read, else the text read then — which is
then exactly as fresh as a new read (the safety argument is in that module and in
docs/agent.md). Only the read and parse are saved; every check still happens right before
its act.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from unstick.agent.holders.scan import scan_holders
from unstick.agent.holders.scan_group import ScanGroup, shared_scans
from unstick.agent.keylocks import KeyLocks
from unstick.agent.probe.containers import still_running
from unstick.agent.probe.mount_file import MountTable
from unstick.agent.probe.mount_table import MountWatch, watch_for
from unstick.agent.probe.plugins import Plugin, registered_plugins
from unstick.agent.probe.waiters import scan_waiters
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.safepath import PathGone, UnsafePath, check_path, parent_fd
from unstick.agent.steps.vol_data import VOL_DATA
from unstick.core.model.kubelet_paths import is_pod_volume_path, normalise, pod_dir
from unstick.core.model.mountinfo import Mount


class Refused(Exception):
    """A precondition does not hold: the step is refused and nothing is changed."""


def _identity(m: Mount) -> tuple[int, int, int, str, str, str]:
    """What must not change between planning and acting on a mount: its mount id (which
    the kernel may reuse), its identity (device and root: core/model/mount_identity.py),
    filesystem type and source."""
    return (m.mount_id, m.major, m.minor, m.root, m.fstype, m.source)


def _words(mounts: tuple[Mount, ...]) -> str:
    return ", ".join(f"id {m.mount_id} {m.fstype} {m.source} at {m.mount_point}" for m in mounts)


@dataclass(frozen=True)
class AtPoint:
    """What an unmount at `top.mount_point` can take, as read from one table: `top`, the
    mount on top there (a plain umount takes it), `stack`, every mount at the point (the
    top one among them), and `below`, every mount strictly below the point (MNT_DETACH
    takes the top one's whole subtree). The holder scan is of `top` (and, before a
    MNT_DETACH, of `below`); right before the act `Checks.check_unchanged` re-reads them."""

    top: Mount
    stack: tuple[Mount, ...]
    below: tuple[Mount, ...]

    def identities(self) -> tuple[object, ...]:
        return (
            _identity(self.top),
            frozenset(map(_identity, self.stack)),
            frozenset(map(_identity, self.below)),
        )


def at_point(mounts: list[Mount], point: str) -> tuple[list[Mount], AtPoint | None]:
    """The mounts at `point` among `mounts` (a pod table's), and what an unmount there
    would take (None when nothing or more than one mount is on top there)."""
    here = [m for m in mounts if m.mount_point == point]
    parents = {m.parent_id for m in here}
    top = [m for m in here if m.mount_id not in parents]  # what umount2 would hit
    if len(top) != 1:
        return here, None
    below = tuple(m for m in mounts if m.mount_point.startswith(point.rstrip("/") + "/"))
    return here, AtPoint(top[0], tuple(here), below)


FRESH = "each right after its own checks"  # in a step's message: see ActLog
REREAD = "top and below re-read after the holder scan"  # ditto


@dataclass
class ActLog:
    """What was checked since this thread's last act (reset by each act), and the step's
    tally: every act (umount2, NodeUnpublishVolume, rmdir) must follow, in its own step
    and since the previous act, a check of the mount table (re-read, or unchanged since
    its last read per poll), of the pod's containers and — for an unmount or unpublish —
    of the mount's holders; a umount2 (plain or MNT_DETACH) also a re-read, after the
    holder scan, of the mount on top at its path and of the mounts below it
    (`Checks.check_unchanged`). The tally goes into the step's message, so the record
    shows it (`[acts 2, each right after its own checks: table unchanged 2, top and below
    re-read after the holder scan 2]`)."""

    table: str | None = None  # "re-read" | "unchanged"
    holders: bool = False
    containers: bool = False
    unchanged: bool = False  # top and below re-read after the holder scan, the same
    acts: int = 0
    fresh: int = 0
    rereads: int = 0
    tables: dict[str, int] = field(default_factory=dict)

    def act(self, needs_holders: bool, needs_reread: bool = False) -> None:
        self.acts += 1
        if (
            self.table
            and self.containers
            and (self.holders or not needs_holders)
            and (self.unchanged or not needs_reread)
        ):
            self.fresh += 1
            self.tables[self.table] = self.tables.get(self.table, 0) + 1
            self.rereads += needs_reread
        self.table, self.holders, self.containers, self.unchanged = None, False, False, False

    def summary(self) -> str:
        if not self.acts:
            return ""
        how = ", ".join(f"table {k} {v}" for k, v in sorted(self.tables.items()))
        if self.rereads:
            how += f", {REREAD} {self.rereads}"
        if self.fresh == self.acts:
            return f" [acts {self.acts}, {FRESH}: {how}]"
        return f" [acts {self.acts}, only {self.fresh} right after their own checks: {how}]"


@dataclass
class Checks:
    """What every node step shares: the node's settings and clock, the mount table, this
    thread's ActLog, the holder scans, the CSI volume locks, and the checks each act re-runs
    right before it. The executor (agent/steps/executor.py) holds one and hands it to each
    step."""

    settings: AgentSettings
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    plugins: Callable[[], dict[str, Plugin]] | None = None
    mounts: MountWatch | None = None  # default: the process's watch of settings.mountinfo
    _local: threading.local = field(default_factory=threading.local, repr=False)
    # at most one CSI call in flight per volume (the CSI spec's rule; the kubelet keeps it
    # too): replays of different volumes may run at once on the worker threads
    volume_locks: KeyLocks = field(default_factory=KeyLocks, repr=False)
    # holder scans shared by the checks (acts' and probes') asked at the same moment, each
    # a scan that started after its caller asked (agent/holders/scan_group.py)
    holder_scans: ScanGroup = field(default_factory=ScanGroup, repr=False)

    @property
    def root(self) -> str:
        return normalise(self.settings.kubelet_root) or self.settings.kubelet_root

    @property
    def watch(self) -> MountWatch:
        """The mount table, re-read when the kernel says it changed (probe/mount_table.py)."""
        if self.mounts is None:
            self.mounts = watch_for(self.settings.mountinfo)
        return self.mounts

    def start_step(self) -> None:
        """A new ActLog for the step this thread starts."""
        self._local.log = ActLog()

    @property
    def acts(self) -> ActLog:
        """This thread's log of checks and acts for the step it runs."""
        log_: ActLog | None = getattr(self._local, "log", None)
        if log_ is None:
            log_ = self._local.log = ActLog()
        return log_

    def table(self) -> MountTable:
        """The host table's mounts under the kubelet root, as of now: a replay looks there
        for the pod's mount, the volume's staging mount and the volume's other pods."""
        table = self.watch.under(self.root)
        self.acts.table = "re-read" if self.watch.last_read_now() else "unchanged"
        return table

    def pod_table(self, uid: str) -> MountTable:
        """The host table's mounts under this pod's directory, as of now: all a check of
        this pod's paths needs (no other line is parsed)."""
        table = self.watch.pod_table(self.root, uid)
        self.acts.table = "re-read" if self.watch.last_read_now() else "unchanged"
        return table

    def select(
        self,
        uid: str,
        target: str,
        derived: list[str],
        what: str,
        *,
        table: MountTable,
        exists_ok: bool,
    ) -> list[str]:
        """The derived paths the target selects: all for "" or the pod dir, else the derived
        path equal to it plus those below it. A target of this pod that was not derived is
        accepted only when there is nothing to do at it (see `_nothing_there`)."""
        wanted = normalise(target) if target else ""
        if wanted is None:
            raise Refused(f"target {target!r} is not a normalised absolute path")
        if wanted in ("", pod_dir(self.root, uid)):
            return derived
        if wanted in derived:
            return [p for p in derived if p == wanted or p.startswith(wanted + "/")]
        self._nothing_there(uid, wanted, what, table, exists_ok)
        return []

    def _nothing_there(
        self, uid: str, path: str, what: str, table: MountTable, exists_ok: bool
    ) -> None:
        """Raise Refused unless `path`, under this pod's volume dirs, is already gone (or, with
        `exists_ok`, is a plain directory, not through any symlink, and not mounted): then a
        step planned from an older probe has nothing left to do there."""
        not_derived = f"target {path!r} is not one of the {what} the agent derived for pod {uid}"
        if not is_pod_volume_path(path, self.root, uid):
            raise Refused(not_derived)
        for mount in table.pod_mounts(self.root, uid):
            if path.startswith(mount.mount_point.rstrip("/") + "/"):
                raise Refused(f"{not_derived}: it is inside the mount {mount.mount_point}")
        try:
            check_path(path, is_mount_point=False)
        except PathGone:
            return
        except UnsafePath as exc:
            raise Refused(f"unsafe path: {exc}") from None
        if not exists_ok:
            raise Refused(not_derived)

    def check_pod(self, uid: str) -> None:
        s = self.settings
        why = still_running(s.host_proc, uid, s.cri_socket, s.grpc_timeout_s)
        if why:
            raise Refused(why)
        self.acts.containers = True

    def check_mount(self, uid: str, mount: Mount) -> None:
        self.check_path(uid, mount)
        self.check_no_holders(mount)

    def check_mounts(self, uid: str, mounts: list[Mount]) -> None:
        """`check_mount` for each, with one holder scan for all of them (a plan's check:
        each act re-checks its own mount right before it)."""
        for mount in mounts:
            self.check_path(uid, mount)
        self.check_no_holders(*mounts)

    def check_path(self, uid: str, mount: Mount) -> None:
        path = mount.mount_point
        if not is_pod_volume_path(path, self.root, uid):
            raise Refused(f"{path} is not under this pod's volumes/ or volume-subpaths/")
        try:
            check_path(path, is_mount_point=True)
        except UnsafePath as exc:
            raise Refused(f"unsafe path: {exc}") from None

    def check_no_holders(self, *mounts: Mount, after: str = "") -> None:
        """Refused unless a complete holder scan, started now, finds nobody holding any of
        the mounts."""
        with shared_scans(self.holder_scans):  # a scan started after this call (scan_group)
            scan = scan_holders(self.settings.host_proc, mounts, kubelet_root=self.root)
        if scan.holders:
            point = scan.holders[0].mount_point
            names = ", ".join(
                f"pid {h.pid} ({h.comm}) via {h.via}"
                for h in scan.holders
                if h.mount_point == point
            )
            raise Refused(f"{after}{point} is held: {names}")
        if scan.unknown:
            points = ", ".join(dict.fromkeys(m.mount_point for m in mounts))
            raise Refused(f"{after}cannot tell who holds {points}, not unmounting: {scan.unknown}")
        self.acts.holders = True

    def check_no_waiters(self, *mounts: Mount) -> None:
        """Refused when a task is blocked looking up a path through one of the mounts
        (agent/probe/waiters.py), or one that could be cannot be told: a plain umount
        (a CSI driver's unpublish too) would hang with it, and hold the worker for ever. A
        hung mount is lazy-unmount's."""
        scan = scan_waiters(self.settings.host_proc, mounts)
        if scan.waiters:
            point = scan.waiters[0].mount_point
            names = "; ".join(w.words() for w in scan.waiters if w.mount_point == point)
            raise Refused(
                f"{point} hangs: {names} — a plain unmount would hang too, not unmounting "
                "(a hung mount is for lazy-unmount)"
            )
        if scan.unknown:
            points = ", ".join(dict.fromkeys(m.mount_point for m in mounts))
            raise Refused(
                f"cannot tell whether tasks blocked in a path lookup wait on {points}, not "
                f"unmounting: {'; '.join(scan.unknown[:3])}"
            )

    def recheck(self, uid: str, planned: Mount) -> Mount | None:
        """The mount now on top at the planned mount point, re-read right before acting: None
        when nothing of this pod is mounted there any more; Refused unless it is the planned
        mount (same mount id, device, root, filesystem type and source: a mount id can be
        reused by a new mount, and a new mount can appear at the same path)."""
        now = self.at(uid, planned)
        return None if now is None else now.top

    def at(self, uid: str, planned: Mount) -> AtPoint | None:
        """`recheck`, with the mounts stacked at the point and below it, from the same read
        of the table: what the holder scan before an unmount is of."""
        here, now = at_point(self.pod_table(uid).pod_mounts(self.root, uid), planned.mount_point)
        if not here:
            return None
        if now is None or _identity(now.top) != _identity(planned):
            listed = ", ".join(f"id {m.mount_id} {m.fstype} {m.source}" for m in here)
            raise Refused(
                f"{planned.mount_point} changed since it was planned (mount id "
                f"{planned.mount_id} {planned.fstype} {planned.source}; now {listed}): "
                "not unmounting"
            )
        return now

    def check_unchanged(self, uid: str, scanned: AtPoint, after: str = "") -> None:
        """Right before a umount2 at `scanned.top`'s path, after its holder scan: the table
        re-read, the mount on top there, every mount stacked there and every mount below
        it must be the ones scanned (mount id and identity, core/model/mount_identity.py),
        else Refused — a plain umount would take a mount stacked since on top, MNT_DETACH
        that one or one mounted below, with its users' files."""
        point = scanned.top.mount_point
        _, now = at_point(self.pod_table(uid).pod_mounts(self.root, uid), point)
        if now is None or now.identities() != scanned.identities():
            was = _words((*scanned.stack, *scanned.below))
            is_ = _words((*now.stack, *now.below)) if now is not None else "not one mount on top"
            raise Refused(
                f"{after}{point} changed since the holder scan (scanned: {was}; now: {is_}): "
                "not unmounting"
            )
        self.acts.unchanged = True

    def volume_lock(self, driver: str, handle: str) -> contextlib.AbstractContextManager[None]:
        """Held around a volume's CSI calls (NodeUnpublishVolume, NodeUnstageVolume)."""
        return self.volume_locks.held(f"{driver}\0{handle}")

    def csi_drivers(self) -> dict[str, Plugin]:
        """The CSI drivers registered on this node now (`plugins`, else the kubelet's
        registry)."""
        if self.plugins is not None:
            return self.plugins()
        return registered_plugins(self.settings.registry_dir, self.settings.grpc_timeout_s)

    def read_vol_data(self, volume_dir: str) -> dict[str, str]:
        """The kubelet's `vol_data.json` of a CSI volume dir, read without following symlinks."""
        path = os.path.join(volume_dir, VOL_DATA)
        try:
            with parent_fd(path) as (fd, name):
                ffd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                with os.fdopen(ffd, encoding="utf-8") as f:
                    data = json.loads(f.read(65536))
        except (OSError, UnsafePath, ValueError) as exc:
            raise Refused(f"cannot read {path}: {exc}") from None
        if not isinstance(data, dict):
            raise Refused(f"{path}: not a JSON object")
        for key in ("volumeHandle", "driverName"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise Refused(f"{path}: {key} missing or not a string")
        return {k: v for k, v in data.items() if isinstance(v, str)}

    def driver_names(self) -> set[str]:
        """The CSI drivers registered on this node now (the kubelet's registry)."""
        return set(self.csi_drivers())
