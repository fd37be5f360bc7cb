"""A holder scan whose namespace table cannot be read in full is incomplete, never "no
holders": a process's mountinfo that does not parse (never seen from a kernel, but a scan
that skipped that namespace would miss every hold in it)."""

from __future__ import annotations

from pathlib import Path

from unstick.agent.holders.scan import scan_holders
from unstick.core.model.mountinfo import parse_mountinfo

TARGET = "50 22 0:1048575 / /x/vol rw - tmpfs tmpfs rw\n"


def fake_proc(tmp_path: Path, mountinfo: str) -> str:
    """A /proc with the agent's own entry and one process (pid 7) in its own namespace."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    pid = proc / "7"
    (pid / "ns").mkdir(parents=True)
    (pid / "fd").mkdir()
    (pid / "ns" / "mnt").symlink_to("mnt:[4026530001]")
    (pid / "comm").write_text("holder\n")
    (pid / "mountinfo").write_text(mountinfo)
    (pid / "maps").write_text("")
    return str(proc)


def test_a_mount_table_that_does_not_parse_makes_the_scan_incomplete(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, TARGET + "51 50 0:1048575 / /x/vol/copy rw shared:1\n")
    scan = scan_holders(proc, parse_mountinfo(TARGET))
    assert scan.holders == []
    assert scan.unknown is not None
    assert f"cannot parse {proc}/7/mountinfo: mountinfo line 2" in scan.unknown


def test_a_table_that_parses_is_complete(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, TARGET + "51 1 0:77 / /other rw - tmpfs other rw\n")
    scan = scan_holders(proc, parse_mountinfo(TARGET))
    assert (scan.holders, scan.unknown) == ([], None)
