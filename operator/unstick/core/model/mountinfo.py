"""Parse the text of `/proc/<pid>/mountinfo` (see proc(5)).

Each line is::

    id parent major:minor root mount-point options [optional...] - fstype source super-options

Paths escape space, tab, newline and backslash as `\\040 \\011 \\012 \\134`; any
three-digit octal escape is decoded. Parsing is pure string work: the agent reads the
file and never `stat`s a mount point (a hung NFS server would block it forever).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import NamedTuple

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
_SEPARATOR = "-"
_FIELDS_BEFORE_OPTIONAL = 6
_FIELDS_AFTER_SEPARATOR = 3


class MountinfoError(ValueError):
    """A malformed mountinfo line; `line` is 1-based."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"mountinfo line {line}: {reason}")
        self.line = line
        self.reason = reason


class Mount(NamedTuple):
    """One mount as the kernel reports it, with paths unescaped. (A NamedTuple, not a frozen
    dataclass: building 10,000 of them is several times faster, and it is just as immutable.)"""

    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str
    mount_point: str
    options: tuple[str, ...]
    optional: tuple[str, ...]
    fstype: str
    source: str
    super_options: tuple[str, ...]


def unescape(field: str) -> str:
    """Decode the kernel's octal escapes (`\\040` → space, `\\134` → backslash, ...)."""
    if "\\" not in field:
        return field
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def escape(path: str) -> str:
    """Escape a path the way the kernel writes it in mountinfo (for tests and fixtures)."""
    return (
        path.replace("\\", "\\134")
        .replace(" ", "\\040")
        .replace("\t", "\\011")
        .replace("\n", "\\012")
    )


def _int(text: str, name: str, line: int) -> int:
    if not (text.isascii() and text.isdigit()):  # int() would take '²' or '٣' too
        raise MountinfoError(line, f"{name} {text!r} is not a non-negative integer")
    return int(text)


def _options(text: str) -> tuple[str, ...]:
    return tuple(text.split(",")) if text else ()


def parse_line(text: str, line: int = 1) -> Mount:
    """Parse one mountinfo line (without its newline)."""
    fields = text.split(" ")
    if len(fields) < _FIELDS_BEFORE_OPTIONAL + 1 + _FIELDS_AFTER_SEPARATOR:
        raise MountinfoError(line, f"expected at least 10 fields, found {len(fields)}")
    try:
        sep = fields.index(_SEPARATOR, _FIELDS_BEFORE_OPTIONAL)
    except ValueError:
        raise MountinfoError(line, "no ' - ' separator before the filesystem type") from None
    after = fields[sep + 1 :]
    if len(after) != _FIELDS_AFTER_SEPARATOR:
        raise MountinfoError(
            line, f"expected fstype, source and super options after ' - ', found {len(after)}"
        )
    major_minor = fields[2].split(":")
    if len(major_minor) != 2:
        raise MountinfoError(line, f"major:minor {fields[2]!r} is malformed")
    mount_point = unescape(fields[4])
    if not mount_point.startswith("/"):
        raise MountinfoError(line, f"mount point {fields[4]!r} is not an absolute path")
    return Mount(
        mount_id=_int(fields[0], "mount id", line),
        parent_id=_int(fields[1], "parent id", line),
        major=_int(major_minor[0], "major", line),
        minor=_int(major_minor[1], "minor", line),
        root=unescape(fields[3]),
        mount_point=mount_point,
        options=_options(fields[5]),
        optional=tuple(f for f in fields[_FIELDS_BEFORE_OPTIONAL:sep] if f),
        fstype=unescape(after[0]),
        source=unescape(after[1]),
        super_options=_options(after[2]),
    )


class MountStub(NamedTuple):
    """A mount known only by id, parent and mount point (see `parse_relevant`)."""

    mount_id: int
    parent_id: int
    mount_point: str


def _stub(text: str, line: int) -> tuple[MountStub, str]:
    """(the stub, the `major:minor` field) of one line, checked as far as it is read."""
    fields = text.split(" ", 5)
    if len(fields) < _FIELDS_BEFORE_OPTIONAL:
        raise MountinfoError(line, f"expected at least 10 fields, found {len(fields)}")
    mount_point = unescape(fields[4])
    if not mount_point.startswith("/"):
        raise MountinfoError(line, f"mount point {fields[4]!r} is not an absolute path")
    stub = MountStub(
        _int(fields[0], "mount id", line), _int(fields[1], "parent id", line), mount_point
    )
    return stub, fields[2]


def parse_relevant(
    text: str, devices: Collection[tuple[int, int]]
) -> tuple[list[Mount], list[MountStub]]:
    """Parse a mountinfo text keeping in full only the mounts of the given devices
    (`(major, minor)`) and their parents; every other mount is a `MountStub`. Raises
    MountinfoError as `parse_mountinfo` does for the lines parsed in full, and for a stub
    line without an integer id and parent or an absolute mount point."""
    wanted = {f"{major}:{minor}" for major, minor in devices}
    rows: list[tuple[int, MountStub, str, str]] = []
    keep: set[int] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        line = raw.rstrip("\r")
        stub, device = _stub(line, number)
        rows.append((number, stub, device, line))
        if device in wanted:
            keep.update((stub.mount_id, stub.parent_id))
    full: list[Mount] = []
    stubs: list[MountStub] = []
    for number, stub, _device, line in rows:
        if stub.mount_id in keep:
            full.append(parse_line(line, number))
        else:
            stubs.append(stub)
    return full, stubs


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse a whole mountinfo text; blank lines are skipped.

    Raises MountinfoError naming the 1-based line number and what is wrong.
    """
    mounts: list[Mount] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        mounts.append(parse_line(line.rstrip("\r"), number))
    return mounts
