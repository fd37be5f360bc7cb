"""Resolve a path without following symlinks, and act on it through directory fds.

`os.path.realpath` is the wrong tool here: it follows symlinks. Each component is opened
with `O_PATH | O_NOFOLLOW | O_DIRECTORY` relative to its parent, so a symlink anywhere on
the way makes the walk fail instead of leading elsewhere (e.g. to `/etc` or another pod).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator

_DIR_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


class UnsafePath(Exception):
    """The path has a symlink (or non-directory) component, or is not absolute."""


class PathGone(UnsafePath):
    """A component of the path does not exist."""


def _components(path: str) -> list[str]:
    if not path.startswith("/"):
        raise UnsafePath(f"{path!r} is not an absolute path")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts) or not parts:
        raise UnsafePath(f"{path!r} is not a normalised path below /")
    return parts


@contextlib.contextmanager
def parent_fd(path: str) -> Iterator[tuple[int, str]]:
    """(fd of the parent directory, last component), every parent component checked to be
    a real directory and not a symlink. The fd is closed on exit."""
    parts = _components(path)
    fd = os.open("/", _DIR_FLAGS)
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                where = "/" + "/".join(parts[: i + 1])
                if exc.errno == errno.ENOENT:
                    raise PathGone(f"{where} does not exist") from None
                raise UnsafePath(f"{where}: not a plain directory ({exc.strerror})") from None
            os.close(fd)
            fd = nfd
        yield fd, parts[-1]
    finally:
        os.close(fd)


def check_path(path: str, *, is_mount_point: bool) -> None:
    """Raise UnsafePath unless every component of `path` is a real directory, not a symlink.

    The last component of a mount point is not stat'ed (that would touch the mounted
    filesystem); mountinfo already says it is a mount point, and unmounting uses
    UMOUNT_NOFOLLOW so a symlink swapped in there is not followed either.
    """
    with parent_fd(path) as (fd, name):
        if is_mount_point:
            return
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise PathGone(f"{path} does not exist") from None
            raise UnsafePath(f"{path}: {exc.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(f"{path} is a symlink")


def rmdir_at(path: str, before: Callable[[int, str], None] | None = None) -> bool:
    """rmdir(2) of the directory `path` through its parent's fd (unlinkat with
    AT_REMOVEDIR): every parent component opened `O_NOFOLLOW | O_DIRECTORY` from `/`, the
    last one lstat'ed to be a directory — a symlink anywhere on the way is never followed,
    even one swapped in after `path` was listed. Never recursive: a directory with anything
    in it stays. `before(parent_fd, name)` runs right before the rmdir (e.g. removing the
    kubelet's own file in it). True when removed or already gone, False when not empty;
    raises UnsafePath for a symlink or non-directory on the way or at `path` itself."""
    try:
        with parent_fd(path) as (fd, name):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePath(f"{path} is not a directory (symlinks are never followed)")
            if before is not None:
                before(fd, name)
            os.rmdir(name, dir_fd=fd)
    except (FileNotFoundError, PathGone):
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    return True
