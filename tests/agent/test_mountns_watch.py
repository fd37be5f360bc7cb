"""The mount-table view re-read only when the kernel says it changed (agent/probe/mount_table.py):
real mounts and unmounts by other processes, in this namespace and propagated from
another, are seen by the next check; a property test over interleavings of the agent's
checks and foreign changes, some made inside a check (mountns_watch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from unstick.agent.steps.checks import FRESH

pytestmark = pytest.mark.mountns

WATCH = Path(__file__).parent / "mountns_watch.py"


def test_a_foreign_mount_or_unmount_is_seen_by_the_next_check(scenario, work: Path) -> None:
    r = scenario("foreign", work, script=WATCH)
    top = r["top"]
    assert r["watching"] is True  # /proc/self/mountinfo: poll reports changes
    assert r["seen"] == [
        [],
        [],
        [f"{top}/v0"],  # mounted by another process of this namespace
        [f"{top}/v0", f"{top}/v1"],  # mounted in another namespace, propagated here
        [f"{top}/v0", f"{top}/v1"],
        [f"{top}/v1"],  # unmounted by the first process
        [],  # unmounted in the other namespace
    ]
    # read, kept (nothing changed), read, read, kept
    assert r["reads"] == [True, False, True, True, False]
    # a plain file (a copy of the table): no poll, read fresh on every call
    assert r["plain_watching"] is False and r["plain_reads"] == 2 and r["plain_sees_edit"]


def test_every_interleaving_of_checks_and_foreign_changes(scenario, work: Path) -> None:
    r = scenario("interleavings", work, script=WATCH, timeout=600)
    assert r["watching"] is True and r["examples"] >= 20, r
    assert r["unchanged"] > 0 and r["reads"] > 0, r  # both paths were exercised


def test_every_act_follows_its_own_checks(scenario, work: Path) -> None:
    r = scenario("acts", work, script=WATCH)
    unmount1, unmount2, rmdir = r["results"]
    for step in (unmount1, unmount2, rmdir):
        assert step["result"] == "succeeded", step
        assert f"{FRESH}:" in step["message"], step
    assert "[acts 1," in unmount1["message"] and "[acts 1," in unmount2["message"]
    # token, certs, cache and their plugin dirs: each rmdir after its own checks
    assert "[acts 5," in rmdir["message"]
    assert r["reread_after_other"] is True  # another pod's mount changed the table
    assert r["stats"]["unchanged"] > 0  # checks with nothing changed read nothing
    assert [p for p in r["left"] if "/volumes/" in p] == []
