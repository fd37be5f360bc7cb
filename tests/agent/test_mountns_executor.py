"""Executor re-checks with real mounts and a real cgroup: unmount acts only on the mount it
planned (mount id reuse), a user-controlled mount source with `\\x1c`/`\\u2028` does not
break the probe, and rmdir-stale refuses while a container of the pod runs."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import pod_container_cgroup
from unstick.agent.probe.mount_file import MountTable
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.checks import Checks
from unstick.agent.steps.executor import Executor

pytestmark = pytest.mark.mountns

EXECUTOR = Path(__file__).parent / "mountns_executor.py"
UID = "dddddddd-4444-4444-8444-dddddddddddd"


@pytest.mark.parametrize("case", ["id_reuse_same_path", "id_reuse_other_path"])
def test_unmount_acts_only_on_the_mount_it_planned(scenario, work: Path, case: str) -> None:
    r = scenario(case, work, script=EXECUTOR)
    assert r["result"]["result"] == "refused", r
    assert "changed since it was planned" in r["result"]["message"], r
    assert r["sources_at_vol"] == ["new"]  # the new mount at the path was not unmounted
    assert r["other_mounted"] is True


def test_a_mount_source_with_unicode_line_breaks_is_one_mountinfo_line(
    scenario, work: Path
) -> None:
    r = scenario("odd_source", work, script=EXECUTOR)
    (line,) = r["probe_mountinfo"].split("\n")[:-1]
    assert "nfs\x1cserver\u2028:/export" in line and f" {r['path']} " in line
    assert r["unmount"]["result"] == "succeeded", r["unmount"]
    assert r["mounted_after"] is False


@pytest.fixture
def pod_cgroup() -> Iterator[Path]:
    """A real pids cgroup named like a kubelet pod's container (removed afterwards)."""
    with pod_container_cgroup(UID, "abc123") as container:
        yield container


class _StartsAContainer(Checks):
    """Starts a process in the pod's cgroup on the table read right before an rmdir."""

    def __init__(self, settings: AgentSettings, cgroup: Path, procs: list) -> None:
        super().__init__(settings)
        self.cgroup, self.procs, self.reads = cgroup, procs, 0

    def pod_table(self, uid: str) -> MountTable:
        self.reads += 1
        if self.reads == 2 and not self.procs:
            proc = subprocess.Popen(["sleep", "600"])
            self.procs.append(proc)
            (self.cgroup / "cgroup.procs").write_text(str(proc.pid))
        return super().pod_table(uid)


def test_rmdir_stale_refuses_while_a_container_of_the_pod_runs(
    tmp_path: Path, pod_cgroup: Path
) -> None:
    stale = tmp_path / "kubelet" / "pods" / UID / "volumes" / "kubernetes.io~empty-dir" / "cache"
    stale.mkdir(parents=True)
    settings = AgentSettings(
        node_name="n", kubelet_root=str(tmp_path / "kubelet"), host_proc="/proc",
        mountinfo_path="/proc/self/mountinfo", state_dir=str(tmp_path / "state"),
    )  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []

    def rmdir(ex: Executor) -> tuple[str, str]:
        r = ex.run_step(UID, "rmdir-stale", "", dry_run=False, lazy_unmount=False)
        return r.result, r.message

    try:
        # a container started between the first check and the rmdir: the re-check sees it
        racing = Executor(settings)
        racing.checks = _StartsAContainer(settings, pod_cgroup, procs)
        result, message = rmdir(racing)
        assert (result, "still run" in message) == ("refused", True), message
        assert stale.is_dir()
        result, message = rmdir(Executor(settings))  # still running: refused up front
        assert (result, "still run" in message) == ("refused", True), message
        assert stale.is_dir()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert rmdir(Executor(settings))[0] == "succeeded"
    assert not stale.exists()
