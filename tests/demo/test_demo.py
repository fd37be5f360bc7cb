"""`unstick demo` end to end: every scenario reaches its expected outcome, and nothing is
left behind (no processes of the demo, no mounts in this namespace)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from unstick.demo.scenarios import SCENARIOS

pytestmark = [pytest.mark.envtest, pytest.mark.mountns, pytest.mark.timeout(240)]


def _demo_processes() -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "unstick-demo-" in cmdline or "unstick.demo.node" in cmdline:
            found.append(cmdline)
    return found


def test_demo_reaches_every_expected_outcome(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    result = subprocess.run(
        [sys.executable, "-m", "unstick", "demo", "--non-interactive", "--summary", str(summary)],
        capture_output=True,
        text=True,
        timeout=220,
    )
    outcome = json.loads(summary.read_text())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for sc in SCENARIOS:
        row = outcome[sc.pod]
        assert row["causes"][0] == sc.cause, (sc.pod, row)
        assert row["pod_gone"] is sc.fixed, (sc.pod, row)
    # What must be left alone was only observed: nothing changed it.
    assert "force-delete" not in outcome["web-7"]["actions"]
    assert "unmount" not in outcome["uploader"]["actions"]
    # The CSI pod went through the replay, the fallback unmount and the cleanup.
    assert outcome["db-0"]["plans"][0].startswith("replay-unpublish→unmount→rmdir-stale")
    # ... and the Remediation records each step the agent carried out, with its result:
    # the driver answered OK without unmounting, so the agent's unmount did the work.
    assert outcome["db-0"]["actions"].startswith("replay-unpublish ✓ → unmount ✓ → rmdir-stale ✓")
    assert "unstick_stuck_pods" in result.stdout  # the metrics were shown
    # The aftermath (docs/aftermath.md): the replacement blocked by web-7's volume, and the
    # orphaned pod dir the agent found on node-storage (its file kept, reported).
    assert (
        "BlockedReplacement on Pod web-7-replacement: volume pvc/sessions is held by "
        "shop/web-7, stuck Terminating on node-silent (NodeUnreachable, not fenced)"
    ) in result.stdout
    assert "OrphanedPodDirs on Node node-storage: 1 orphaned pod directory" in result.stdout
    assert 'unstick_node_orphaned_pod_dirs{node="node-storage"} 1.0' in result.stdout
    assert "No real kubelet runs here" in result.stdout  # the stand-in is said on screen
    assert _demo_processes() == []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        assert "unstick-demo" not in f.read()
