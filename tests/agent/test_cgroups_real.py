"""The agent's container check by cgroup, its frozen-cgroup detection and the node step
`thaw` on REAL cgroup hierarchies (tests/agent/cgroup_scenarios.py): a real cgroup2 mount
in a private mount namespace (a cgroup v2 node's layout) and this machine's hybrid tree
(the v1 freezer), each with the pods' cgroups named as the systemd and the cgroupfs kubelet
drivers name them, real processes moved into them and frozen for real. The step thaws
exactly the pod's frozen cgroup: another pod's frozen cgroup stays frozen, the pod's other
cgroups are not touched. Afterwards no cgroup of the test is left on the host."""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from devcluster.process import wait_until
from tests.agent.cgroup_scenarios import UID_A, UID_B, UID_C
from tests.support.processes import run_unshared

pytestmark = pytest.mark.mountns

SCRIPT = Path(__file__).parent / "cgroup_scenarios.py"
HOST_TREES = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/freezer"))


def _empty(cgroup: Path) -> bool:
    return not (cgroup / "cgroup.procs").read_text().split()


def _leftovers(top: str) -> list[Path]:
    """The test's cgroups still on the host (both hierarchies), emptied and removed."""
    left = [tree / top for tree in HOST_TREES if (tree / top).exists()]
    for top_dir in left:
        dirs = sorted((p for p in top_dir.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for d in [*dirs, top_dir]:
            for name in ("cgroup.freeze", "freezer.state"):
                if (d / name).exists():
                    (d / name).write_text("0" if name == "cgroup.freeze" else "THAWED")
            for pid in (d / "cgroup.procs").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
    for top_dir in left:
        dirs = sorted((p for p in top_dir.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for d in [*dirs, top_dir]:
            wait_until(partial(_empty, d), timeout=30, what=f"{d} empty")
            d.rmdir()
    return left


def _run(layout: str, driver: str, work: Path) -> dict[str, Any]:
    if not all(os.access(tree, os.W_OK) for tree in HOST_TREES):
        pytest.skip("needs root and a writable cgroup tree (v1 freezer, cgroup2)")
    top = f"unstick-test-{uuid.uuid4().hex[:8]}"
    # a PID namespace of its own: the scenario is PID 1, the "host" of --host-proc=/proc
    argv = ["unshare", "-p", "--fork", "--mount-proc", sys.executable, str(SCRIPT)]
    try:
        done = run_unshared([*argv, layout, driver, str(work), top], timeout=120)
    finally:
        left = _leftovers(top)
    assert done.returncode == 0, done.stderr[-4000:]
    assert not left, f"cgroups of {top} were left on the host"
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


LAYOUTS = [("v2", "systemd"), ("v2", "cgroupfs"), ("hybrid", "systemd"), ("hybrid", "cgroupfs")]


@pytest.mark.parametrize(("layout", "driver"), LAYOUTS)
def test_frozen_cgroups_are_seen_and_only_the_pods_own_is_thawed(
    tmp_path: Path, layout: str, driver: str
) -> None:
    out = _run(layout, driver, tmp_path)
    version = "v2" if layout == "v2" else "v1"
    paths = out["paths"]
    # the agent found the freezer where the "host" (PID 1) has it, and says which it saw
    assert out["layout"] == layout, out["mounts"]
    assert out["driver"] == driver
    if layout == "v2":
        assert out["mounts"] == [["v2", "/", "/proc/1/root/sys/fs/cgroup"]]
    # the container check by cgroup: A's two containers and B's CRI-O-named one run;
    # C's cgroups hold no process: an answered "none"
    assert out["scan_a"] == ["a0a0a0", "a1a1a1"]
    assert out["scan_b"] == ["b1b1b1"]
    assert "a0a0a0" in out["running"][UID_A] and "a1a1a1" in out["running"][UID_A]
    assert "(proc-cgroup)" in out["running"][UID_A]
    assert "b1b1b1" in out["running"][UID_B]
    assert out["running"][UID_C] is None
    # the probe: nothing frozen before; after the freeze exactly A's container cgroup
    assert out["probe_before"] == []
    frozen_a = {
        "path": paths["a_app"],
        "state": "FROZEN",
        "version": version,
        "container": "a1a1a1",
        "selfFrozen": True,
    }
    assert out["probe_a"] == {
        "frozenCgroups": [frozen_a],
        "runtime": "cgroup",
        "blindSpots": [],
        "cgroupLayout": layout,  # the probe says which layout and driver it saw
        "cgroupDriver": driver,
    }
    assert out["probe_a_containers"] == ["a0a0a0", "a1a1a1"]
    assert out["probe_b"] == [{**frozen_a, "path": paths["b_app"], "container": "b1b1b1"}]
    # thaw: a dry run writes nothing; another pod's cgroup and a cgroup of the pod that is
    # not frozen are refused; the step thaws A's container cgroup and nothing else
    steps = out["steps"]
    assert steps["dry_run"]["result"] == "dry_run", steps
    assert out["a_frozen_after_dry_run"] is True
    assert steps["other_pods"]["result"] == "refused", steps
    assert steps["not_frozen"]["result"] == "refused", steps
    assert "not a frozen cgroup of pod" in steps["not_frozen"]["message"]
    assert steps["thaw"]["result"] == "succeeded", steps
    written = "wrote 0 to cgroup.freeze" if layout == "v2" else "wrote THAWED to freezer.state"
    assert steps["thaw"]["message"].startswith(f"{written} of {paths['a_app']}")
    assert f"cgroup {layout}, {driver} driver" in steps["thaw"]["message"]
    assert out["after"] == {"a_app": False, "a_pause": False, "a_pod": False, "b_app": True}
    assert out["a_app_exit"] == -signal.SIGTERM  # thawed: the runtime's kill lands
    assert out["probe_a_after"] == []


def test_the_agent_reports_the_layout_it_sees_in_its_metrics_and_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """This machine is a hybrid host (the v1 freezer, cgroup2 at /sys/fs/cgroup/unified):
    `unstick_node_cgroup_layout{layout="hybrid"}` is 1, the other layouts 0, and the log
    says where each freezer is. (The v2 layout: the scenarios above, `layout`.)"""
    from prometheus_client import generate_latest

    from tests.agent.conftest import UNREACHABLE_KUBECONFIG
    from unstick.agent.loop import Agent, LoopSettings
    from unstick.agent.settings import AgentSettings

    if not all(tree.is_dir() for tree in HOST_TREES):
        pytest.skip("not a hybrid host")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
    settings = AgentSettings(node_name="n", kubelet_root=str(tmp_path), host_proc="/proc")
    agent = Agent(settings, LoopSettings(kubeconfig=str(kubeconfig)))
    with caplog.at_level("INFO", logger="unstick.agent.loop"):
        assert agent.refresh_cgroup_layout() == "hybrid"
    text = generate_latest(agent.metrics.registry).decode()
    lines = sorted(line for line in text.splitlines() if line.startswith("unstick_node_cgroup"))
    assert lines == [
        f'unstick_node_cgroup_layout{{layout="{layout}",node="n"}} {value}'
        for layout, value in (("hybrid", "1.0"), ("none", "0.0"), ("v1", "0.0"), ("v2", "0.0"))
    ]
    assert "cgroup layout hybrid (v1 at " in caplog.text
    assert "/sys/fs/cgroup/freezer, v2 at " in caplog.text
