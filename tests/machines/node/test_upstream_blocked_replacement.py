"""A replacement blocked by a stuck pod, with real parts (issue #19): a ReadWriteOncePod claim
of the upstream csi-driver-host-path v1.11.0 is held by `db-0`; the driver's container
restarts (it forgets where it published and what it staged). A second pod on the same
claim, `db-next`, comes to the node while `db-0` still runs (a surge replacement, placed
by `spec.nodeName`): the kubelet itself refuses to mount the volume for it ("volume uses
the ReadWriteOncePod access mode and is already in use by another pod"), FailedMount.
`db-0` is deleted and stays Terminating (its mount orphaned; not opted in yet, so unstick
only observes): its volume is torn down (v1.11.0 "succeeds": it forgot the publish, the
mount stays), but the kubelet keeps the volume staged for `db-next` and only asks the
driver to publish it, which v1.11.0 refuses ("must be staged before publishing": it forgot
its staging too). unstick's BlockedReplacement Event on `db-next` names the holder. Once
`db-0` opts in, unstick's fix lands and the kubelet removes it; `db-next`, still refused,
is replaced, as its controller would, and the new pod starts and reads the file `db-0`
wrote.

Why `db-next` is placed on the node before `db-0` is deleted, not by the scheduler after:
the real kube-scheduler places a pod on a ReadWriteOncePod claim only once the other pod
using it is terminal (its informer drops Succeeded/Failed pods), and the kubelet writes
that terminal phase as it starts tearing down `db-0`'s volumes. If the kubelet's reconciler
reaches `db-0`'s UnmountDevice before `db-next` is in its desired state (a ~100 ms race on
a loaded machine), it unstages the volume (v1.11.0 "succeeds": it forgot it), then stages
and publishes it afresh for `db-next`, which runs: no FailedMount, so nothing is blocked
and unstick rightly says nothing. With `db-next` on the node first (its FailedMount awaited
before `db-0` is deleted), the kubelet never unstages a volume a pod of its desired state
still wants, so the refusal holds every time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.csi_upstream import BUGGY, UpstreamDriver
from devcluster.csi_upstream_seed import UpstreamSeed
from devcluster.node import RealNode
from devcluster.process import wait_until

from .support import REMEDIATE, Release, pod_exists

pytestmark = pytest.mark.node


SEED = {"access_mode": "ReadWriteOncePod"}


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
    waiter = seed.create_pod("db-next", claim=False, pinned=True)
    # the kubelet's own word: the claim is in use by another pod (db-0, running)
    in_use = "ReadWriteOncePod access mode and is already in use by another pod"
    wait_until(
        lambda: any(in_use in m for m in events(core, ns, waiter, "FailedMount")),
        timeout=60,
        what=f"the kubelet refusing db-next's mount (FailedMount: {in_use})",
    )
    core.delete_namespaced_pod(seed.pod_name, ns)

    # db-0 stays (its mount orphaned, not opted in: observed only), db-next waits
    wait_until(
        lambda: any("stuck in Terminating" in m for m in all_messages(core, ns, uid)),
        timeout=60,
        what="db-0 stuck and observed by unstick (not opted in)",
    )
    assert pod_exists(core, ns, seed.pod_name, uid)
    # unstick's Event on the waiter names the holder and why it stays. db-next waited before
    # db-0 was deleted, so a first Event may come while db-0's cause is still Unknown (the
    # agent's look at the node not in yet): one Event per holder and cause, await the one
    # with the diagnosed cause.
    wait_until(
        lambda: [
            m
            for m in events(core, ns, waiter, "BlockedReplacement")
            if f"held by {ns}/{seed.pod_name}" in m and "OrphanedMount" in m
        ],
        timeout=90,
        what=f"unstick's BlockedReplacement Event on db-next naming {seed.pod_name}, OrphanedMount",
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
    # still refuses db-next's NodePublish ("must be staged before publishing"). Not
    # unstick's to fix (its holder is gone): db-next is replaced, as its controller would,
    # and the new pod is staged afresh.
    assert core.read_namespaced_pod("db-next", ns).status.phase == "Pending"
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
