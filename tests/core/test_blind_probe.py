"""The agent's start-up check of its kubelet root, pure (design.md §3 invariant 8): it refuses
a root that cannot be the kubelet's, naming the flag and what it found."""

from __future__ import annotations

import pytest

from unstick.core.model.kubelet_paths import RootView, check_kubelet_root, mounted_pods
from unstick.core.model.mountinfo import Mount, parse_mountinfo

ROOT = "/var/lib/kubelet"


def table(*points: str) -> list[Mount]:
    text = "".join(
        f"{100 + i} 22 0:{50 + i} / {p} rw - tmpfs tmpfs rw\n" for i, p in enumerate(points)
    )
    return list(parse_mountinfo(text))


def vol(root: str, uid: str, sub: str = "volumes/kubernetes.io~projected/t") -> str:
    return f"{root}/pods/{uid}/{sub}"


def view(
    root: str = ROOT,
    *,
    is_dir: bool = True,
    is_symlink: bool = False,
    pods: bool = True,
    dirs: tuple[str, ...] = ("u1", "u2"),
) -> RootView:
    return RootView(root, is_dir, is_symlink, pods, frozenset(dirs))


def test_mounted_pods_groups_by_root_and_uid() -> None:
    mounts = table(
        vol(ROOT, "u1"),
        vol(ROOT, "u1", "volume-subpaths/data/app/0"),
        vol("/var/lib/k0s/kubelet", "u3"),
        f"{ROOT}/pods/u1/etc-hosts",  # not a volume mount
        f"{ROOT}/plugins/kubernetes.io/csi/d/h/globalmount",
    )
    assert mounted_pods(mounts) == {ROOT: {"u1": 2}, "/var/lib/k0s/kubelet": {"u3": 1}}


def test_a_root_whose_pod_dirs_match_the_mount_table_passes() -> None:
    assert check_kubelet_root(view(), table(vol(ROOT, "u1"), vol(ROOT, "u2"))) is None
    assert check_kubelet_root(view(dirs=()), []) is None  # a node with no pods yet
    assert check_kubelet_root(view(ROOT + "/"), table(vol(ROOT, "u1"))) is None


@pytest.mark.parametrize(
    ("the_view", "points", "message"),
    [
        (
            view("/var/lib/kubelt", is_dir=False, pods=False, dirs=()),
            [vol(ROOT, f"u{i}") for i in range(12)],
            "--kubelet-root /var/lib/kubelt: no such directory; the host mount table has 12 "
            "mounts under /var/lib/kubelet/pods/ — is the root /var/lib/kubelet?",
        ),
        (
            view(is_symlink=True),
            [vol(ROOT, "u1")],
            "--kubelet-root /var/lib/kubelet: is a symlink; pass the real path",
        ),
        (
            view(pods=False, dirs=()),
            [],
            "--kubelet-root /var/lib/kubelet: has no pods/ directory",
        ),
        (
            view(dirs=("u1",)),
            [vol(ROOT, "u1"), vol(ROOT, "u2"), vol(ROOT, "u2", "volumes/a/b")],
            "--kubelet-root /var/lib/kubelet: the host mount table has 2 mounts under "
            "/var/lib/kubelet/pods/ of 1 pods whose directories the agent does not see there "
            "(e.g. u2)",
        ),
        (
            view(dirs=()),
            [vol("/var/lib/k0s/kubelet", "u1")],
            "--kubelet-root /var/lib/kubelet: the host mount table has no mount under "
            "/var/lib/kubelet/pods/; the host mount table has 1 mounts under "
            "/var/lib/k0s/kubelet/pods/ — is the root /var/lib/k0s/kubelet?",
        ),
    ],
)
def test_a_wrong_root_is_refused_naming_the_flag(
    the_view: RootView, points: list[str], message: str
) -> None:
    problem = check_kubelet_root(the_view, table(*points))
    assert problem is not None and problem.startswith(message), problem


def test_mounts_of_another_kubelet_do_not_matter_when_the_root_has_its_own() -> None:
    mounts = table(vol(ROOT, "u1"), vol("/var/lib/nested/kubelet", "x9"))
    assert check_kubelet_root(view(), mounts) is None
