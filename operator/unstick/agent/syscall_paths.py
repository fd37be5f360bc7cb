"""The system calls that look a path up, per machine (agent/mount_waiters.py): a task
blocked in one of them on a hung mount waits on the path its argument names."""

from __future__ import annotations

#: syscall number → (index of the dirfd argument or None, index of the path argument),
#: for the calls that look a path up (the ones a blocked stat/open/umount of a mount is in).
PATH_CALLS: dict[str, dict[int, tuple[int | None, int]]] = {
    "x86_64": {
        2: (None, 0),  # open
        4: (None, 0),  # stat
        6: (None, 0),  # lstat
        21: (None, 0),  # access
        59: (None, 0),  # execve
        76: (None, 0),  # truncate
        80: (None, 0),  # chdir
        83: (None, 0),  # mkdir
        84: (None, 0),  # rmdir
        85: (None, 0),  # creat
        87: (None, 0),  # unlink
        89: (None, 0),  # readlink
        90: (None, 0),  # chmod
        92: (None, 0),  # chown
        94: (None, 0),  # lchown
        137: (None, 0),  # statfs
        165: (None, 1),  # mount (its target)
        166: (None, 0),  # umount2
        191: (None, 0),  # getxattr
        192: (None, 0),  # lgetxattr
        194: (None, 0),  # listxattr
        195: (None, 0),  # llistxattr
        257: (0, 1),  # openat
        258: (0, 1),  # mkdirat
        260: (0, 1),  # fchownat
        262: (0, 1),  # newfstatat
        263: (0, 1),  # unlinkat
        267: (0, 1),  # readlinkat
        268: (0, 1),  # fchmodat
        269: (0, 1),  # faccessat
        280: (0, 1),  # utimensat
        303: (0, 1),  # name_to_handle_at
        322: (0, 1),  # execveat
        332: (0, 1),  # statx
        437: (0, 1),  # openat2
        439: (0, 1),  # faccessat2
    },
    "aarch64": {
        8: (None, 0),  # getxattr
        9: (None, 0),  # lgetxattr
        11: (None, 0),  # listxattr
        12: (None, 0),  # llistxattr
        34: (0, 1),  # mkdirat
        35: (0, 1),  # unlinkat
        39: (None, 0),  # umount2
        40: (None, 1),  # mount (its target)
        43: (None, 0),  # statfs
        45: (None, 0),  # truncate
        48: (0, 1),  # faccessat
        49: (None, 0),  # chdir
        53: (0, 1),  # fchmodat
        54: (0, 1),  # fchownat
        56: (0, 1),  # openat
        78: (0, 1),  # readlinkat
        79: (0, 1),  # newfstatat
        88: (0, 1),  # utimensat
        221: (None, 0),  # execve
        264: (0, 1),  # name_to_handle_at
        281: (0, 1),  # execveat
        291: (0, 1),  # statx
        437: (0, 1),  # openat2
        439: (0, 1),  # faccessat2
    },
}
