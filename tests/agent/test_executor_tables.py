"""The replay reads only the host table's lines under the kubelet root (its pod's mount,
the volume's staging mount, the volume's other pods): every such line, and no other."""

from __future__ import annotations

from unstick.agent.probe.mount_table import lines_under
from unstick.core.model.mountinfo import escape, parse_mountinfo

ROOT = "/var/lib/kube let"  # a space: escaped in mountinfo as \040


def line(mount_id: int, root: str, point: str) -> str:
    return f"{mount_id} 1 0:{mount_id} {escape(root)} {escape(point)} rw - tmpfs t rw"


def test_exactly_the_mounts_under_the_root_are_kept() -> None:
    text = "\n".join(
        [
            line(1, "/", "/"),
            line(2, "/", ROOT),  # the root itself: not under it
            line(3, "/", f"{ROOT}/pods/u/volumes/kubernetes.io~csi/pv/mount"),
            line(4, "/", f"{ROOT}/plugins/kubernetes.io/csi/d/h/globalmount"),
            line(5, f"{ROOT}/pods/u", "/elsewhere"),  # the root's path in field 4 only
            line(6, "/", f"{ROOT}x/pods"),  # a sibling whose name starts the same
            line(7, "/", "/tmp/host-mounts/1"),
        ]
    )
    kept = [m.mount_id for m in parse_mountinfo(lines_under(text + "\n", ROOT))]
    assert kept == [3, 4]
