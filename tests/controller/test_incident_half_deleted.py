"""A force-delete the API server carried out only half, on the real API server with the
real controller process (docs/incidents.md, "What survives a crash").

The API server removes a Terminating pod with a DELETE of `gracePeriodSeconds=0` in two
steps: it first writes the pod with `deletionGracePeriodSeconds: 0` (and a new
deletionTimestamp), then deletes it from etcd. When the second step does not happen — the
client that sent the DELETE was SIGKILLed in between (its request's context cancelled:
the audit log says 500), or the delete failed in etcd — the pod stays, with
`deletionGracePeriodSeconds: 0` and no finalizer, and nothing else deletes it: its node is
gone, and nothing here runs the pod garbage collector. The flaky controller crash test
(test_incident_crashes.py) ended so: a DELETE in flight when an incarnation was killed
left its pod half deleted, and every later incarnation took the pod for one that "goes
now" and never looked at it again — the pod stayed stuck and the last incarnation never
settled.

Here the second step is refused, deterministically, by a ValidatingAdmissionPolicy (the
API server validates a DELETE before each step; the policy refuses a pod whose
`deletionGracePeriodSeconds` is already 0), and the controller is SIGKILLed at its fail
point right after that DELETE's answer, before the answer is on record: the state a kill
between the two steps leaves. Once the policy is gone, the next controller must finish the
force-delete: the pod is gone, its entry `succeeded`, the record `Resolved`.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import (
    Controller,
    Objects,
    controller_delete_codes,
    policy_spec,
    refuse_pod_requests,
)

pytestmark = pytest.mark.envtest

ENV = "UNSTICK_TEST_FAILPOINTS"
VAP = "t-half-deleted"


POLICIES = {"default": policy_spec()}


def _refuse_second_step(admission: Any, namespace: str) -> None:
    """Refuse, in `namespace`, a pod DELETE whose pod already has deletionGracePeriodSeconds
    0: the first step of a force-delete (grace 1 -> 0) passes, the removal does not."""
    refuse_pod_requests(
        admission,
        VAP,
        namespace,
        "DELETE",
        {
            "expression": "!has(oldObject.metadata.deletionGracePeriodSeconds)"
            " || oldObject.metadata.deletionGracePeriodSeconds != 0",
            "message": "test: the second step of this force-delete is refused",
        },
    )


def _probe_refused(objects: Objects, namespace: str, probe: str) -> bool:
    """Does the policy refuse a DELETE of `probe` (a pod held by a finalizer, already at
    grace 0)? A DELETE it lets through changes nothing (the finalizer holds the pod)."""
    try:
        objects.core.delete_namespaced_pod(probe, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status in (403, 422):
            return True
        raise
    return False


def test_a_pod_left_half_deleted_by_a_killed_controller_is_force_deleted_by_the_next(
    control_plane: ControlPlane,
    objects: Objects,
    namespace: str,
    make_node: Any,
    tmp_path: Path,
) -> None:
    admission = client.AdmissionregistrationV1Api(objects.api_client)
    probe = objects.pod(namespace, None, name="vap-probe", finalizers=["example.com/x"])["name"]
    objects.core.delete_namespaced_pod(probe, namespace, grace_period_seconds=0)
    _refuse_second_step(admission, namespace)
    try:
        wait_until(
            lambda: _probe_refused(objects, namespace, probe),
            timeout=30,
            what="the policy in force",
        )
        node = make_node(kubelet=False)
        pod = objects.stuck_pod(
            namespace, node, remediate="true", name=f"p-{uuid.uuid4().hex[:8]}", node_gone=True
        )

        first = Controller(
            control_plane, tmp_path / "killed.log", env={ENV: "incident-deleted=kill@1"}
        )
        try:
            first.start()
        except AssertionError:  # it may reach its fail point right after the pod list
            assert "fail point" in first.log(), first.log()[-3000:]
        assert first.proc is not None
        assert first.proc.wait(timeout=60) == -signal.SIGKILL, first.log()[-3000:]
        first.proc = None
        assert "fail point incident-deleted reached" in first.log()
        # What a kill between the DELETE's two steps leaves: the intent on record, the
        # pod still there with deletionGracePeriodSeconds 0 and no finalizer.
        assert objects.incident_entry(namespace, pod).get("result") == "deleting"
        left = objects.read_pod(namespace, pod["name"])
        assert left is not None and left.metadata.deletion_grace_period_seconds == 0
        assert not left.metadata.finalizers
    finally:
        admission.delete_validating_admission_policy_binding(VAP)
        admission.delete_validating_admission_policy(VAP)
        wait_until(
            lambda: not _probe_refused(objects, namespace, probe),
            timeout=30,
            what="the policy gone",
        )
        objects.core.patch_namespaced_pod(probe, namespace, {"metadata": {"finalizers": None}})

    second = Controller(control_plane, tmp_path / "next.log")
    try:
        second.start()
        objects.pod_gone(namespace, pod, timeout=60, what="the pod gone")
        rem = objects.remediation_when(
            namespace,
            pod,
            incident=True,
            timeout=30,
            what="the incident Resolved",
            phase="Resolved",
        )
        (entry,) = [e for e in rem["status"]["pods"] if e["uid"] == pod["uid"]]
        assert (entry["action"], entry["result"]) == ("force-delete", "succeeded"), entry
        deletes = controller_delete_codes(control_plane, namespace, pod["name"])
        assert deletes[-1] == 200 and len(deletes) == 2, deletes  # the half one, then the rest
    finally:
        second.stop()
        print(second.log()[-4000:])
