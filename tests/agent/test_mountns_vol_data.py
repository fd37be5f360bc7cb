"""rmdir-stale keeps the kubelet's vol_data.json of a CSI volume whose driver is missing
(CSIDriverMissing; docs/csi.md): the kubelet has not torn that volume down and needs the
file to do so once the driver is back. Real mounts in a private mount namespace, a real
CSI driver process (tests/agent/mountns_vol_data.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from unstick.agent.steps.vol_data import VOL_DATA

pytestmark = pytest.mark.mountns

SCRIPT = Path(__file__).parent / "mountns_vol_data.py"
DRIVER = "hostpath.csi.k8s.io"


def test_vol_data_kept_while_the_driver_is_missing_and_left_for_the_kubelet(
    scenario, work: Path
) -> None:
    r = scenario("driver_missing", work, script=SCRIPT)
    assert r["core_before"]["cause"] == "CSIDriverMissing", r["core_before"]
    assert [a for a, _ in r["core_before"]["steps"]] == ["unmount"] + ["rmdir-stale"] * 3
    unmount, rmdir_mount, rmdir_pv, rmdir_csi = r["missing"]
    assert [s["result"] for s in r["missing"]] == ["succeeded"] * 4, r["missing"]
    assert unmount["action"] == "unmount" and r["after_missing"]["mounted"] is False
    # the empty mount dir goes; the kubelet's file stays, byte for byte, and says why
    assert f"kept {r['pv_dir']}/{VOL_DATA}" in rmdir_mount["message"], rmdir_mount
    assert f"CSI driver {DRIVER} is not registered" in rmdir_mount["message"], rmdir_mount
    assert r["after_missing"]["tree"] == [
        str(Path(r["pv_dir"]).parents[1]),
        r["csi_dir"],
        r["pv_dir"],
        f"{r['pv_dir']}/{VOL_DATA}",
    ]
    assert r["after_missing"]["vol_data"] == r["vol_data_before"]
    # what is left is the kubelet's: still CSIDriverMissing, nothing more to do, no force-delete
    assert r["core_after"]["cause"] == "CSIDriverMissing", r["core_after"]
    assert r["core_after"]["steps"] == [], r["core_after"]
    assert "force-delete" not in r["core_after"]["actions"], r["core_after"]
    for kept in (rmdir_pv, rmdir_csi):
        assert "left for the kubelet" in kept["message"], kept
    # the driver back (registered): rmdir-stale still leaves the file to the kubelet
    assert r["back"]["result"] == "succeeded", r["back"]
    assert f"{r['pv_dir']} left for the kubelet" in r["back"]["message"], r["back"]
    assert r["tree_back"] == r["after_missing"]["tree"]
    # and the kubelet can finish: vol_data.json read, NodeUnpublishVolume answers OK
    assert r["teardown"]["driverName"] == DRIVER
