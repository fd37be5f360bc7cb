"""Safety rules of the agent against real mounts in a private mount namespace (see
mountns_safety.py): lazy unmount only after EBUSY with a complete holder scan finding
nobody; an incomplete scan refuses; stale requests and requests for a pod that is not
overdue-Terminating change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.mountns

SAFETY = Path(__file__).parent / "mountns_safety.py"


def test_lazy_unmount_only_after_ebusy_with_a_complete_scan_finding_nobody(
    scenario, work: Path
) -> None:
    r = scenario("lazy", work, script=SAFETY)
    for key in ("blind_plain", "blind_lazy"):
        assert r[key]["result"] == "refused", r[key]
        # a blind /proc hides both the holders and the pod's containers: either refuses
        message = r[key]["message"]
        assert "cannot tell who holds" in message or "cannot tell whether containers" in message
    assert r["held_still_mounted"] is True
    plain = r["inflight_plain"]
    assert plain["result"] == "failed" and "busy" in plain["message"].lower(), plain
    assert r["inflight_mounted_after_plain"] is True
    lazy = r["inflight_lazy"]
    assert lazy["result"] == "succeeded" and "(lazy)" in lazy["message"], lazy
    assert r["inflight_mounted_after_lazy"] is False
    racy = r["racy_lazy"]
    assert racy["result"] == "refused", racy
    assert "busy (EBUSY) and" in racy["message"] and "via cwd" in racy["message"], racy
    assert r["racy_still_mounted"] is True
    stacked = r["stacked_lazy"]  # a mount stacked between the EBUSY and the detach
    assert stacked["result"] == "refused", (stacked, r["stacked_sources"])
    assert "changed since it was planned" in stacked["message"], stacked
    assert r["stacked_sources"][-1] == "foreign", r["stacked_sources"]  # the new one stays
    assert len(r["stacked_sources"]) == 2, r["stacked_sources"]  # and the planned one too
    sub = r["submount_lazy"]  # MNT_DETACH takes the subtree: a held submount refuses it
    assert sub["result"] == "refused" and "is held" in sub["message"], sub
    assert "busy (EBUSY) and" in sub["message"] and "/inner" in sub["message"], sub
    assert len(r["submount_points"]) == 2, r["submount_points"]  # both still mounted


def test_stale_or_unverified_requests_never_unmount(scenario, work: Path) -> None:
    r = scenario("requests", work, script=SAFETY)
    stale, creating, fresh = r["stale"], r["not_terminating"], r["fresh"]
    for case, why in ((stale, "--max-request-age"), (creating, "is not terminating")):
        actions = case["patch"]["nodeActions"]
        assert [a["result"] for a in actions] == ["refused", "refused"], actions
        assert all(why in a["message"] for a in actions), actions
        assert case["mounted"] is True and case["dir"] is True
    assert [a["result"] for a in fresh["patch"]["nodeActions"]] == ["succeeded", "succeeded"]
    assert fresh["mounted"] is False and fresh["dir"] is False
