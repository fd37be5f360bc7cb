"""The agent's mount-table view (agent/probe/mount_table.py) against real mounts made by other
processes, run INSIDE a private mount namespace by conftest (`script=WATCH`):

- `foreign`: a mount and an unmount by another process of this namespace, and by a
  process of *another* namespace whose mount propagates here (a peer of a shared mount),
  each seen by the very next check; checks with nothing changed keep the text read before
  (no read); a plain file (no poll) is read fresh every time;
- `acts`: the executor's node steps on a pod with two volumes: every act (umount2,
  rmdir) follows its own checks (the step's message says so); a mount of another pod made
  between two steps makes the next check re-read the table;
- `interleavings`: a hypothesis property over sequences of the agent's steps (a check
  of the pod's table, a check of the whole table) and foreign mounts and unmounts, some
  made between the check's poll and its read, some right after its read (the races of
  the safety argument): every check shows exactly the mounts the foreign processes had
  finished before it started (one made during a check may or may not be in it), and the
  next check always shows it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.agent.mountns_scenarios import Node, main, sh
from unstick.agent.probe.mount_file import MountTable
from unstick.agent.probe.mount_table import MountWatch, Snapshot
from unstick.core.model.mountinfo import parse_mountinfo

UID = "cccccccc-3333-4333-8333-cccccccccccc"
SLOTS = 4
HELPER = (
    "import subprocess, sys\n"
    "for line in sys.stdin:\n"
    "    cmd, path = line.split()\n"
    "    argv = ['mount', '-t', 'tmpfs', '-o', 'size=1m', 'foreign', path] if cmd == 'mount'"
    " else ['umount', path]\n"
    "    r = subprocess.run(argv, capture_output=True, text=True)\n"
    "    print('ok' if r.returncode == 0 else 'error ' + r.stderr.strip(), flush=True)\n"
)


class Foreign:
    """Another process that mounts and unmounts on request, answering once it is done:
    in this namespace, or in a new one whose copy of the pod's volumes dir is a peer of
    this one's (its mounts there propagate here)."""

    def __init__(self, own_namespace: bool) -> None:
        prefix = ["unshare", "-m", "--propagation", "unchanged"] if own_namespace else []
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-c", HELPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def do(self, cmd: str, path: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{cmd} {path}\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"foreign {cmd} {path}: {answer}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def _volumes(node: Node) -> Path:
    """The pod's emptyDir plugin dir, a shared mount (so a peer namespace's mounts under it
    propagate here), with SLOTS volume dirs to mount on."""
    top = node.pod(UID) / "volumes" / "kubernetes.io~empty-dir"
    top.mkdir(parents=True)
    sh("mount", "--bind", str(top), str(top))
    sh("mount", "--make-shared", str(top))
    for i in range(SLOTS):
        (top / f"v{i}").mkdir()
    return top


def _points(table: MountTable, top: Path) -> set[str]:
    return {m.mount_point for m in table.mounts if m.mount_point.startswith(f"{top}/")}


def _truth(top: Path) -> set[str]:
    """The mounts under `top`, from an independent fresh read of the table."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        mounts = parse_mountinfo(f.read())
    return {m.mount_point for m in mounts if m.mount_point.startswith(f"{top}/")}


def foreign(node: Node) -> dict[str, Any]:
    top = _volumes(node)
    watch = MountWatch("/proc/self/mountinfo")
    root = str(node.root)
    same, other = Foreign(own_namespace=False), Foreign(own_namespace=True)
    seen: list[list[str]] = []
    try:

        def check() -> bool:
            snap_reads = watch.stats.reads
            seen.append(sorted(_points(watch.pod_table(root, UID), top)))
            return watch.stats.reads > snap_reads

        read_first = check()
        read_unchanged = check()
        same.do("mount", f"{top}/v0")
        read_after_mount = check()
        other.do("mount", f"{top}/v1")  # made in another namespace, propagated here
        read_after_peer_mount = check()
        read_unchanged_2 = check()
        same.do("umount", f"{top}/v0")
        check()
        other.do("umount", f"{top}/v1")
        check()
        copy = node.work / "mountinfo-copy"
        copy.write_text(Path("/proc/self/mountinfo").read_text())
        plain = MountWatch(str(copy))
        plain.table()
        copy.write_text("")
        empty_after_edit = plain.table().mounts == ()
        return {
            "watching": watch.watching,
            "reads": [
                read_first,
                read_unchanged,
                read_after_mount,
                read_after_peer_mount,
                read_unchanged_2,
            ],
            "seen": seen,
            "top": str(top),
            "plain_watching": plain.watching,
            "plain_reads": plain.stats.reads,
            "plain_sees_edit": empty_after_edit,
        }
    finally:
        same.stop()
        other.stop()
        watch.close()


class _Racing(MountWatch):
    """Runs a pending foreign step inside its next check: right after the poll (before the
    read, or before the kept text is handed out), right after the read, or once the check
    has its text (the races of the safety argument). A step set for after the read of a
    check that reads nothing runs as it returns."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.after_poll: Callable[[], None] | None = None
        self.after_read: Callable[[], None] | None = None
        self.after_check: Callable[[], None] | None = None

    def _fire(self, name: str) -> None:
        act = getattr(self, name)
        if act is not None:
            setattr(self, name, None)
            act()

    def _changed(self) -> bool:
        changed = super()._changed()
        self._fire("after_poll")
        return changed

    def _read(self, fd: int) -> str:
        text = super()._read(fd)
        self._fire("after_read")
        return text

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        self._fire("after_read")
        self._fire("after_check")
        return snap


