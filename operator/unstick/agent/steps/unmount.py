"""The node step `unmount`: the pod's volume and subpath mounts the target selects, deepest
first (stacked mounts top first). Before the first act all of them are checked (a dry run
stops there); right before each umount2 its own mount is re-read and re-checked: still the
planned mount, under this pod's volume dirs with no symlink, no holder, no container of the
pod running, no task blocked in a path lookup through it (agent/steps/checks.py); then,
after that holder scan, the mount on top at the path and the mounts below it are re-read
once more and must be the ones scanned (`Checks.check_unchanged`: a mount stacked there
meanwhile is what umount2 would take)."""

from __future__ import annotations

import errno

from unstick.agent.steps.checks import AtPoint, Checks
from unstick.agent.steps.umount2 import MNT_DETACH, umount2


def run(checks: Checks, uid: str, target: str, dry_run: bool, *, lazy: bool = False) -> str:
    """Unmount the pod's volume/subpath mounts (deepest first); plain umount, lazy
    (MNT_DETACH) only if `lazy`, the plain one failed with EBUSY and a complete holder
    scan right after still finds no holder; never MNT_FORCE."""
    table = checks.pod_table(uid)
    mounts = table.pod_mounts(checks.root, uid)
    points = list(dict.fromkeys(m.mount_point for m in mounts))
    selected = checks.select(uid, target, points, "mount points", table=table, exists_ok=True)
    # deepest first; where mounts are stacked on one point, the top (listed last) first
    todo = [m for p in selected for m in reversed(mounts) if m.mount_point == p]
    if not todo:
        return "not mounted (nothing to do)"
    if dry_run or len(todo) > 1:  # all or none: every mount checked before the first act
        checks.check_pod(uid)
        checks.check_mounts(uid, todo)
        checks.check_no_waiters(*todo)  # a hung mount's unmount hangs
    # one mount: the checks right before its act (below) are these
    if dry_run:
        return "would unmount " + ", ".join(m.mount_point for m in todo)
    done = []
    for mount in todo:
        scanned = checks.at(uid, mount)
        if scanned is None:
            continue  # gone meanwhile
        current = scanned.top
        checks.check_pod(uid)
        checks.check_mount(uid, current)
        checks.check_no_waiters(current)
        done.append(_umount(checks, uid, scanned, lazy))
    left = {(m.mount_id, m.mount_point) for m in checks.pod_table(uid).mounts} & {
        (m.mount_id, m.mount_point) for m in todo
    }
    if left:
        raise RuntimeError(f"still mounted after unmount: {sorted(p for _, p in left)}")
    return "unmounted " + ", ".join(done)


def _umount(checks: Checks, uid: str, scanned: AtPoint, lazy: bool) -> str:
    """Plain umount of the re-read mount, if what is at and below its path is still what
    was scanned; with `lazy`, MNT_DETACH after EBUSY only if the planned mount is still
    the one on top (re-read: MNT_DETACH takes whatever is mounted there now, and its whole
    subtree), a fresh, complete holder scan of it and of every mount below it still finds
    nobody (a hold that is not a process, e.g. an fd in flight), no container of the pod
    runs, and after that scan the top and the mounts below are still the ones scanned."""
    mount = scanned.top
    checks.check_unchanged(uid, scanned)
    checks.acts.act(needs_holders=True, needs_reread=True)
    try:
        umount2(mount.mount_point)
        return mount.mount_point
    except OSError as exc:
        if not (lazy and exc.errno == errno.EBUSY):
            raise
    busy = "busy (EBUSY) and "
    again = checks.at(uid, mount)
    if again is None:
        return f"{mount.mount_point} (gone meanwhile)"
    checks.check_pod(uid)
    checks.check_no_holders(again.top, *again.below, after=busy)
    checks.check_unchanged(uid, again, after=busy)
    checks.acts.act(needs_holders=True, needs_reread=True)
    umount2(again.top.mount_point, MNT_DETACH)
    return f"{again.top.mount_point} (lazy)"
