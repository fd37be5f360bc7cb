"""kubelet_paths: which paths are a pod's volume paths, and what they are."""

from __future__ import annotations

import pytest

from unstick.core.model.kubelet_paths import (
    PodVolumePath,
    classify,
    is_pod_volume_path,
    normalise,
    pod_dir,
    pod_mounts,
)
from unstick.core.model.mountinfo import parse_mountinfo

ROOT = "/var/lib/kubelet"
UID = "9a42f711-028a-4ca2-802a-0e4db734592d"
OTHER = "3c1f6d2e-55aa-4a0e-9d61-7f2b0c9e1a11"
POD = f"{ROOT}/pods/{UID}"


def test_pod_dir_normalises_the_root() -> None:
    assert pod_dir("/var/lib/kubelet/", UID) == POD
    assert pod_dir("//var//lib/kubelet", UID) == POD


@pytest.mark.parametrize("uid", ["", "..", ".", "a/b"])
def test_pod_dir_rejects_uids_that_are_not_one_component(uid: str) -> None:
    with pytest.raises(ValueError, match="uid"):
        pod_dir(ROOT, uid)


@pytest.mark.parametrize("root", ["var/lib/kubelet", "/var/../kubelet"])
def test_pod_dir_rejects_bad_roots(root: str) -> None:
    with pytest.raises(ValueError, match="kubelet root"):
        pod_dir(root, UID)


@pytest.mark.parametrize(
    "path",
    [
        f"{POD}/volumes/kubernetes.io~csi/pvc-1/mount",
        f"{POD}/volumes/kubernetes.io~csi/pvc-1",
        f"{POD}/volumes/kubernetes.io~empty-dir",
        f"{POD}/volume-subpaths/data/nginx/0",
        f"{POD}//volumes/./kubernetes.io~csi/pvc-1/mount/",
        f"{POD}/volumes/kubernetes.io~csi/my vol/mount",
    ],
)
def test_paths_strictly_under_the_pods_volume_dirs(path: str) -> None:
    assert is_pod_volume_path(path, ROOT, UID)
    assert is_pod_volume_path(path, ROOT + "/", UID)


@pytest.mark.parametrize(
    "path",
    [
        f"{POD}/volumes",
        f"{POD}/volumes/",
        f"{POD}/volume-subpaths",
        POD,
        f"{POD}/etc-hosts",
        f"{POD}/containers/nginx/0",
        f"{POD}/volumes/../volumes/kubernetes.io~csi/pvc-1",
        f"{POD}/volumes/kubernetes.io~csi/../../../{OTHER}/volumes/x/y",
        f"{ROOT}/pods/{OTHER}/volumes/kubernetes.io~csi/pvc-1/mount",
        f"{ROOT}/pods/{UID}x/volumes/kubernetes.io~csi/pvc-1/mount",
        f"{ROOT}/plugins/kubernetes.io/csi/hostpath.csi.k8s.io/5b1f/globalmount",
        f"/other/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount",
        f"var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount",
        "",
    ],
)
def test_paths_that_are_not_this_pods_volume_paths(path: str) -> None:
    assert not is_pod_volume_path(path, ROOT, UID)


def test_a_uid_with_slash_or_dots_matches_nothing() -> None:
    assert not is_pod_volume_path(f"{ROOT}/pods/../volumes/x/y", ROOT, "..")
    assert not is_pod_volume_path(f"{ROOT}/pods/a/b/volumes/x/y", ROOT, "a/b")


def test_normalise() -> None:
    assert normalise("/a//b/./c/") == "/a/b/c"
    assert normalise("/") == "/"
    assert normalise("/a/../b") is None
    assert normalise("a/b") is None


def test_classify_csi_volume_mount() -> None:
    c = classify(f"{POD}/volumes/kubernetes.io~csi/pvc-1/mount", ROOT, UID)
    assert c == PodVolumePath(
        kind="volume", plugin="kubernetes.io~csi", volume="pvc-1", rest="mount"
    )
    assert c is not None and c.csi_volume == "pvc-1"


def test_classify_non_csi_volume() -> None:
    c = classify(f"{POD}/volumes/kubernetes.io~projected/kube-api-access-x", ROOT, UID)
    assert c is not None
    assert (c.kind, c.plugin, c.volume, c.rest, c.csi_volume) == (
        "volume",
        "kubernetes.io~projected",
        "kube-api-access-x",
        "",
        None,
    )


def test_classify_subpath() -> None:
    c = classify(f"{POD}/volume-subpaths/data/nginx/2", ROOT, UID)
    assert c == PodVolumePath(kind="subpath", volume="data", container="nginx", index=2)
    assert c is not None and c.csi_volume is None


def test_classify_rejects_incomplete_and_foreign_paths() -> None:
    assert classify(f"{POD}/volumes/kubernetes.io~csi", ROOT, UID) is None
    assert classify(f"{POD}/volumes", ROOT, UID) is None
    assert classify(f"{ROOT}/plugins/kubernetes.io/csi/d/h/globalmount", ROOT, UID) is None
    assert classify(f"{ROOT}/pods/{OTHER}/volumes/kubernetes.io~csi/p/mount", ROOT, UID) is None


def test_pod_mounts_deepest_first_and_only_this_pod() -> None:
    text = "\n".join(
        [
            "22 1 253:1 / / rw - ext4 /dev/vda1 rw",
            f"30 22 0:60 / {POD}/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/sdb rw",
            f"31 22 0:61 / {POD}/volume-subpaths/data/nginx/0 rw - ext4 /dev/sdb rw",
            f"32 30 0:62 / {POD}/volumes/kubernetes.io~csi/pvc-1/mount/deeper/x rw - tmpfs t rw",
            f"33 22 0:63 / {ROOT}/pods/{OTHER}/volumes/kubernetes.io~csi/p2/mount rw - ext4 s rw",
            f"34 22 0:64 / {ROOT}/plugins/kubernetes.io/csi/d/h/globalmount rw - ext4 /dev/sdb rw",
            f"35 30 0:60 / {POD}/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/sdb rw",
            f"36 22 0:65 / {POD} rw - tmpfs t rw",
        ]
    )
    got = [m.mount_id for m in pod_mounts(parse_mountinfo(text), ROOT, UID)]
    assert got == [32, 35, 31, 30]  # same depth: the later mount first
