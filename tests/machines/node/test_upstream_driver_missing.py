"""The incident's first act with the upstream driver (issue #19): csi-driver-host-path is
uninstalled (its plugin StatefulSet deleted) while a pod uses one of its volumes, then the
pod is deleted. The real kubelet cannot tear the volume down: the driver is "not found in
the list of registered CSI drivers". unstick diagnoses CSIDriverMissing and does what
DESIGN §3 plans for it: unmount and rmdir-stale (no replay: there is no driver to call).
rmdir-stale removes the empty `mount` dir but keeps the kubelet's own vol_data.json: the
kubelet still holds the volume and needs the file to tear it down (docs/csi.md). So the pod
stays Terminating while the driver is away: nothing of it runs, nothing is mounted, no
force-delete. Once the driver is reinstalled the kubelet finishes by itself — no kubelet
restart: it tears the volume down, removes the dir, unstages, and removes the pod. The
StatefulSet's replacement then starts on the same volume and reads the file written before,
and the claim has one VolumeAttachment, attached to the node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.csi_upstream import BUGGY, DRIVER, UpstreamDriver
from devcluster.csi_upstream_seed import UpstreamSeed
from devcluster.node import RealNode
from devcluster.process import wait_until

from .support import REMEDIATE, Release, pod_exists, remediation_for

pytestmark = pytest.mark.node


SEED = {"annotations": REMEDIATE}


def test_driver_uninstalled_under_a_mounted_volume(
    upstream_driver: Callable[[str], UpstreamDriver],
    unstick_release: Release,
    real_node: RealNode,
    node_control_plane: ControlPlane,
    core: Any,
    seed: UpstreamSeed,
) -> None:
    driver, cp, ns = upstream_driver(BUGGY), node_control_plane, seed.ns
    seed.create()
    uid = seed.wait_running()
    assert seed.mounted(uid)
    wait_until(lambda: "wrote" in seed.logs(), timeout=30, what="the pod wrote its file")
    log_start = len(real_node.log_text("kubelet"))
    vol_data = seed.target(uid).parent / "vol_data.json"
    try:
        driver.stop_plugin()
        core.delete_namespaced_pod(seed.pod_name, ns)

        def steps_done() -> list[tuple[str, str]] | None:
            rem = remediation_for(cp, ns, uid) or {}
            done = [
                (a["action"], a["result"]) for a in rem.get("status", {}).get("nodeActions", [])
            ]
            return done if {"unmount", "rmdir-stale"} <= {a for a, _ in done} else None

        done = wait_until(steps_done, timeout=150, what="unstick's unmount and rmdir-stale")
        assert all(result == "succeeded" for _, result in done), done
        assert not seed.mounted(uid)
        assert not seed.target(uid).exists()  # the empty mount dir removed
        # the kubelet's own file kept: it has not torn the volume down (no driver)
        assert '"driverName"' in vol_data.read_text() and DRIVER in vol_data.read_text()
        log = real_node.log_text("kubelet")[log_start:]
        assert any(
            f"driver name {DRIVER} not found in the list of registered CSI drivers" in line
            and uid in line
            for line in log.splitlines()
        ), log[-3000:]
        events = core.list_namespaced_event(ns, field_selector=f"involvedObject.uid={uid}").items
        assert any("CSIDriverMissing" in (e.message or "") for e in events), events
        # the pod waits for the kubelet, which waits for the driver: no force-delete
        assert pod_exists(core, ns, seed.pod_name, uid)
        rem = remediation_for(cp, ns, uid) or {}
        assert "force-delete" not in str(rem.get("status", {}).get("actions", "")), rem
        assert not driver.registered()
    finally:
        if driver.plugin_pod() is None:
            driver.start_plugin()

    # nothing of the volume's data removed: the file is in the driver's data dir
    assert (driver.data_dir / seed.volume_handle() / "file").read_text() == "written\n"

    # the driver back: the kubelet finishes the old pod itself, without a restart
    wait_until(
        lambda: not pod_exists(core, ns, seed.pod_name, uid),
        timeout=240,
        what="the kubelet removing the old pod once the driver is back",
    )
    assert not vol_data.parent.exists()  # the kubelet removed the volume dir and its file
    final = wait_until(
        lambda: (r := remediation_for(cp, ns, uid)) and (r.get("status") or {}).get("phase")
        == "Resolved" and r,
        timeout=60,
        what="the Remediation marked Resolved",
    )  # fmt: skip
    assert "force-delete" not in str(final["status"].get("actions", "")), final["status"]
    log = real_node.log_text("kubelet")[log_start:]
    assert "vol_data.json: no such file" not in log, log[-3000:]
    # The replacement's mount may have failed while the driver was away ("must be staged
    # before publishing"): the kubelet's retry backs off up to 2 min 2 s between tries, and
    # 180 s was once not enough after two such failures.
    seed.wait_running(other_than=uid, timeout=300)
    wait_until(lambda: "found: written" in seed.logs(), timeout=30, what="the file read back")
    wait_until(
        lambda: attached_to(seed) == [real_node.settings.name] and len(seed.attachments()) == 1,
        timeout=60,
        what="one VolumeAttachment of the claim, attached to the node",
    )


def attached_to(seed: UpstreamSeed) -> list[str]:
    return [
        a["spec"]["nodeName"] for a in seed.attachments() if (a.get("status") or {}).get("attached")
    ]
