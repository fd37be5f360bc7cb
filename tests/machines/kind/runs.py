"""Which kind clusters of this suite belong to a run that is still going (docs/kind.md,
"Two runs at once").

Every run of the suite makes its own cluster, named `unstick-kind-<pid>-<random>`, with a
podman network of the same name, and holds an exclusive flock on
`<cache>/runs/<name>.lock` for as long as it lives (the kernel releases it when the
process dies, however it dies). A cluster, network or node volume of the suite whose
name's lock nobody holds is a leftover of a run that was killed: the next run deletes
it. A cluster of a run still going is never touched, so two clones running `make test`
at once each get their own cluster.

Short steps that must not interleave between runs (the leftover sweep, taking a run's
lock, making and removing the empty /lib/modules kind mounts) are done under one
machine-wide flock, `<cache>/runs/.lock`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

PREFIX = "unstick-kind"
# The suite's names: this run's form, and the fixed name of earlier versions of the suite.
NAME = re.compile(rf"^{PREFIX}(-\d+-[0-9a-f]{{4}})?$")
# kind labels a node's /var volume with the node's name: `<cluster>-control-plane`,
# `<cluster>-worker`, `<cluster>-worker2`.
NODE = re.compile(r"^(.+)-(control-plane|worker\d*)$")


def cache_dir() -> Path:
    """The node image's cache (hack/build-kind-node-image.sh reads the same variables)."""
    if "UNSTICK_KIND_CACHE" in os.environ:
        return Path(os.environ["UNSTICK_KIND_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "unstick" / "kind"


def runs_dir() -> Path:
    path = cache_dir() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_name() -> str:
    return f"{PREFIX}-{os.getpid()}-{secrets.token_hex(2)}"


def cluster_of(resource: str) -> str | None:
    """The suite's cluster a cluster/network name or a node name belongs to (None: not the
    suite's)."""
    if NAME.match(resource):
        return resource
    node = NODE.match(resource)
    if node and NAME.match(node.group(1)):
        return node.group(1)
    return None


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """The machine-wide lock for the short steps that must not interleave between runs."""
    with open(runs_dir() / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class RunLock:
    """This run's claim on its cluster name, held (an open, flocked file) until released
    or until the process ends."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = runs_dir() / f"{name}.lock"
        self._file = open(self.path, "w")  # noqa: SIM115 (held for the run's life)
        fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._file.write(f"{os.getpid()}\n")
        self._file.flush()

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._file.close()


def alive(name: str) -> bool:
    """Whether the run that made `name` still holds its lock (a name without a lock file is
    a leftover, e.g. of the suite's earlier fixed name)."""
    path = runs_dir() / f"{name}.lock"
    try:
        f = open(path)  # noqa: SIM115
    except FileNotFoundError:
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def live_runs() -> list[str]:
    """The names of the runs going now (this one included)."""
    return sorted(p.stem for p in runs_dir().glob(f"{PREFIX}*.lock") if alive(p.stem))


def workdir(name: str) -> Path:
    """The run's own directory (its kubeconfig, pytest-kind's files), next to its lock: a
    killed run's is swept with it."""
    return runs_dir() / name


def dead_files() -> list[Path]:
    """The lock files and work directories of runs that are not going any more."""
    found = [p for p in runs_dir().glob(f"{PREFIX}*.lock") if not alive(p.stem)]
    found += [p for p in runs_dir().glob(f"{PREFIX}*") if p.is_dir() and not alive(p.name)]
    return found
