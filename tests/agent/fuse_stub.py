"""A tiny FUSE daemon speaking the kernel's raw protocol over /dev/fuse (no libfuse, no
PyPI package): it serves one read-only directory, empty unless subdirectory names are
given (each an empty directory: a place to mount something below the FUSE mount). Issue
#25's stand-in for an NFS server: SIGSTOP it and every process that touches the mount
waits in the kernel for an answer that does not come, exactly as with a dead NFS server.

Usage (as root, inside the test's private mount namespace):
`python fuse_stub.py MOUNTPOINT SOURCE [SUBDIR,...]` — mounts `fuse.stub` with source SOURCE on
MOUNTPOINT, prints `ready` once the kernel's INIT is answered, then serves until killed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
import sys

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid extlen pad
OUT_HEADER = struct.Struct("<IiQ")  # len error unique
LOOKUP, FORGET, GETATTR, STATFS, INIT, OPENDIR, READDIR, RELEASEDIR = 1, 2, 3, 17, 26, 27, 28, 29
ACCESS, INTERRUPT, DESTROY, BATCH_FORGET, GETXATTR = 34, 36, 38, 42, 22
NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}
ROOT_MODE = 0o40555
MS_NOSUID, MS_NODEV = 2, 4


def _attr_body(ino: int = 1) -> bytes:
    # ino size blocks atime mtime ctime | atimensec mtimensec ctimensec mode nlink uid gid
    # rdev blksize flags
    return struct.pack(
        "<QQQQQQIIIIIIIIII", ino, 0, 0, 0, 0, 0, 0, 0, 0, ROOT_MODE, 2, 0, 0, 0, 4096, 0
    )


def _attr(ino: int = 1) -> bytes:
    # attr_valid attr_valid_nsec dummy: 0, always ask
    return struct.pack("<QII", 0, 0, 0) + _attr_body(ino)


def _entry(nodeid: int) -> bytes:
    # nodeid generation entry_valid attr_valid entry_valid_nsec attr_valid_nsec: 0, always ask
    return struct.pack("<QQQQII", nodeid, 0, 0, 0, 0, 0) + _attr_body(nodeid)


def _init(major: int, minor: int) -> bytes:
    # major minor max_readahead flags max_background congestion max_write time_gran
    # max_pages map_alignment flags2 max_stack_depth unused[6]
    return (
        struct.pack("<IIIIHHIIHHII24x", 7, min(minor, 31), 0, 0, 16, 12, 4096, 1, 1, 0, 0, 0)
        if major == 7
        else b""
    )


def _answer(
    opcode: int, body: bytes, nodeid: int = 1, subdirs: tuple[str, ...] = ()
) -> tuple[int, bytes]:
    if opcode == INIT:
        major, minor = struct.unpack_from("<II", body)
        return 0, _init(major, minor)
    if opcode == GETATTR:
        return 0, _attr(nodeid)
    if opcode == OPENDIR:
        return 0, struct.pack("<QIi", 1, 0, 0)
    if opcode in (READDIR, RELEASEDIR, ACCESS, DESTROY):
        return 0, b""
    if opcode == STATFS:
        return 0, struct.pack("<QQQQQIIII24x", 0, 0, 0, 0, 0, 4096, 255, 4096, 0)
    if opcode == LOOKUP:
        name = body.split(b"\0", 1)[0].decode(errors="replace")
        if nodeid == 1 and name in subdirs:
            return 0, _entry(2 + subdirs.index(name))
        return -errno.ENOENT, b""
    return -errno.ENOSYS, b""


def _mount(mount_point: str, source: str, fd: int) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,default_permissions"
    rc = libc.mount(
        source.encode(), mount_point.encode(), b"fuse.stub", MS_NOSUID | MS_NODEV, options.encode()
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), mount_point)


def serve(fd: int, subdirs: tuple[str, ...] = ()) -> None:
    announced = False
    while True:
        try:
            data = os.read(fd, 1 << 20)
        except OSError as exc:
            if exc.errno in (errno.ENODEV,):  # unmounted: the connection is gone
                return
            if exc.errno in (errno.EINTR, errno.ENOENT):
                continue
            raise
        _, opcode, unique, nodeid, *_ = IN_HEADER.unpack_from(data)
        if opcode in NO_REPLY:
            continue
        error, body = _answer(opcode, data[IN_HEADER.size :], nodeid, subdirs)
        os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), error, unique) + body)
        if opcode == INIT and not announced:
            print("ready", flush=True)
            announced = True


def main() -> int:
    mount_point, source = sys.argv[1], sys.argv[2]
    subdirs = tuple(n for n in (sys.argv[3] if len(sys.argv) > 3 else "").split(",") if n)
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    _mount(mount_point, source, fd)
    serve(fd, subdirs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
