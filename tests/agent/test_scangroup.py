"""One holder scan for the probes of several pods (agent/holders/scan_group.py), with the real scan
over this machine's /proc: callers asking at the same time share one scan; a caller that
asks while a scan runs never gets that scan (it started before the caller asked) but the
next one; each caller gets only the holders of its own mounts."""

from __future__ import annotations

import threading

from devcluster.process import wait_until
from unstick.agent.holders import scan as holders
from unstick.agent.holders.scan import HolderScan, scan_holders
from unstick.agent.holders.scan_group import ScanGroup, shared_scans
from unstick.core.model.mountinfo import Mount, parse_mountinfo


def _mount(point: str) -> Mount:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        mounts = [m for m in parse_mountinfo(f.read()) if m.mount_point == point]
    return mounts[-1]


class _Gated:
    """The real scan, held at its start until released; records each scan's targets."""

    def __init__(self) -> None:
        self.started = threading.Semaphore(0)
        self.release = threading.Semaphore(0)
        self.targets: list[list[str]] = []

    def __call__(self, proc: str, mounts: list[Mount], root: str | None) -> HolderScan:
        self.targets.append(sorted(m.mount_point for m in mounts))
        self.started.release()
        self.release.acquire()
        return holders._scan_now(proc, mounts, root)


def _ask(
    group: ScanGroup, gate: _Gated, mount: Mount, out: dict[str, HolderScan]
) -> threading.Thread:
    def run() -> None:
        out[mount.mount_point] = group.scan("/proc", [mount], None, gate)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_callers_share_the_next_scan_never_a_running_one() -> None:
    root, proc = _mount("/"), _mount("/proc")
    group, gate = ScanGroup(), _Gated()
    out: dict[str, HolderScan] = {}
    first = _ask(group, gate, root, out)
    gate.started.acquire()  # the first scan runs (for "/" alone) ...
    second = _ask(group, gate, proc, out)  # ... when "/proc" is asked about
    wait_until(lambda: bool(group._next), timeout=10, what='"/proc" waiting in the next batch')
    gate.release.release()
    first.join()
    gate.started.acquire()  # the second scan started after "/proc" asked
    gate.release.release()
    second.join()
    assert gate.targets == [["/"], ["/proc"]]
    assert (group.scans, group.served) == (2, 2)
    assert {h.mount_point for h in out["/"].holders} <= {"/"}
    assert {h.mount_point for h in out["/proc"].holders} <= {"/proc"}


def test_callers_waiting_together_share_one_scan_each_gets_its_own_holders() -> None:
    root, proc = _mount("/"), _mount("/proc")
    group, gate = ScanGroup(), _Gated()
    out: dict[str, HolderScan] = {}
    blocker = _ask(group, gate, root, {})
    gate.started.acquire()  # a scan runs; two callers arrive meanwhile
    waiting = [_ask(group, gate, root, out), _ask(group, gate, proc, out)]
    wait_until(
        lambda: [len(b.mounts) for b in group._next.values()] == [2],
        timeout=10,
        what="both callers in the next batch",
    )
    gate.release.release()
    blocker.join()
    gate.started.acquire()
    gate.release.release()
    for t in waiting:
        t.join()
    assert gate.targets == [["/"], ["/", "/proc"]]  # one scan for both
    assert (group.scans, group.served) == (2, 3)
    alone = scan_holders("/proc", [root])
    assert out["/"].holders and {h.mount_point for h in out["/"].holders} == {"/"}
    assert {h.via for h in out["/"].holders} <= {h.via for h in alone.holders} | {"mountns"}
    assert {h.mount_point for h in out["/proc"].holders} <= {"/proc"}


def test_scan_holders_joins_the_group_only_inside_shared_scans() -> None:
    group = ScanGroup()
    scan_holders("/proc", [_mount("/proc")])
    assert group.scans == 0
    with shared_scans(group):
        scan_holders("/proc", [_mount("/proc")])
    assert (group.scans, group.served) == (1, 1)
