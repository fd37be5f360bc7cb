"""`unstick demo` end to end, on both paths: every scenario reaches its expected outcome,
and nothing is left behind (no processes of the demo, no mounts, and on the real node no
cgroup, bridge or node directory either).

- the kubelet stand-in (`--node stand-in`): a kubelet-less node in a private mount
  namespace, the stand-in finalising pods;
- the real node (`--node real`, marker `node`): kubelet + containerd, unstick installed
  from the chart, the CSI plugin as a pod; the real kubelet's own log lines for the stuck
  volumes are shown. It takes the real node's lock: tests/demo/conftest.py runs it before
  the real-node suite's session node exists, and it refuses to wait for a lock this very
  process holds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from devcluster.demo.scenarios import SCENARIOS

pytestmark = [pytest.mark.envtest, pytest.mark.mountns]


def _workdir(stdout: str) -> str:
    """The demo's temporary directory, from the kubectl hint it prints."""
    found = re.search(r"--kubeconfig (/\S+/unstick-demo-[^/\s]+)/", stdout)
    assert found, stdout[-2000:]
    return found.group(1)


def _processes_of(path: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if path in cmdline:
            found.append(cmdline)
    return found


def _mounts() -> str:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return f.read()


def _run_demo(tmp_path: Path, node: str, timeout: float) -> tuple[str, dict[str, Any]]:
    summary = tmp_path / "summary.json"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "unstick", "demo", "--non-interactive", "--node", node,
         "--summary", str(summary)],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    print(f"unstick demo --node {node}: {time.monotonic() - started:.1f}s wall time")
    assert summary.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    outcome = json.loads(summary.read_text())
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout, outcome


def _check_outcomes(stdout: str, outcome: dict[str, Any], node: str) -> None:
    """What both paths must show: each cause, each fate, the fix's steps, the aftermath."""
    rows = outcome["scenarios"]
    for sc in SCENARIOS:
        row = rows[sc.pod]
        if sc.pod == "cache-0" and not row["causes"]:
            # the controller of the image may file NodeGone under a node incident the
            # demo could not read: its counter says what it did
            forced = 'action="force-delete",cause="NodeGone",result="succeeded"} 1.0'
            assert forced in stdout, (sc.pod, row)
        else:
            assert row["causes"][0] == sc.cause, (sc.pod, row)
        assert row["pod_gone"] is sc.fixed, (sc.pod, row)
        assert row["done"], (sc.pod, row)
    # What must be left alone was only observed: nothing changed it.
    assert "force-delete" not in rows["web-7"]["actions"]
    assert "unmount" not in rows["uploader"]["actions"]
    assert rows["uploader"]["actions"] == "observe ✓"
    # The CSI pod went through the replay, the fallback unmount and the cleanup, in that
    # order; the driver answered OK without unmounting, so the agent's unmount did the work.
    assert rows["db-0"]["plans"][0].startswith("replay-unpublish→unmount→rmdir-stale")
    assert rows["db-0"]["actions"].startswith("replay-unpublish ✓ → unmount ✓ → rmdir-stale ✓")
    assert rows["cache-0"]["actions"] in ("force-delete ✓", "")
    assert rows["report-job"]["actions"] == "remove-finalizer ✓"
    assert "unstick_stuck_pods" in stdout  # the metrics were shown
    assert 'unstick_remediations_total{action="unmount",cause="OrphanedMount"' in stdout
    # The aftermath (docs/aftermath.md): the replacement blocked by web-7's volume, and the
    # orphaned pod dir the agent found on the agent's node (its file kept, reported).
    assert (
        "BlockedReplacement on Pod web-7-replacement: volume pvc/sessions is held by "
        "shop/web-7, stuck Terminating on node-silent (NodeUnreachable, not fenced)"
    ) in stdout
    assert f"OrphanedPodDirs on Node {node}: 1 orphaned pod directory" in stdout
    assert f'unstick_node_orphaned_pod_dirs{{node="{node}"}} 1.0' in stdout
    assert "stopped everything" in stdout
    workdir = _workdir(stdout)  # this run's (another demo may run beside it)
    assert _processes_of(workdir) == []
    assert workdir not in _mounts()
    assert not Path(workdir).exists()


@pytest.mark.timeout(240)
def test_demo_with_the_kubelet_stand_in(tmp_path: Path) -> None:
    stdout, outcome = _run_demo(tmp_path, "stand-in", timeout=220)
    assert outcome["node"] == "stand-in"
    _check_outcomes(stdout, outcome, "node-storage")
    # the stand-in is said on screen, and no kubelet view is claimed
    assert "with a KUBELET STAND-IN (asked for with --node stand-in)" in stdout
    assert "No real kubelet runs here" in stdout
    assert "└ kubelet:" not in stdout
    assert all(row["kubelet"] == "" for row in outcome["scenarios"].values())


@pytest.mark.node
@pytest.mark.timeout(900)  # it may wait for another session's real node (the lock)
def test_demo_on_the_real_node(tmp_path: Path) -> None:
    from devcluster.demo.real import NODE
    from devcluster.node_check import lock_holders, node_unavailable

    reason = node_unavailable()
    if reason:
        pytest.skip(f"node: {reason}")
    if os.getpid() in lock_holders(NODE):
        pytest.fail(
            f"this pytest process holds the real node's lock ({NODE}): the demo would wait "
            "for it forever; the demo's real-node test must run before tests/node's session "
            "node starts (tests/demo/conftest.py orders it first)"
        )
    stdout, outcome = _run_demo(tmp_path, "real", timeout=880)
    assert outcome["node"] == "real"
    _check_outcomes(stdout, outcome, NODE)
    assert "unstick demo on a REAL NODE (kubelet + containerd)" in stdout
    assert "No real kubelet runs here" not in stdout
    rows = outcome["scenarios"]
    # The real kubelet's view, from its own log: it keeps db-0 because the orphaned mount is
    # still on disk (the driver answered NodeUnpublish OK), and cannot unmount uploader's
    # emptyDir (a process on the node holds it).
    db_kubelet = rows["db-0"]["kubelet"]
    assert any(
        said in db_kubelet
        for said in ("volumes are still mounted on disk", "some volumes have not been cleaned up")
    ), rows["db-0"]
    assert "target is busy" in rows["uploader"]["kubelet"], rows["uploader"]
    assert "└ kubelet: " in stdout
    # Nothing of the node is left (RealNode.stop() checked its cgroups, bridge, links and
    # mounts, or the demo would have failed): no process or mount of its directory.
    node_dir = re.search(rf"real node {NODE} Ready \(its state in (\S+)\)", stdout)
    assert node_dir, stdout[-2000:]
    assert _processes_of(node_dir.group(1)) == []
    assert node_dir.group(1) not in _mounts()
    assert not Path(node_dir.group(1)).exists()
