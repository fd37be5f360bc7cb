"""core/model/probe.py and core/rules/hung_mounts.py: the probe's `hungMounts` with a waiter
outside the pod (issue #25, a blocked system call's path: `via: path`), its words, and what
makes a mount hung."""

from __future__ import annotations

import pytest

from unstick.core import fields as f
from unstick.core.model.probe import BlockedTask, HungMount, parse_waiters_unknown
from unstick.core.rules.hung_mounts import hung_words, is_hung, lazy_unmount_safe

ROOT = "/var/lib/kubelet"
UID = "6f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"
VOL = f"{ROOT}/pods/{UID}/volumes/kubernetes.io~nfs/pv-data"
KUBELET = {
    "pid": 812,
    "comm": "kubelet",
    "state": "D",
    "wchan": "rpc_wait_bit_killable",
    "via": "path",
    "path": VOL,
}


def _hung(fstype: str = "nfs4", **kw: object) -> dict[str, object]:
    return {"mountPoint": VOL, "fstype": fstype, "source": "10.0.0.5:/x", "blocked": []} | kw


def test_an_outside_waiters_path_is_read_and_old_probes_have_none() -> None:
    h = HungMount.from_json(_hung(blocked=[KUBELET]), "probe.hungMounts[0]")
    assert h.blocked == (BlockedTask(812, "kubelet", "D", "rpc_wait_bit_killable", "path", VOL),)
    old = {k: v for k, v in KUBELET.items() if k != "path"} | {"via": "cwd"}
    h = HungMount.from_json(_hung(blocked=[old]), "probe.hungMounts[0]")
    assert h.blocked[0].path == ""


def test_a_bad_path_names_its_field() -> None:
    with pytest.raises(f.FieldError, match=r"probe\.hungMounts\[0\]\.blocked\[0\]\.path"):
        HungMount.from_json(_hung(blocked=[KUBELET | {"path": 7}]), "probe.hungMounts[0]")


def test_the_words_name_the_waiter_outside_the_pod_and_its_path() -> None:
    h = HungMount.from_json(_hung(blocked=[KUBELET]), "probe.hungMounts[0]")
    assert (
        f"pid 812 (kubelet, outside the pod, holding nothing) waits in "
        f"`rpc_wait_bit_killable` on {VOL}"
    ) in hung_words(h)
    assert "NFS server 10.0.0.5 (10.0.0.5:/x) does not answer" in hung_words(h)


def test_any_blocked_waiter_makes_a_mount_hung_a_fuse_count_only_a_fuse_mount() -> None:
    waiter = BlockedTask(812, "kubelet", "D", "", "path", VOL)
    assert is_hung(HungMount(VOL, "nfs4", "10.0.0.5:/x", None, (waiter,)))
    assert is_hung(HungMount(VOL, "ext4", "/dev/rbd0", None, (waiter,)))  # a dead block device
    assert is_hung(HungMount(VOL, "fuse.sshfs", "h:", 1))
    assert not is_hung(HungMount(VOL, "ext4", "/dev/rbd0", 1))
    assert not is_hung(HungMount(VOL, "nfs4", "10.0.0.5:/x", 0))


def test_lazy_unmount_only_of_a_network_or_fuse_mount() -> None:
    waiter = BlockedTask(812, "kubelet", "D", "", "path", VOL)
    ext4 = (HungMount(VOL, "ext4", "/dev/rbd0", None, (waiter,)),)
    verdict = lazy_unmount_safe(VOL, ROOT, UID, ext4, holders=0, containers_running=False)
    assert not verdict and "no network or FUSE mount" in verdict.reason
    nfs = (HungMount(VOL, "nfs4", "10.0.0.5:/x", None, (waiter,)),)
    assert lazy_unmount_safe(VOL, ROOT, UID, nfs, holders=0, containers_running=False)
    assert "device or server behind /dev/rbd0 (ext4)" in hung_words(ext4[0])


def test_waiters_unknown_are_mount_points_a_bad_one_names_its_field() -> None:
    assert parse_waiters_unknown({"waitersUnknown": [VOL]}) == (VOL,)
    assert parse_waiters_unknown({}) == ()  # an older probe: none
    with pytest.raises(f.FieldError, match=r"probe\.waitersUnknown\[1\]"):
        parse_waiters_unknown({"waitersUnknown": [VOL, "relative"]})
    with pytest.raises(f.FieldError, match=r"probe\.waitersUnknown"):
        parse_waiters_unknown({"waitersUnknown": [VOL, 7]})
