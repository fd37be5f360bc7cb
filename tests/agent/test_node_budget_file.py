"""The agent's node budget on disk (`authority.NodeBudget` with a path): every grant is
written before it is returned, a new budget on the same file starts from the grants still in
the window, a torn last line (a kill mid-write) is skipped, the file is compacted, and a
grant that cannot be written is not made; and a grant is returned only once the entries
it made in their directories (the file, the state dir, the compacted file's rename) are on
disk too."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
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


_CALL = re.compile(r"^\d+ +(\w+)\((.*)\) += (-?\d+)")


def _entries_and_syncs(trace: str, under: Path) -> list[tuple[str, str]]:
    """From an strace log: ("entry", path) for each directory entry made under `under`
    (a file created, a directory made, a rename's new name), ("fsync", path) for each
    fsync of an open file or directory, ("granted", "") where the script said so."""
    fds: dict[str, str] = {}
    events = []
    for line in trace.splitlines():
        found = _CALL.match(line)
        if found is None:
            continue
        call, args, ret = found.groups()
        paths = re.findall(r'"([^"]*)"', args)
        if call == "openat" and ret != "-1":
            fds[ret] = paths[0]
            if "O_CREAT" in args and paths[0].startswith(str(under)):
                events.append(("entry", paths[0]))
        elif call in ("mkdir", "mkdirat") and ret == "0" and paths[0].startswith(str(under)):
            events.append(("entry", paths[0]))
        elif call.startswith("rename") and ret == "0" and paths[-1].startswith(str(under)):
            events.append(("entry", paths[-1]))
        elif call == "fsync" and ret == "0":
            events.append(("fsync", fds.get(args.strip(), "?")))
        elif call == "write" and args.startswith('1, "granted'):
            events.append(("granted", ""))
    return events


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_grant_is_returned_once_its_directory_entries_are_on_disk(tmp_path: Path) -> None:
    """A machine crash right after a grant must not lose it: a new file's data fsynced is
    not enough while its entry in the directory is not (nor a rename's). Seen in the
    agent's own system calls: the first grant makes the state dir and the file, the second
    compacts the file (a new file renamed over it); before each grant is returned, every
    entry made for it has its directory fsynced after it."""
    path = tmp_path / "state" / "node-budget"
    script = (
        "from unstick.agent.authority import rederive\n"
        "rederive.COMPACT_AFTER = 1\n"
        f"budget = rederive.NodeBudget(cap=10, path={str(path)!r})\n"
        "for i in range(2):\n"
        f"    assert budget.try_take({T} + i, 5) == 0.0\n"
        "    print('granted', flush=True)\n"
    )
    trace = tmp_path / "trace"
    calls = "trace=openat,mkdir,mkdirat,fsync,rename,renameat,renameat2,write"
    subprocess.run(
        ["strace", "-f", "-qq", "-s", "4096", "-e", calls, "-o", str(trace),
         sys.executable, "-c", script],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    events = _entries_and_syncs(trace.read_text(), tmp_path / "state")
    events = [e for e in events if e[0] != "fsync" or e[1].startswith(str(tmp_path))]
    granted = [i for i, e in enumerate(events) if e[0] == "granted"]
    assert len(granted) == 2, events
    made = {e[1] for e in events if e[0] == "entry"}
    assert {str(path.parent), str(path), f"{path}.tmp"} <= made, events
    start = 0
    for end in granted:
        for i in range(start, end):
            kind, entry = events[i]
            if kind == "entry":
                parent = str(Path(entry).parent)
                assert ("fsync", parent) in events[i + 1 : end], (entry, events)
        start = end
