"""agent/probe/waiters.py's reading of a task's blocked system call, on this process's own
/proc: the syscall line, the path string from `/proc/<pid>/mem` (only from anonymous memory
or a file mapping on a device the process's table shows with a local filesystem), lexical
paths; what cannot be told is unknown, naming the mounts it could wait on. A blocked task
on a real hung mount is in test_mountns_hung.py."""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import tempfile
from pathlib import Path

import pytest

from unstick.agent.probe.waiters import (
    WaiterScan,
    _Reader,
    lexical,
    parse_syscall,
    readable,
    safe_devices,
    scan_waiters,
    signed,
)
from unstick.core.model.mountinfo import Mount, parse_mountinfo

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


def test_strings_are_read_only_from_anonymous_or_local_file_mappings() -> None:
    safe = safe_devices(
        "30 1 0:42 / /mnt/nfs rw - nfs4 10.0.0.5:/x rw\n"
        "31 1 0:43 / /mnt/f rw - fuse.sshfs h: rw\n"
        "32 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "33 32 8:1 /srv /srv rw - ext4 /dev/sda1 rw\n"
    )
    assert safe == {"8:1"}
    assert readable(MAPS, 0x55D0C0A00010, safe) == 4096  # the heap
    assert readable(MAPS, 0x55D0C0A20FF0, safe) == 0x10  # up to the mapping's end
    assert readable(MAPS, 0x7F0000002100, safe) == 4096  # a file on a disk
    assert readable(MAPS, 0x7F0000000100, safe) == 0  # a file on the NFS mount
    assert readable(MAPS, 0x7F0000001800, safe) == 0  # not mapped


def test_a_file_mapping_of_a_device_the_table_does_not_show_is_not_read() -> None:
    # a file mapped from a hung mount that was lazily detached since: its device is in no
    # mount table any more, and its page would still have to come from the dead server
    assert readable(MAPS, 0x7F0000000100, {"8:1"}) == 0
    assert readable(MAPS, 0x7F0000002100, set()) == 0  # the process's table was unreadable
    assert readable(MAPS, 0x55D0C0A00010, set()) == 4096  # anonymous memory still is


def test_the_path_string_is_read_from_the_process_memory() -> None:
    text = ctypes.create_string_buffer(b"/var/lib/kubelet/pods/x/volumes/nfs/pv\0tail")
    reader = _Reader("/proc")
    got = reader.string(os.getpid(), ctypes.addressof(text), set())
    assert got == "/var/lib/kubelet/pods/x/volumes/nfs/pv"
    assert reader.string(os.getpid(), 8, set()) is None  # unmapped: not read


def test_a_string_in_a_file_mapping_is_read_only_from_a_local_device() -> None:
    with tempfile.TemporaryFile() as f:
        f.write(b"/some/path\0" + b"\0" * 4085)
        f.flush()
        with mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ) as mapped:
            copy = (ctypes.c_char * 4096).from_buffer_copy(mapped)  # anonymous memory
            reader = _Reader("/proc")
            assert reader.string(os.getpid(), ctypes.addressof(copy), set()) == "/some/path"
            st = os.fstat(f.fileno())
            device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
            start = _mapping_of(st.st_ino)
            assert reader.string(os.getpid(), start, {device}) == "/some/path"
            assert reader.string(os.getpid(), start, set()) is None


def _mapping_of(inode: int) -> int:
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 5 and parts[4] == str(inode):
                return int(parts[0].split("-")[0], 16)
    raise AssertionError(f"inode {inode} is not mapped")


NFS_LINE = "30 1 0:42 / /mnt/nfs rw - nfs4 10.0.0.5:/x rw\n"
TABLE = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n" + NFS_LINE
CALLS = {"x86_64": {"fstatat": 262, "renameat": 264}, "aarch64": {"fstatat": 79, "renameat": 38}}
NR = CALLS.get(platform.machine(), {})
CWD = 0xFFFFFFFFFFFFFF9C  # AT_FDCWD
needs_table = pytest.mark.skipif(not NR, reason="no system call table for this machine")


def _target() -> list[Mount]:
    return list(parse_mountinfo(NFS_LINE))


def _proc(
    tmp: Path,
    call: str = "fstatat",
    args: tuple[int, ...] = (CWD, 0x1000),
    *,
    strings: tuple[bytes, ...] = (),
    cwd: str = "/",
    root: str = "/",
    fds: dict[int, str] | None = None,
    syscall: bool = True,
) -> str:
    """A /proc tree — pid 1 the reader, pid 42 one task in D in `call(*args)`, `strings`
    at 0x1000, 0x1100, ... of its anonymous memory — standing in for what the kernel would
    show in the cases a test machine cannot make safely: a chroot whose cwd is outside it,
    a system call not ours to read, a task blocked on a dirfd's own file."""
    proc = tmp / "proc"
    task = proc / "42" / "task" / "42"
    task.mkdir(parents=True)
    (proc / "1").mkdir()
    (proc / "self").symlink_to("1")
    (task / "stat").write_text("42 (stat) D 1 42 42 0 -1\n")
    (task / "wchan").write_text("rpc_wait_bit_killable")
    if syscall:
        regs = " ".join(hex(a) for a in (*args, 0, 0, 0, 0, 0, 0)[:6])
        (task / "syscall").write_text(f"{NR[call]} {regs} 0x7ffd2a00 0x7f12ab\n")
    (task / "cwd").symlink_to(cwd)
    (proc / "42" / "fd").mkdir()
    for fd, target in (fds or {}).items():
        (proc / "42" / "fd" / str(fd)).symlink_to(target)
    (proc / "42" / "root").symlink_to(root)
    (proc / "42" / "mountinfo").write_text(TABLE)
    (proc / "42" / "maps").write_text("1000-2000 rw-p 00000000 00:00 0 \n")
    memory = bytearray(0x2000)
    for i, text in enumerate(strings):
        memory[0x1000 + 0x100 * i : 0x1000 + 0x100 * i + len(text) + 1] = text + b"\0"
    (proc / "42" / "mem").write_bytes(bytes(memory))
    return str(proc)


