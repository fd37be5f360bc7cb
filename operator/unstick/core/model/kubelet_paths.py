"""Where the kubelet keeps a pod's volumes, as pure string work on absolute paths.

Layout under the kubelet root (default `/var/lib/kubelet`)::

    pods/<uid>/volumes/<plugin>/<volume>[/...]          e.g. kubernetes.io~csi/<pv>/mount
    pods/<uid>/volume-subpaths/<volume>/<container>/<index>
    plugins/kubernetes.io/csi/<driver>/<hash>/globalmount   (staging: NOT a pod mount)

Paths are normalised (repeated and trailing slashes, `.` components); a path with a
`..` component is never a pod path. No symlink resolution happens here: the agent
resolves paths without following symlinks before acting.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from unstick.core.model.mountinfo import Mount

VOLUMES = "volumes"
SUBPATHS = "volume-subpaths"
CSI_PLUGIN = "kubernetes.io~csi"


@dataclass(frozen=True, slots=True)
class PodVolumePath:
    """What a path under a pod's directory is.

    kind "volume": `volumes/<plugin>/<volume>[/rest]`; for the CSI plugin `volume` is the
    PV name (PVC-backed) or the pod's volume name (inline CSI volume).
    kind "subpath": `volume-subpaths/<volume>/<container>/<index>`; `volume` is the pod's
    volume name.
    """

    kind: Literal["volume", "subpath"]
    volume: str
    plugin: str | None = None
    container: str | None = None
    index: int | None = None
    rest: str = ""

    @property
    def csi_volume(self) -> str | None:
        """The volume's directory name when it belongs to the CSI plugin, else None."""
        return self.volume if self.kind == "volume" and self.plugin == CSI_PLUGIN else None


def _components(path: str) -> list[str] | None:
    """Components of an absolute path, normalised; None if relative or containing `..`."""
    if not path.startswith("/"):
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None
    return parts


def normalise(path: str) -> str | None:
    """`/a//b/./c/` → `/a/b/c`; None for relative paths and paths with `..`."""
    parts = _components(path)
    return None if parts is None else "/" + "/".join(parts)


def _valid_uid(uid: str) -> bool:
    return bool(uid) and "/" not in uid and uid not in (".", "..")


def pod_dir(kubelet_root: str, uid: str) -> str:
    """`<kubelet_root>/pods/<uid>`, normalised. Raises ValueError on a bad root or uid."""
    root = normalise(kubelet_root)
    if root is None:
        raise ValueError(f"kubelet root {kubelet_root!r} must be an absolute path without '..'")
    if not _valid_uid(uid):
        raise ValueError(f"pod uid {uid!r} is not a single path component")
    return f"{root.rstrip('/')}/pods/{uid}"


def _relative(path: str, kubelet_root: str, uid: str) -> list[str] | None:
    """The components of `path` below `pods/<uid>/`, or None if it is not below it."""
    parts = _components(path)
    root = _components(kubelet_root)
    if parts is None or root is None or not _valid_uid(uid):
        return None
    prefix = [*root, "pods", uid]
    if parts[: len(prefix)] != prefix:
        return None
    return parts[len(prefix) :]


def is_pod_volume_path(path: str, kubelet_root: str, uid: str) -> bool:
    """True when `path` is strictly under `pods/<uid>/volumes/` or `pods/<uid>/volume-subpaths/`."""
    rel = _relative(path, kubelet_root, uid)
    return rel is not None and len(rel) >= 2 and rel[0] in (VOLUMES, SUBPATHS)


def classify(path: str, kubelet_root: str, uid: str) -> PodVolumePath | None:
    """Describe a path under the pod's volume dirs; None if it is not one (or incomplete)."""
    rel = _relative(path, kubelet_root, uid)
    if rel is None or len(rel) < 2:
        return None
    if rel[0] == VOLUMES:
        if len(rel) < 3:
            return None
        return PodVolumePath(kind="volume", plugin=rel[1], volume=rel[2], rest="/".join(rel[3:]))
    if rel[0] == SUBPATHS:
        container = rel[2] if len(rel) > 2 else None
        index = int(rel[3]) if len(rel) > 3 and rel[3].isascii() and rel[3].isdigit() else None
        return PodVolumePath(
            kind="subpath",
            volume=rel[1],
            container=container,
            index=index,
            rest="/".join(rel[4:]),
        )
    return None


