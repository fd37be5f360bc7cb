"""Invariant 9 against real mounts with shared/slave propagation (see mountns_holders.py):
a process in a second mount namespace that uses pod A's volume through an rslave copy at
another path (fd, cwd) or bind-mounts it elsewhere is a holder, and nothing is unmounted,
lazily or not; an unused propagated copy is no holder and goes with the unmount."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.mountns

HOLDERS = Path(__file__).parent / "mountns_holders.py"


def _assert_held(r: dict, via: str) -> None:
    held = {(h["mountPoint"], h["pid"], h["via"]) for h in r["probe"]["holders"]}
    assert r["copy_in_other_ns"] is True
    assert (r["vol"], r["pid"], via) in held, r["probe"]["holders"]
    for key in ("plain", "lazy"):
        assert r[key]["result"] == "refused", r[key]
        assert f"pid {r['pid']} (sleep) via {via}" in r[key]["message"], r[key]
    assert r["mounted_after"] is True


def test_a_file_open_through_a_propagated_copy_at_another_path_holds(scenario, work: Path) -> None:
    _assert_held(scenario("fd_through_copy", work, script=HOLDERS), "fd")


def test_a_working_directory_inside_a_propagated_copy_holds(scenario, work: Path) -> None:
    _assert_held(scenario("cwd_in_copy", work, script=HOLDERS), "cwd")


def test_a_program_mapped_from_a_propagated_copy_holds(scenario, work: Path) -> None:
    _assert_held(scenario("maps_through_copy", work, script=HOLDERS), "maps")


def test_a_bind_of_the_volume_elsewhere_in_another_namespace_holds(scenario, work: Path) -> None:
    r = scenario("bind_elsewhere", work, script=HOLDERS)
    _assert_held(r, "mountns")
    assert r["after_release"]["result"] == "succeeded", r["after_release"]
    assert r["mounted_after_release"] is False


def test_a_bind_outside_the_kubelet_root_in_the_agents_namespace_holds(
    scenario, work: Path
) -> None:
    r = scenario("bind_in_same_namespace", work, script=HOLDERS)
    assert r["refused"]["result"] == "refused" and "via mountns" in r["refused"]["message"], r
    assert r["mounted"] is True
    assert r["after"]["result"] == "succeeded", r["after"]


def test_an_unused_propagated_copy_is_no_holder_and_goes_with_the_unmount(
    scenario, work: Path
) -> None:
    r = scenario("unused_copy", work, script=HOLDERS)
    assert sorted(r["copies_before"]) == sorted([r["vol"], r["copy"]])
    assert r["probe"]["holders"] == []
    assert r["plain"]["result"] == "succeeded", r["plain"]
    assert r["mounted_after"] is False
    assert r["copies_after"] == []


def test_the_agents_own_look_at_a_volume_is_no_holder(scenario, work: Path) -> None:
    r = scenario("own_look_is_no_holder", work, script=HOLDERS)
    assert r["alone"] == [] and r["alone_scan"] == "complete", r
    assert [h["pid"] for h in r["with_other"]] == [r["other_pid"]], r
