"""The Remediation's integrity, enforced by the real API server (DESIGN §3 invariant 7, §5).

The chart's CRDs, ServiceAccounts, RBAC and its ValidatingAdmissionPolicy + binding are
applied to the test API server exactly as `helm template` renders them. Every write below
is a real request with a real ServiceAccount token from the TokenRequest API: the agents'
tokens are bound to agent pods on node A and node B (so the API server records their node
in `authentication.kubernetes.io/node-name`, as for the projected token of a DaemonSet
pod), and a tenant's ServiceAccount has RBAC to create and edit remediations in its
namespace. What is shown:
- a tenant can neither create a Remediation nor change its spec, its status or the labels
  the agent selects by; each refusal names who may;
- nobody, controller included, changes a Remediation's identity (podName, podUID,
  nodeName): the CRD's CEL rule;
- the agent of node B cannot write the status of node A's Remediation; node A's agent can;
  an agent token bound to no pod names no node and is refused too;
- the controller creates Remediations and writes its requests to the agent;
- a 1.5 MB forged probe is rejected by the status schema.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.chart.render import CHART, release_objects
from tests.support.integrity import (
    JSON,
    Answer,
    TokenClient,
    applied,
    tenant_refused,
    token_for,
    whoami,
)
from tests.support.remediations import remediation

pytestmark = pytest.mark.envtest

RELEASE = "integrity"
SYSTEM_NS = "unstick-integrity"  # where the chart's ServiceAccounts live
TENANT_NS = "integrity-tenant"  # where the pods and their Remediations live
NODE_A, NODE_B = "integrity-node-a", "integrity-node-b"
CONTROLLER_SA, AGENT_SA = f"{RELEASE}-unstick-controller", f"{RELEASE}-unstick-agent"
REMEDIATIONS = f"/apis/unstick.dev/v1alpha1/namespaces/{TENANT_NS}/remediations"
# The kinds the integrity needs; the workloads are left out (no kubelet runs them here).
KINDS = (
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)


def render_chart() -> list[JSON]:
    """The chart's objects of KINDS, rendered as a release in SYSTEM_NS."""
    return release_objects(
        RELEASE, SYSTEM_NS, KINDS, f"controller.peeringName={RELEASE}", f"policy.name={RELEASE}"
    )


def _namespace(name: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _node(name: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def _pod(name: str, node: str, service_account: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": SYSTEM_NS},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "containers": [{"name": "agent", "image": "unstick:test"}],
        },
    }


def _tenant_rbac() -> list[JSON]:
    """A tenant who may do anything to remediations in its namespace, as far as RBAC goes."""
    rules = [
        {
            "apiGroups": ["unstick.dev"],
            "resources": ["remediations", "remediations/status"],
            "verbs": ["get", "list", "create", "update", "patch"],
        }
    ]
    meta = {"name": "remediation-editor", "namespace": TENANT_NS}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "tenant", "namespace": TENANT_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "remediation-editor"},
         "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": TENANT_NS}]},
    ]  # fmt: skip


@dataclass
class World:
    cp: ControlPlane
    controller: TokenClient
    agent_a: TokenClient  # bound to an agent pod on NODE_A
    agent_b: TokenClient  # bound to an agent pod on NODE_B
    agent_unbound: TokenClient  # the agent's ServiceAccount, bound to no pod
    tenant: TokenClient

    def remediation(self, node: str = NODE_A, **spec: Any) -> JSON:
        """A Remediation created by the controller, as the controller creates them."""
        uid = str(uuid.uuid4())
        name = f"web-{uid[:8]}"
        labels = {"unstick.dev/node": node, "unstick.dev/pod-uid": uid}
        meta = {"labels": labels}
        body = remediation("web-0", uid, node, name=name, metadata=meta, dryRun=True, **spec)
        answer = self.controller.request("POST", REMEDIATIONS, body)
        assert answer.status == 201, answer
        return answer.body

    def stored(self, rem: JSON) -> JSON:
        return self.cp.request("GET", f"{REMEDIATIONS}/{rem['metadata']['name']}")  # type: ignore[no-any-return]


def _path(rem: JSON, sub: str = "") -> str:
    return f"{REMEDIATIONS}/{rem['metadata']['name']}{sub}"


