"""The agent's node budget on disk (`authority.NodeBudget` with a path): every grant is
written before it is returned, a new budget on the same file starts from the grants still in
the window, a torn last line (a kill mid-write) is skipped, the file is compacted, and a
grant that cannot be written is not made."""

from __future__ import annotations

from pathlib import Path

import pytest

from unstick.agent.authority import rederive as authority
from unstick.agent.authority.rederive import NodeBudget, read_grants

T = 1_800_000_000.0


def test_a_restarted_budget_counts_the_grants_of_the_last_minute(tmp_path: Path) -> None:
    path = str(tmp_path / "state" / "node-budget")  # the state dir is created on demand
    first = NodeBudget(cap=10, path=path)
    assert first.try_take(T, 3) == 0.0
    assert first.try_take(T + 1, 3) == 0.0
    again = NodeBudget(cap=10, path=path)  # the agent restarted
    assert again.try_take(T + 2, 3) == 0.0
    assert again.try_take(T + 3, 3) == pytest.approx(57.0)  # 3 in the window: full
    later = NodeBudget(cap=10, path=path)
    assert later.try_take(T + 61, 3) == 0.0  # the first grant left the window


def test_the_strictest_limit_in_the_window_survives_too(tmp_path: Path) -> None:
    path = str(tmp_path / "node-budget")
    NodeBudget(cap=10, path=path).try_take(T, 1)  # a strict policy's grant
    assert NodeBudget(cap=10, path=path).try_take(T + 5, 100) > 0


def test_a_torn_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "node-budget"
    path.write_text(f"{T:.6f} 5\n{T + 1:.6f} 5\n{T + 2:.2f}")  # killed mid-write: no limit
    assert [g.at for g in read_grants(str(path))] == [T, T + 1]
    assert NodeBudget(cap=10, path=str(path)).try_take(T + 3, 3) == 0.0


def test_the_file_is_compacted_to_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(authority, "COMPACT_AFTER", 4)
    path = str(tmp_path / "node-budget")
    budget = NodeBudget(cap=1000, path=path)
    for i in range(10):
        assert budget.try_take(T + 30 * i, 1000) == 0.0
    grants = read_grants(path)
    assert len(grants) <= 5
    assert grants[-1].at == T + 270
    assert all(g.at > T + 270 - 60 - 30 * 4 for g in grants)


def test_a_grant_that_cannot_be_written_is_not_made(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    budget = NodeBudget(cap=10, path=str(blocker / "node-budget"))  # parent is a file
    assert budget.try_take(T, 5) == authority.UNRECORDED_WAIT_S
    assert budget.try_take(T, 5) == authority.UNRECORDED_WAIT_S  # still nothing granted