def depth(path: str) -> int:
    """Number of components of a path (for deepest-first ordering)."""
    return len([p for p in path.split("/") if p not in ("", ".")])


def pod_mounts(mounts: Iterable[Mount], kubelet_root: str, uid: str) -> list[Mount]:
    """The mounts strictly under this pod's volume dirs, deepest first.

    At one mount point, the later (higher id, mounted on top) comes first, so
    unmounting in this order never tries to unmount something still covered.
    """
    mine = [m for m in mounts if is_pod_volume_path(m.mount_point, kubelet_root, uid)]
    return sorted(mine, key=lambda m: (-depth(m.mount_point), -m.mount_id))


# --- the agent's start-up check of its kubelet root (design.md §3 invariant 8) ------------


@dataclass(frozen=True, slots=True)
class RootView:
    """What the agent sees of its kubelet root, read with lstat (no symlink followed)."""

    root: str
    is_dir: bool  # the root is a directory (a symlink is not)
    is_symlink: bool
    has_pods_dir: bool  # <root>/pods is a directory
    pod_dirs: frozenset[str]  # names of the directories in <root>/pods


def _volume_mount_root(mount_point: str) -> tuple[str, str] | None:
    """(root, uid) when `mount_point` is `<root>/pods/<uid>/volumes|volume-subpaths/...`."""
    parts = _components(mount_point)
    if parts is None:
        return None
    for i in range(len(parts) - 3):
        if parts[i] == "pods" and parts[i + 2] in (VOLUMES, SUBPATHS):
            return "/" + "/".join(parts[:i]), parts[i + 1]
    return None


def mounted_pods(mounts: Iterable[Mount]) -> dict[str, dict[str, int]]:
    """Kubelet root → pod uid → number of volume/subpath mounts, over a mount table."""
    out: dict[str, dict[str, int]] = {}
    for m in mounts:
        found = _volume_mount_root(m.mount_point)
        if found is not None:
            per_uid = out.setdefault(found[0], {})
            per_uid[found[1]] = per_uid.get(found[1], 0) + 1
    return out


def _hint(others: dict[str, dict[str, int]]) -> str:
    if not others:
        return ""
    best = max(others, key=lambda r: sum(others[r].values()))
    count = sum(others[best].values())
    return f"; the host mount table has {count} mounts under {best}/pods/ — is the root {best}?"


def check_kubelet_root(view: RootView, mounts: Iterable[Mount]) -> str | None:
    """Why `--kubelet-root` is not this node's kubelet root, or None when it is.

    It is when the root is a real directory with a `pods` directory, and every pod whose
    volumes are mounted under `<root>/pods/` in the host mount table has its directory
    there (an agent whose root is empty or a different directory would see none). A node
    with no pod mounts yet passes with an existing `pods` directory, unless the host mount
    table shows pod mounts under another root only.
    """
    root = normalise(view.root) or view.root
    by_root = mounted_pods(mounts)
    mine = by_root.pop(root, {})
    flag = f"--kubelet-root {view.root}"
    if view.is_symlink:
        return f"{flag}: is a symlink; pass the real path (mountinfo shows real paths)"
    if not view.is_dir:
        return f"{flag}: no such directory{_hint(by_root)}"
    if not view.has_pods_dir:
        return f"{flag}: has no pods/ directory{_hint(by_root)}"
    missing = sorted(uid for uid in mine if uid not in view.pod_dirs)
    if missing:
        count = sum(mine[uid] for uid in missing)
        return (
            f"{flag}: the host mount table has {count} mounts under {root}/pods/ of "
            f"{len(missing)} pods whose directories the agent does not see there (e.g. "
            f"{missing[0]}); mount the host's {root} at the same path in the agent"
        )
    if not mine and by_root:
        return f"{flag}: the host mount table has no mount under {root}/pods/{_hint(by_root)}"
    return None
