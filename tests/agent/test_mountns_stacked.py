"""A mount stacked on the target, or below it, between the holder scan and the act
(mountns_stacked.py, real mounts in a private mount namespace, a hook right after the
scan): every plain umount and every MNT_DETACH re-reads the top mount at the path and the
mounts below it right before it acts, refuses when they are not the ones scanned, and the
act log says so."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.mountns

STACKED = Path(__file__).parent / "mountns_stacked.py"
REREAD = "top and below re-read after the holder scan"


def _refused_as_changed(step: dict[str, str]) -> None:
    assert step["result"] == "refused", step
    assert "changed since the holder scan" in step["message"], step


def test_unmount_refuses_a_mount_stacked_after_its_scan(scenario, work: Path) -> None:
    r = scenario("unmount", work, script=STACKED)
    # a plain umount would take the new (unused) top mount instead of the planned one
    _refused_as_changed(r["plain"])
    assert r["plain_sources"] == ["tmpfs", "foreign"], r["plain_sources"]
    # the EBUSY fallback: MNT_DETACH would detach the held mount stacked on top ...
    _refused_as_changed(r["fallback_top"])
    assert "busy (EBUSY) and" in r["fallback_top"]["message"], r["fallback_top"]
    assert r["fallback_top_sources"] == ["tmpfs", "foreign"], r["fallback_top_sources"]
    # ... or the held mount stacked inside the volume, with the volume's subtree
    _refused_as_changed(r["fallback_below"])
    assert r["fallback_below_sources"] == ["tmpfs"], r["fallback_below_sources"]
    assert r["fallback_below_sub_sources"] == ["foreign"], r["fallback_below_sub_sources"]
    # nothing stacked: done, and the act log states the re-read before each act
    for key in ("fine", "fine_lazy"):
        assert r[key]["result"] == "succeeded", r[key]
        assert REREAD in r[key]["message"], r[key]
    assert "(lazy)" in r["fine_lazy"]["message"], r["fine_lazy"]


@pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse on this machine")
def test_lazy_unmount_refuses_a_mount_stacked_after_its_scan(scenario, work: Path) -> None:
    r = scenario("lazy_unmount", work, script=STACKED)
    _refused_as_changed(r["top"])
    assert r["top_sources"] == ["nfs.example:/exports/data", "foreign"], r["top_sources"]
    _refused_as_changed(r["below"])
    assert r["below_sources"] == ["nfs.example:/exports/data"], r["below_sources"]
    assert r["below_sub_sources"] == ["foreign"], r["below_sub_sources"]
    assert r["fine"]["result"] == "succeeded", r["fine"]
    assert REREAD in r["fine"]["message"], r["fine"]
    assert r["fine_sources"] == [], r["fine_sources"]
