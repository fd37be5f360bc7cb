"""Fencing evidence from medik8s' records on a real kube-apiserver (docs/fencing.md): the
real FenceAgentsRemediation (FAR v0.7.0) and SelfNodeRemediation (SNR v0.13.0) CRDs,
installed from the vendored sources in ../shared/thirdparty/ (`medik8s` of
tests/controller/conftest.py; skipped without them), their status written through the
status subresource as FAR's and SNR's managers write it.

- A NotReady node with a FAR in a namespace the policy names, whose fence action succeeded
  after the node went NotReady: the pod's diagnosis is NodeUnreachable fenced by
  fenceAgentsRemediation, and it is force-deleted (the policy permits it and lists FAR).
- The same with a policy that does not list fenceAgentsRemediation: not fenced, observed.
- A FAR success older than the node's last Ready transition: not proof (observed); the
  `unstick snapshot` of that pod carries the FAR without its spec, and `unstick diagnose`
  says why it proves nothing.
- An SNR whose timeAssumedRebooted has passed, under a policy that lists it: force-deleted.
- A group whose CRD is not installed (404) is no evidence; the CRD refuses a policy that
  lists fenceAgentsRemediation without a namespace.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from devcluster import ControlPlane
from tests.commands.test_snapshot import diagnose, snapshot
from tests.controller.conftest import FAR_NS  # the fixtures: `far_namespace`, `medik8s`
from tests.support.controller import (
    Controller,
    Objects,
    controller_pod_writes,
    controller_started,
    node_unknown,
    policy_spec,
)
from unstick.controller.deciding.fencing_records import (
    FAR_GROUP,
    SNR_GROUP,
    SNR_PATH,
    FencingRecords,
    far_path,
)
from unstick.core.rules.fencing import FencingSettings, FencingSource
from unstick.kube.client import Kube

pytestmark = pytest.mark.envtest

FAR_POLICY = {
    "fencingEvidence": ["outOfServiceTaint", "fenceAgentsRemediation"],
    "fenceAgentsRemediationNamespaces": [FAR_NS],
}
POLICIES = {
    "default": policy_spec(),
    "t-far": policy_spec(**FAR_POLICY),
    "t-taint-only": policy_spec(),  # fencingEvidence absent: [outOfServiceTaint]
    "t-snr": policy_spec(fencingEvidence=["selfNodeRemediation"]),
}


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _not_ready(objects: Objects, node: str, since: datetime) -> None:
    message = "Kubelet stopped posting node status."
    node_unknown(objects.core, node, _iso(since), message=message)


def _lost_node(objects: Objects, make_node: Any) -> tuple[str, datetime]:
    """A node with no kubelet, NotReady since 10 minutes ago; that time."""
    node = make_node(kubelet=False)
    lost = datetime.now(UTC) - timedelta(minutes=10)
    _not_ready(objects, node, lost)
    return node, lost


def _far(kube: Kube, node: str, succeeded: datetime) -> dict[str, Any]:
    """A FAR for `node` (NHC's generated name, the node in the annotation), its status as
    FAR v0.7.0's manager writes it once the fence agent succeeded."""
    base = far_path(FAR_NS)
    name = f"{node}-{uuid.uuid4().hex[:4]}"
    kube.request(
        "POST",
        base,
        body={
            "apiVersion": f"{FAR_GROUP}/v1alpha1",
            "kind": "FenceAgentsRemediation",
            "metadata": {
                "name": name,
                "annotations": {"remediation.medik8s.io/node-name": node},
            },
            "spec": {
                "agent": "fence_ipmilan",
                "sharedparameters": {"--username": "admin", "--password": "s3cret"},
                "remediationStrategy": "ResourceDeletion",
            },
        },
    )
    started = _iso(succeeded - timedelta(seconds=20))
    conditions = [
        {"type": "Processing", "status": "True", "reason": "RemediationStarted",
         "message": "FAR CR was found", "lastTransitionTime": started},
        {"type": "FenceAgentActionSucceeded", "status": "True", "reason": "FenceAgentSucceeded",
         "message": "FAR taint was added and the fence agent command has been created and "
         "executed successfully", "lastTransitionTime": _iso(succeeded)},
        {"type": "Succeeded", "status": "Unknown", "reason": "RemediationStarted",
         "message": "FAR CR was found", "lastTransitionTime": started},
    ]  # fmt: skip
    return kube.request(
        "PATCH",
        f"{base}/{name}/status",
        body={"status": {"conditions": conditions, "lastUpdateTime": _iso(succeeded)}},
        content_type="application/merge-patch+json",
    )


def _evidence(status: dict[str, Any]) -> str:
    return " | ".join(e["message"] for e in status.get("evidence") or [])


def test_a_far_success_after_notready_fences_the_node_and_the_pod_is_force_deleted(
    medik8s: Kube, controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    node, lost = _lost_node(objects, make_node)
    far = _far(medik8s, node, lost + timedelta(minutes=2))
    pod = objects.stuck_pod(namespace, node, remediate="t-far")
    objects.pod_gone(namespace, pod, timeout=60, what="force-delete (fenced by FAR)")
    incident = objects.remediation_when(
        namespace, pod, incident=True, timeout=30, what="the incident", podsGone=1
    )
    assert incident["spec"]["incident"] == "NodeUnreachable"
    text = _evidence(incident["status"])
    assert "fenced by fenceAgentsRemediation" in text, text
    assert f"FenceAgentsRemediation {FAR_NS}/{far['metadata']['name']}" in text, text
    assert _iso(lost + timedelta(minutes=2)) in text, text


def test_a_far_success_after_the_pod_was_observed_is_acted_on_without_another_change(
    medik8s: Kube, control_plane: ControlPlane, objects: Objects, namespace: str,
    make_node: Any, tmp_path: Path,
) -> None:  # fmt: skip
    """A FAR record changes neither the pod nor its Node: with a slow re-check of 300 s
    (the default), the pod observed as NodeUnreachable, NOT fenced, is looked at again
    every 10 s while its policy reads FAR records, and force-deleted once one proves the
    node off — not at the re-check."""
    node, lost = _lost_node(objects, make_node)
    with controller_started(
        control_plane, objects, tmp_path / "controller.log", valid=POLICIES,
        extra_args=("--recheck-seconds", "300"),
    ):  # fmt: skip
        pod = objects.stuck_pod(namespace, node, remediate="t-far")
        status = objects.remediation_when(
            namespace, pod, timeout=60, what="observing, not fenced", phase="Observing",
            cause="NodeUnreachable",
        )["status"]  # fmt: skip
        assert "NOT fenced" in _evidence(status), _evidence(status)
        _far(medik8s, node, lost + timedelta(minutes=2))
        objects.pod_gone(namespace, pod, timeout=60, what="force-delete on FAR's proof")


def test_a_policy_that_does_not_list_far_observes(
    medik8s: Kube, controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    node, lost = _lost_node(objects, make_node)
    _far(medik8s, node, lost + timedelta(minutes=2))
    pod = objects.stuck_pod(namespace, node, remediate="t-taint-only")
    status = objects.remediation_when(
        namespace, pod, timeout=60, what="observing", phase="Observing", cause="NodeUnreachable"
    )["status"]
    assert "force-delete" in [r["action"] for r in status.get("refused") or []]
    assert "NOT fenced" in _evidence(status) and "fencingEvidence: outOfServiceTaint" in _evidence(
        status
    )
    assert objects.read_pod(namespace, pod["name"]) is not None
    assert controller_pod_writes(controller.cp, namespace) == []


def test_a_far_success_before_the_last_ready_is_not_proof_and_is_captured_without_spec(
    medik8s: Kube,
    controller: Controller,
    objects: Objects,
    namespace: str,
    make_node: Any,
    control_plane: ControlPlane,
    tmp_path: Path,
) -> None:
    node = make_node(kubelet=False)
    lost = datetime.now(UTC) - timedelta(minutes=10)
    _far(medik8s, node, lost - timedelta(hours=1))  # an earlier incident's fence
    _not_ready(objects, node, lost)
    pod = objects.stuck_pod(namespace, node, remediate="t-far")
    status = objects.remediation_when(
        namespace, pod, timeout=60, what="observing", phase="Observing", cause="NodeUnreachable"
    )["status"]
    assert "predates the node's last Ready transition" in _evidence(status), _evidence(status)
    assert objects.read_pod(namespace, pod["name"]) is not None
    assert controller_pod_writes(controller.cp, namespace) == []

    bundle = snapshot(control_plane, f"{namespace}/{pod['name']}")
    [captured] = bundle["fenceAgentsRemediations"]
    assert "spec" not in captured and "s3cret" not in str(bundle)
    assert captured["status"]["conditions"][1]["type"] == "FenceAgentActionSucceeded"
    assert "selfNodeRemediations" not in bundle  # the policy does not trust SNR
    report = diagnose(tmp_path, bundle, POLICIES["t-far"])
    assert report["cause"] == "NodeUnreachable"
    assert "force-delete" not in [s["action"] for s in report["plan"]]
    assert "predates" in " ".join(e["message"] for e in report["evidence"])


def test_an_snr_whose_reboot_time_passed_fences_the_node(
    medik8s: Kube, controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    node, lost = _lost_node(objects, make_node)
    medik8s.request(
        "POST",
        f"/apis/{SNR_GROUP}/v1alpha1/namespaces/{FAR_NS}/selfnoderemediations",
        body={
            "apiVersion": f"{SNR_GROUP}/v1alpha1",
            "kind": "SelfNodeRemediation",
            "metadata": {"name": node},
            "spec": {},
        },
    )
    medik8s.request(
        "PATCH",
        f"/apis/{SNR_GROUP}/v1alpha1/namespaces/{FAR_NS}/selfnoderemediations/{node}/status",
        body={"status": {"timeAssumedRebooted": _iso(lost + timedelta(minutes=3))}},
        content_type="application/merge-patch+json",
    )
    pod = objects.stuck_pod(namespace, node, remediate="t-snr")
    objects.pod_gone(namespace, pod, timeout=60, what="force-delete (fenced by SNR)")
    incident = objects.remediation_when(
        namespace, pod, incident=True, timeout=30, what="the incident", podsGone=1
    )
    text = _evidence(incident["status"])
    assert f"fenced by selfNodeRemediation: SelfNodeRemediation {FAR_NS}/{node}" in text, text


def test_a_missing_crd_is_no_evidence_and_records_are_kept_without_spec(
    medik8s: Kube, make_node: Any
) -> None:
    node = make_node(kubelet=False)
    _far(medik8s, node, datetime.now(UTC))
    records = FencingRecords(medik8s, ttl_s=0)
    assert records._fetch("/apis/nothere.example.com/v1/widgets") == []  # 404: no evidence
    both = FencingSettings(frozenset(FencingSource), (FAR_NS, "no-such-namespace"))
    read = records.read(node, both)
    assert [o["metadata"]["annotations"] for o in read["fenceAgentsRemediations"]] == [
        {"remediation.medik8s.io/node-name": node}
    ]
    assert all("spec" not in o for o in read["fenceAgentsRemediations"])
    assert read["selfNodeRemediations"] == []
    assert records.read(node, FencingSettings()) == {}  # the default trusts neither
    assert medik8s.list_all(SNR_PATH) is not None


def test_the_crd_refuses_far_without_a_namespace(medik8s: Kube) -> None:
    with pytest.raises(ApiException) as err:
        medik8s.request(
            "POST",
            "/apis/unstick.dev/v1alpha1/remediationpolicies",
            body={
                "apiVersion": "unstick.dev/v1alpha1",
                "kind": "RemediationPolicy",
                "metadata": {"name": f"t-bad-{uuid.uuid4().hex[:6]}"},
                "spec": {"fencingEvidence": ["fenceAgentsRemediation"]},
            },
        )
    assert err.value.status == 422
    assert "fenceAgentsRemediationNamespaces must name the namespaces" in str(err.value.body)
