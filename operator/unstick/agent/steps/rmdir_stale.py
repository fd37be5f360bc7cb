"""rmdir-stale: the pod's empty volume directories, deepest first, never recursively and
never through a symlink; the kubelet's own `vol_data.json` only as
agent/steps/vol_data.py allows."""

from __future__ import annotations

import os

from unstick.agent.probe.volume_dirs import volume_dirs
from unstick.agent.steps.checks import Checks, Refused
from unstick.agent.steps.safepath import UnsafePath, rmdir_at
from unstick.agent.steps.vol_data import (
    VOL_DATA,
    is_csi_mount_dir,
    left_for_kubelet,
    settle_after_mount_rmdir,
)
from unstick.core.model.kubelet_paths import SUBPATHS, depth, is_pod_volume_path, pod_dir


def run(checks: Checks, uid: str, target: str, dry_run: bool) -> str:
    """Remove the pod's empty volume directories, deepest first, never recursively and
    never through a symlink. The kubelet's own `vol_data.json` of a CSI volume goes only
    with its `mount` dir and only while the volume's driver is registered (else the
    kubelet still needs it: agent/steps/vol_data.py); a dir left for the kubelet is reported
    as kept, not as a failure. `volumes/` itself and everything above it stay."""
    table = checks.pod_table(uid)
    dirs = [d.path for d in volume_dirs(checks.root, uid, table.mount_points())]
    subpaths = os.path.join(pod_dir(checks.root, uid), SUBPATHS)
    candidates = [*dirs, subpaths] if os.path.isdir(subpaths) else dirs
    selected = checks.select(
        uid, target, candidates, "volume directories", table=table, exists_ok=False
    )
    selected.sort(key=lambda p: -depth(p))
    if not selected:
        return "no volume directories left (nothing to do)"
    if dry_run or len(selected) > 1:  # else: the check right before its one rmdir
        checks.check_pod(uid)
    if dry_run:
        return "would remove the empty ones of " + ", ".join(selected)
    removed: list[str] = []
    kept: list[str] = []
    notes: list[str] = []
    for path in selected:
        if _rmdir_one(checks, uid, path, notes):
            removed.append(path)
        elif left_for_kubelet(path, checks.root, uid):
            notes.append(f"{path} left for the kubelet (it holds only {VOL_DATA})")
        else:
            kept.append(path)
    if kept:
        raise RuntimeError(f"not empty, kept: {', '.join(kept)}; removed: {len(removed)}")
    return "; ".join([f"removed {len(removed)} empty directories", *dict.fromkeys(notes)])


def _rmdir_one(checks: Checks, uid: str, path: str, notes: list[str]) -> bool:
    table = checks.pod_table(uid)  # `path` is under the pod's directory
    inside = [m.mount_point for m in table.mounts if m.mount_point.startswith(path + "/")]
    if path in table.mount_points() or inside:
        raise Refused(f"{path} is (or contains) a mount point")
    subpaths = os.path.join(pod_dir(checks.root, uid), SUBPATHS)
    if not (is_pod_volume_path(path, checks.root, uid) or path == subpaths):
        raise Refused(f"{path} is not a volume directory of pod {uid}")
    checks.check_pod(uid)  # right before acting: a container may have started meanwhile
    existed: list[str] = []
    try:
        removed = rmdir_at(path, lambda fd, name: _before_rmdir(checks, existed, name))
    except UnsafePath as exc:
        raise Refused(f"unsafe path: {exc}") from None
    if removed and existed and is_csi_mount_dir(path, checks.root, uid):
        try:
            note = settle_after_mount_rmdir(os.path.dirname(path), checks.driver_names)
        except UnsafePath as exc:
            raise Refused(f"unsafe path: {exc}") from None
        if note:
            notes.append(note)
    return removed


def _before_rmdir(checks: Checks, existed: list[str], name: str) -> None:
    existed.append(name)  # the dir was there right before the rmdir: this act removes it
    checks.acts.act(needs_holders=False)