def _forged(uid: str) -> JSON:
    steps = [{"action": "restart-kubelet"}]
    return remediation("db-0", uid, NODE_A, name=f"forged-{uid[:8]}", nodeSteps=steps)


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane) -> Iterator[World]:
    cp = control_plane
    cp.install_crds(CHART / "crds")
    chart = render_chart()
    base = [_namespace(SYSTEM_NS), _namespace(TENANT_NS), _node(NODE_A), _node(NODE_B)]
    pods = [_pod("agent-a", NODE_A, AGENT_SA), _pod("agent-b", NODE_B, AGENT_SA)]
    with applied(cp, base + chart + _tenant_rbac(), records_in=[TENANT_NS], agents_in=SYSTEM_NS):
        created = {
            p["metadata"]["name"]: cp.request("POST", f"/api/v1/namespaces/{SYSTEM_NS}/pods", p)
            for p in pods
        }
        w = World(
            cp,
            controller=token_for(cp, SYSTEM_NS, CONTROLLER_SA),
            agent_a=token_for(cp, SYSTEM_NS, AGENT_SA, created["agent-a"]),
            agent_b=token_for(cp, SYSTEM_NS, AGENT_SA, created["agent-b"]),
            agent_unbound=token_for(cp, SYSTEM_NS, AGENT_SA),
            tenant=token_for(cp, TENANT_NS, "tenant"),
        )
        wait_until(
            lambda: tenant_refused(cp, w.tenant, REMEDIATIONS, _forged(str(uuid.uuid4()))),
            timeout=60,
            what="the admission policy",
        )
        yield w


def _refused(answer: Answer, status: int, *words: str) -> None:
    assert answer.status == status, answer
    for word in words:
        assert word in answer.message, answer.message


# -- who the API server sees ---------------------------------------------------------------


def test_agent_tokens_carry_their_node(world: World) -> None:
    key = "authentication.kubernetes.io/node-name"
    assert whoami(world.agent_a)["extra"][key] == [NODE_A]
    assert whoami(world.agent_b)["extra"][key] == [NODE_B]
    assert key not in (whoami(world.agent_unbound).get("extra") or {})


def test_the_tenant_has_rbac_for_remediations(world: World) -> None:
    """So every refusal below comes from the policy, not from RBAC."""
    for verb, sub in (("create", ""), ("patch", ""), ("patch", "--subresource=status")):
        proc = world.cp.kubectl(
            "auth", "can-i", verb, "remediations.unstick.dev", "-n", TENANT_NS,
            f"--as=system:serviceaccount:{TENANT_NS}:tenant", *([sub] if sub else []),
            check=False,
        )  # fmt: skip
        assert proc.stdout.strip() == "yes", (verb, sub, proc.stdout, proc.stderr)


# -- spec: only the controller -------------------------------------------------------------


def test_a_tenant_cannot_create_a_remediation(world: World) -> None:
    body = _forged(str(uuid.uuid4()))
    answer = world.tenant.request("POST", REMEDIATIONS, body)
    _refused(
        answer,
        403,
        f"only the unstick controller (system:serviceaccount:{SYSTEM_NS}:{CONTROLLER_SA})",
        "may create a Remediation",
        f"system:serviceaccount:{TENANT_NS}:tenant may not",
    )
    listed = world.cp.request("GET", REMEDIATIONS)["items"]
    assert body["metadata"]["name"] not in {r["metadata"]["name"] for r in listed}


def test_an_agent_cannot_create_a_remediation(world: World) -> None:
    answer = world.agent_a.request("POST", REMEDIATIONS, _forged(str(uuid.uuid4())))
    assert answer.status == 403, answer  # RBAC already: the agent may not create


def test_the_controller_creates_and_writes_its_requests(world: World) -> None:
    rem = world.remediation()
    answer = world.controller.patch(
        _path(rem),
        {"spec": {
            "probeRequestedAt": "2026-01-01T00:00:00.000000Z",
            "nodeSteps": [{"action": "unmount", "target": "/var/lib/kubelet/pods/x/volumes/v",
                           "reason": "orphaned"}],
            "nodeStepsRequestedAt": "2026-01-01T00:00:01.000000Z",
            "dryRun": False,
            "lazyUnmount": True,
        }},
    )  # fmt: skip
    assert answer.status == 200, answer
    spec = world.stored(rem)["spec"]
    assert spec["nodeSteps"][0]["action"] == "unmount"
    assert spec["dryRun"] is False and spec["lazyUnmount"] is True


@pytest.mark.parametrize(
    "change",
    [
        {"nodeSteps": [{"action": "restart-kubelet"}]},
        {"dryRun": False},
        {"probeRequestedAt": "2026-01-01T00:00:00Z"},
    ],
)
def test_a_tenant_cannot_change_the_spec(world: World, change: JSON) -> None:
    rem = world.remediation()
    answer = world.tenant.patch(_path(rem), {"spec": change})
    _refused(answer, 403, "may write the spec of a Remediation", f"{TENANT_NS}:tenant may not")
    assert world.stored(rem)["spec"] == rem["spec"]


