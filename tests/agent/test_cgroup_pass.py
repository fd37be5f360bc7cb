"""The container check's cgroup scan, one pass over the host's processes shared by the
pods asking at the same time (agent/probe/containers.py, scangroup.NextPass): a caller never
gets a pass that started before it asked; each pod gets exactly what a scan of its own
would have found, from a directory laid out like /proc."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from devcluster.process import wait_until
from unstick.agent.holders.scan_group import NextPass
from unstick.agent.probe import containers
from unstick.agent.probe.containers import Member, scan_cgroups

UID_A = "0c6b5a52-7d1e-4f0a-9a6e-1c2d3e4f5a6b"
UID_B = "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"


class _Gated:
    """A pass held at its start until released; counts the passes that ran."""

    def __init__(self) -> None:
        self.started = threading.Semaphore(0)
        self.release = threading.Semaphore(0)
        self.runs = 0

    def __call__(self) -> int:
        self.runs += 1
        run = self.runs
        self.started.release()
        self.release.acquire()
        return run


def _ask(passes: NextPass[int], gate: _Gated, out: list[int]) -> threading.Thread:
    t = threading.Thread(target=lambda: out.append(passes.run("/proc", gate)))
    t.start()
    return t


def test_a_caller_never_gets_the_pass_running_when_it_asked() -> None:
    passes, gate = NextPass[int](), _Gated()
    first_out: list[int] = []
    later: list[int] = []
    first = _ask(passes, gate, first_out)
    gate.started.acquire()  # pass 1 runs ...
    waiting = [_ask(passes, gate, later), _ask(passes, gate, later)]  # ... two callers ask
    wait_until(
        lambda: [b.callers for b in passes._next.values()] == [2],
        timeout=10,
        what="both callers in the next pass",
    )
    gate.release.release()
    first.join()
    gate.started.acquire()  # pass 2, started after both asked, serves both
    gate.release.release()
    for t in waiting:
        t.join()
    assert first_out == [1] and later == [2, 2]
    assert (passes.passes, passes.served) == (2, 3)


def test_a_failed_pass_fails_every_caller_of_it_and_the_next_runs_again() -> None:
    passes: NextPass[int] = NextPass()

    def boom() -> int:
        raise OSError("cannot list")

    with pytest.raises(OSError, match="cannot list"):
        passes.run("/proc", boom)
    assert passes.run("/proc", lambda: 7) == 7


def _proc(tmp_path: Path, files: dict[int, str | None]) -> str:
    """A /proc-like dir: `<pid>/cgroup` with the text (None: a directory, unreadable),
    pid 1 and `self` (the agent's own process) present."""
    proc = tmp_path / "proc"
    proc.mkdir()
    for pid, text in {1: "0::/init.scope\n", **files}.items():
        (proc / str(pid)).mkdir()
        if text is None:
            (proc / str(pid) / "cgroup").mkdir()
        else:
            (proc / str(pid) / "cgroup").write_text(text)
    (proc / "self").symlink_to("1")
    return str(proc)


def _reference(proc: str, uid: str) -> tuple[list[str], list[tuple[int, str]]]:
    """What the scan of one pod found before the shared pass (its own pattern per line)."""
    pattern = containers.pod_component(uid)
    ids: set[str] = set()
    members: list[tuple[int, str]] = []
    for entry in sorted(Path(proc).iterdir()):
        if not entry.name.isdigit() or not (entry / "cgroup").is_file():
            continue
        mine: set[str] = set()
        for line in (entry / "cgroup").read_text().splitlines():
            parts = line.split(":", 2)[-1].split("/")
            for i, part in enumerate(parts):
                if pattern.match(part):
                    below = parts[i + 1] if i + 1 < len(parts) else ""
                    mine.add(containers._container_id(below) if below else "")
        if mine:
            ids |= mine
            members.append((int(entry.name), max(mine)))
    return sorted(ids), sorted(members)


UNDERSCORED_B = UID_B.replace("-", "_")
CGROUP_FILES: dict[int, str | None] = {
    # cgroup v2, cgroupfs driver: the pause container and an app container of pod A
    10: f"0::/kubepods/besteffort/pod{UID_A}/cri-containerd-aaa111.scope\n",
    11: f"0::/kubepods/besteffort/pod{UID_A}/bbb222\n",
    # cgroup v1 (several hierarchies), systemd driver: pod B's container
    20: (
        f"12:pids:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UNDERSCORED_B}.slice/crio-ccc333.scope\n"
        f"11:memory:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UNDERSCORED_B}.slice/crio-ccc333.scope\n"
    ),
    # a process in pod B's pod-level cgroup (no container below it)
    21: f"0::/kubepods.slice/kubepods-pod{UNDERSCORED_B}.slice\n",
    # look-alikes of no pod asked about, and a host process
    30: "0::/system.slice/podman.service\n",
    31: f"0::/kubepods/pod{UID_A}x/ddd444\n",
    32: "0::/user.slice/user-0.slice/session-1.scope\n",
}


def test_each_pod_gets_what_its_own_scan_would_find(tmp_path: Path) -> None:
    proc = _proc(tmp_path, CGROUP_FILES)
    for uid in (UID_A, UID_B, "not-a-pod"):
        scan = scan_cgroups(proc, uid)
        ids, members = _reference(proc, uid)
        assert scan.gap is None
        assert sorted(c.id for c in scan.containers) == ids
        assert sorted((m.pid, m.container) for m in scan.members) == members
    a = scan_cgroups(proc, UID_A)
    assert [(c.id, c.state) for c in a.containers] == [("aaa111", "running"), ("bbb222", "running")]
    b = scan_cgroups(proc, UID_B)
    assert {m.pid: m.container for m in b.members} == {20: "ccc333", 21: ""}
    assert all(isinstance(m, Member) and m.cgroups for m in b.members)
    assert [c.name for c in b.containers] == ["(pod)", "ccc333"]


def test_an_unreadable_cgroup_file_is_a_gap_for_every_pod(tmp_path: Path) -> None:
    proc = _proc(tmp_path, {**CGROUP_FILES, 40: None})
    for uid in (UID_A, UID_B):
        gap = scan_cgroups(proc, uid).gap
        assert gap is not None and re.search(r"cannot read .*/40/cgroup", gap)


def test_pods_asking_at_once_share_passes_each_fresh(tmp_path: Path) -> None:
    proc = _proc(tmp_path, CGROUP_FILES)
    before = containers._PASSES.passes
    found: dict[str, list[str]] = {}

    def ask(uid: str) -> None:
        found[uid] = [c.id for c in scan_cgroups(proc, uid).containers]

    threads = [threading.Thread(target=ask, args=(uid,)) for uid in (UID_A, UID_B) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found == {UID_A: ["aaa111", "bbb222"], UID_B: ["", "ccc333"]}
    assert 1 <= containers._PASSES.passes - before <= len(threads)
    # a process that appears after a pass is seen by the next caller
    (Path(proc) / "50").mkdir()
    (Path(proc) / "50" / "cgroup").write_text(f"0::/kubepods/pod{UID_A}/eee555\n")
    assert "eee555" in [c.id for c in scan_cgroups(proc, UID_A).containers]
