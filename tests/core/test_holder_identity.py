"""Invariant 9 in the pure core (unstick.core.model.mount_identity): copies are found by device
and root at any path; path text alone never makes or unmakes a holder; only the
propagated copy (same place on a peer/slave of the parent) is exempt."""

from __future__ import annotations

from hypothesis import event, given
from hypothesis import strategies as st

from unstick.core.model.mount_identity import (
    MountTable,
    Target,
    holding_copies,
    is_copy,
    is_propagated_copy,
    under,
    uses,
)
from unstick.core.model.mountinfo import Mount

NAMES = st.text(alphabet="abcxyz~-_.\x1c\u2028 ", min_size=1, max_size=6).filter(
    lambda s: s not in (".", "..")
)
PATHS = st.lists(NAMES, max_size=4).map(lambda parts: "/" + "/".join(parts))
DEVS = st.tuples(st.integers(0, 3), st.integers(0, 3))
TAGS = st.lists(st.sampled_from(["shared:7", "master:7", "shared:9", "master:3"]), max_size=2)


def mount(
    mount_id: int,
    parent: int,
    dev: tuple[int, int],
    root: str,
    point: str,
    optional: tuple[str, ...] = (),
) -> Mount:
    return Mount(mount_id, parent, dev[0], dev[1], root, point, ("rw",), optional, "tmpfs", "s", ())


HOST_PARENT = mount(10, 1, (0, 50), "/", "/k", ("shared:3",))
TARGET = mount(100, 10, (0, 51), "/", "/k/pods/u/volumes/p/v", ("shared:7",))


@given(point=PATHS, below=PATHS, tags=st.lists(st.sampled_from(["", "unbindable"]), max_size=1))
def test_a_private_copy_is_found_at_any_path(point: str, below: str, tags: list[str]) -> None:
    copy = mount(300, 290, (0, 51), below, point, tuple(t for t in tags if t))
    table = MountTable.of([mount(290, 290, (8, 1), "/", "/"), copy])
    assert holding_copies(table, Target(TARGET, HOST_PARENT)) == [copy]


@given(point=PATHS, root=PATHS, dev=DEVS, tags=TAGS)
def test_path_text_never_makes_a_holder(
    point: str, root: str, dev: tuple[int, int], tags: list[str]
) -> None:
    """Another filesystem, even at the target's own mount point text, is no copy."""
    other = mount(300, 290, dev, root, point, tuple(tags))
    for at in (point, TARGET.mount_point):
        m = other._replace(mount_point=at)
        assert not is_copy(m, TARGET)
        assert holding_copies(MountTable.of([m]), Target(TARGET, HOST_PARENT)) == []
        assert not uses(m, at + "/f", TARGET)


@given(
    point=st.one_of(PATHS, st.just("/pods/u/volumes/p/v")),
    tags=TAGS,
    parent_tags=TAGS,
    parent_root=st.one_of(PATHS, st.just("/")),
)
def test_path_text_never_unmakes_a_holder(
    point: str, tags: list[str], parent_tags: list[str], parent_root: str
) -> None:
    """A copy that is not at the propagated place holds whatever its path says; moving it
    to the propagated place (same parent place) is the only thing that can exempt it."""
    parent = mount(290, 289, (0, 50), parent_root, "/mnt", tuple(parent_tags))
    copy = mount(300, 290, (0, 51), "/", "/mnt" + point, tuple(tags))
    table = MountTable.of([parent, copy])
    target = Target(TARGET, HOST_PARENT)
    exempt = is_propagated_copy(copy, table, target)
    event(f"exempt={exempt}")
    if exempt:  # only the propagated place, on a peer/slave parent, as a peer/slave
        assert parent_root == "/" and "/mnt" + point == "/mnt/pods/u/volumes/p/v"
        assert {"shared:7", "master:7"} & set(tags) and "master:3" in parent_tags
    assert holding_copies(table, target) == ([] if exempt else [copy])
    # without a known parent of the target, no copy is ever exempt
    assert holding_copies(table, Target(TARGET, None)) == [copy]


@given(tags=TAGS)
def test_a_propagated_copy_with_something_mounted_on_it_holds(tags: list[str]) -> None:
    parent = mount(290, 289, (0, 50), "/", "/k", ("master:3",))
    copy = mount(300, 290, (0, 51), "/", TARGET.mount_point, ("master:7",))
    table = MountTable.of([parent, copy])
    assert holding_copies(table, Target(TARGET, HOST_PARENT)) == []
    on_top = mount(301, 300, (0, 60), "/", TARGET.mount_point + "/x", tuple(tags))
    assert holding_copies(MountTable.of([parent, copy, on_top]), Target(TARGET, HOST_PARENT)) == [
        copy
    ]


@given(mount_root=PATHS, target_root=PATHS, rest=PATHS)
def test_a_file_is_content_of_the_target_exactly_when_its_place_in_the_fs_is(
    mount_root: str, target_root: str, rest: str
) -> None:
    """Through a mount of the same device, a file is the target's content iff its place in
    the filesystem (mount root + path below the mount point) is under the target's root."""
    target = mount(100, 10, (0, 51), target_root, "/t")
    m = mount(300, 290, (0, 51), mount_root, "/elsewhere")
    path = "/elsewhere" + ("" if rest == "/" else rest)
    place = mount_root.rstrip("/") + ("" if rest == "/" else rest) or "/"
    expected = under(mount_root, target_root) or under(place, target_root)
    assert uses(m, path, target) is expected
    assert uses(m._replace(major=1), path, target) is False  # another device: never


@given(points=st.lists(PATHS, min_size=1, max_size=6), path=PATHS)
def test_containing_is_the_longest_mount_point_prefix(points: list[str], path: str) -> None:
    mounts = [mount(i + 1, 1, (0, i), "/", p) for i, p in enumerate(points)]
    found = MountTable.of(mounts).containing(path)
    prefixes = [p for p in points if under(path, p)]
    if not prefixes:
        assert found == ()
    else:
        longest = max(prefixes, key=len)
        assert {m.mount_point for m in found} == {longest}
        assert len(found) == points.count(longest)


STAGING = mount(110, 10, (0, 51), "/", "/k/plugins/d/h/globalmount", ("shared:7",))


@given(point=st.one_of(PATHS, st.just("/plugins/d/h/globalmount")), tags=TAGS)
def test_a_propagated_copy_of_an_exempt_copy_is_exempt_only_at_its_place(
    point: str, tags: list[str]
) -> None:
    """A CSI staging mount (the kubelet's, not a holder in its own namespace) shows in a pod
    that mounts the kubelet root (Bidirectional) at its own path: that copy goes with the
    staging mount, so it is exempt given the staging mount; any other copy still holds,
    and a staging mount of unknown parent, or of other content, exempts nothing."""
    parent = mount(290, 289, (0, 50), "/", "/k", ("shared:3",))
    copy = mount(300, 290, (0, 51), "/", "/k" + point, tuple(tags))
    table = MountTable.of([parent, copy])
    target = Target(TARGET, HOST_PARENT)
    at_place = point == "/plugins/d/h/globalmount" and bool({"shared:7", "master:7"} & set(tags))
    event(f"at_place={at_place}")
    assert holding_copies(table, target, [Target(STAGING, HOST_PARENT)]) == (
        [] if at_place else [copy]
    )
    assert holding_copies(table, target) == [copy]
    assert holding_copies(table, target, [Target(STAGING, None)]) == [copy]
    other = STAGING._replace(major=1)
    assert holding_copies(table, target, [Target(other, HOST_PARENT)]) == [copy]
