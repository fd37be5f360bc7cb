"""The orphan pass removes empty dirs through directory fds (issue #22 finding 4): a parent
swapped for a symlink between the listing and the removal is never followed — the dirs it
points to stay, and the pod's own dirs that are still reachable without a symlink go.
Real directories and symlinks on the test's filesystem; the swap happens deterministically
at the pass's hook between listing and removal."""

from __future__ import annotations

from pathlib import Path

from unstick.agent.orphans.cleanup import rmdir_empty_tree
from unstick.agent.steps.safepath import UnsafePath, rmdir_at

UID = "abababab-7777-4777-8777-abababababab"
EMPTY_DIR = "kubernetes.io~empty-dir"


def _pod(tmp_path: Path) -> Path:
    top = tmp_path / "kubelet" / "pods" / UID
    (top / "volumes" / EMPTY_DIR / "cache").mkdir(parents=True)
    (top / "containers" / "app").mkdir(parents=True)
    return top


def _victim(tmp_path: Path) -> Path:
    """Empty dirs outside the pod dir with the same layout (think of /etc's empty dirs)."""
    victim = tmp_path / "elsewhere" / "volumes"
    (victim / EMPTY_DIR / "cache").mkdir(parents=True)
    return victim


def test_a_parent_swapped_for_a_symlink_after_listing_is_not_followed(tmp_path: Path) -> None:
    top, victim = _pod(tmp_path), _victim(tmp_path)

    def swap() -> None:  # the pod's volumes/ moved away, a symlink to elsewhere in its place
        (top / "volumes").rename(tmp_path / "moved-volumes")
        (top / "volumes").symlink_to(victim)

    removed, kept = rmdir_empty_tree(str(top), frozenset(), after_listing=swap)
    assert (victim / EMPTY_DIR / "cache").is_dir(), "followed the swapped-in symlink"
    assert (top / "volumes").is_symlink()  # the symlink itself is no directory: it stays
    assert not (top / "containers").exists()  # reachable without a symlink: removed
    assert removed == 2, (removed, kept)
    assert set(kept) == {
        str(top),
        str(top / "volumes"),
        str(top / "volumes" / EMPTY_DIR),
        str(top / "volumes" / EMPTY_DIR / "cache"),
    }


def test_without_a_swap_every_empty_dir_goes_and_data_stays(tmp_path: Path) -> None:
    top = _pod(tmp_path)
    (top / "etc-hosts").write_text("127.0.0.1 localhost\n")
    removed, kept = rmdir_empty_tree(str(top), frozenset())
    assert removed == 5 and kept == [str(top)], (removed, kept)
    assert [p.name for p in top.iterdir()] == ["etc-hosts"]


def test_a_mount_point_and_its_parents_are_kept(tmp_path: Path) -> None:
    top = _pod(tmp_path)
    point = str(top / "volumes" / EMPTY_DIR / "cache")
    removed, kept = rmdir_empty_tree(str(top), frozenset({point}))
    assert set(kept) == {str(top), str(top / "volumes"), str(top / "volumes" / EMPTY_DIR)}
    assert removed == 2 and Path(point).is_dir()  # never listed, never entered


def test_rmdir_at_refuses_a_symlink_on_the_way_and_at_the_end(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "pod").mkdir()
    (tmp_path / "pod" / "link").symlink_to(victim)
    for path in (tmp_path / "pod" / "link" / EMPTY_DIR / "cache", tmp_path / "pod" / "link"):
        try:
            rmdir_at(str(path))
        except UnsafePath:
            pass
        else:
            raise AssertionError(f"rmdir_at({path}) did not refuse")
    assert (victim / EMPTY_DIR / "cache").is_dir()
    assert rmdir_at(str(victim / EMPTY_DIR / "cache")) is True  # a plain empty dir goes
    assert rmdir_at(str(victim / EMPTY_DIR / "cache")) is True  # already gone: nothing to do
    (victim / EMPTY_DIR / "f").write_text("x")
    assert rmdir_at(str(victim / EMPTY_DIR)) is False  # not empty: stays