def _found(scan: WaiterScan) -> list[tuple[int, str, str]]:
    return [(w.pid, w.path, w.mount_point) for w in scan.waiters]


@needs_table
def test_a_relative_path_is_joined_to_the_cwd_from_the_process_root(tmp_path: Path) -> None:
    scan = scan_waiters(_proc(tmp_path, strings=(b"x",), cwd="/mnt/nfs"), _target())
    assert _found(scan) == [(42, "/mnt/nfs/x", "/mnt/nfs")]
    assert scan.unknown == [] and scan.unsure == ()


@needs_table
def test_a_cwd_outside_the_process_root_cannot_be_told(tmp_path: Path) -> None:
    # chroot without chdir: the cwd is outside the root, its path means nothing there
    proc = _proc(tmp_path, strings=(b"x",), cwd="/mnt/nfs", root="/jail")
    scan = scan_waiters(proc, _target())
    assert scan.waiters == [] and scan.unsure == ("/mnt/nfs",)
    assert scan.unknown == [
        "pid 42 (stat) in rpc_wait_bit_killable: the directory its relative path 'x' starts "
        "from is unknown"
    ]


@needs_table
def test_a_blocked_task_whose_system_call_cannot_be_read_cannot_be_told(tmp_path: Path) -> None:
    proc = _proc(tmp_path, strings=(b"/mnt/nfs/x",), syscall=False)
    scan = scan_waiters(proc, _target())
    assert scan.waiters == [] and scan.unsure == ("/mnt/nfs",)
    assert scan.unknown == [
        "pid 42 (stat) in rpc_wait_bit_killable: its system call could not be read"
    ]


@needs_table
def test_an_empty_path_is_the_dirfds_own_file(tmp_path: Path) -> None:
    # glibc's fstat(3, ...) is newfstatat(3, "", AT_EMPTY_PATH): blocked on fd 3's file
    proc = _proc(tmp_path, args=(3, 0x1000), strings=(b"",), fds={3: "/mnt/nfs/data.db"})
    assert _found(scan_waiters(proc, _target())) == [(42, "/mnt/nfs/data.db", "/mnt/nfs")]


@needs_table
def test_every_path_of_a_two_path_call_is_looked_at(tmp_path: Path) -> None:
    args = (CWD, 0x1000, CWD, 0x1100)  # renameat(AT_FDCWD, old, AT_FDCWD, new)
    proc = _proc(tmp_path, "renameat", args, strings=(b"/tmp/a", b"/mnt/nfs/b"))
    assert _found(scan_waiters(proc, _target())) == [(42, "/mnt/nfs/b", "/mnt/nfs")]
    unread = _proc(tmp_path / "2", "renameat", (CWD, 0x1000, CWD, 0x3000), strings=(b"/tmp/a",))
    scan = scan_waiters(unread, _target())  # the second path: unmapped, not read
    assert scan.waiters == [] and scan.unsure == ("/mnt/nfs",)
    assert scan.unknown[0].endswith(f"system call {NR['renameat']}: its path could not be read")


def test_a_proc_that_does_not_show_every_process_makes_every_mount_unsure(
    tmp_path: Path,
) -> None:
    scan = scan_waiters(str(tmp_path), _target())  # lists no process
    assert scan.waiters == [] and scan.unsure == ("/mnt/nfs",)
    assert scan.unknown == [f"{tmp_path} lists no process (not a mounted /proc?)"]


@needs_table  # to write the task's system call line (its number means nothing on s390x)
def test_on_a_machine_without_a_system_call_table_a_blocked_task_cannot_be_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: "no waiters" on any machine but x86_64 and aarch64 — a plain unmount of a
    # mount a task is blocked on then went ahead (and hung its worker).
    proc = _proc(tmp_path, strings=(b"/mnt/nfs/x",))
    monkeypatch.setattr(platform, "machine", lambda: "s390x")
    scan = scan_waiters(proc, _target())
    assert scan.waiters == [] and scan.unsure == ("/mnt/nfs",)
    assert scan.unknown == [
        "pid 42 (stat) in rpc_wait_bit_killable: no system call table for s390x: its path "
        "cannot be told"
    ]
