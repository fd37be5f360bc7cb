"""The waiter scan's shared pass over a node's tasks (agent/probe/waiter_pass.py): checks asking
at the same time share one pass, each picking its own mounts' waiters from it; a check that
asks while a pass runs gets the next pass, never that one, so a task that started waiting
after a pass read the node is seen by every check that asked after it started waiting.

The pass is the real one, over a /proc tree standing in for a node's (as in
test_mount_waiters.py: a blocked task on an NFS mount is not something a test machine can
make safely), held after its reads until the test releases it."""

from __future__ import annotations

import platform
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster.process import wait_until
from unstick.agent.holders.scan_group import NextPass
from unstick.agent.probe import waiter_pass
from unstick.agent.probe.waiters import WaiterScan, scan_waiters
from unstick.core.model.mountinfo import Mount, parse_mountinfo

NFS_A = "30 1 0:42 / /mnt/a rw - nfs4 10.0.0.5:/a rw\n"
NFS_B = "31 1 0:43 / /mnt/b rw - nfs4 10.0.0.5:/b rw\n"
TABLE = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n" + NFS_A + NFS_B
FSTATAT = {"x86_64": 262, "aarch64": 79}.get(platform.machine())
CWD = 0xFFFFFFFFFFFFFF9C  # AT_FDCWD

pytestmark = pytest.mark.skipif(FSTATAT is None, reason="no system call table for this machine")


def _node(tmp: Path) -> Path:
    """A /proc with the reader's own process (pid 1) and no blocked task yet."""
    proc = tmp / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "self").symlink_to("1")
    return proc


def _block(proc: Path, pid: int, path: bytes) -> None:
    """Process `pid`: one task in D in `fstatat(AT_FDCWD, path)`, the path in its memory."""
    task = proc / str(pid) / "task" / str(pid)
    task.mkdir(parents=True)
    (task / "stat").write_text(f"{pid} (stat) D 1 {pid} {pid} 0 -1\n")
    (task / "wchan").write_text("rpc_wait_bit_killable")
    (task / "syscall").write_text(f"{FSTATAT} {CWD:#x} 0x1000 0x0 0x0 0x0 0x0 0x7ffd 0x7f12\n")
    (task / "cwd").symlink_to("/")
    (proc / str(pid) / "root").symlink_to("/")
    (proc / str(pid) / "mountinfo").write_text(TABLE)
    (proc / str(pid) / "maps").write_text("1000-2000 rw-p 00000000 00:00 0 \n")
    memory = bytearray(0x2000)
    memory[0x1000 : 0x1000 + len(path)] = path
    (proc / str(pid) / "mem").write_bytes(bytes(memory))


def _target(line: str) -> list[Mount]:
    return list(parse_mountinfo(line))


class _Gate:
    """The real pass, held after its reads (before it answers) until released."""

    def __init__(self) -> None:
        self.read = threading.Semaphore(0)
        self.release = threading.Semaphore(0)
        self.passes = 0

    def __call__(self, host_proc: str, fuse: bool) -> waiter_pass.TaskPass:
        found = _real_read_pass(host_proc, fuse)
        self.passes += 1
        self.read.release()
        self.release.acquire()
        return found


_real_read_pass = waiter_pass.read_pass


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Gate]:
    gate = _Gate()
    monkeypatch.setattr(waiter_pass, "PASSES", NextPass())
    monkeypatch.setattr(waiter_pass, "read_pass", gate)
    yield gate
    for _ in range(4):  # never leave a pass held (a failed test's threads end too)
        gate.release.release()


def _ask(proc: Path, line: str, out: dict[str, WaiterScan], name: str) -> threading.Thread:
    def run() -> None:
        out[name] = scan_waiters(str(proc), _target(line))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _waiting(proc: Path, callers: int) -> bool:
    batch = waiter_pass.PASSES._next.get(f"d:{proc}")
    return batch is not None and batch.callers == callers


def _found(scan: WaiterScan) -> list[tuple[int, str, str]]:
    return [(w.pid, w.path, w.mount_point) for w in scan.waiters]


def test_checks_asking_together_share_the_next_pass_never_a_running_one(
    tmp_path: Path, gate: _Gate
) -> None:
    proc = _node(tmp_path)
    _block(proc, 42, b"/mnt/a/x")
    _block(proc, 43, b"/mnt/b/y")
    out: dict[str, WaiterScan] = {}
    first = _ask(proc, NFS_A, out, "first")
    gate.read.acquire()  # the first pass has read the node, and is held ...
    second = _ask(proc, NFS_A, out, "second")  # ... when two more checks ask
    third = _ask(proc, NFS_B, out, "third")
    wait_until(lambda: _waiting(proc, 2), timeout=10, what="two checks waiting for the next pass")
    gate.release.release()
    first.join(timeout=30)
    gate.read.acquire()  # one pass for both, started after they asked
    gate.release.release()
    second.join(timeout=30)
    third.join(timeout=30)
    assert gate.passes == 2
    assert (waiter_pass.PASSES.passes, waiter_pass.PASSES.served) == (2, 3)
    # each check its own mount's waiters, from the same pass
    assert _found(out["first"]) == _found(out["second"]) == [(42, "/mnt/a/x", "/mnt/a")]
    assert _found(out["third"]) == [(43, "/mnt/b/y", "/mnt/b")]


def test_a_waiter_appearing_between_two_passes_is_seen_by_the_next_check(
    tmp_path: Path, gate: _Gate
) -> None:
    proc = _node(tmp_path)
    out: dict[str, WaiterScan] = {}
    before = _ask(proc, NFS_A, out, "before")
    gate.read.acquire()  # the pass has read the node: nobody waits yet
    _block(proc, 42, b"/mnt/a/x")  # a task starts waiting on /mnt/a ...
    after = _ask(proc, NFS_A, out, "after")  # ... then a check asks, while the pass runs
    wait_until(lambda: _waiting(proc, 1), timeout=10, what="the check waiting for the next pass")
    gate.release.release()
    before.join(timeout=30)
    gate.read.acquire()
    gate.release.release()
    after.join(timeout=30)
    assert out["before"].waiters == []  # it asked before the task waited
    assert _found(out["after"]) == [(42, "/mnt/a/x", "/mnt/a")]
    # a pass is never reused: once the waiter is gone, the next check does not see it
    (proc / "42" / "task" / "42" / "stat").write_text("42 (stat) S 1 42 42 0 -1\n")
    later = _ask(proc, NFS_A, out, "later")
    gate.read.acquire()
    gate.release.release()
    later.join(timeout=30)
    assert out["later"].waiters == [] and gate.passes == 3
