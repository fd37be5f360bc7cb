"""Issue #25, finalizer triage against a real kube-apiserver: a pod held by the Job
controller's `batch.kubernetes.io/job-tracking` finalizer while kube-controller-manager's
leader lease was last renewed hours ago (the envtest runs no kube-controller-manager: the
test writes the Lease as a gone leader left it). `unstick snapshot` captures the lease,
`unstick diagnose` says who owns the finalizer and that it seems gone; removal is still
only for an allowlisted finalizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_snapshot import diagnose, snapshot

from unstick.devcluster import ControlPlane
from unstick.devcluster.process import wait_until
from unstick.kube.client import ClientSettings, Kube

pytestmark = pytest.mark.envtest

JOB = "batch.kubernetes.io/job-tracking"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"


@pytest.fixture
def gone_leader(control_plane: ControlPlane) -> Iterator[None]:
    kube = Kube(ClientSettings(kubeconfig=str(control_plane.kubeconfig)))
    kube.request(
        "POST",
        LEASES,
        body={
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "kube-controller-manager"},
            "spec": {
                "holderIdentity": "cp-1_8f2c",
                "leaseDurationSeconds": 15,
                "renewTime": "2020-01-01T00:00:00.000000Z",
            },
        },
    )
    try:
        yield
    finally:
        kube.request("DELETE", f"{LEASES}/kube-controller-manager")


def test_a_job_tracking_finalizer_whose_controller_is_gone_is_triaged(
    control_plane: ControlPlane, core_api: Any, namespace: str, gone_leader: None, tmp_path: Path
) -> None:
    core_api.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": "job-x-abcde",
                "finalizers": [JOB],
                "annotations": {"unstick.dev/remediate": "true"},
            },
            "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
        },
    )
    core_api.delete_namespaced_pod("job-x-abcde", namespace)
    try:
        bundle = wait_until(
            lambda: (
                (b := snapshot(control_plane, f"{namespace}/job-x-abcde"))
                and b["pod"]["metadata"].get("deletionTimestamp")
                and b
            ),
            timeout=30,
            what="the pod to be deleted",
        )
        assert [le["metadata"]["name"] for le in bundle["leases"]] == ["kube-controller-manager"]
        plain = {"spec": {"slackSeconds": 0, "actions": ["observe", "remove-finalizer"]}}
        report = diagnose(tmp_path, bundle, plain)
        assert report["cause"] == "FinalizerBlocked", report
        words = " ".join(e["message"] for e in report["evidence"])
        assert (
            f"finalizer {JOB} is removed by the Job controller of kube-controller-manager" in words
        )
        assert "by cp-1_8f2c: the Job controller of kube-controller-manager seems gone" in words
        assert [s["action"] for s in report["plan"]] == ["observe"]  # not allowlisted
        allowed = {"spec": plain["spec"] | {"finalizerAllowlist": [JOB]}}
        report = diagnose(tmp_path, bundle, allowed)
        assert [(s["action"], s["target"]) for s in report["plan"]] == [("remove-finalizer", JOB)]
    finally:
        core_api.patch_namespaced_pod("job-x-abcde", namespace, {"metadata": {"finalizers": None}})


def test_the_running_controller_says_the_finalizers_owner_seems_gone(
    control_plane: ControlPlane, namespace: str, gone_leader: None, tmp_path: Path
) -> None:
    from controller_support import await_, policy_spec, running_controller

    with running_controller(control_plane, tmp_path, {"default": policy_spec()}) as (_, objects):
        pod = objects.pod(namespace, None, remediate="true", finalizers=[JOB])
        objects.core.delete_namespaced_pod(pod["name"], namespace)
        try:
            rem = await_(
                lambda: (
                    (r := objects.remediation(namespace, pod))
                    and "seems gone" in str((r.get("status") or {}).get("evidence"))
                    and r
                ),
                60,
                "the Remediation to name the finalizer's owner",
            )
            assert rem["status"]["cause"] == "FinalizerBlocked"
            words = " ".join(e["message"] for e in rem["status"]["evidence"])
            assert "removed by the Job controller of kube-controller-manager" in words
            assert objects.read_pod(namespace, pod["name"]) is not None  # not allowlisted
        finally:
            objects.core.patch_namespaced_pod(
                pod["name"], namespace, {"metadata": {"finalizers": None}}
            )
