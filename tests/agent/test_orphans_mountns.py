"""Orphaned pod dirs (DESIGN §9) with real mounts, a real holder and the real executor, in
a private mount namespace: a held mount stays, an unheld one is unmounted and its dirs
removed, a dir with a file in it stays and is reported with the file's path and size; a
pod whose container runs (a real process in its cgroup), or whose runtime cannot tell, is
not touched even when it has no volume dirs (issue #22 finding 2)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.mountns_orphans import UID_C, UID_R
from tests.agent.mountns_scenarios import UID_A, UID_B
from tests.support.processes import pod_container_cgroup

pytestmark = pytest.mark.mountns

ORPHANS = Path(__file__).parent / "mountns_orphans.py"


@pytest.fixture
def container_cgroup() -> Iterator[Path]:
    """A real pids cgroup named like a container of pod UID_R (removed afterwards)."""
    with pod_container_cgroup(UID_R, "dbg42") as container:
        yield container


def test_clean_never_touches_a_pod_whose_container_runs(
    scenario, work: Path, container_cgroup: Path
) -> None:
    r = scenario("running", work, str(container_cgroup), script=ORPHANS)
    first = r["first"][UID_R]
    assert first["result"].startswith("not cleaned: containers of the pod still run"), first
    assert "dbg42" in first["result"], first
    assert r["kept"] == [
        "containers",
        "containers/app",
        "plugins",
        "plugins/kubernetes.io~empty-dir",
        "plugins/kubernetes.io~empty-dir/wrapped_cache",
    ]
    # the container gone, the next pass cleans the empty dirs
    assert "empty dir(s) removed" in r["second"][UID_R]["result"], r["second"]
    assert not r["dir_after"]


def test_clean_does_nothing_when_the_runtime_cannot_tell(scenario, work: Path) -> None:
    r = scenario("blind", work, script=ORPHANS)
    first = r["first"][UID_R]
    assert first["result"] == (
        "not cleaned: cannot tell whether containers of the pod still run"
    ), first
    assert r["dir_after"]


def test_clean_keeps_held_mounts_and_data_and_removes_the_rest(scenario, work: Path) -> None:
    r = scenario("clean", work, script=ORPHANS)
    reports = r["reports"]
    assert set(reports) == {UID_A, UID_B, UID_C}, reports  # the live pod's dir is no orphan
    # held: nothing done, the mount and its holder stay
    assert r["held_mounted"] and r["dir_a"] and r["holder_alive"]
    assert reports[UID_A]["state"] == "held", reports[UID_A]
    assert "sleep" in reports[UID_A]["held"][0] and reports[UID_A]["result"] == ""
    # unheld: unmounted, empty dirs removed, the whole pod dir gone
    assert not r["unheld_mounted"] and not r["dir_b"], reports[UID_B]
    assert "unmount succeeded" in reports[UID_B]["result"], reports[UID_B]
    # data: the file stays and is reported with its path and size
    assert r["dir_c"] and r["data_kept"]
    c = reports[UID_C]
    assert c["state"] == "data", c
    assert c["files"] == [{"path": r["paths"]["data"], "bytes": 512}]
    # nothing to do there (no mount, no empty dir): no step, no budget taken
    assert c["bytes"] == 512 and c["result"].startswith("not cleaned: nothing to do"), c
    assert r["live_kept"]


def test_observe_changes_nothing(scenario, work: Path) -> None:
    r = scenario("observe", work, script=ORPHANS)
    assert set(r["reports"]) == {UID_A, UID_B, UID_C}
    assert r["reports"][UID_B]["state"] == "mounted"
    assert r["unheld_mounted"] and r["dir_b"] and r["held_mounted"] and r["dir_c"]
    assert all(d["result"] == "" for d in r["reports"].values())


def test_dry_run_policy_changes_nothing(scenario, work: Path) -> None:
    r = scenario("dry_run", work, script=ORPHANS)
    assert "unmount dry_run" in r["reports"][UID_B]["result"], r["reports"][UID_B]
    assert r["unheld_mounted"] and r["dir_b"]


def test_a_young_pod_dir_is_no_orphan(scenario, work: Path) -> None:
    r = scenario("young", work, script=ORPHANS)
    assert r["reports"] == {}
    assert r["unheld_mounted"] and r["dir_b"] and r["dir_c"]
