"""Peering: with `--peering NAME` the controller acts only while no other live replica of
higher or equal priority is listed in the ClusterKopfPeering (Kopf's rule), both in
Kopf's handlers and in the lean watcher's actions."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import (
    Controller,
    Objects,
    controller_started,
    policies_in_place,
    policy_spec,
)

pytestmark = pytest.mark.envtest

PEERING = "t-peering"


def test_acts_only_when_the_other_replica_is_gone(
    control_plane: ControlPlane, namespace: str, make_node: Any, tmp_path: Path
) -> None:
    with policies_in_place(control_plane, {"default": policy_spec()}) as objects:
        _peering_crd(control_plane)
        peering = {
            "apiVersion": "kopf.dev/v1",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": PEERING},
            "status": {
                "other-replica": {
                    "priority": 100,
                    "lifetime": 600,
                    "lastseen": datetime.now(UTC).isoformat(),
                }
            },
        }
        objects.custom.create_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", peering
        )
        try:
            # Paused from the start: the policy is never validated by it (valid=()).
            with controller_started(
                control_plane, objects, tmp_path / "controller.log", peering=PEERING
            ) as ctl:
                _acts_once_active(ctl, objects, namespace, make_node)
        finally:
            objects.custom.delete_cluster_custom_object(
                "kopf.dev", "v1", "clusterkopfpeerings", PEERING
            )


def _peering_crd(control_plane: ControlPlane) -> None:
    control_plane.kubectl("apply", "-f", "operator/unstick/crds/kopfpeerings.yaml")
    control_plane.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev")


def _acts_once_active(ctl: Controller, objects: Objects, namespace: str, make_node: Any) -> None:
    wait_until(
        lambda: f"peering {PEERING}: paused" in ctl.log(), timeout=30, what="the gate to pause"
    )
    node = make_node(kubelet=False)
    pod = objects.pod(namespace, node, remediate="true")
    objects.core.delete_node(node)
    objects.core.delete_namespaced_pod(pod["name"], namespace)
    # Paused (Kopf starts paused with mandatory peering and stays so): nothing written.
    wait_until(
        lambda: objects.read_pod(namespace, pod["name"]).metadata.deletion_timestamp,
        timeout=30,
        what="the deletion",
    )
    assert objects.remediation(namespace, pod) is None

    objects.custom.patch_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings", PEERING, {"status": {"other-replica": None}}
    )
    wait_until(
        lambda: objects.read_pod(namespace, pod["name"]) is None,
        timeout=60,
        what="force-delete once this replica is the active one",
    )
    assert f"peering {PEERING}: active" in ctl.log()


FAILOVER = "t-failover"


def _active_at(ctl: Controller, name: str) -> float | None:
    """When the replica's log says its peering gate turned active (epoch seconds)."""
    for line in ctl.log().splitlines():
        if f"peering {name}: active" in line:
            stamp = line[:23]  # logging's asctime: "2026-11-22 15:00:00,123"
            return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def _live_peers(objects: Objects) -> dict[str, Any]:
    peering = objects.custom.get_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings", FAILOVER
    )
    return {k: v for k, v in (peering.get("status") or {}).items() if v and v.get("lifetime")}


def measure_failover(
    cp: ControlPlane, objects: Objects, namespace: str, node: str, log_dir: Path, *args: str
) -> tuple[float, float, dict[str, Any]]:
    """SIGKILL the active replica, start the next one (as the chart's Recreate Deployment
    does), and time it: (s until the new one is active, s until it force-deleted a pod
    that got stuck meanwhile, the peering record it wrote)."""
    first = Controller(cp, log_dir / "first.log", peering=FAILOVER, extra_args=args)
    second = Controller(cp, log_dir / "second.log", peering=FAILOVER, extra_args=args)
    try:
        first.start()
        wait_until(
            lambda: _active_at(first, FAILOVER), timeout=60, what="the first replica to be active"
        )
        wait_until(
            lambda: _live_peers(objects), timeout=60, what="the first replica's peering record"
        )
        assert first.proc is not None
        first.proc.kill()  # no goodbye: its peering record stays until its lifetime ends
        first.proc.wait(timeout=10)
        first.proc = None
        killed = time.time()
        pod = objects.pod(namespace, node, remediate="true")
        objects.core.delete_namespaced_pod(pod["name"], namespace)
        second.start()
        wait_until(
            lambda: objects.read_pod(namespace, pod["name"]) is None,
            timeout=150,
            what="the new replica to take over and force-delete the stuck pod",
        )
        acted = time.time() - killed
        active = (_active_at(second, FAILOVER) or float("nan")) - killed
        peers = objects.custom.get_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", FAILOVER
        )
        return active, acted, dict(peers.get("status") or {})
    finally:
        second.stop()
        first.stop()
        print(first.log()[-1500:], second.log()[-3000:])


def test_failover_after_sigkill_waits_only_the_short_peering_lifetime(
    control_plane: ControlPlane, namespace: str, make_node: Any, tmp_path: Path
) -> None:
    with policies_in_place(control_plane, {"default": policy_spec()}) as objects:
        _peering_crd(control_plane)
        objects.custom.create_cluster_custom_object(
            "kopf.dev",
            "v1",
            "clusterkopfpeerings",
            {
                "apiVersion": "kopf.dev/v1",
                "kind": "ClusterKopfPeering",
                "metadata": {"name": FAILOVER},
            },
        )
        node = make_node(kubelet=False)
        objects.core.delete_node(node)
        try:
            # UNSTICK_TEST_PEERING_LIFETIME=60 measures Kopf's default for comparison.
            lifetime = os.environ.get("UNSTICK_TEST_PEERING_LIFETIME")
            args = ("--peering-lifetime", lifetime) if lifetime else ()
            active, acted, peers = measure_failover(
                control_plane, objects, namespace, node, tmp_path, *args
            )
            print(
                f"failover: active after {active:.1f}s, stuck pod force-deleted after {acted:.1f}s"
            )
            # Each replica announces the short lifetime (Kopf's default is 60 s): that is
            # what a successor waits for at most after a SIGKILL.
            assert {int(p["lifetime"]) for p in peers.values() if p} == {int(lifetime or 20)}
        finally:
            objects.custom.delete_cluster_custom_object(
                "kopf.dev", "v1", "clusterkopfpeerings", FAILOVER
            )
