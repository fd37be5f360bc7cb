"""The node actions of design.md §3, one method per action, each re-checking its own
preconditions on the host right before it acts: `run_step` runs one; unmount and
replay-unpublish are here, rmdir-stale in agent/steps/rmdir_stale.py, the checks they share (and
the rules every act follows) in agent/steps/checks.py.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from unstick.agent.probe.mount_table import lines_under
from unstick.agent.steps.checks import (
    DRY_RUN,
    FAILED,
    FRESH,
    REFUSED,
    SUCCEEDED,
    ActLog,
    Refused,
    StepResult,
)
from unstick.agent.steps.lazy_unmount import lazy_unmount
from unstick.agent.steps.replay_unpublish import replay_volume
from unstick.agent.steps.restart_kubelet import restart_kubelet
from unstick.agent.steps.rmdir_stale import RmdirSteps
from unstick.agent.steps.thaw import ThawRefused, thaw_cgroup
from unstick.agent.steps.umount2 import MNT_DETACH, umount2
from unstick.core.model.kubelet_paths import classify, pod_dir
from unstick.core.model.mountinfo import Mount

__all__ = [
    "DRY_RUN",
    "FAILED",
    "FRESH",
    "REFUSED",
    "SUCCEEDED",
    "ActLog",
    "Executor",
    "Refused",
    "StepResult",
    "lines_under",
]

log = logging.getLogger(__name__)


@dataclass
class Executor(RmdirSteps):
    """Runs node steps for pods of this node (the shared checks: agent/steps/checks.py)."""

    # --- entry point ---------------------------------------------------------------

    def run_step(
        self, uid: str, action: str, target: str = "", *, dry_run: bool, lazy_unmount: bool
    ) -> StepResult:
        """Run one node step; never raises for a bad step or a failed precondition."""
        actions: dict[str, Callable[[str, str, bool], str]] = {
            "replay-unpublish": self.replay_unpublish,
            "unmount": lambda u, t, d: self.unmount(u, t, d, lazy=lazy_unmount),
            "rmdir-stale": self.rmdir_stale,
            "restart-kubelet": self.restart_kubelet,
            "thaw": self.thaw,
            "lazy-unmount": self.lazy_unmount,
        }
        fn = actions.get(action)
        if fn is None:
            return self._result(action, target, REFUSED, f"{action!r} is not a node action")
        try:
            pod_dir(self.root, uid)
        except ValueError as exc:
            return self._result(action, target, REFUSED, str(exc))
        self._local.log = ActLog()
        try:
            message = fn(uid, target, dry_run) + self.acts.summary()
        except Refused as exc:
            return self._result(action, target, REFUSED, str(exc))
        except Exception as exc:  # the step failed; report, never crash the agent
            log.exception("%s failed", action)
            return self._result(action, target, FAILED, f"{type(exc).__name__}: {exc}")
        return self._result(action, target, DRY_RUN if dry_run else SUCCEEDED, message)

    # --- unmount -------------------------------------------------------------------

    def unmount(self, uid: str, target: str, dry_run: bool, *, lazy: bool = False) -> str:
        """Unmount the pod's volume/subpath mounts (deepest first); plain umount, lazy
        (MNT_DETACH) only if `lazy`, the plain one failed with EBUSY and a complete holder
        scan right after still finds no holder; never MNT_FORCE."""
        table = self._pod_table(uid)
        mounts = table.pod_mounts(self.root, uid)
        points = list(dict.fromkeys(m.mount_point for m in mounts))
        selected = self._select(uid, target, points, "mount points", table=table, exists_ok=True)
        # deepest first; where mounts are stacked on one point, the top (listed last) first
        todo = [m for p in selected for m in reversed(mounts) if m.mount_point == p]
        if not todo:
            return "not mounted (nothing to do)"
        if dry_run or len(todo) > 1:  # all or none: every mount checked before the first act
            self._check_pod(uid)
            self._check_mounts(uid, todo)
            self._check_no_waiters(*todo)  # issue #25: a hung mount's unmount hangs
        # one mount: the checks right before its act (below) are these
        if dry_run:
            return "would unmount " + ", ".join(m.mount_point for m in todo)
        done = []
        for mount in todo:
            current = self._recheck(uid, mount)
            if current is None:
                continue  # gone meanwhile
            self._check_pod(uid)
            self._check_mount(uid, current)
            self._check_no_waiters(current)
            done.append(self._umount(uid, current, lazy))
        left = {(m.mount_id, m.mount_point) for m in self._pod_table(uid).mounts} & {
            (m.mount_id, m.mount_point) for m in todo
        }
        if left:
            raise RuntimeError(f"still mounted after unmount: {sorted(p for _, p in left)}")
        return "unmounted " + ", ".join(done)

    def _umount(self, uid: str, mount: Mount, lazy: bool) -> str:
        """Plain umount of the re-read mount; with `lazy`, MNT_DETACH after EBUSY only if the
        planned mount is still the one on top (re-read: MNT_DETACH takes whatever is
        mounted there now, and its whole subtree) and a fresh, complete holder scan still
        finds nobody (a hold that is not a process, e.g. an fd in flight)."""
        self.acts.act(needs_holders=True)
        try:
            umount2(mount.mount_point)
            return mount.mount_point
        except OSError as exc:
            if not (lazy and exc.errno == errno.EBUSY):
                raise
        current = self._recheck(uid, mount)
        if current is None:
            return f"{mount.mount_point} (gone meanwhile)"
        self._check_no_holders(current, after="busy (EBUSY) and ")
        umount2(current.mount_point, MNT_DETACH)
        return f"{current.mount_point} (lazy)"

    # --- replay-unpublish ----------------------------------------------------------

    def replay_unpublish(self, uid: str, target: str, dry_run: bool) -> str:
        """NodeUnpublishVolume for the pod's mounted CSI volumes (then NodeUnstageVolume
        where the staging mount is used by no other pod), as the kubelet would."""
        table = self._pod_table(uid)
        csi = [
            m
            for m in table.pod_mounts(self.root, uid)
            if (c := classify(m.mount_point, self.root, uid)) and c.csi_volume and c.rest == "mount"
        ]
        points = list(dict.fromkeys(m.mount_point for m in csi))
        selected = self._select(
            uid, target, points, "CSI target paths", table=table, exists_ok=True
        )
        if not selected:
            return "no CSI volume of this pod is mounted"
        if dry_run or len(selected) > 1:  # else: the check right before its one call
            self._check_pod(uid)
        plugins = (self.plugins or self._registered)()
        messages = []
        for path in selected:
            planned = next(m for m in csi if m.mount_point == path)
            data = self.read_vol_data(os.path.dirname(path))
            # at most one CSI call in flight per volume (the CSI spec's rule): the lock is
            # taken before the checks, so they stay right before the call
            with self.volume_lock(data["driverName"], data["volumeHandle"]):
                mount = self._recheck(uid, planned)  # each volume: the table as of now
                if mount is None:
                    messages.append(f"{path}: not mounted any more (nothing to do)")
                    continue
                self._check_pod(uid)
                self._check_mount(uid, mount)
                self._check_no_waiters(mount)  # issue #25: the driver's umount would hang
                if not dry_run:
                    self.acts.act(needs_holders=True)  # NodeUnpublishVolume, right after
                messages.append(replay_volume(self, uid, mount, plugins, dry_run))
        return "; ".join(messages)

    # --- thaw (agent/steps/thaw.py) ------------------------------------------------------

    def thaw(self, uid: str, target: str, dry_run: bool) -> str:
        """Thaw one frozen cgroup of the pod, re-found by a fresh scan from the pod UID."""
        try:
            return thaw_cgroup(self.settings.host_proc, uid, target, dry_run)
        except ThawRefused as exc:
            raise Refused(str(exc)) from None

    # --- lazy-unmount (agent/steps/lazy_unmount.py) -------------------------------------

    def lazy_unmount(self, uid: str, target: str, dry_run: bool) -> str:
        """MNT_DETACH of one hung network/FUSE mount of the pod, re-checked right before."""
        return lazy_unmount(self, uid, target, dry_run)

    # --- restart-kubelet -----------------------------------------------------------

    def restart_kubelet(self, uid: str, target: str, dry_run: bool) -> str:
        """Restart the kubelet with the configured host command, at most once an hour.
        The target is empty or this node's name."""
        if target not in ("", self.settings.node_name):
            raise Refused(f"target {target!r} is not this node ({self.settings.node_name})")
        return restart_kubelet(self.settings, self.clock(), dry_run)
