"""A replacement blocked by a stuck pod, with real parts (issue #19): a ReadWriteOncePod claim
of the upstream csi-driver-host-path v1.11.0 is held by `db-0`; the driver's container
restarts (it forgets where it published) and `db-0` is deleted and stays Terminating (its
mount orphaned; not opted in yet, so unstick only observes). A second pod on the same claim,
`db-next`, waits: the real scheduler will not place it while another pod uses a
ReadWriteOncePod claim. unstick's BlockedReplacement Event on `db-next` should name the
holder. Once `db-0` opts in, unstick's fix lands and the kubelet removes it. v1.11.0 then
refuses `db-next`'s NodePublish (it forgot its staging too, and the kubelet does not stage
again a volume it believes staged): `db-next` is replaced, as its controller would, and the
new pod starts and reads the file `db-0` wrote."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from unstick.devcluster import ControlPlane
from unstick.devcluster.csi_upstream import BUGGY, UpstreamDriver
from unstick.devcluster.csi_upstream_seed import UpstreamSeed
from unstick.devcluster.node import RealNode
from unstick.devcluster.process import wait_until

from .support import REMEDIATE, Release, pod_exists

pytestmark = pytest.mark.node


@pytest.fixture
def seed(
    real_node: RealNode, node_control_plane: ControlPlane, core: Any, node_namespace: str
) -> Iterator[UpstreamSeed]:
    seed = UpstreamSeed(
        node_control_plane, core, real_node, node_namespace, access_mode="ReadWriteOncePod"
    )
    try:
        yield seed
    finally:
        seed.cleanup()


def events(core: Any, ns: str, uid: str, reason: str) -> list[str]:
    found = core.list_namespaced_event(ns, field_selector=f"involvedObject.uid={uid}").items
    return [e.message or "" for e in found if e.reason == reason]


def test_read_write_once_pod_replacement_waits_for_the_stuck_holder(
    upstream_driver: Callable[[str], UpstreamDriver],
    unstick_release: Release,
    real_node: RealNode,
    node_control_plane: ControlPlane,
    core: Any,
    seed: UpstreamSeed,
) -> None:
    driver, cp, ns = upstream_driver(BUGGY), node_control_plane, seed.ns
    uid = seed.create_pod()
    seed.wait_running()
    assert seed.mounted(uid)
    wait_until(lambda: "wrote" in seed.logs(), timeout=30, what="db-0 wrote its file")
    driver.restart_plugin_container()
    core.delete_namespaced_pod(seed.pod_name, ns)
    waiter = seed.create_pod("db-next", claim=False)

    # db-0 stays (its mount orphaned, not opted in: observed only), db-next waits
    wait_until(
        lambda: any("stuck in Terminating" in m for m in all_messages(core, ns, uid)),
        timeout=60,
        what="db-0 stuck and observed by unstick (not opted in)",
    )
    assert pod_exists(core, ns, seed.pod_name, uid)
    # the real scheduler's word first: the claim is in use by another pod
    wait_until(
        lambda: any(
            "ReadWriteOncePod access mode already in-use by another pod" in m
            for m in events(core, ns, waiter, "FailedScheduling")
        ),
        timeout=60,
        what="the scheduler refusing db-next (ReadWriteOncePod in use)",
    )
    # unstick's Event on the waiter names the holder and why it stays
    blocked = wait_until(
        lambda: events(core, ns, waiter, "BlockedReplacement"),
        timeout=90,
        what="unstick's BlockedReplacement Event on db-next",
    )
    assert any(f"held by {ns}/{seed.pod_name}" in m and "OrphanedMount" in m for m in blocked), (
        blocked
    )
    assert core.read_namespaced_pod("db-next", ns).status.phase == "Pending"

    # db-0 opts in: the fix lands, the kubelet removes it, db-next starts with the data
    core.patch_namespaced_pod(seed.pod_name, ns, {"metadata": {"annotations": REMEDIATE}})
    wait_until(
        lambda: not pod_exists(core, ns, seed.pod_name, uid),
        timeout=120,
        what="db-0 fixed and removed",
    )
    # v1.11.0's other face: its staging is forgotten too, and the kubelet, which staged the
    # volume for db-0 and keeps it staged for db-next, never stages it again: the driver
    # refuses db-next's NodePublish. Not unstick's to fix (its holder is gone): db-next is
    # replaced, as its controller would, and the new pod is staged afresh.
    refusal = "must be staged before publishing"
    wait_until(
        lambda: any(refusal in m for m in all_messages(core, ns, waiter)),
        timeout=60,
        what=f"hostpathplugin {BUGGY} refusing db-next: {refusal}",
    )
    core.delete_namespaced_pod("db-next", ns, grace_period_seconds=1)
    wait_until(
        lambda: not pod_exists(core, ns, "db-next", waiter),
        timeout=60,
        what="db-next gone",
    )
    # The kubelet unstages a volume only after its last pod is gone, and until then a new
    # pod would again get only a NodePublish (refused): wait until the node no longer lists
    # the volume in use (the kubelet's own word that it unmounted the device).
    handle = seed.volume_handle()
    wait_until(
        lambda: (
            not any(
                handle in v
                for v in core.read_node(real_node.settings.name).status.volumes_in_use or []
            )
        ),
        timeout=120,
        what="the kubelet to unstage the claim's volume (gone from the node's volumesInUse)",
    )
    seed.create_pod("db-next-2", claim=False)
    wait_until(
        lambda: core.read_namespaced_pod("db-next-2", ns).status.phase == "Running",
        timeout=120,
        what="db-next-2 Running",
    )
    wait_until(
        lambda: "found: written" in cp.kubectl("logs", "-n", ns, "db-next-2", check=False).stdout,
        timeout=30,
        what="db-next-2 reads the file db-0 wrote",
    )


def all_messages(core: Any, ns: str, uid: str) -> list[str]:
    found = core.list_namespaced_event(ns, field_selector=f"involvedObject.uid={uid}").items
    return [e.message or "" for e in found]
