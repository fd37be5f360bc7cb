"""Read the host's mount table: the file only, parsed by `unstick.core.model.mountinfo`.

The agent never `stat`s or opens a mount point to learn about mounts (a hung NFS server
would block it forever); the kernel's mountinfo text says everything needed.
"""

from __future__ import annotations

from dataclasses import dataclass

from unstick.core.model.kubelet_paths import pod_dir, pod_mounts
from unstick.core.model.mountinfo import Mount, escape, parse_mountinfo


@dataclass(frozen=True, slots=True)
class MountTable:
    """The raw text of a mountinfo file and its parsed mounts."""

    text: str
    mounts: tuple[Mount, ...]

    def pod_mounts(self, kubelet_root: str, uid: str) -> list[Mount]:
        """Mounts strictly under this pod's volumes/ or volume-subpaths/, deepest first."""
        return pod_mounts(self.mounts, kubelet_root, uid)

    def mount_points(self) -> frozenset[str]:
        """Every mount point in the table."""
        return frozenset(m.mount_point for m in self.mounts)


def read_mount_table(path: str) -> MountTable:
    """Read and parse a mountinfo file. Raises OSError or MountinfoError."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        text = f.read()
    return MountTable(text=text, mounts=tuple(parse_mountinfo(text)))


def read_pod_table(path: str, kubelet_root: str, uid: str) -> MountTable:
    """Only the mounts under `<root>/pods/<uid>/` (text = those lines): all a probe of one pod
    needs, without parsing the rest of a large host table. Raises OSError/MountinfoError."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        text = pod_lines(f.read(), kubelet_root, uid)
    return MountTable(text=text, mounts=tuple(parse_mountinfo(text)))


def pod_lines(text: str, kubelet_root: str, uid: str) -> str:
    """The lines of a mountinfo text whose mount point is under `<root>/pods/<uid>/`.

    This is what the probe reports as `mountinfo`: the pod's own mounts (volumes,
    subpaths and anything else under its directory), not the whole host table.
    """
    prefix = pod_dir(kubelet_root, uid) + "/"
    escaped = escape(prefix)
    kept = []
    for line in text.split("\n"):  # mountinfo is \n-separated; never splitlines()
        if escaped not in line:  # cheap pre-filter; the parse below decides
            continue
        mount = parse_mountinfo(line)[0]
        if mount.mount_point.startswith(prefix):
            kept.append(line)
    return "".join(f"{line}\n" for line in kept)
