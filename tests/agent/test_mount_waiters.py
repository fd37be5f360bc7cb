"""agent/mount_waiters.py's reading of a task's blocked system call, on this process's own
/proc: the syscall line, the path string from `/proc/<pid>/mem` (never from a file mapping
on a network/FUSE device), lexical paths. A blocked task on a real hung mount is in
test_mountns_hung.py."""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile

from unstick.agent.mount_waiters import (
    _Reader,
    lexical,
    parse_syscall,
    readable,
    signed,
    unsafe_devices,
)

MAPS = (
    "55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0          [heap]\n"
    "7f0000000000-7f0000001000 r--p 00000000 00:2a 1234       /mnt/nfs/lib.so\n"
    "7f0000002000-7f0000004000 r--p 00000000 08:01 99         /usr/lib/libc.so.6\n"
)


def test_a_syscall_line_gives_the_number_and_six_arguments() -> None:
    line = "262 0xffffffffffffff9c 0x7ffd2a3b 0x7ffd2a40 0x0 0x0 0x0 0x7ffd2a00 0x7f12ab\n"
    assert parse_syscall(line) == (262, (2**64 - 100, 0x7FFD2A3B, 0x7FFD2A40, 0, 0, 0))
    assert signed(2**64 - 100) == -100 and signed(5) == 5
    assert parse_syscall("running\n") is None
    assert parse_syscall("-1 0x7ffd2a00 0x7f12ab\n") is None  # blocked outside a syscall
    assert parse_syscall("") is None


def test_paths_are_lexical_and_never_resolved_through_dotdot() -> None:
    assert lexical("/var/lib//kubelet/./pods/x") == "/var/lib/kubelet/pods/x"
    assert lexical("//var/lib") == "/var/lib"
    assert lexical("/var/lib/link/../pods") is None  # a symlink before `..` leads anywhere
    assert lexical("relative/path") is None


def test_strings_are_read_only_from_anonymous_or_safe_file_mappings() -> None:
    unsafe = unsafe_devices(
        "30 1 0:42 / /mnt/nfs rw - nfs4 10.0.0.5:/x rw\n"
        "31 1 0:43 / /mnt/f rw - fuse.sshfs h: rw\n"
        "32 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
    )
    assert unsafe == {"0:42", "0:43"}
    assert readable(MAPS, 0x55D0C0A00010, unsafe) == 4096  # the heap
    assert readable(MAPS, 0x55D0C0A20FF0, unsafe) == 0x10  # up to the mapping's end
    assert readable(MAPS, 0x7F0000002100, unsafe) == 4096  # a file on a disk
    assert readable(MAPS, 0x7F0000000100, {"0:42"}) == 0  # a file on the NFS mount
    assert readable(MAPS, 0x7F0000001800, unsafe) == 0  # not mapped


def test_the_path_string_is_read_from_the_process_memory() -> None:
    text = ctypes.create_string_buffer(b"/var/lib/kubelet/pods/x/volumes/nfs/pv\0tail")
    reader = _Reader("/proc", [])
    got = reader.string(os.getpid(), ctypes.addressof(text), set())
    assert got == "/var/lib/kubelet/pods/x/volumes/nfs/pv"
    assert reader.string(os.getpid(), 8, set()) is None  # unmapped: not read


def test_a_string_in_a_file_mapping_of_an_unsafe_device_is_not_read() -> None:
    with tempfile.TemporaryFile() as f:
        f.write(b"/some/path\0" + b"\0" * 4085)
        f.flush()
        with mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ) as mapped:
            copy = (ctypes.c_char * 4096).from_buffer_copy(mapped)  # anonymous memory
            reader = _Reader("/proc", [])
            assert reader.string(os.getpid(), ctypes.addressof(copy), set()) == "/some/path"
            st = os.fstat(f.fileno())
            device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
            start = _mapping_of(st.st_ino)
            assert reader.string(os.getpid(), start, set()) == "/some/path"
            assert reader.string(os.getpid(), start, {device}) is None


def _mapping_of(inode: int) -> int:
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 5 and parts[4] == str(inode):
                return int(parts[0].split("-")[0], 16)
    raise AssertionError(f"inode {inode} is not mapped")
