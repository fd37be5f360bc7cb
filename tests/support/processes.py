"""Processes a test starts and owns: a script in a private mount namespace (`unshare -m`)
in a process group of its own, and real cgroups named as the kubelet names a pod's
containers. Whatever happens, what they start is killed and what they make is removed."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PIDS_CGROUP = Path("/sys/fs/cgroup/pids")


def run_unshared(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`unshare -m --propagation private ARGV` in a session of its own; once it ends (or
    its time is up) its whole process group is killed by its id."""
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the script and everything it started
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@contextmanager
def pod_container_cgroup(
    pod_uid: str, container_id: str, qos: str | None = "besteffort", root: Path = PIDS_CGROUP
) -> Iterator[Path]:
    """A real cgroup `<root>/unstick-test-*/kubepods[/<qos>]/pod<uid>/cri-containerd-<id>.scope`
    (as the kubelet names a container's), removed afterwards, deepest first. Skips the test
    where `root` is not writable."""
    if not os.access(root, os.W_OK):
        pytest.skip(f"needs a writable {root.name} cgroup")
    top = root / f"unstick-test-{uuid.uuid4().hex[:8]}"
    levels = ["kubepods", *([qos] if qos else []), f"pod{pod_uid}"]
    container = top.joinpath(*levels, f"cri-containerd-{container_id}.scope")
    container.mkdir(parents=True)
    try:
        yield container
    finally:
        for path in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
            if path.is_dir():
                path.rmdir()
        top.rmdir()


@contextmanager
def process_in(cgroup: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real process (`sleep 600`) moved into `cgroup`; killed at the end."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        (cgroup / "cgroup.procs").write_text(str(proc.pid))
        yield proc
    finally:
        proc.kill()
        proc.wait()
