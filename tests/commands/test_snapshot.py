"""`unstick snapshot` against a real kube-apiserver: a pod stuck Terminating on a node
without a kubelet is captured, and the bundle diagnoses as the cluster really is."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import node_unknown
from tests.support.pods import claim_body, pod_body

pytestmark = pytest.mark.envtest

DRIVER = "hostpath.csi.k8s.io"


def unstick(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unstick", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def storage(control_plane: ControlPlane) -> Iterator[Any]:
    """storage.k8s.io + PV creation, with every cluster-scoped object deleted afterwards."""
    from kubernetes import client

    api_client = control_plane.api_client()
    core, storage_api = client.CoreV1Api(api_client), client.StorageV1Api(api_client)
    pvs: list[str] = []
    attachments: list[str] = []

    class Storage:
        def pv(self, name: str, claim_ns: str, claim: str) -> None:
            core.create_persistent_volume(
                {
                    "metadata": {"name": name},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "claimRef": {"namespace": claim_ns, "name": claim},
                        "csi": {"driver": DRIVER, "volumeHandle": f"h-{name}"},
                    },
                }
            )
            pvs.append(name)

        def attach(self, name: str, pv: str, node: str) -> None:
            storage_api.create_volume_attachment(
                {
                    "metadata": {"name": name},
                    "spec": {
                        "attacher": DRIVER,
                        "nodeName": node,
                        "source": {"persistentVolumeName": pv},
                    },
                }
            )
            attachments.append(name)

    try:
        yield Storage()
    finally:
        for name in attachments:
            storage_api.delete_volume_attachment(name)
        for name in pvs:
            core.delete_persistent_volume(name)
        api_client.close()


def snapshot(control_plane: ControlPlane, ref: str) -> dict[str, Any]:
    r = unstick("snapshot", ref, "--kubeconfig", str(control_plane.kubeconfig))
    assert r.returncode == 0, r.stderr
    bundle: dict[str, Any] = json.loads(r.stdout)
    return bundle


def diagnose(tmp_path: Path, bundle: dict[str, Any], policy: dict[str, Any]) -> dict[str, Any]:
    (tmp_path / "bundle.json").write_text(json.dumps(bundle))
    (tmp_path / "policy.json").write_text(json.dumps(policy))
    r = unstick(
        "diagnose",
        "--snapshot",
        str(tmp_path / "bundle.json"),
        "--policy",
        str(tmp_path / "policy.json"),
        "--output",
        "json",
    )
    assert r.returncode == 0, r.stderr
    report: dict[str, Any] = json.loads(r.stdout)
    return report


def _overdue(bundle: dict[str, Any]) -> bool:
    dts = bundle["pod"]["metadata"].get("deletionTimestamp")
    return dts is not None and datetime.fromisoformat(
        bundle["capturedAt"]
    ) > datetime.fromisoformat(dts)


def test_snapshot_of_a_stuck_pod_diagnoses_as_the_cluster_is(
    control_plane: ControlPlane,
    core_api: Any,
    namespace: str,
    make_node: Any,
    storage: Any,
    tmp_path: Path,
) -> None:
    node = make_node(kubelet=False)
    other = make_node(kubelet=False)
    pv = f"pv-{uuid.uuid4().hex[:8]}"
    core_api.create_namespaced_persistent_volume_claim(namespace, claim_body("data", pv))
    storage.pv(pv, namespace, "data")
    storage.attach(f"va-{pv}", pv, node)
    storage.attach(f"va-other-{pv}", pv, other)
    pod = core_api.create_namespaced_pod(
        namespace, pod_body("web-0", node, remediate="true", claim="data")
    )
    uid = pod.metadata.uid
    core_api.create_namespaced_event(
        namespace,
        {
            "metadata": {"name": f"web-0.{uuid.uuid4().hex[:6]}"},
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": "web-0", "uid": uid},
            "reason": "FailedKillPod",
            "message": "error killing pod",
            "type": "Warning",
        },
    )
    # The node went down 10 minutes ago and an admin fenced it.
    node_unknown(core_api, node, "2020-01-01T00:00:00Z")
    core_api.patch_node(
        node,
        {
            "spec": {
                "taints": [
                    {
                        "key": "node.kubernetes.io/out-of-service",
                        "value": "nodeshutdown",
                        "effect": "NoExecute",
                    }
                ]
            }
        },
    )
    core_api.delete_namespaced_pod("web-0", namespace)

    policy = {"spec": {"slackSeconds": 0, "actions": ["observe", "force-delete"]}}

    def overdue_snapshot() -> dict[str, Any] | None:
        b = snapshot(control_plane, f"{namespace}/web-0")
        return b if _overdue(b) else None

    bundle = wait_until(
        overdue_snapshot, timeout=30, what="the stuck pod to pass its deletionTimestamp"
    )

    # The bundle holds the API objects exactly as served (camelCase, not client models).
    assert bundle["kind"] == "Snapshot"
    assert bundle["pod"]["metadata"]["uid"] == uid
    assert bundle["pod"]["metadata"]["deletionGracePeriodSeconds"] == 1
    assert bundle["node"]["metadata"]["name"] == node
    assert bundle["csiNode"] is None
    assert [c["metadata"]["name"] for c in bundle["persistentVolumeClaims"]] == ["data"]
    assert [v["spec"]["csi"]["driver"] for v in bundle["persistentVolumes"]] == [DRIVER]
    assert [a["metadata"]["name"] for a in bundle["volumeAttachments"]] == [f"va-{pv}"]
    assert [e["reason"] for e in bundle["events"]] == ["FailedKillPod"]
    assert bundle["probe"] is None

    report = diagnose(tmp_path, bundle, policy)
    assert report["pod"] == f"{namespace}/web-0"
    assert report["stuck"] is True
    assert report["cause"] == "NodeUnreachable"
    assert [s["action"] for s in report["plan"]] == ["force-delete"]
    assert any("fenced" in e["message"] for e in report["evidence"])

    # The node object is deleted: the same pod is now NodeGone.
    core_api.delete_node(node)
    wait_until(
        lambda: snapshot(control_plane, f"{namespace}/web-0")["node"] is None,
        timeout=30,
        what="the deleted node to disappear from the snapshot",
    )
    gone = diagnose(tmp_path, snapshot(control_plane, f"{namespace}/web-0"), policy)
    assert gone["cause"] == "NodeGone"
    assert [s["action"] for s in gone["plan"]] == ["force-delete"]


def test_snapshot_errors_are_one_line(control_plane: ControlPlane, namespace: str) -> None:
    r = unstick("snapshot", f"{namespace}/nope", "--kubeconfig", str(control_plane.kubeconfig))
    assert r.returncode == 1
    assert r.stderr.strip() == f"unstick snapshot: pod {namespace}/nope not found"
    assert r.stdout == ""
