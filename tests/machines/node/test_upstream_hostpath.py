"""The OrphanedMount incident with its own driver (issue #19): upstream csi-driver-host-path,
deployed as upstream deploys it (plugin, node-driver-registrar, external-provisioner,
external-attacher; attachRequired: true) on the real node, a StatefulSet pod on a
dynamically provisioned claim writes a file, the hostpathplugin container is killed and
restarted by the kubelet, the pod is deleted.

- v1.11.0 forgot on restart where it had published (its state file was not rewritten on
  NodePublish), so it answers NodeUnpublishVolume "not published … nothing to do" and
  leaves the mount; the real kubelet loops on "failed to remove dir … device or resource
  busy". unstick diagnoses OrphanedMount, replays the unpublish against the real driver
  (OK, the mount stays), unmounts, removes the empty dirs; the kubelet removes the pod
  itself and the StatefulSet's replacement reads the file written before.
- v1.12.0 (the fix): tests/machines/node/test_upstream_hostpath_fixed.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.csi_upstream import BUGGY, DRIVER, UpstreamDriver
from devcluster.csi_upstream_seed import UpstreamSeed
from devcluster.node import RealNode
from devcluster.process import wait_until

from .support import REMEDIATE, Release, await_resolved_with_answer, pod_exists

pytestmark = pytest.mark.node


SEED = {"annotations": REMEDIATE}


def start_restart_delete(driver: UpstreamDriver, seed: UpstreamSeed, core: Any) -> str:
    """The incident's first steps; returns the deleted pod's UID."""
    seed.create()
    uid = seed.wait_running()
    assert seed.mounted(uid), seed.node.log_tail("kubelet", 30)
    wait_until(
        lambda: [a for a in seed.attachments() if (a.get("status") or {}).get("attached")],
        timeout=60,
        what="the claim's VolumeAttachment attached by external-attacher",
    )
    wait_until(lambda: "wrote" in seed.logs(), timeout=30, what="the pod wrote its file")
    driver.restart_plugin_container()
    core.delete_namespaced_pod(seed.pod_name, seed.ns)
    return uid


def test_v1_11_0_orphaned_mount_fixed_by_unstick(
    upstream_driver: Callable[[str], UpstreamDriver],
    unstick_release: Release,
    real_node: RealNode,
    node_control_plane: ControlPlane,
    core: Any,
    seed: UpstreamSeed,
    kubelet_verbosity: Callable[[int], None],
) -> None:
    driver, cp, ns = upstream_driver(BUGGY), node_control_plane, seed.ns
    log_start = len(real_node.log_text("kubelet"))
    kubelet_verbosity(4)
    uid = start_restart_delete(driver, seed, core)
    target = str(seed.target(uid))
    wait_until(
        lambda: not pod_exists(core, ns, seed.pod_name, uid),
        timeout=150,
        what="the pod remediated and removed by the kubelet",
    )
    # The driver's own answer: OK without unmounting (the kubelet's call, then unstick's
    # replay of it).
    answer = f'Volume "{seed.volume_handle()}" is not published at "{target}", nothing to do.'
    assert driver.log().count(answer) >= 2, driver.log()[-3000:]
    # The kubelet's own lines: its TearDown "succeeded" (the driver said OK; the 1.36
    # kubelet sees the bind mount, so no "failed to remove dir … busy" as 1.29 logged),
    # then it keeps the pod because the mount is still on disk.
    log = real_node.log_text("kubelet")[log_start:]
    assert any(
        "UnmountVolume.TearDown succeeded" in line and uid in line and DRIVER in line
        for line in log.splitlines()
    ), log[-3000:]
    assert any(
        "Pod is terminated, but some volumes have not been cleaned up" in line and uid in line
        for line in log.splitlines()
    ), log[-3000:]
    # The kubelet may remove the pod (the mount gone) before the agent has written its
    # answer: the Remediation is Resolved first, the agent's nodeActions land right after.
    final = await_resolved_with_answer(cp, ns, uid)
    status = final["status"]
    done = [(a["action"], a["result"]) for a in status.get("nodeActions", [])]
    assert done and all(result == "succeeded" for _, result in done), status.get("nodeActions")
    assert done[0][0] == "replay-unpublish", done
    assert {action for action, _ in done} == {"replay-unpublish", "unmount", "rmdir-stale"}, done
    # the replay against the real driver: it answered OK and the mount stayed
    replay = status["nodeActions"][0]["message"]
    assert f"{DRIVER} NodeUnpublishVolume({seed.volume_handle()})" in replay, replay
    assert "driver answered OK but the mount is still there" in replay, replay
    assert status["cause"] in ("OrphanedMount", "KubeletNotProgressing"), status["evidence"]
    # the kubelet removed the pod: nothing of the controller's own force-delete
    assert "force-delete" not in str(status.get("actions", "")), status
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.uid={uid}").items
    assert any("OrphanedMount" in (e.message or "") for e in events), events
    assert not seed.mounted(uid)

    # the replacement starts on the same volume and reads what the first pod wrote
    seed.wait_running(other_than=uid)
    wait_until(lambda: "found: written" in seed.logs(), timeout=30, what="the file read back")
    attached = [a for a in seed.attachments() if (a.get("status") or {}).get("attached")]
    assert len(attached) == 1 and attached[0]["spec"]["nodeName"] == real_node.settings.name
