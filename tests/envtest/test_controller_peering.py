"""Peering: with `--peering NAME` the controller acts only while no other live replica of
higher or equal priority is listed in the ClusterKopfPeering (Kopf's rule), both in
Kopf's handlers and in the lean watcher's actions."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from controller_support import Controller, Objects, await_, crds_installed, policy_spec

from unstick.devcluster import ControlPlane

pytestmark = pytest.mark.envtest

PEERING = "t-peering"


def test_acts_only_when_the_other_replica_is_gone(
    control_plane: ControlPlane, namespace: str, make_node: Any, tmp_path: Path
) -> None:
    with crds_installed(control_plane):
        control_plane.kubectl("apply", "-f", "operator/unstick/crds/kopfpeerings.yaml")
        control_plane.kubectl(
            "wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev"
        )
        objects = Objects(control_plane)
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
        before = objects.replace_policy("default", policy_spec())
        ctl = Controller(control_plane, tmp_path / "controller.log", peering=PEERING)
        try:
            ctl.start()
            await_(lambda: f"peering {PEERING}: paused" in ctl.log(), 30, "the gate to pause")
            node = make_node(kubelet=False)
            pod = objects.pod(namespace, node, remediate="true")
            objects.core.delete_node(node)
            objects.core.delete_namespaced_pod(pod["name"], namespace)
            # Paused (Kopf starts paused with mandatory peering and stays so): nothing written.
            await_(
                lambda: objects.read_pod(namespace, pod["name"]).metadata.deletion_timestamp,
                30,
                "the deletion",
            )
            assert objects.remediation(namespace, pod) is None

            objects.custom.patch_cluster_custom_object(
                "kopf.dev",
                "v1",
                "clusterkopfpeerings",
                PEERING,
                {"status": {"other-replica": None}},
            )
            await_(
                lambda: objects.read_pod(namespace, pod["name"]) is None,
                60,
                "force-delete once this replica is the active one",
            )
            assert f"peering {PEERING}: active" in ctl.log()
        finally:
            ctl.stop()
            print(ctl.log()[-3000:])
            objects.replace_policy("default", before)
            objects.custom.delete_cluster_custom_object(
                "kopf.dev", "v1", "clusterkopfpeerings", PEERING
            )
            objects.api_client.close()
