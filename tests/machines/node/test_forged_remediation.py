"""A forged Remediation does nothing on the real node (DESIGN §3 invariant 7, §5;
docs/admission.md, docs/agent.md "Rules before node steps").

With the chart installed (its ValidatingAdmissionPolicy on):
- a tenant ServiceAccount with every RBAC verb on remediations in its namespace cannot
  create one: the API server refuses it with the policy's message;
- a cluster admin (system:masters, exempt from the policy by default) can: the record
  names a running pod that never opted in and asks the node for `restart-kubelet` and
  `unmount`, not in dry-run. The real agent refuses every step (the pod is not
  terminating), counts it in `unstick_refusals_total` on its /metrics (scraped from its
  pod) and logs why (read with `kubectl logs`, from the real kubelet); nothing is
  unmounted, the kubelet is the same process, the pod runs on; the controller marks the
  record `Refused` (it is not backed by a stuck pod).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.node import RealNode
from devcluster.node_images import NodeImages
from devcluster.process import wait_until

from .support import (
    Release,
    agent_metrics,
    busybox_pod,
    counter,
    pod_logs,
    pod_mounts,
    request_with_token,
    service_account_token,
    wait_running,
)

pytestmark = pytest.mark.node

GROUP = "/apis/unstick.dev/v1alpha1"
STEPS = [{"action": "restart-kubelet"}, {"action": "unmount"}]


def _remediations(namespace: str) -> str:
    return f"{GROUP}/namespaces/{namespace}/remediations"


def _forged(pod: Any, node: str) -> dict[str, Any]:
    """What an attacker writes: the pod's identity, the labels the agent selects by, node
    steps requested now, dry-run off."""
    uid = pod.metadata.uid
    return {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "Remediation",
        "metadata": {
            "name": f"forged-{uuid.uuid4().hex[:8]}",
            "labels": {"unstick.dev/node": node, "unstick.dev/pod-uid": uid},
        },
        "spec": {
            "podName": pod.metadata.name,
            "podUID": uid,
            "nodeName": node,
            "nodeSteps": STEPS,
            "nodeStepsRequestedAt": datetime.now(UTC).isoformat(timespec="seconds"),
            "dryRun": False,
        },
    }


def _tenant(cp: ControlPlane, namespace: str) -> str:
    """A ServiceAccount that RBAC lets do anything to remediations in `namespace`; its
    token."""
    rule = {"apiGroups": ["unstick.dev"], "resources": ["remediations", "remediations/status"],
            "verbs": ["*"]}  # fmt: skip
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/" + namespace
    cp.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
               {"metadata": {"name": "tenant"}})  # fmt: skip
    cp.request("POST", f"{rbac}/roles", {"metadata": {"name": "tenant"}, "rules": [rule]})
    binding = {
        "metadata": {"name": "tenant"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
    }
    cp.request("POST", f"{rbac}/rolebindings", binding)
    return service_account_token(cp, namespace, "tenant")


def test_a_tenant_cannot_create_a_remediation(
    real_node: RealNode,
    unstick_release: Release,
    node_control_plane: ControlPlane,
    node_images: NodeImages,
    core: Any,
    node_namespace: str,
) -> None:
    cp, ns = node_control_plane, node_namespace
    token = _tenant(cp, ns)
    pod = core.create_namespaced_pod(
        ns, busybox_pod("victim", node_images.busybox.ref, real_node.settings.name)
    )
    body = _forged(pod, real_node.settings.name)
    # RBAC lets the tenant: the API server says so (SelfSubjectAccessReview).
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"group": "unstick.dev", "resource": "remediations",
                                              "verb": "create", "namespace": ns}}}  # fmt: skip
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    status, answer = request_with_token(cp, token, "POST", path, review)
    assert status == 201 and answer["status"]["allowed"] is True, answer

    status, answer = request_with_token(cp, token, "POST", _remediations(ns), body)

    assert status == 403, answer
    message = answer["message"]
    controller_sa = f"system:serviceaccount:{unstick_release.namespace}:unstick-controller"
    assert "ValidatingAdmissionPolicy" in message, message
    assert f"only the unstick controller ({controller_sa})" in message, message
    assert f"system:serviceaccount:{ns}:tenant may not" in message, message
    assert cp.request("GET", _remediations(ns))["items"] == []


def test_an_admins_forged_remediation_does_nothing(
    real_node: RealNode,
    unstick_release: Release,
    node_control_plane: ControlPlane,
    node_images: NodeImages,
    core: Any,
    node_namespace: str,
) -> None:
    cp, ns, node = node_control_plane, node_namespace, real_node.settings.name
    pod = core.create_namespaced_pod(ns, busybox_pod("victim", node_images.busybox.ref, node))
    wait_running(core, ns, "victim")
    assert "unstick.dev/remediate" not in (pod.metadata.annotations or {})
    uid = pod.metadata.uid
    mounts_before = pod_mounts(real_node, uid)
    assert any("kubernetes.io~empty-dir/data" in line for line in mounts_before)
    assert real_node.kubelet is not None
    kubelet_pid = real_node.kubelet.host_pid
    refused_before = counter(agent_metrics(unstick_release), "unstick_refusals_total",
                             reason="forged")  # fmt: skip

    body = _forged(pod, node)
    name = body["metadata"]["name"]
    cp.request("POST", _remediations(ns), body)  # the admin: exempt from the policy

    def stored() -> dict[str, Any]:
        rem: dict[str, Any] = cp.request("GET", f"{_remediations(ns)}/{name}")
        return rem

    def answered() -> dict[str, Any] | None:
        status: dict[str, Any] = stored().get("status") or {}
        return status if status.get("nodeActions") and status.get("phase") == "Refused" else None

    try:
        status = wait_until(answered, timeout=60, what="the agent's answer and phase Refused")
    except TimeoutError as e:
        raise AssertionError(f"{e}: {stored()}") from None

    # The agent refused every step, in the pod check (the pod is not terminating).
    actions = status["nodeActions"]
    assert [a["action"] for a in actions] == ["restart-kubelet", "unmount"], actions
    for action in actions:
        assert action["result"] == "refused", actions
        assert "spec.podName: pod 'victim' is not terminating" in action["message"], actions
    assert "probe" not in status  # a refused request gets no probe of the pod either
    # The controller: not backed by a stuck pod.
    controller_refusals = status.get("refusals") or []
    assert any("not being deleted" in r["message"] for r in controller_refusals), status
    refused_after = counter(agent_metrics(unstick_release), "unstick_refusals_total",
                            reason="forged")  # fmt: skip
    assert refused_after >= refused_before + 1
    agent_log = pod_logs(unstick_release, "agent")
    assert f"remediation {ns}/{name}: node steps refused: spec.podName" in agent_log, agent_log

    # Nothing happened on the node.
    assert real_node.kubelet is not None and real_node.kubelet.host_pid == kubelet_pid
    assert pod_mounts(real_node, uid) == mounts_before
    now = core.read_namespaced_pod("victim", ns)
    assert now.status.phase == "Running" and now.metadata.deletion_timestamp is None
    assert now.status.container_statuses[0].restart_count == 0
