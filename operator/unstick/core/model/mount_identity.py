"""Mount identity (design.md §3 invariant 9): which mounts of a mount table are the same
filesystem content as a target mount, whatever path they sit at.

A mount's identity is its device (`major:minor`, the superblock) and its root within that
filesystem (mountinfo field 4). Two mounts overlap when they have the same device and one
root is equal to or under the other; a *copy* of a target exposes nothing but the
target's content: same device, root equal to or under the target's root (a bind of the
volume, or of a directory inside it, at any path). Every tmpfs has its own anonymous
device (`0:NN`), so for tmpfs volumes device + root is exact.

A copy goes away with the target only when it is the target's propagated copy: mounted at
the same place (the same directory of the same filesystem) on a propagation peer or slave
of the target's parent, itself a peer or slave of the target, with nothing mounted on
top of it. That copy is removed by the kernel when the target is unmounted. The same holds
for the propagated copies of a copy the caller does not count as a holder (the kubelet's
own staging mount of the volume, under the kubelet root of the table the target was read
from): they go when that copy goes, exactly as it does. Every other copy keeps the
filesystem alive and is a holder. Path text is never compared between
namespaces: only device, root and the place within the parent's filesystem.

Pure string work on parsed `Mount`s; the agent reads the tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from unstick.core.model.mountinfo import Mount, MountStub

_PEER_TAGS = ("shared", "master")


def under(path: str, top: str) -> bool:
    """`path` is `top` or below it (component-wise, not as text prefix: `/ab` is not under `/a`)."""
    if top == "/":
        return path.startswith("/")
    return path == top or path.startswith(top.rstrip("/") + "/")


def relative(path: str, top: str) -> str | None:
    """`path` below `top`, starting with `/` (`/` for `top` itself); None when not under."""
    if not under(path, top):
        return None
    rest = path[len(top.rstrip("/")) :] if top != "/" else path
    return rest or "/"


def join(root: str, rest: str) -> str:
    """`root` + `rest` (`rest` starts with `/`)."""
    if rest == "/":
        return root
    return root.rstrip("/") + rest


def same_device(a: Mount, b: Mount) -> bool:
    return (a.major, a.minor) == (b.major, b.minor)


def is_copy(other: Mount, target: Mount) -> bool:
    """`other` shows only content of `target`: same device, root equal to or under its root."""
    return same_device(other, target) and under(other.root, target.root)


def overlaps(other: Mount, target: Mount) -> bool:
    """Same device and one root equal to or under the other."""
    return same_device(other, target) and (
        under(other.root, target.root) or under(target.root, other.root)
    )


def fs_path(mount: Mount, path: str) -> str | None:
    """Where `path` (a path at or under `mount`'s mount point, in the mount's own table)
    lies inside the mount's filesystem; None when `path` is not under the mount point."""
    rest = relative(path, mount.mount_point)
    return None if rest is None else join(mount.root, rest)


def uses(mount: Mount, path: str | None, target: Mount) -> bool:
    """A file at `path` reached through `mount` is content of `target`.

    A copy (root equal to or under the target's): always. A mount of a larger part of
    the same filesystem (the target's root is under the mount's root): when the file's
    place in the filesystem is under the target's root, or cannot be told (no path, or
    a path outside the mount point): counted, never guessed away.
    """
    if is_copy(mount, target):
        return True
    if not overlaps(mount, target):
        return False
    where = fs_path(mount, path) if path is not None else None
    return where is None or under(where, target.root)


def groups(mount: Mount, tags: tuple[str, ...] = ("shared",)) -> set[str]:
    """The propagation group numbers in `mount`'s optional fields with the given tags."""
    found = set()
    for opt in mount.optional:
        tag, _, group = opt.partition(":")
        if tag in tags and group:
            found.add(group)
    return found


def propagates_from(other: Mount, source: Mount) -> bool:
    """`other` is a peer (`shared:N`) or direct slave (`master:N`) of `source`'s peer
    group. Slaves of slaves are not followed (mountinfo does not show the chain): such a
    copy is not trusted to go away."""
    return bool(groups(source) & groups(other, _PEER_TAGS))


