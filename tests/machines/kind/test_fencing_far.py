"""Fencing from a real medik8s FenceAgentsRemediation (design.md §10, docs/fencing.md): FAR
v0.7.0 in the cluster runs Debian's `fence_docker`, which powers a kind worker off through
podman's Docker API (tests/machines/kind/far.py), and unstick, whose policy trusts only
`fenceAgentsRemediation` in FAR's namespace, reads FAR's success as proof and force-deletes
the StatefulSet pod stuck on that worker.

A worker whose kubelet stopped (it no longer answers; its containers still run) goes
NotReady; a FenceAgentsRemediation is made for it as NodeHealthCheck would make one; FAR
runs `fence_docker --action off`, the worker's container is killed, and FAR's condition
`FenceAgentActionSucceeded` turns True. FAR would then force-delete every pod of the node
itself (its ResourceDeletion strategy, right after that condition): here an admission
policy refuses FAR's service account the deletion of pods in the test's namespace, so what
happens to the stuck pod there is unstick's doing, on FAR's proof. The worker is started
again and Ready before the test ends, FAR's record deleted (FAR takes its taint off).

FAR's records in a namespace the policy does not name, or from before the node's last
Ready, are no proof: the envtests check that against the real CRD
(tests/controller/test_fencing_records.py, test_out_of_service.py); not repeated here.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devcluster.process import wait_until

from . import csi
from . import far as farmod
from .support import NAMESPACE, Kind, podman
from .test_fencing import OPT_IN, messages, power_on, ready

pytestmark = [
    pytest.mark.kind,
    pytest.mark.timeout(900),
    # (before the suite's cluster is made for it)
    pytest.mark.skipif(bool(farmod.sources_missing()), reason=farmod.sources_missing()),
]
log = logging.getLogger(__name__)

STUCK_NS = "kind-far-off"  # sorts before kube-system: FAR's cleanup stops at it, refused


@pytest.fixture(scope="module")
def far(kind: Kind) -> Iterator[farmod.Far]:
    """FAR in the cluster, fencing through podman's API (the image missing: an error)."""
    farmod.require_image(kind.images)
    with farmod.deployed(kind) as deployed:
        yield deployed


