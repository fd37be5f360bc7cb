"""Invariant 9 with a CSI plugin that mounts inside its own (Bidirectional) namespace (see
mountns_csi_propagation.py): the propagated copies of the orphaned target, and of the
kubelet's staging mount, in the pods' namespaces are no holders, the unmount goes through
and takes the target's copies along; a file open or a bind at another path in the
plugin's namespace still holds."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.mountns

CSI = Path(__file__).parent / "mountns_csi_propagation.py"


def _show(r: dict) -> None:
    for ns, lines in r["mountinfo"].items():
        print(f"== {ns} namespace")
        print("\n".join(lines))


def _assert_free(r: dict) -> None:
    _show(r)
    assert r["copies_before"]["agent"] and r["copies_before"]["plugin"], r["copies_before"]
    assert r["scan"] == {"holders": [], "unknown": None}, r["scan"]
    assert r["probe"]["holders"] == [] and r["probe"]["holderScan"] == "complete", r["probe"]
    assert r["unmount"]["result"] == "succeeded", r["unmount"]
    assert r["copies_after"] == {"host": [], "agent": [], "plugin": []}


def test_an_orphaned_staged_csi_mount_made_in_the_plugins_namespace_has_no_holder(
    scenario, work: Path
) -> None:
    r = scenario("orphan_staged", work, script=CSI)
    _assert_free(r)
    assert r["staging_after"] is True  # the kubelet's, left to its UnmountDevice


def test_an_orphaned_unstaged_csi_mount_made_in_the_plugins_namespace_has_no_holder(
    scenario, work: Path
) -> None:
    _assert_free(scenario("orphan_unstaged", work, script=CSI))


@pytest.mark.parametrize(("name", "via"), [("fd_in_plugin", "fd"), ("bind_in_plugin", "mountns")])
def test_a_real_hold_in_the_plugins_namespace_still_holds(
    scenario, work: Path, name: str, via: str
) -> None:
    r = scenario(name, work, script=CSI)
    _show(r)
    pid = r["pids"]["plugin"]
    held = {(h["mountPoint"], h["pid"], h["via"]) for h in r["probe"]["holders"]}
    assert (r["target"], pid, via) in held, r["probe"]["holders"]
    assert {h["pid"] for h in r["probe"]["holders"]} == {pid}, r["probe"]["holders"]
    assert r["unmount"]["result"] == "refused", r["unmount"]
    assert f"pid {pid} (sleep) via {via}" in r["unmount"]["message"], r["unmount"]
    assert r["target"] in r["copies_after"]["host"]
