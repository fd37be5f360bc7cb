"""The OrphanedMount seed on the real node (DESIGN §2 rule 7): the project's CSI plugin,
run as a pod and registered with the real kubelet, publishes a static PV for a pod; the
driver is restarted and loses its state; the pod is deleted. The real kubelet's
NodeUnpublishVolume is answered OK while the mount stays, so the kubelet keeps the pod
Terminating ("volumes are still mounted on disk"). unstick, running as the chart's pods,
diagnoses OrphanedMount, the agent replays the unpublish (OK, mount stays), unmounts and
removes the empty directory, and the real kubelet then removes the pod."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.node import RealNode
from devcluster.node_images import NodeImages
from devcluster.process import wait_until

from .csi_seed import DRIVER, CsiSeed
from .support import (
    REMEDIATE,
    Release,
    agent_metrics,
    await_resolved_with_answer,
    component_pod,
    counter,
    eventually,
    pod_exists,
    remediation_for,
    scrape,
    wait_running,
)

pytestmark = pytest.mark.node


@pytest.fixture
def csi_seed(
    real_node: RealNode,
    node_control_plane: ControlPlane,
    node_images: NodeImages,
    core: Any,
    node_namespace: str,
) -> Iterator[CsiSeed]:
    seed = CsiSeed(node_control_plane, core, real_node, node_images.unstick.ref, node_namespace)
    try:
        seed.setup()
        yield seed
    finally:
        seed.cleanup()


def test_orphaned_mount_from_a_driver_that_lost_its_state(
    real_node: RealNode,
    unstick_release: Release,
    node_control_plane: ControlPlane,
    core: Any,
    node_namespace: str,
    csi_seed: CsiSeed,
    kubelet_verbosity: Callable[[int], None],
) -> None:
    ns, cp = node_namespace, node_control_plane
    uid = core.create_namespaced_pod(ns, csi_seed.pod_manifest("app", REMEDIATE)).metadata.uid
    wait_running(core, ns, "app")
    assert csi_seed.mounted(uid), real_node.log_tail("kubelet", 40)
    log_start = len(real_node.log_text("kubelet"))
    # the agent is shared by the node suite: earlier tests may have had refusals of their own
    unsafe_before = counter(
        agent_metrics(unstick_release), "unstick_refusals_total", reason="unsafe"
    )

    csi_seed.stop_plugin()
    csi_seed.start_plugin()
    kubelet_verbosity(4)
    core.delete_namespaced_pod("app", ns)

    seen: dict[str, Any] = {}

    def remediated() -> bool:
        """Keeps the last Remediation seen (the pod's is gone with it) until the pod is."""
        rem = remediation_for(cp, ns, uid)
        if rem is not None:
            seen["rem"] = rem
        return not pod_exists(core, ns, "app", uid)

    wait_until(remediated, timeout=100, what="the pod remediated and removed")
    log = real_node.log_text("kubelet")[log_start:]
    # The real kubelet: TearDown "succeeded" (the driver answered OK), then it keeps the
    # pod because the mount is still on disk.
    assert any(
        "UnmountVolume.TearDown succeeded" in line and f"kubernetes.io/csi/{DRIVER}" in line
        for line in log.splitlines()
    )
    assert "Pod found, but volumes are still mounted on disk" in log
    assert "Pod is terminated, but some volumes have not been cleaned up" in log
    # The Remediation stays as the audit trail: read it once the controller has marked it
    # Resolved and recorded the agent's answer, which may land after the pod went.
    final = await_resolved_with_answer(cp, ns, uid)
    status = final["status"]
    # The diagnosis the steps were planned for is on record in the agent's results (counted
    # with their cause below) and the pod's Event; after them the cause may read
    # KubeletNotProgressing for the instant before the kubelet removes the pod.
    assert status["cause"] in ("OrphanedMount", "KubeletNotProgressing"), status.get("evidence")
    done = [(a["action"], a["result"]) for a in status.get("nodeActions", [])]
    # the core's plan for OrphanedMount, deepest first: replay the unpublish (the driver
    # answers OK, the mount stays), unmount, then rmdir-stale of each empty volume dir
    assert done and all(result == "succeeded" for _, result in done), status.get("nodeActions")
    assert done[0][0] == "replay-unpublish", done
    assert {action for action, _ in done} == {"replay-unpublish", "unmount", "rmdir-stale"}, done
    assert not csi_seed.mounted(uid)
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.uid={uid}").items
    assert any("OrphanedMount" in (e.message or "") for e in events), events
    metrics = controller_metrics(unstick_release)
    for action in ("replay-unpublish", "unmount", "rmdir-stale"):
        labels = {"action": action, "cause": "OrphanedMount", "result": "succeeded"}
        assert counter(metrics, "unstick_remediations_total", **labels) >= 1, action
    unsafe = counter(agent_metrics(unstick_release), "unstick_refusals_total", reason="unsafe")
    assert unsafe == unsafe_before, "the agent refused a step of the fix as unsafe"


def controller_metrics(release: Release) -> str:
    """The controller's /metrics, scraped from its pod's address on the node's bridge."""
    ip = component_pod(release, "controller")["status"]["podIP"]
    text: str = eventually(lambda: scrape(f"http://{ip}:9100/metrics"), 30, "controller /metrics")
    return text