def test_a_tenant_cannot_move_the_labels_the_agent_selects_by(world: World) -> None:
    rem = world.remediation()
    answer = world.tenant.patch(_path(rem), {"metadata": {"labels": {"unstick.dev/node": NODE_B}}})
    _refused(answer, 403, "may change the labels unstick.dev/node and unstick.dev/pod-uid")
    assert world.stored(rem)["metadata"]["labels"]["unstick.dev/node"] == NODE_A


def test_a_tenant_may_still_annotate_a_remediation(world: World) -> None:
    """The policy guards spec and unstick's labels, not every byte of the object."""
    rem = world.remediation()
    answer = world.tenant.patch(
        _path(rem), {"metadata": {"annotations": {"team.example/ticket": "OPS-1"}}}
    )
    assert answer.status == 200, answer


# -- records a tenant cannot decorate (issue 33 finding 7) ---------------------------------


@pytest.mark.parametrize(
    ("labels", "key"),
    [
        ({"pod.unstick.dev/db-0": "true"}, "pod.unstick.dev/db-0"),  # another pod's story
        ({"unstick.dev/incident": "x"}, "unstick.dev/incident"),  # a key unstick may read
    ],
)
def test_a_tenant_cannot_add_unsticks_labels(world: World, labels: JSON, key: str) -> None:
    rem = world.remediation()
    answer = world.tenant.patch(_path(rem), {"metadata": {"labels": labels}})
    _refused(answer, 403, f"may set, change or remove the label {key}", "of a Remediation")
    assert key not in world.stored(rem)["metadata"]["labels"]


def test_a_tenant_cannot_change_or_remove_a_pods_label(world: World) -> None:
    """`pod.unstick.dev/<pod>` finds a pod's story by its name: hiding it is refused too."""
    rem = world.remediation()
    label = "pod.unstick.dev/web-0"
    assert world.controller.patch(_path(rem), {"metadata": {"labels": {label: "t"}}}).status == 200
    for value in ("other", None):
        answer = world.tenant.patch(_path(rem), {"metadata": {"labels": {label: value}}})
        _refused(answer, 403, f"may set, change or remove the label {label}")
    assert world.stored(rem)["metadata"]["labels"][label] == "t"


