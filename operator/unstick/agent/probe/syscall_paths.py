"""The system calls that look a path up, per machine (agent/probe/waiters.py): a task
blocked in one of them on a hung mount waits on a path its arguments name.

Each call maps to its (dirfd argument index or None, path argument index) pairs: one per
path it looks up (`rename` looks up two; `symlink`'s target is only text, not looked up;
`mount`'s source is not counted: for a network filesystem it is no path). A dirfd of None
means the path is relative to the cwd. An empty path with a dirfd (`fstatat(fd, "",
AT_EMPTY_PATH)`, glibc's `fstat`) is the dirfd's own file.
"""

from __future__ import annotations

Where = tuple[int | None, int]
ONE: tuple[Where, ...] = ((None, 0),)  # the path is the first argument
AT: tuple[Where, ...] = ((0, 1),)  # dirfd, path
TWO: tuple[Where, ...] = ((None, 0), (None, 1))  # two paths
TWO_AT: tuple[Where, ...] = ((0, 1), (2, 3))  # olddirfd, old, newdirfd, new

PATH_CALLS: dict[str, dict[int, tuple[Where, ...]]] = {
    "x86_64": {
        2: ONE,  # open
        4: ONE,  # stat
        6: ONE,  # lstat
        21: ONE,  # access
        59: ONE,  # execve
        76: ONE,  # truncate
        80: ONE,  # chdir
        82: TWO,  # rename
        83: ONE,  # mkdir
        84: ONE,  # rmdir
        85: ONE,  # creat
        86: TWO,  # link
        87: ONE,  # unlink
        88: ((None, 1),),  # symlink (the link's path)
        89: ONE,  # readlink
        90: ONE,  # chmod
        92: ONE,  # chown
        94: ONE,  # lchown
        132: ONE,  # utime
        133: ONE,  # mknod
        137: ONE,  # statfs
        155: TWO,  # pivot_root
        161: ONE,  # chroot
        165: ((None, 1),),  # mount (its target)
        166: ONE,  # umount2
        188: ONE,  # setxattr
        189: ONE,  # lsetxattr
        191: ONE,  # getxattr
        192: ONE,  # lgetxattr
        194: ONE,  # listxattr
        195: ONE,  # llistxattr
        197: ONE,  # removexattr
        198: ONE,  # lremovexattr
        235: ONE,  # utimes
        254: ((None, 1),),  # inotify_add_watch
        257: AT,  # openat
        258: AT,  # mkdirat
        259: AT,  # mknodat
        260: AT,  # fchownat
        261: AT,  # futimesat
        262: AT,  # newfstatat
        263: AT,  # unlinkat
        264: TWO_AT,  # renameat
        265: TWO_AT,  # linkat
        266: ((1, 2),),  # symlinkat (the link's path)
        267: AT,  # readlinkat
        268: AT,  # fchmodat
        269: AT,  # faccessat
        280: AT,  # utimensat
        303: AT,  # name_to_handle_at
        316: TWO_AT,  # renameat2
        322: AT,  # execveat
        332: AT,  # statx
        428: AT,  # open_tree
        437: AT,  # openat2
        439: AT,  # faccessat2
        452: AT,  # fchmodat2
    },
    "aarch64": {
        5: ONE,  # setxattr
        6: ONE,  # lsetxattr
        8: ONE,  # getxattr
        9: ONE,  # lgetxattr
        11: ONE,  # listxattr
        12: ONE,  # llistxattr
        14: ONE,  # removexattr
        15: ONE,  # lremovexattr
        27: ((None, 1),),  # inotify_add_watch
        33: AT,  # mknodat
        34: AT,  # mkdirat
        35: AT,  # unlinkat
        36: ((1, 2),),  # symlinkat (the link's path)
        37: TWO_AT,  # linkat
        38: TWO_AT,  # renameat
        39: ONE,  # umount2
        40: ((None, 1),),  # mount (its target)
        41: TWO,  # pivot_root
        43: ONE,  # statfs
        45: ONE,  # truncate
        48: AT,  # faccessat
        49: ONE,  # chdir
        51: ONE,  # chroot
        53: AT,  # fchmodat
        54: AT,  # fchownat
        56: AT,  # openat
        78: AT,  # readlinkat
        79: AT,  # newfstatat
        88: AT,  # utimensat
        221: ONE,  # execve
        264: AT,  # name_to_handle_at
        276: TWO_AT,  # renameat2
        281: AT,  # execveat
        291: AT,  # statx
        428: AT,  # open_tree
        437: AT,  # openat2
        439: AT,  # faccessat2
        452: AT,  # fchmodat2
    },
}
