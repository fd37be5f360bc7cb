"""A pod dir is an orphan only once the agent has seen it without its pod for the minimum
age (#33 finding 8b; mountns_orphan_age.py: a real mount, the real executor): the age of
the dir itself says nothing about when its pod left the API — a long-lived pod force-
deleted now has an old dir, and the kubelet is tearing it down beside the agent."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.mountns

AGE = Path(__file__).parent / "mountns_orphan_age.py"


def test_a_long_lived_pod_force_deleted_now_is_left_to_the_kubelet_first(
    scenario, work: Path
) -> None:
    r = scenario("force_deleted", work, script=AGE)
    assert r["alive"] == []  # in the pod list: no orphan
    assert r["just_deleted"] == [], r["just_deleted"]  # seen orphaned a moment ago
    assert r["mounted_after_deletion"] is True
    assert r["almost"] == [], r["almost"]  # 299 s after it was first seen orphaned
    (later,) = r["later"]  # 300 s: an orphan, cleaned
    assert later["ageSeconds"] == 300, later
    assert "unmount succeeded" in later["result"], later
    assert r["mounted_later"] is False