@dataclass(frozen=True, slots=True)
class MountTable:
    """One namespace's mounts, indexed by id, mount point and parent.

    `others` are the mounts of the namespace known only as stubs (`parse_relevant`: not
    of a device the caller asked about, nor a parent of such a mount). They are never
    returned, but they still count: `containing` stops at their mount points (a path
    under one lies in it, not in a mount further up), `has_children` sees them on top of
    a mount, and `known` knows their ids."""

    mounts: tuple[Mount, ...]
    others: tuple[MountStub, ...] = ()
    by_id: dict[int, Mount] = field(init=False)
    by_point: dict[str, tuple[Mount, ...]] = field(init=False)
    parents: frozenset[int] = field(init=False)
    other_points: frozenset[str] = field(init=False)
    other_ids: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        by_point: dict[str, list[Mount]] = {}
        for m in self.mounts:
            by_point.setdefault(m.mount_point, []).append(m)
        ids = [(m.mount_id, m.parent_id) for m in self.mounts]
        ids += [(m.mount_id, m.parent_id) for m in self.others]
        object.__setattr__(self, "by_id", {m.mount_id: m for m in self.mounts})
        object.__setattr__(self, "by_point", {k: tuple(v) for k, v in by_point.items()})
        object.__setattr__(
            self,
            "parents",
            frozenset(parent for mount_id, parent in ids if parent != mount_id),
        )
        object.__setattr__(self, "other_points", frozenset(m.mount_point for m in self.others))
        object.__setattr__(self, "other_ids", frozenset(m.mount_id for m in self.others))

    @classmethod
    def of(cls, mounts: Iterable[Mount], others: Iterable[MountStub] = ()) -> MountTable:
        return cls(tuple(mounts), tuple(others))

    def known(self, mount_id: int) -> bool:
        """The id is of a mount of this table (in full or a stub)."""
        return mount_id in self.by_id or mount_id in self.other_ids

    def containing(self, path: str) -> tuple[Mount, ...]:
        """The mounts at the longest mount point that `path` is at or under (all of them when
        several are stacked there: which one is on top is not guessed); () when none is, or
        when only stubs are there."""
        if not path.startswith("/"):
            return ()
        probe = path.rstrip("/") or "/"
        while True:
            found = self.by_point.get(probe)
            if found:
                return found
            if probe == "/" or probe in self.other_points:
                return ()
            probe = probe.rsplit("/", 1)[0] or "/"

    def has_children(self, mount: Mount) -> bool:
        return mount.mount_id in self.parents


def place(mount: Mount, parent: Mount) -> str | None:
    """The directory `mount` is mounted on, as a path inside its parent's filesystem."""
    return fs_path(parent, mount.mount_point)


@dataclass(frozen=True, slots=True)
class Target:
    """A mount to be unmounted, with its parent from the table it was read from (None when
    the parent is not known: then no copy is trusted to go away with it)."""

    mount: Mount
    parent: Mount | None


def is_propagated_copy(copy: Mount, table: MountTable, target: Target) -> bool:
    """`copy` (in `table`) is removed by the kernel when `target` is unmounted: see the
    module docstring. Anything less certain is not."""
    t, tp = target.mount, target.parent
    parent = table.by_id.get(copy.parent_id)
    if tp is None or parent is None or parent.mount_id == copy.mount_id:
        return False
    return (
        copy.root == t.root
        and same_device(copy, t)
        and propagates_from(copy, t)
        and same_device(parent, tp)
        and propagates_from(parent, tp)
        and place(copy, parent) is not None
        and place(copy, parent) == place(t, tp)
        and not table.has_children(copy)
    )


def holding_copies(table: MountTable, target: Target, exempt: Sequence[Target] = ()) -> list[Mount]:
    """The copies of `target` in `table` (another namespace's) that keep its filesystem
    alive after the unmount: every copy except the propagated copy of the target or of one
    of `exempt` (copies of the target in the target's own table that are not holders, with
    their parents from that table; one without a known parent exempts nothing)."""
    refs = [target, *(e for e in exempt if is_copy(e.mount, target.mount))]
    return [
        m
        for m in table.mounts
        if is_copy(m, target.mount) and not any(is_propagated_copy(m, table, r) for r in refs)
    ]


def targets_in(table: MountTable, mounts: Sequence[Mount]) -> list[Target]:
    """Each mount with its parent looked up in `table` (the table it was read from)."""
    return [Target(m, table.by_id.get(m.parent_id)) for m in mounts]