Step = tuple[str, int, str]
STEP = st.one_of(
    st.tuples(st.sampled_from(["check_pod", "check_all"]), st.just(0), st.just("")),
    st.tuples(
        st.sampled_from(["foreign", "after_poll", "after_read", "after_check"]),
        st.integers(0, SLOTS - 1),
        st.sampled_from(["same", "other"]),
    ),
)


def _check(watch: _Racing, root: str, kind: str) -> MountTable:
    return watch.pod_table(root, UID) if kind == "check_pod" else watch.table()


def _run(steps: list[Step], watch: _Racing, procs: dict[str, Foreign], top: Path, root: str) -> int:
    """One interleaving; returns how many checks were made."""
    mounted: set[str] = set()  # what the foreign processes have done (the model)
    pending: tuple[str, Callable[[], None], str] | None = None  # to run in the next check
    checks = 0
    watch.pod_table(root, UID)
    for kind, slot, who in steps:
        if kind.startswith("check"):
            raced: set[str] = set()
            if pending is not None:
                setattr(watch, pending[0], pending[1])
                raced, pending = {pending[2]}, None
            got = _points(_check(watch, root, kind), top)
            assert (watch.after_poll, watch.after_read, watch.after_check) == (None, None, None)
            # exactly what was done before the check began; a change made during it may
            # or may not be in it
            assert got - raced == mounted - raced, (steps, got, mounted)
            checks += 1
            continue
        if pending is not None:  # not raced with a check after all: done before this step
            pending[1]()
            pending = None
        path = f"{top}/v{slot}"
        cmd = "umount" if path in mounted else "mount"

        def act(path: str = path, cmd: str = cmd, who: str = who) -> None:
            procs[who].do(cmd, path)

        if kind == "foreign":
            act()
        else:
            pending = (kind, act, path)
        mounted ^= {path}
    if pending is not None:
        pending[1]()
    # whatever happened during the last check, the next one sees everything
    assert _points(watch.pod_table(root, UID), top) == mounted == _truth(top), steps
    assert _points(watch.table(), top) == mounted, steps
    return checks + 2


def interleavings(node: Node) -> dict[str, Any]:
    top = _volumes(node)
    root = str(node.root)
    procs = {"same": Foreign(own_namespace=False), "other": Foreign(own_namespace=True)}
    runs = {"examples": 0, "checks": 0, "unchanged": 0, "reads": 0, "watching": True}
    try:

        @settings(
            max_examples=int(os.environ.get("WATCH_EXAMPLES", "60")),
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.lists(STEP, min_size=1, max_size=25))
        def prop(steps: list[Step]) -> None:
            watch = _Racing("/proc/self/mountinfo")
            try:
                runs["checks"] += _run(steps, watch, procs, top, root)
                runs["unchanged"] += watch.stats.unchanged
                runs["reads"] += watch.stats.reads
                runs["watching"] = runs["watching"] and watch.watching
            finally:
                watch.close()
                for path in sorted(_truth(top), reverse=True):
                    sh("umount", path)
            runs["examples"] += 1

        prop()
    finally:
        for proc in procs.values():
            proc.stop()
    return runs


def acts(node: Node) -> dict[str, Any]:
    first, second = node.projected(UID, "token"), node.projected(UID, "certs")
    (node.pod(UID) / "volumes" / "kubernetes.io~empty-dir" / "cache").mkdir(parents=True)
    other = node.pod("dddddddd-4444-4444-8444-dddddddddddd") / "volumes" / "x~y" / "z"
    other.mkdir(parents=True)
    ex = node.executor()
    ex.checks.mounts = watch = MountWatch(node.settings.mountinfo)  # counts of its own
    messages = [ex.run_step(UID, "unmount", str(first), dry_run=False, lazy_unmount=False)]
    sh("mount", "-t", "tmpfs", "-o", "size=1m", "other", str(other))  # another pod's mount
    reads = watch.stats.reads
    messages.append(ex.run_step(UID, "unmount", str(second), dry_run=False, lazy_unmount=False))
    reread_after_other = watch.stats.reads > reads
    messages.append(ex.run_step(UID, "rmdir-stale", "", dry_run=False, lazy_unmount=False))
    sh("umount", str(other))
    return {
        "results": [r.to_json() for r in messages],
        "reread_after_other": reread_after_other,
        "stats": {"reads": watch.stats.reads, "unchanged": watch.stats.unchanged},
        "left": sorted(str(p) for p in node.pod(UID).rglob("*")),
    }


if __name__ == "__main__":
    sys.exit(main({"foreign": foreign, "interleavings": interleavings, "acts": acts}))