@pytest.fixture
def far_proof(kind: Kind) -> Iterator[None]:
    """The default policy trusts only fenceAgentsRemediation, in FAR's namespace; the
    controller may read FARs there (the Role the chart makes for each namespace its
    policy.fenceAgentsRemediationNamespaces names). All undone afterwards."""
    spec = kind.get("remediationpolicy", "default")["spec"]
    before = {k: spec.get(k) for k in ("fencingEvidence", "fenceAgentsRemediationNamespaces")}
    sa = kind.leader_pod()["spec"]["serviceAccountName"]
    name = "unstick-controller-fencing"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": farmod.NAMESPACE},
        "rules": [
            {
                "apiGroups": ["fence-agents-remediation.medik8s.io"],
                "resources": ["fenceagentsremediations"],
                "verbs": ["get", "list"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": farmod.NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}],
    }
    kind.apply(role, binding)
    trust = {
        "fencingEvidence": ["fenceAgentsRemediation"],
        "fenceAgentsRemediationNamespaces": [farmod.NAMESPACE],
    }
    kind.kubectl(
        "patch", "remediationpolicy", "default", "--type=merge", "-p", json.dumps({"spec": trust})
    )
    try:
        yield
    finally:
        kind.kubectl(
            "patch", "remediationpolicy", "default", "--type=merge",
            "-p", json.dumps({"spec": before}),
        )  # fmt: skip
        kind.kubectl("delete", "rolebinding,role", name, "-n", farmod.NAMESPACE, check=False)


@pytest.fixture
def far_kept_out(kind: Kind) -> Iterator[None]:
    """A ValidatingAdmissionPolicy (and its binding) refusing FAR's service account the
    deletion of pods in STUCK_NS; deleted afterwards."""
    namespace = STUCK_NS
    name = f"{namespace}-no-far-cleanup"
    sa = f"system:serviceaccount:{farmod.NAMESPACE}:{farmod.PREFIX}controller-manager"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["DELETE"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            },
            "validations": [
                {
                    "expression": f"request.userInfo.username != '{sa}'",
                    "message": "the kind test leaves this namespace's pods to unstick",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    kind.apply(policy, binding)
    try:
        yield
    finally:
        kind.kubectl(
            "delete", f"validatingadmissionpolicybinding/{name}",
            f"validatingadmissionpolicy/{name}", "--ignore-not-found", check=False,
        )  # fmt: skip


def db0_running(kind: Kind, namespace: str, other_than: str = "") -> dict[str, Any] | None:
    """Pod db-0 once it runs (and its uid is not `other_than`)."""
    for pod in kind.pods(namespace):
        meta = pod["metadata"]
        running = pod.get("status", {}).get("phase") == "Running"
        if meta["name"] == "db-0" and meta["uid"] != other_than and running:
            return pod
    return None


def unready_since(kind: Kind, node: str) -> datetime:
    """When `node`'s Ready condition last changed (the API server's whole seconds)."""
    conditions = kind.get("node", node)["status"]["conditions"]
    at = next(c["lastTransitionTime"] for c in conditions if c["type"] == "Ready")
    return datetime.fromisoformat(at.replace("Z", "+00:00"))


def fence_succeeded(far: farmod.Far, node: str) -> dict[str, Any] | None:
    """FAR's FenceAgentActionSucceeded condition for `node` once True."""
    found = farmod.condition(far.get(node), farmod.SUCCEEDED)
    return found if found and found["status"] == "True" else None


def force_deleted_on_far(kind: Kind, namespace: str) -> tuple[dict[str, Any], str] | None:
    """(the record, where its force-delete of db-0 is) once a NodeUnreachable record says
    unstick force-deleted it: its node's incident (an entry of `status.pods` with
    `goneAt`) or the pod's own Remediation (`status.actions`)."""
    for rem in kind.remediations(namespace):
        status: dict[str, Any] = rem.get("status") or {}
        if status.get("cause") != "NodeUnreachable":
            continue
        if any(q.get("name") == "db-0" and q.get("goneAt") for q in status.get("pods", [])):
            return rem, "incident"
        done = {(a.get("action"), a.get("result")) for a in status.get("actions", [])}
        if rem["spec"].get("podName") == "db-0" and ("force-delete", "succeeded") in done:
            return rem, "own record"
    return None


def test_far_powers_a_worker_off_and_unstick_force_deletes_on_its_proof(
    kind: Kind,
    quick_policy: None,
    far: farmod.Far,
    far_proof: None,
    far_kept_out: None,
    namespaces: list[str],
) -> None:
    node = kind.worker_without_controller()
    namespaces.append(STUCK_NS)
    kind.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": STUCK_NS, "labels": OPT_IN}},
        csi.statefulset(kind, STUCK_NS, claim=False, prefer=node),
    )
    first = wait_until(lambda: db0_running(kind, STUCK_NS), timeout=120, what="db-0 running")
    assert first is not None  # (wait_until returns the first true answer)
    assert first["spec"]["nodeName"] == node, first["spec"]
    uid = first["metadata"]["uid"]
    try:
        # the worker stops answering: its kubelet stopped, its containers still running
        start = time.monotonic()
        podman("exec", node, "systemctl", "stop", "kubelet")
        wait_until(lambda: not ready(kind, node), timeout=180, what=f"{node} NotReady")
        not_ready = time.monotonic()
        # NodeHealthCheck makes the record once the condition has lasted its duration (300 s
        # by default); here 2 s past the transition's second, as the conditions' times have
        # whole seconds and a fence in the same second is not after it (no proof)
        since = unready_since(kind, node)
        wait_until(
            lambda: datetime.now(UTC) >= since + timedelta(seconds=2),
            timeout=30,
            what="2 s of NotReady",
        )
        kind.apply(far.remediation(node))  # as NodeHealthCheck would
        try:
            record = wait_until(
                lambda: fence_succeeded(far, node), timeout=240, what=f"FAR's {farmod.SUCCEEDED}"
            )
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{far.get(node)}\n{far.logs()}") from None
        assert record is not None
        fenced = time.monotonic()
        log.info(
            "kubelet stopped: NotReady after %.1f s; FAR's fence succeeded %.1f s after its "
            "record was made (%s)", not_ready - start, fenced - not_ready, record,
        )  # fmt: skip
        # powered off for real: the container killed through the gate
        state = podman("inspect", "--format", "{{.State.Status}}", node).strip()
        assert state == "exited", state
        kills = [s for s in far.gate.seen if s[0] == "POST" and s[1].endswith(f"/{node}/kill")]
        assert kills and all(status < 300 for *_, status in kills), far.gate.seen
        assert {s[1].split("/")[3] for s in far.gate.seen} == {node}, far.gate.seen

        # the pod deleted (as a user would, or an eviction): stuck Terminating on the dead
        # node; unstick force-deletes it on FAR's proof
        kind.kubectl("delete", "pod", "db-0", "-n", STUCK_NS, "--wait=false")
        try:
            found = wait_until(
                lambda: force_deleted_on_far(kind, STUCK_NS),
                timeout=120,
                what="unstick's force-delete of db-0 on record",
            )
        except TimeoutError:
            records = kind.remediations(STUCK_NS)
            raise AssertionError(f"no force-delete of db-0: {records}\n{far.logs()}") from None
        acted = time.monotonic()
        assert found is not None  # (wait_until returns the first true answer)
        rem, where = found
        said = messages(rem["status"])
        log.info("force-deleted %.1f s after FAR's success (%s): %s", acted - fenced, where, said)
        node_line = f"node {node} has Ready=Unknown (NodeStatusUnknown) for "
        assert any(
            m.startswith(node_line) and m.endswith("fenced by fenceAgentsRemediation") for m in said
        ), said
        proof = (
            f"fenced by fenceAgentsRemediation: FenceAgentsRemediation {farmod.NAMESPACE}/{node}"
            f" says the fence action succeeded (FenceAgentActionSucceeded=True"
        )
        at = f") at {record['lastTransitionTime']}"
        assert any(m.startswith(proof) and at in m for m in said), (said, record)
        # the StatefulSet's replacement, elsewhere
        new = wait_until(
            lambda: db0_running(kind, STUCK_NS, other_than=uid),
            timeout=180,
            what="db-0's replacement running",
        )
        assert new is not None
        assert new["spec"]["nodeName"] != node, new["spec"]
        log.info("replacement running %.1f s after the force-delete", time.monotonic() - acted)
    finally:
        record_now = far.get(node) or {}
        log.info("FAR's record at the end: %s", (record_now.get("status") or {}).get("conditions"))
        # FAR's record deleted first (FAR takes its NoSchedule taint off the node, or the
        # node's pods could not come back), then the worker started again
        far.delete_all()
        started = time.monotonic()
        if podman("inspect", "--format", "{{.State.Status}}", node).strip() == "running":
            podman("exec", node, "systemctl", "start", "kubelet")  # (not fenced: failed before)
        back = power_on(kind, node)
        log.info("started again: Ready after %.1f s, unstick's pods %.1f s later",
                 back - started, time.monotonic() - back)  # fmt: skip
    taints = kind.get("node", node)["spec"].get("taints") or []
    assert not [t for t in taints if t["key"] == farmod.TAINT], taints
