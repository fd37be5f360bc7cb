"""The node step `lazy-unmount`, for one hung network/FUSE mount of a pod (the probe finds
such mounts without touching them: agent/probe/hung_mounts.py).

`lazy-unmount` (MNT_DETACH; never a plain umount, which can wait for ever
on the dead server, never MNT_FORCE) re-derives the mount from the pod UID and re-checks,
right before acting: it is a mount of this pod, of a network or FUSE filesystem, a
complete holder scan finds nobody holding it nor any mount below it (MNT_DETACH detaches
the whole subtree: an NFSv4 submount, or anything mounted inside the volume, goes with it),
no container of the pod runs; and, after that scan, right before MNT_DETACH, the mount on
top at the path and the mounts below it are re-read and must be the ones scanned
(`Checks.check_unchanged`: a mount stacked on it or inside it meanwhile would be detached
instead, or with it).
"""

from __future__ import annotations

from unstick.agent.steps.checks import Checks, Refused, at_point
from unstick.agent.steps.umount2 import MNT_DETACH, umount2
from unstick.core.model.kubelet_paths import is_pod_volume_path, normalise
from unstick.core.rules.hung_mounts import family


def run(checks: Checks, uid: str, target: str, dry_run: bool) -> str:
    """The node step `lazy-unmount` for one mount point of the pod (see the module doc)."""
    wanted = normalise(target) if target else None
    if wanted is None:
        raise Refused(f"target {target!r} is not a normalised absolute mount point")
    if not is_pod_volume_path(wanted, checks.root, uid):
        raise Refused(f"{wanted} is not under this pod's volumes/ or volume-subpaths/")
    here, scanned = at_point(checks.pod_table(uid).pod_mounts(checks.root, uid), wanted)
    if not here:
        return f"{wanted} is not mounted (nothing to do)"
    if scanned is None or family(scanned.top.fstype) is None:
        kinds = ", ".join(m.fstype for m in here)
        raise Refused(f"{wanted} is not one network or FUSE mount ({kinds}): not lazily unmounted")
    mount = scanned.top
    checks.check_pod(uid)
    checks.check_path(uid, mount)
    # MNT_DETACH takes the whole subtree: every mount below the point goes with it, so
    # their holders count too (an NFSv4 submount, a mount stacked in the volume)
    checks.check_no_holders(mount, *scanned.below)
    if dry_run:
        return f"would lazily unmount {wanted} ({mount.fstype} from {mount.source})"
    checks.check_unchanged(uid, scanned)
    checks.acts.act(needs_holders=True, needs_reread=True)
    umount2(wanted, MNT_DETACH)
    return f"lazily unmounted {wanted} ({mount.fstype} from {mount.source})"