def test_a_tenant_cannot_add_a_finalizer(world: World) -> None:
    """A finalizer nobody removes blocks the namespace's deletion and hides the record's end."""
    rem = world.remediation()
    try:
        answer = world.tenant.patch(
            _path(rem), {"metadata": {"finalizers": ["tenant.example/keep"]}}
        )
        _refused(answer, 403, "may add the finalizer tenant.example/keep to a Remediation")
        assert "finalizers" not in world.stored(rem)["metadata"]
    finally:  # the cluster admin (exempt) takes one that got through away again
        world.cp.kubectl(
            "patch", "remediation.unstick.dev", rem["metadata"]["name"], "-n", TENANT_NS,
            "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip


def test_a_tenant_may_still_label_a_remediation_with_its_own_keys(world: World) -> None:
    rem = world.remediation()
    labels = {"team.example/owner": "db", "unstick.dev.example/x": "y"}
    answer = world.tenant.patch(_path(rem), {"metadata": {"labels": labels}})
    assert answer.status == 200, answer


def test_the_controller_labels_and_the_agent_writes_status_as_before(world: World) -> None:
    rem = world.remediation()
    label = {"pod.unstick.dev/web-1": "t"}
    assert world.controller.patch(_path(rem), {"metadata": {"labels": label}}).status == 200
    probe = {**PROBE["probe"], "podUID": rem["spec"]["podUID"]}
    answer = world.agent_a.patch(_path(rem, "/status"), {"status": {"probe": probe}})
    assert answer.status == 200, answer


# -- identity: nobody ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("podUID", "0000-other-uid"), ("podName", "other-0"), ("nodeName", NODE_B)],
)
def test_nobody_changes_the_identity_not_even_the_controller(
    world: World, field: str, value: str
) -> None:
    rem = world.remediation()
    answer = world.controller.patch(_path(rem), {"spec": {field: value}})
    _refused(answer, 422, f"spec.{field}", f"spec.{field} is immutable")
    # Cluster admins (exempt from the admission policy) are bound by the CRD rule too.
    proc = world.cp.kubectl(
        "patch", "remediation.unstick.dev", rem["metadata"]["name"], "-n", TENANT_NS,
        "--type=merge", "-p", json.dumps({"spec": {field: value}}), check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and f"spec.{field} is immutable" in proc.stderr, proc.stderr
    assert world.stored(rem)["spec"][field] == rem["spec"][field]


def test_node_name_cannot_be_removed(world: World) -> None:
    rem = world.remediation()
    answer = world.controller.patch(_path(rem), {"spec": {"nodeName": None}})
    _refused(answer, 422, "spec.nodeName is immutable")
    assert world.stored(rem)["spec"]["nodeName"] == NODE_A


# -- status: the controller, and the agent of the Remediation's node -----------------------


PROBE: JSON = {
    "probe": {
        "podUID": "",
        "nodeName": NODE_A,
        "probedAt": "2026-01-01T00:00:02.000000Z",
        "kubeletRoot": "/var/lib/kubelet",
        "kubeletHealthy": True,
        "registeredPlugins": [],
        "mountinfo": "",
        "volumeDirs": [],
        "holders": [],
        "containers": [],
        "containersSource": "cri",
    }
}


def test_the_agent_of_the_node_writes_status(world: World) -> None:
    rem = world.remediation()
    probe = {**PROBE["probe"], "podUID": rem["spec"]["podUID"]}
    answer = world.agent_a.patch(_path(rem, "/status"), {"status": {"probe": probe}})
    assert answer.status == 200, answer
    assert world.stored(rem)["status"]["probe"]["podUID"] == rem["spec"]["podUID"]


def test_the_agent_of_another_node_cannot_write_status(world: World) -> None:
    rem = world.remediation(node=NODE_A)
    answer = world.agent_b.patch(_path(rem, "/status"), {"status": PROBE})
    _refused(
        answer,
        403,
        f"the unstick agent of node {NODE_B} may write the status of Remediations of its "
        f"own node only; this one is for node '{NODE_A}'",
    )
    assert "status" not in world.stored(rem)


def test_an_agent_token_bound_to_no_pod_cannot_write_status(world: World) -> None:
    rem = world.remediation()
    answer = world.agent_unbound.patch(_path(rem, "/status"), {"status": PROBE})
    _refused(answer, 403, "bound to its pod", "this token names no node")


def test_a_tenant_cannot_write_status(world: World) -> None:
    rem = world.remediation()
    answer = world.tenant.patch(_path(rem, "/status"), {"status": PROBE})
    _refused(
        answer,
        403,
        "only the unstick controller",
        "and the unstick agent of the Remediation's node",
        f"{TENANT_NS}:tenant may not",
    )
    assert "status" not in world.stored(rem)


def test_the_controller_writes_status_and_records_a_refusal(world: World) -> None:
    rem = world.remediation()
    answer = world.controller.patch(
        _path(rem, "/status"),
        {"status": {
            "phase": "Refused",
            "refusal": "spec.podUID names no pod of this node",
            "refusals": [{"action": "force-delete", "reason": "probe of another UID",
                          "time": "2026-01-01T00:00:03Z", "by": "controller"}],
        }},
    )  # fmt: skip
    assert answer.status == 200, answer
    status = world.stored(rem)["status"]
    assert status["phase"] == "Refused"
    assert status["refusals"][0]["reason"] == "probe of another UID"


# -- status schema: bounded ----------------------------------------------------------------


def test_a_huge_forged_probe_is_rejected_by_the_schema(world: World) -> None:
    """Even from the node's own agent: 1.5 MB of mountinfo is never stored."""
    rem = world.remediation()
    huge = {**PROBE["probe"], "mountinfo": "x" * 1_500_000}
    answer = world.agent_a.patch(_path(rem, "/status"), {"status": {"probe": huge}})
    _refused(answer, 422, "status.probe.mountinfo", "Too long")
    assert "status" not in world.stored(rem)


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"phase": "Pwned"}, "status.phase"),
        ({"cause": "Whatever"}, "status.cause"),
        ({"evidence": [{"kind": "x", "message": "m"}] * 300}, "status.evidence"),
        ({"probe": {"holders": [{"pid": 1}] * 2000}}, "status.probe.holders"),
    ],
)
def test_status_fields_are_typed_and_bounded(world: World, status: JSON, field: str) -> None:
    rem = world.remediation()
    answer = world.controller.patch(_path(rem, "/status"), {"status": status})
    _refused(answer, 422, field)
