"""The pod's volume directories as the kubelet lays them out, listed without following
symlinks and without entering mount points.

Listed levels (nothing deeper: below them is the user's data):

    <root>/pods/<uid>/volumes/<plugin>
    <root>/pods/<uid>/volumes/<plugin>/<volume>
    <root>/pods/<uid>/volumes/kubernetes.io~csi/<volume>/mount
    <root>/pods/<uid>/volume-subpaths/<volume>[/<container>[/<index>]]

A directory that is a mount point (per the mount table) is reported with `empty: false`
and never opened or stat'ed. Symlinks are never followed and not reported. A directory is
`empty` when it has no entries at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from unstick.core.model.kubelet_paths import CSI_PLUGIN, SUBPATHS, VOLUMES, pod_dir
from unstick.core.model.probe import VolumeDir

_CSI_MOUNT_DIR = "mount"


def _subdirs(path: str, mount_points: frozenset[str]) -> Iterator[str]:
    """Real (non-symlink) subdirectories of a directory that is not a mount point."""
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        child = os.path.join(path, entry.name)
        if child in mount_points:
            yield child  # never stat a mount point: it is a directory by definition
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                yield child
        except OSError:
            continue


def _is_empty(path: str, mount_points: frozenset[str]) -> bool:
    if path in mount_points:
        return False
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except OSError:
        return False


def _walk(top: str, depth: int, mount_points: frozenset[str], csi: bool) -> Iterator[str]:
    """Directories under `top` down to `depth` levels; for CSI, only `<volume>/mount` below."""
    for child in _subdirs(top, mount_points):
        yield child
        if child in mount_points or depth <= 1:
            continue
        if csi and os.path.basename(child) == CSI_PLUGIN:
            for volume in _subdirs(child, mount_points):
                yield volume
                if volume in mount_points:
                    continue
                for leaf in _subdirs(volume, mount_points):
                    if os.path.basename(leaf) == _CSI_MOUNT_DIR:
                        yield leaf
            continue
        yield from _walk(child, depth - 1, mount_points, csi=False)


def volume_dirs(kubelet_root: str, uid: str, mount_points: frozenset[str]) -> list[VolumeDir]:
    """The pod's volume directories (see module doc), parents before children."""
    base = pod_dir(kubelet_root, uid)
    found: list[VolumeDir] = []
    for sub, depth in ((VOLUMES, 2), (SUBPATHS, 3)):
        top = os.path.join(base, sub)
        if top in mount_points or os.path.islink(top):
            continue
        for path in _walk(top, depth, mount_points, csi=sub == VOLUMES):
            found.append(VolumeDir(path, _is_empty(path, mount_points)))
    return found
