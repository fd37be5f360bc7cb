"""The node step `unmount`: the pod's volume and subpath mounts the target selects, deepest
first (stacked mounts top first). Before the first act all of them are checked (a dry run
stops there); right before each umount2 its own mount is re-read and re-checked: still the
planned mount, under this pod's volume dirs with no symlink, no holder, no container of the
pod running, no task blocked in a path lookup through it (agent/steps/checks.py)."""

from __future__ import annotations

import errno

from unstick.agent.steps.checks import Checks
from unstick.agent.steps.umount2 import MNT_DETACH, umount2
from unstick.core.model.mountinfo import Mount


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
        current = checks.recheck(uid, mount)
        if current is None:
            continue  # gone meanwhile
        checks.check_pod(uid)
        checks.check_mount(uid, current)
        checks.check_no_waiters(current)
        done.append(_umount(checks, uid, current, lazy))
    left = {(m.mount_id, m.mount_point) for m in checks.pod_table(uid).mounts} & {
        (m.mount_id, m.mount_point) for m in todo
    }
    if left:
        raise RuntimeError(f"still mounted after unmount: {sorted(p for _, p in left)}")
    return "unmounted " + ", ".join(done)


def _umount(checks: Checks, uid: str, mount: Mount, lazy: bool) -> str:
    """Plain umount of the re-read mount; with `lazy`, MNT_DETACH after EBUSY only if the
    planned mount is still the one on top (re-read: MNT_DETACH takes whatever is
    mounted there now, and its whole subtree) and a fresh, complete holder scan still
    finds nobody (a hold that is not a process, e.g. an fd in flight)."""
    checks.acts.act(needs_holders=True)
    try:
        umount2(mount.mount_point)
        return mount.mount_point
    except OSError as exc:
        if not (lazy and exc.errno == errno.EBUSY):
            raise
    current = checks.recheck(uid, mount)
    if current is None:
        return f"{mount.mount_point} (gone meanwhile)"
    checks.check_no_holders(current, after="busy (EBUSY) and ")
    umount2(current.mount_point, MNT_DETACH)
    return f"{current.mount_point} (lazy)"
