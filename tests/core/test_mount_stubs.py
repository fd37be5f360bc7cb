"""The holder scan parses each namespace's table in full only for the targets' devices and
their parents (`parse_relevant`); every other mount is a stub. These properties say that
this never changes an answer of invariant 9: the same copies hold, the same mounts have
children, the same paths are content of a target, on any table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.core.test_holder_identity import DEVS, PATHS, TAGS
from unstick.core.model.mount_identity import MountTable, Target, holding_copies, uses
from unstick.core.model.mountinfo import (
    Mount,
    MountinfoError,
    escape,
    parse_mountinfo,
    parse_relevant,
)

ROWS = st.lists(st.tuples(st.integers(0, 12), DEVS, PATHS, PATHS, TAGS), min_size=1, max_size=12)


def render(rows: list[tuple[int, tuple[int, int], str, str, list[str]]]) -> str:
    """A mountinfo text: mount i + 1 on parent `p` (0: none of the table's), any device."""
    lines = []
    for i, (p, (major, minor), root, point, tags) in enumerate(rows):
        parent = p if 0 < p <= len(rows) else 99
        optional = "".join(f" {t}" for t in tags)
        lines.append(
            f"{i + 1} {parent} {major}:{minor} {escape(root)} {escape(point)} rw{optional}"
            " - tmpfs src rw"
        )
    return "\n".join(lines) + "\n"


def tables(text: str, devices: set[tuple[int, int]]) -> tuple[MountTable, MountTable]:
    return MountTable.of(parse_mountinfo(text)), MountTable.of(*parse_relevant(text, devices))


def _ids(mounts: list[Mount]) -> set[int]:
    return {m.mount_id for m in mounts}


@given(rows=ROWS, devices=st.sets(DEVS, max_size=2))
def test_a_stub_is_never_of_a_wanted_device_nor_a_parent_of_one(
    rows: list[tuple[int, tuple[int, int], str, str, list[str]]], devices: set[tuple[int, int]]
) -> None:
    full, part = tables(render(rows), devices)
    wanted = [m for m in full.mounts if (m.major, m.minor) in devices]
    assert {m.mount_id for m in wanted} <= set(part.by_id)
    assert {m.parent_id for m in wanted} & set(full.by_id) <= set(part.by_id)
    assert set(part.mounts) <= set(full.mounts)
    assert part.other_ids == set(full.by_id) - set(part.by_id)
    assert part.parents == full.parents


@given(rows=ROWS, devices=st.sets(DEVS, min_size=1, max_size=2), path=PATHS)
def test_the_same_copies_hold_and_the_same_paths_are_content_of_a_target(
    rows: list[tuple[int, tuple[int, int], str, str, list[str]]],
    devices: set[tuple[int, int]],
    path: str,
) -> None:
    full, part = tables(render(rows), devices)
    for target in (m for m in full.mounts if (m.major, m.minor) in devices):
        assert part.has_children(target) == full.has_children(target)
        exact = Target(target, full.by_id.get(target.parent_id))
        filtered = Target(target, part.by_id.get(target.parent_id))
        assert exact == filtered
        assert _ids(holding_copies(part, filtered)) == _ids(holding_copies(full, exact))
        assert any(uses(m, path, target) for m in part.containing(path)) == any(
            uses(m, path, target) for m in full.containing(path)
        )


def test_a_path_under_a_stub_is_in_the_stub_not_in_a_mount_further_up() -> None:
    text = (
        "1 0 0:50 / / rw - tmpfs a rw\n"  # the target's device, at /
        "2 1 0:60 / /tmp rw - tmpfs b rw\n"  # another device on /tmp: a stub
    )
    part = MountTable.of(*parse_relevant(text, {(0, 50)}))
    assert [m.mount_id for m in part.mounts] == [1]
    assert part.containing("/tmp/csi/vol") == ()
    assert [m.mount_id for m in part.containing("/var/x")] == [1]
    assert part.known(2) and not part.known(3)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("x 1 0:1 / /a rw - tmpfs t rw", "mount id 'x'"),
        ("1 1 0:1 / a rw - tmpfs t rw", "mount point 'a'"),
        ("1 1 0:1", "expected at least 10 fields"),
    ],
)
def test_a_malformed_line_is_an_error_naming_it_even_as_a_stub(line: str, reason: str) -> None:
    with pytest.raises(MountinfoError, match=f"line 2: .*{reason}"):
        parse_relevant("1 0 0:9 / / rw - tmpfs r rw\n" + line + "\n", {(0, 9)})
