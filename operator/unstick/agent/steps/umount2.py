"""umount2(2) through libc: the agent unmounts in its own mount namespace, which shares
the kubelet root with the host (Bidirectional mount propagation), so the unmount
propagates to the host."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

MNT_FORCE = 1  # never used: it can abort in-flight I/O on network filesystems
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.umount2.restype = ctypes.c_int


def umount2(path: str, flags: int = 0) -> None:
    """Unmount `path` (never following a final symlink). Raises OSError with the errno."""
    if flags & MNT_FORCE:
        raise ValueError("MNT_FORCE is never used by unstick")
    if _libc.umount2(os.fsencode(path), flags | UMOUNT_NOFOLLOW) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
