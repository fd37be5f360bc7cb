"""A mount stacked on the target, or below it, after the holder scan and before the act,
run INSIDE a private mount namespace by conftest (`run_scenario(name, workdir,
script=STACKED)`), like mountns_scenarios.py.

The race is made by a hook on the holder scan the checks run (`checks.scan_holders`):
right after the real scan of the given number returns, the hook mounts a tmpfs on the
target (or inside it) and, unless told not to, starts a process with its working
directory in that new mount. Whatever the agent does next, that mount is not one it
scanned: MNT_DETACH would detach it (and the process's files with it), a plain umount
would take it instead of the planned mount. Each scenario reports the mounts left.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import unstick.agent.steps.checks as checks_module
from devcluster.process import wait_until
from tests.agent.mountns_hung import _hung_volume
from tests.agent.mountns_safety import _cwd_in, _hold_in_flight
from tests.agent.mountns_scenarios import UID_A, Node, main, scenarios_in, sh, step
from unstick.agent.steps.executor import Executor
from unstick.core.model.mountinfo import parse_mountinfo


def _sources_at(path: Path) -> list[str]:
    """The sources of the mounts at `path`, bottom first."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [m.source for m in parse_mountinfo(f.read()) if m.mount_point == str(path)]


@contextmanager
def _stack_after_scan(node: Node, nth: int, where: Path, held: bool = True) -> Iterator[None]:
    """Right after the `nth` holder scan of the checks (1-based), a tmpfs named `foreign`
    is mounted on `where`, and (with `held`) a process starts in it."""
    real = checks_module.scan_holders
    calls = [0]

    def hooked(*args: Any, **kw: Any) -> Any:
        scan = real(*args, **kw)
        calls[0] += 1
        if calls[0] == nth:
            sh("mount", "-t", "tmpfs", "-o", "size=1m", "foreign", str(where))
            if held:
                user = node.start("sleep", "600", cwd=where)
                wait_until(lambda: _cwd_in(user.pid, where), timeout=20, what=f"a user of {where}")
        return scan

    checks_module.scan_holders = hooked  # type: ignore[assignment]
    try:
        yield
    finally:
        checks_module.scan_holders = real


def _unmount(ex: Executor, vol: Path, lazy: bool) -> dict[str, str]:
    return ex.run_step(UID_A, "unmount", str(vol), dry_run=False, lazy_unmount=lazy).to_json()


def scenario_unmount(node: Node) -> dict[str, Any]:
    """The unmount step: a plain umount (stacked on top after its one scan), and the
    EBUSY fallback to MNT_DETACH (an fd in flight holds the volume; stacked on top, or
    inside the volume, after the fallback's own scan, the second)."""
    out: dict[str, Any] = {}
    ex = node.executor()

    plain = node.projected(UID_A, "plain")
    with _stack_after_scan(node, 1, plain, held=False):  # an unused mount: umount takes it
        out["plain"] = _unmount(ex, plain, lazy=False)
    out["plain_sources"] = _sources_at(plain)

    top = node.projected(UID_A, "top")
    _hold_in_flight(node, top)
    with _stack_after_scan(node, 2, top):
        out["fallback_top"] = _unmount(ex, top, lazy=True)
    out["fallback_top_sources"] = _sources_at(top)

    below = node.projected(UID_A, "below")
    (below / "sub").mkdir()
    _hold_in_flight(node, below)
    with _stack_after_scan(node, 2, below / "sub"):
        out["fallback_below"] = _unmount(ex, below, lazy=True)
    out["fallback_below_sources"] = _sources_at(below)
    out["fallback_below_sub_sources"] = _sources_at(below / "sub")

    # nothing stacked: the act log says what was re-read right before each act
    fine = node.projected(UID_A, "fine")
    out["fine"] = _unmount(ex, fine, lazy=False)
    inflight = node.projected(UID_A, "inflight")
    _hold_in_flight(node, inflight)
    out["fine_lazy"] = _unmount(ex, inflight, lazy=True)
    return out


def scenario_lazy_unmount(node: Node) -> dict[str, Any]:
    """The lazy-unmount step of a FUSE volume (fuse_stub.py, answering): a held tmpfs
    stacked on it, or on a directory inside it, right after the step's one holder scan."""
    out: dict[str, Any] = {}
    ex = node.executor()
    base = node.pod(UID_A) / "volumes" / "kubernetes.io~nfs"
    for case, where in (("top", ""), ("below", "sub")):
        (base / case).mkdir(parents=True)
        vol, _daemon = _hung_volume(node, base / case, subdirs="sub")
        with _stack_after_scan(node, 1, vol / where if where else vol):
            out[case] = step(ex, UID_A, "lazy-unmount", str(vol))
        out[f"{case}_sources"] = _sources_at(vol)
        out[f"{case}_sub_sources"] = _sources_at(vol / "sub")
    (base / "fine").mkdir()
    vol, _daemon = _hung_volume(node, base / "fine")
    out["fine"] = step(ex, UID_A, "lazy-unmount", str(vol))
    out["fine_sources"] = _sources_at(vol)
    return out


if __name__ == "__main__":
    sys.exit(main(scenarios_in(globals())))
