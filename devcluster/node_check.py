"""Whether this machine can run a real node (devcluster.node), and whether one runs.

`node_unavailable()` says why not (None: it can): the real-node suite skips with it, and
`unstick demo` falls back to its kubelet stand-in with it. A node takes a lock per name
(`RealNode._take_lock`, one node of a name per machine); `lock_holders()` tells who holds
it, so a caller that would wait for itself (a test process whose session node holds the
lock) can say so instead of waiting."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

COMMANDS = ("containerd", "runc", "ctr", "unshare", "nsenter", "ip", "mount")
CNI_BRIDGE = Path("/usr/lib/cni/bridge")


def node_unavailable() -> str | None:
    """Why a real node cannot run here, or None."""
    from devcluster.controlplane import find_bin_dir
    from devcluster.node_images import load_images

    if os.geteuid() != 0:
        return "needs root (containerd, the kubelet, mounts, a bridge)"
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return f"{', '.join(missing)} not installed (make node-deps / hack/install-node-deps.sh)"
    if not CNI_BRIDGE.exists():
        return "CNI plugins not in /usr/lib/cni (apt-get install containernetworking-plugins)"
    try:
        bin_dir = find_bin_dir()
    except FileNotFoundError as e:
        return str(e)
    for tool in ("kubelet", "kube-scheduler", "kube-controller-manager"):
        if not (bin_dir / tool).exists():
            return f"{tool} not in {bin_dir}: run `make tools`"
    try:
        load_images()
    except FileNotFoundError as e:
        return str(e)
    if subprocess.run(["unshare", "--mount", "--pid", "--fork", "true"]).returncode != 0:
        return "unshare --mount --pid is not permitted here"
    return None


def lock_path(node_name: str) -> Path:
    """The lock file of a node of that name (as RealNode._take_lock names it)."""
    return Path(tempfile.gettempdir()) / f"{node_name}.lock"


def lock_holders(node_name: str) -> list[int]:
    """PIDs holding the node's lock (from /proc/locks; empty when it is free)."""
    try:
        inode = lock_path(node_name).stat().st_ino
    except FileNotFoundError:
        return []
    holders = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            # "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"; a waiter's line has "->"
            if len(fields) < 6 or fields[1] != "FLOCK" or "->" in fields:
                continue
            if int(fields[5].rsplit(":", 1)[1]) == inode:
                holders.append(int(fields[4]))
    return holders


def lock_free(node_name: str) -> bool:
    """The node's lock can be taken now (tried and released at once)."""
    path = lock_path(node_name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # releases the lock if it was taken
    return True
