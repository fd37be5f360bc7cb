"""A pod's view of the mount table (`MountWatch.pod_table`) is derived from the lines of
the table that name the kubelet root's `pods/` dir, split out once per text and shared by
every pod's view: the same mounts as the pod's lines picked from the whole text, for
every pod, whatever the paths (escaped characters, look-alike UIDs and roots, the pod's
path in a mount's root field only), and again after the table changed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unstick.agent.probe.mount_file import pod_lines
from unstick.agent.probe.mount_table import MountWatch
from unstick.core.model.mountinfo import escape, parse_mountinfo

ROOT = "/var/lib/kube let"  # a space: \040 in mountinfo
UIDS = ["u1", "u1x", "u 2", "u\\3"]
POINTS = [
    f"{ROOT}/pods/{{uid}}/volumes/kubernetes.io~csi/pv/mount",
    f"{ROOT}/pods/{{uid}}/volume-subpaths/v/c/0",
    f"{ROOT}/pods/{{uid}}",  # the pod dir itself: not under it
    f"{ROOT}x/pods/{{uid}}/volumes/v",  # a look-alike root
    f"/other{ROOT}/pods/{{uid}}/volumes/v",  # the root's path inside another path
    "/tmp/host-mounts/{uid}",
]


def _line(mount_id: int, root: str, point: str) -> str:
    return f"{mount_id} 1 0:{mount_id} {escape(root)} {escape(point)} rw - tmpfs t rw"


lines_st = st.lists(
    st.tuples(
        st.sampled_from(POINTS),
        st.sampled_from(UIDS),
        st.sampled_from(["/", f"{ROOT}/pods/u1/volumes"]),  # the pod's path as a root field
    ),
    max_size=30,
)


def _text(entries: list[tuple[str, str, str]]) -> str:
    body = [
        _line(i + 2, root, point.format(uid=uid)) for i, (point, uid, root) in enumerate(entries)
    ]
    return "\n".join([_line(1, "/", "/"), *body]) + "\n"


def _ids(text: str) -> list[int]:
    return [m.mount_id for m in parse_mountinfo(text)]


@settings(max_examples=60, deadline=None)
@given(before=lines_st, after=lines_st)
def test_each_pods_view_is_its_lines_of_the_whole_table(
    tmp_path_factory: pytest.TempPathFactory,
    before: list[tuple[str, str, str]],
    after: list[tuple[str, str, str]],
) -> None:
    table = Path(tmp_path_factory.mktemp("t")) / "mountinfo.copy"
    watch = MountWatch(str(table))  # a plain file: read again at every call
    for entries in (before, after):  # the table changed between the two rounds
        text = _text(entries)
        table.write_text(text)
        for uid in UIDS:
            view = watch.pod_table(ROOT, uid)
            assert _ids(view.text) == _ids(pod_lines(text, ROOT, uid)), uid
            assert [m.mount_id for m in view.mounts] == _ids(pod_lines(text, ROOT, uid))
    watch.close()
