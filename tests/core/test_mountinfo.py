"""parse_mountinfo: fields, optional fields, escapes, malformed lines, large inputs."""

from __future__ import annotations

import time

import pytest

from unstick.core.model.mountinfo import Mount, MountinfoError, escape, parse_mountinfo, unescape

PROC_EXAMPLE = "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"


def test_parses_every_field_of_the_proc5_example() -> None:
    [m] = parse_mountinfo(PROC_EXAMPLE)
    assert m == Mount(
        mount_id=36,
        parent_id=35,
        major=98,
        minor=0,
        root="/mnt1",
        mount_point="/mnt2",
        options=("rw", "noatime"),
        optional=("master:1",),
        fstype="ext3",
        source="/dev/root",
        super_options=("rw", "errors=continue"),
    )


def test_zero_and_several_optional_fields() -> None:
    text = (
        "22 1 253:1 / / rw,relatime - ext4 /dev/vda1 rw\n"
        "23 22 0:21 / /proc rw shared:12 master:3 propagate_from:2 unbindable - proc proc rw\n"
    )
    a, b = parse_mountinfo(text)
    assert a.optional == ()
    assert b.optional == ("shared:12", "master:3", "propagate_from:2", "unbindable")
    assert b.fstype == "proc"


def test_escaped_space_tab_newline_backslash_in_paths() -> None:
    line = (
        r"100 22 0:50 /a\040b /var/lib/kubelet/pods/u/volumes/x/my\040vol\011t\012n\134b "
        r"rw - tmpfs my\040src rw"
    )
    [m] = parse_mountinfo(line)
    assert m.root == "/a b"
    assert m.mount_point == "/var/lib/kubelet/pods/u/volumes/x/my vol\tt\nn\\b"
    assert m.source == "my src"


def test_escape_round_trips_through_unescape() -> None:
    path = "/x y/\tz/\nw/\\v"
    assert unescape(escape(path)) == path
    assert " " not in escape(path)


def test_blank_lines_and_trailing_newline_are_skipped() -> None:
    assert len(parse_mountinfo("\n" + PROC_EXAMPLE + "\n\n")) == 1
    assert parse_mountinfo("") == []


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("36 35 98:0 /mnt1 /mnt2 rw - ext3", 1, "at least 10 fields"),
        ("36 35 98:0 /mnt1 /mnt2 rw master:1 x ext3 /dev/root rw", 1, "separator"),
        ("x 35 98:0 /mnt1 /mnt2 rw - ext3 /dev/root rw", 1, "mount id"),
        ("36 -1 98:0 /mnt1 /mnt2 rw - ext3 /dev/root rw", 1, "parent id"),
        ("36 35 98 /mnt1 /mnt2 rw - ext3 /dev/root rw", 1, "major:minor"),
        ("36 35 98:z /mnt1 /mnt2 rw - ext3 /dev/root rw", 1, "minor"),
        ("36 35 98:0 /mnt1 mnt2 rw - ext3 /dev/root rw", 1, "absolute"),
        ("36 35 98:0 /mnt1 /mnt2 rw - ext3 /dev/root rw extra", 1, "after ' - '"),
        (PROC_EXAMPLE + "\ngarbage\n", 3, "fields"),
    ],
)
def test_malformed_lines_name_the_line_and_reason(text: str, line: int, reason: str) -> None:
    with pytest.raises(MountinfoError) as err:
        parse_mountinfo(text)
    assert err.value.line == line
    assert reason in str(err.value)
    assert str(err.value).startswith(f"mountinfo line {line}:")


def generated_mountinfo(lines: int) -> str:
    out = []
    for i in range(lines):
        uid = f"{i:08d}-0000-4000-8000-000000000000"
        out.append(
            f"{1000 + i} 22 0:{50 + i % 200} / /var/lib/kubelet/pods/{uid}/volumes/"
            f"kubernetes.io~projected/kube\\040api-{i} rw,relatime shared:{i} - tmpfs tmpfs "
            "rw,size=3912k"
        )
    return "\n".join(out) + "\n"


def test_parses_ten_thousand_lines_and_reports_the_time() -> None:
    text = generated_mountinfo(10_000)
    start = time.perf_counter()
    mounts = parse_mountinfo(text)
    elapsed = time.perf_counter() - start
    print(f"\nparse_mountinfo: 10,000 lines in {elapsed * 1000:.1f} ms")
    assert len(mounts) == 10_000
    assert mounts[-1].mount_point.endswith("kube api-9999")
    assert mounts[1234].optional == ("shared:1234",)


@pytest.mark.parametrize(
    "odd", ["\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x0b", "\x0c"]
)
def test_a_source_with_a_unicode_line_break_stays_one_line(odd: str) -> None:
    """mountinfo is separated by \\n only; a user-controlled NFS/CSI source may hold any
    other character that str.splitlines() would split on."""
    from unstick.agent.probe.mount_file import pod_lines

    point = "/k/pods/u/volumes/kubernetes.io~nfs/data"
    line = f"50 22 0:40 / {point} rw - nfs server{odd}:/export rw"
    text = f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n{line}\n"
    [_, m] = parse_mountinfo(text)
    assert m.source == f"server{odd}:/export" and m.mount_point == point
    assert pod_lines(text, "/k", "u") == line + "\n"
