"""The orphan pass leaves the stuck pods their node budget (mountns_orphan_budget.py: real
dirs, real mounts, the real executor, holder and cgroup scans, one NodeBudget shared with
a stuck pod's Handler, one clock): it takes a slot only when it has an act to do, skips a
dir it could not change until the dir changes, and takes at most half of the budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.mountns_scenarios import UID_A

pytestmark = pytest.mark.mountns

BUDGET = Path(__file__).parent / "mountns_orphan_budget.py"


def test_dirs_that_cannot_be_emptied_take_no_budget(scenario, work: Path) -> None:
    r = scenario("starve", work, script=BUDGET)
    for n, results in enumerate(r["passes"]):
        assert sorted(results) == sorted(r["uids"]), (n, results)
        for uid, result in results.items():
            assert result.startswith("not cleaned: nothing to do"), (n, uid, result)
    actions = r["stuck"]["actions"]
    assert [a["result"] for a in actions] == ["succeeded", "succeeded"], actions
    assert r["stuck"]["mounted"] is False
    assert all(r["kept"]), "a user's file was removed"
    # the dir whose file went has an empty dir now: cleaned at the next pass
    changed = r["changed"][r["uids"][0]]
    assert "empty dir(s) removed" in changed and "rmdir-stale succeeded" in changed, changed
    assert r["scratch0"] is False
    for uid in r["uids"][1:]:
        assert r["changed"][uid].startswith("not cleaned: nothing to do"), r["changed"]


def test_the_orphan_pass_takes_at_most_half_of_the_node_budget(scenario, work: Path) -> None:
    r = scenario("share", work, script=BUDGET)
    results = sorted(r["first"].values())
    cleaned = [x for x in results if "empty dir(s) removed" in x]
    waiting = [x for x in results if "the orphan pass's share" in x]
    assert len(cleaned) == 2 and len(waiting) == 4, results  # 5 // 2 = 2 a minute
    actions = r["stuck"]["actions"]
    assert [a["result"] for a in actions] == ["succeeded", "succeeded"], actions
    assert UID_A in r["left"] and len(r["left"]) == 5, r["left"]  # 4 orphans + pod A
