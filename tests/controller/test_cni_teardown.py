"""Issue #25, CNI teardown failing, against a real kube-apiserver: a pod stuck Terminating on
a node without a kubelet, and the Event a kubelet posts when the CNI plugin's DEL fails
(reason FailedKillPod, its real text: tests/unit/cni_events.py). `unstick snapshot` captures
it with the pod's Events, `unstick diagnose` names the plugin and its error; observe only.

Why not on the real node: the node suite's CNI (devcluster/node_network.py) is the one
network of the shared real node, and a plugin configured to fail DEL there would also fail
every other test's pod teardown until restored — with a one-node lock shared by six
engineers, that was not risked in this session (see docs/diagnosis.md)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.commands.test_snapshot import _overdue, diagnose, snapshot
from tests.support.cni_events import CALICO_ERROR, SANDBOX, kill_pod_event
from tests.support.pods import pod_body

pytestmark = pytest.mark.envtest


def test_a_failing_cni_delete_is_diagnosed_from_the_kubelets_event(
    control_plane: ControlPlane, core_api: Any, namespace: str, make_node: Any, tmp_path: Path
) -> None:
    node = make_node(kubelet=False)
    pod = core_api.create_namespaced_pod(namespace, pod_body("app-0", node, remediate="true"))
    uid = pod.metadata.uid
    core_api.delete_namespaced_pod("app-0", namespace)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = kill_pod_event(uid, now, count=4)
    event["metadata"] = {"name": f"app-0.{uuid.uuid4().hex[:6]}", "namespace": namespace}
    event["involvedObject"] |= {"namespace": namespace, "name": "app-0"}
    core_api.create_namespaced_event(namespace, event)

    def overdue_snapshot() -> dict[str, Any] | None:
        b = snapshot(control_plane, f"{namespace}/app-0")
        return b if _overdue(b) else None

    bundle = wait_until(overdue_snapshot, timeout=60, what="the pod to be overdue")
    assert [e["reason"] for e in bundle["events"]] == ["FailedKillPod"]
    policy = {"spec": {"slackSeconds": 0, "actions": ["observe", "force-delete", "unmount"]}}
    report = diagnose(tmp_path, bundle, policy)
    assert report["cause"] == "CNITeardownFailed", report
    words = " ".join(e["message"] for e in report["evidence"])
    assert f"sandbox {SANDBOX}" in words
    assert f"CNI plugin calico fails to delete its network (4 times): {CALICO_ERROR}" in words
    assert [s["action"] for s in report["plan"]] == ["observe"]
    assert {r["action"] for r in report["refused"]} >= {"force-delete", "unmount"}


def test_the_running_controller_sees_the_kubelets_event_and_only_observes(
    control_plane: ControlPlane, namespace: str, make_node: Any, tmp_path: Path
) -> None:
    from tests.support.controller import policy_spec, running_controller

    with running_controller(control_plane, tmp_path, {"default": policy_spec()}) as (_, objects):
        node = objects.ready_node(make_node)
        pod = objects.pod(namespace, node, remediate="true")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = kill_pod_event(pod["uid"], now, count=2)
        event["metadata"] = {
            "name": f"{pod['name']}.{uuid.uuid4().hex[:6]}",
            "namespace": namespace,
        }
        event["involvedObject"] |= {"namespace": namespace, "name": pod["name"]}
        objects.core.create_namespaced_event(namespace, event)
        objects.core.delete_namespaced_pod(pod["name"], namespace)
        try:
            rem = objects.remediation_when(
                namespace,
                pod,
                timeout=60,
                what="the Remediation to say CNITeardownFailed",
                cause="CNITeardownFailed",
            )
            words = " ".join(e["message"] for e in rem["status"].get("evidence") or [])
            assert "CNI plugin calico fails to delete its network (2 times)" in words, words
            assert objects.read_pod(namespace, pod["name"]) is not None  # observed, not deleted
            assert not [
                a for a in rem["status"].get("actions") or [] if a.get("action") != "observe"
            ]
        finally:
            objects.core.delete_namespaced_pod(pod["name"], namespace, grace_period_seconds=0)
