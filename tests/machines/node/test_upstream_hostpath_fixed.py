"""The same incident with csi-driver-host-path v1.12.0, the release that fixed it (see
test_upstream_hostpath.py): the hostpathplugin container restarted, the pod deleted — the
driver still knows where it published, the kubelet's NodeUnpublishVolume unmounts, and the
pod goes by itself; unstick takes no step.

The pod has not opted in: how fast the kubelet finishes depends on the machine's load, and
an opted-in pod the kubelet takes longer than the slack for would be diagnosed and get a
replayed unpublish (a second NodeUnpublishVolume, answered "not published" because the
kubelet's came first). Whether unstick needs to act is what this test asks, so unstick may
only observe here: no node step, no API action."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.csi_upstream import DRIVER, FIXED, UpstreamDriver
from devcluster.csi_upstream_seed import UpstreamSeed
from devcluster.node import RealNode
from devcluster.process import wait_until

from .support import pod_exists, remediation_for
from .test_upstream_hostpath import start_restart_delete

pytestmark = pytest.mark.node

SEED: dict[str, Any] = {}  # not opted in: unstick observes only


@pytest.mark.usefixtures("unstick_release")
def test_v1_12_0_the_fix_needs_no_unstick(
    upstream_driver: Callable[[str], UpstreamDriver],
    real_node: RealNode,
    node_control_plane: ControlPlane,
    core: Any,
    seed: UpstreamSeed,
) -> None:
    driver, cp, ns = upstream_driver(FIXED), node_control_plane, seed.ns
    uid = start_restart_delete(driver, seed, core)
    target = str(seed.target(uid))
    wait_until(
        lambda: not pod_exists(core, ns, seed.pod_name, uid),
        timeout=60,
        what="the pod removed by the kubelet alone",
    )
    assert f"hostpath: volume {target} has been unpublished." in driver.log()
    assert "not published" not in driver.log()
    assert not any(
        "failed to remove dir" in line and target in line
        for line in real_node.log_text("kubelet").splitlines()
    )
    # observed at most (when the kubelet took longer than the slack), never acted on
    record = remediation_for(cp, ns, uid) or {}
    assert not (record.get("spec") or {}).get("nodeSteps"), record
    assert not (record.get("status") or {}).get("actions"), record
    seed.wait_running(other_than=uid)
    wait_until(lambda: "found: written" in seed.logs(), timeout=30, what="the file read back")
    assert DRIVER in str(seed.attachments())
