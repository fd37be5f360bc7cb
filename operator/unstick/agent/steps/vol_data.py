"""The kubelet's own `vol_data.json` of a CSI volume dir, and when rmdir-stale may remove it.

The kubelet tears a CSI volume of a pod down in one go (pkg/volume/csi csi_mounter.go
`TearDownAt` → `removeMountDir`): NodeUnpublishVolume through the driver, then the `mount`
dir, then `vol_data.json`, then the volume dir `volumes/kubernetes.io~csi/<pv>`. Until that
succeeds its volume manager still holds the volume for the pod, and every retry starts by
reading `vol_data.json` (`NewUnmounter`): without the file it can never finish, never
unstages, and the volume stays in use on the node until the kubelet restarts (found with
csi-driver-host-path uninstalled and reinstalled, docs/csi.md).

So unstick removes `vol_data.json` only in the act in which rmdir-stale removes the
volume's empty `mount` dir, and only when the driver named in it is registered on the node
right then (the kubelet's own registry, `plugins_registry/`): the OrphanedMount case, where
the kubelet's TearDown "succeeded" and it holds the volume no more. With the driver missing,
the kubelet cannot have torn the volume down (CSIDriverMissing): the `mount` dir goes, the
file stays, and the kubelet finishes the volume by itself once the driver is back
(NodeUnpublishVolume of a target that is not mounted is OK by the CSI spec; `removeMountDir`
then removes the file and the dir). A volume dir that holds `vol_data.json` and no `mount`
dir is never touched: that is what unstick leaves for the kubelet (or what a kubelet killed
half-way through `removeMountDir` leaves — it finishes it after its restart, from the
file); so is one whose driver removed its target in a replayed NodeUnpublishVolume
(agent/steps/replay_unpublish.py).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Collection

from unstick.agent.steps.safepath import PathGone, parent_fd
from unstick.core.model.kubelet_paths import CSI_PLUGIN, VOLUMES, classify, pod_dir

VOL_DATA = "vol_data.json"
MOUNT_DIR = "mount"
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO never blocks


def is_csi_mount_dir(path: str, root: str, uid: str) -> bool:
    """`volumes/kubernetes.io~csi/<pv>/mount` of this pod."""
    info = classify(path, root, uid)
    return (
        info is not None
        and info.kind == "volume"
        and info.plugin == CSI_PLUGIN
        and info.rest == MOUNT_DIR
    )


def is_csi_volume_dir(path: str, root: str, uid: str) -> bool:
    """`volumes/kubernetes.io~csi/<pv>` of this pod."""
    info = classify(path, root, uid)
    return (
        info is not None and info.kind == "volume" and info.plugin == CSI_PLUGIN and not info.rest
    )


def driver_at(dfd: int) -> str | None:
    """The `driverName` of the regular file `vol_data.json` in the directory `dfd` (an
    O_PATH fd will do), read without following symlinks; None when it is not there or not
    readable as such."""
    try:
        ffd = os.open(VOL_DATA, _READ_FLAGS, dir_fd=dfd)
    except OSError:
        return None
    with os.fdopen(ffd, encoding="utf-8") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        try:
            data = json.loads(f.read(65536))
        except (OSError, ValueError):
            return None
    driver = data.get("driverName") if isinstance(data, dict) else None
    return driver if isinstance(driver, str) and driver else None


def settle_after_mount_rmdir(volume_dir: str, registered: Callable[[], Collection[str]]) -> str:
    """Right after rmdir-stale removed `<volume_dir>/mount`: unlink the kubelet's
    `vol_data.json` beside it when it is all that is left there and its driver is registered
    now; else keep it. Returns "" when removed (or nothing to do: the dir gone), else why it
    was kept. Raises UnsafePath for a symlink on the way."""
    try:
        return _settle(volume_dir, registered)
    except (PathGone, FileNotFoundError):
        return ""


def _settle(volume_dir: str, registered: Callable[[], Collection[str]]) -> str:
    with parent_fd(volume_dir) as (parent, name):
        dfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=parent)
        try:
            if set(os.listdir(f"/proc/self/fd/{dfd}")) != {VOL_DATA}:
                return ""  # something else there too: rmdir-stale keeps the dir anyway
            driver = driver_at(dfd)
            if driver is None:
                return f"kept {volume_dir}/{VOL_DATA}: no CSI driver can be read from it"
            if driver not in registered():
                return kept_reason(volume_dir, driver)
            os.unlink(VOL_DATA, dir_fd=dfd)
            return ""
        finally:
            os.close(dfd)


def kept_reason(volume_dir: str, driver: str) -> str:
    return (
        f"kept {volume_dir}/{VOL_DATA}: CSI driver {driver} is not registered on this node, "
        "so the kubelet has not torn the volume down; it needs this file to do so once "
        f"{driver} is back, and then removes the dir itself"
    )


def left_for_kubelet(path: str, root: str, uid: str) -> bool:
    """A CSI volume dir of this pod holding `vol_data.json` and no `mount` dir, or a parent
    (`volumes/kubernetes.io~csi`) holding only such dirs: what rmdir-stale leaves to the
    kubelet (see the module doc). Read without following symlinks."""
    if is_csi_volume_dir(path, root, uid):
        return _holds_only_vol_data(path)
    if path != os.path.join(pod_dir(root, uid), VOLUMES, CSI_PLUGIN):
        return False
    try:
        with os.scandir(path) as it:
            children = [e for e in it]
    except OSError:
        return False
    return bool(children) and all(
        e.is_dir(follow_symlinks=False) and _holds_only_vol_data(e.path) for e in children
    )


def _holds_only_vol_data(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            entries = [e for e in it]
    except OSError:
        return False
    return [e.name for e in entries] == [VOL_DATA] and entries[0].is_file(follow_symlinks=False)
