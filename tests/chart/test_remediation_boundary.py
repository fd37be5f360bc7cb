"""The trust boundary around Remediations, round 3 (#22 findings 1, 5 and 6), on the real API
server with the chart's ServiceAccounts, RBAC and admission policy applied exactly as
`helm template` renders them — here with `controller.namespaceScope` set.

- Finding 1, the forged `rmdir-stale` attack: a tenant outside the controller's scope, with
  RBAC to create remediations in its namespace, an opted-in pod of its own held by its own
  finalizer and deleted, creates Remediations labelled with the node, carrying `nodeSteps`
  and a fresh request time. The API server refuses every one (the policy is bound in every
  namespace, whatever the scope). A Remediation outside the scope that does get written (by
  an exempt cluster admin, or with the policy off) is refused on record by the agent, which
  knows the controller's scope, and nothing runs: the stale directory stays.
- Finding 5: nobody but the exempt groups deletes a Remediation, except in a namespace that
  is being deleted; nobody but the controller gives it an owner.
- Finding 6: the agent of the node writes only its own status keys, never `actions`,
  `pods`, `phase`...; its RBAC has no pod watch, no Nodes, and Events only in `default`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.chart.render import CHART, release_objects
from tests.support.agent import agent_running, node_under, watching
from tests.support.integrity import (
    JSON,
    Answer,
    TokenClient,
    applied,
    apply_objects,
    tenant_refused,
    token_for,
)
from tests.support.remediations import remediation

pytestmark = pytest.mark.envtest

RELEASE = "boundary"
SYSTEM_NS = "unstick-boundary"
SCOPED_NS = "boundary-scoped"  # the controller's namespaceScope
TENANT_NS = "boundary-tenant"  # outside it
NODE_A, NODE_B = "boundary-node-a", "boundary-node-b"
CONTROLLER_SA, AGENT_SA = f"{RELEASE}-unstick-controller", f"{RELEASE}-unstick-agent"
POLICY = "boundary-clean"  # a RemediationPolicy that would run rmdir-stale for the tenant
HOLD = "tenant.example/hold"
TENANT_ROLE = "boundary-tenant-editor"
ADMISSION = f"{RELEASE}-unstick-remediation-writers"  # the policy and its binding
KINDS = (
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)


def rems(ns: str) -> str:
    return f"/apis/unstick.dev/v1alpha1/namespaces/{ns}/remediations"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def render_chart() -> list[JSON]:
    return release_objects(
        RELEASE, SYSTEM_NS, KINDS, f"controller.peeringName={RELEASE}",
        f"policy.name={RELEASE}", f"controller.namespaceScope={{{SCOPED_NS}}}",
    )  # fmt: skip


def _tenant_rbac() -> list[JSON]:
    """The tenant may do anything to remediations and pods in its namespace and in the
    scoped one, as far as RBAC goes (delete included)."""
    rules = [
        {"apiGroups": ["unstick.dev"], "resources": ["remediations", "remediations/status"],
         "verbs": ["get", "list", "create", "update", "patch", "delete", "deletecollection"]},
        {"apiGroups": [""], "resources": ["pods"],
         "verbs": ["get", "create", "delete", "patch"]},
    ]  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "tenant", "namespace": TENANT_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": TENANT_ROLE}, "rules": rules},
    ] + [_tenant_binding(ns) for ns in (TENANT_NS, SCOPED_NS)]  # fmt: skip


def _tenant_binding(ns: str) -> JSON:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "tenant-editor", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": TENANT_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": TENANT_NS}],
    }  # fmt: skip


def _policy() -> JSON:
    return {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "dryRun": False,
            "actions": ["observe", "rmdir-stale"],
            "rateLimits": {"clusterPerMinute": 100, "nodePerMinute": 100},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": TENANT_NS}},
        },
    }


@dataclass
class World:
    cp: ControlPlane
    controller: TokenClient
    agent_a: TokenClient  # bound to an agent pod on NODE_A
    tenant: TokenClient
    pod: JSON  # the tenant's opted-in pod on NODE_A: held by its finalizer, deleted

    def remediation(self, client: TokenClient, ns: str, **spec: Any) -> Answer:
        uid = self.pod["metadata"]["uid"] if ns == TENANT_NS else str(uuid.uuid4())
        labels = {"unstick.dev/node": NODE_A, "unstick.dev/pod-uid": uid}
        meta = {"generateName": "web-0-", "labels": labels}
        return client.request(
            "POST", rems(ns), remediation("web-0", uid, NODE_A, metadata=meta, **spec)
        )

    def by_controller(self, ns: str = SCOPED_NS) -> JSON:
        answer = self.remediation(self.controller, ns)
        assert answer.status == 201, answer
        return answer.body


def _controller_writes(cp: ControlPlane, controller: TokenClient) -> bool:
    """Our policy is active (a tenant is refused) and no other release's is left over (our
    controller is not): policies take effect, and go, a moment after they are applied."""
    probe = remediation("p", str(uuid.uuid4()), NODE_B, name=f"probe-{uuid.uuid4().hex[:8]}")
    answer = controller.request("POST", rems(SCOPED_NS), probe)
    if answer.status == 201:
        cp.request("DELETE", f"{rems(SCOPED_NS)}/{probe['metadata']['name']}")
    return answer.status == 201


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane) -> Iterator[World]:
    cp = control_plane
    cp.install_crds(CHART / "crds")
    chart = render_chart()
    base: list[JSON] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
        for n in (SYSTEM_NS, SCOPED_NS, TENANT_NS, "default")
    ] + [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in (NODE_A, NODE_B)]
    agent_pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent-a", "namespace": SYSTEM_NS},
        "spec": {"nodeName": NODE_A, "serviceAccountName": AGENT_SA,
                 "containers": [{"name": "agent", "image": "unstick:test"}]},
    }  # fmt: skip
    tenant_pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": TENANT_NS, "finalizers": [HOLD],
                     "annotations": {"unstick.dev/remediate": POLICY}},
        "spec": {"nodeName": NODE_A, "containers": [{"name": "app", "image": "app:1"}]},
    }  # fmt: skip
    default = [o for o in base if o["metadata"]["name"] == "default"]  # not ours to delete
    ours = base + chart + _tenant_rbac() + [_policy()]
    with (
        applied(cp, ours, records_in=[SCOPED_NS, TENANT_NS], agents_in=SYSTEM_NS, keep=default),
        _finalizer_removed(cp, "web-0", TENANT_NS),
    ):
        agent = cp.request("POST", f"/api/v1/namespaces/{SYSTEM_NS}/pods", agent_pod)
        pod = cp.request("POST", f"/api/v1/namespaces/{TENANT_NS}/pods", tenant_pod)
        tenant = token_for(cp, TENANT_NS, "tenant")
        # the tenant deletes its own pod: its finalizer keeps it Terminating (and overdue)
        answer = tenant.request(
            "DELETE", f"/api/v1/namespaces/{TENANT_NS}/pods/web-0", {"gracePeriodSeconds": 0}
        )
        assert answer.status == 200, answer
        w = World(
            cp,
            controller=token_for(cp, SYSTEM_NS, CONTROLLER_SA),
            agent_a=token_for(cp, SYSTEM_NS, AGENT_SA, agent),
            tenant=tenant,
            pod=pod,
        )
        probe = remediation("p", str(uuid.uuid4()), NODE_B, metadata={"generateName": "probe-"})
        wait_until(
            lambda: tenant_refused(cp, tenant, rems(SCOPED_NS), probe),
            timeout=60,
            what="the admission policy",
        )
        wait_until(lambda: _controller_writes(cp, w.controller), timeout=60, what="no other")
        yield w


@contextmanager
def _finalizer_removed(cp: ControlPlane, pod: str, namespace: str) -> Iterator[None]:
    """At the end, the pod's finalizers removed (it goes, if it was deleted)."""
    try:
        yield
    finally:
        cp.kubectl("patch", "pod", pod, "-n", namespace, "--type=merge",
                   "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip


def _refused(answer: Answer, *words: str) -> None:
    assert answer.status == 403, answer
    for word in words:
        assert word in answer.message, answer.message


# -- finding 1: no side door outside the scope ---------------------------------------------


def test_forged_rmdir_stale_requests_outside_the_scope_are_refused_by_the_api_server(
    world: World,
) -> None:
    for _ in range(5):
        answer = world.remediation(
            world.tenant,
            TENANT_NS,
            nodeSteps=[{"action": "rmdir-stale", "target": ""}],
            nodeStepsRequestedAt=now(),
        )
        _refused(answer, "only the unstick controller", "may create a Remediation")
    assert world.cp.request("GET", rems(TENANT_NS))["items"] == []


def _agent_answer(world: World, tmp_path: Path, path: str, done: str, **settings: Any) -> JSON:
    """Run the agent of NODE_A (in this process, as the admin) until the Remediation at
    `path` has `status.<done>`; its status then."""
    with agent_running(
        node_under(tmp_path, NODE_A, **settings),
        watching(world.cp.kubeconfig, 0, summary_interval_s=3600),
    ):
        status: JSON = wait_until(
            lambda: (s := world.cp.request("GET", path).get("status") or {}).get(done) and s,
            timeout=60,
            what="the agent's answer",
        )
    return status


def test_the_agent_refuses_on_record_a_request_outside_the_scope(
    world: World, tmp_path: Path
) -> None:
    """The record exists anyway (written by an exempt cluster admin here): the agent, told
    the controller's scope, runs nothing for it and says why in the record."""
    uid = world.pod["metadata"]["uid"]
    stale = tmp_path / "kubelet" / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / "c"
    stale.mkdir(parents=True)
    body = remediation(
        "web-0", uid, NODE_A, metadata={"generateName": "web-0-"},
        nodeSteps=[{"action": "rmdir-stale", "target": ""}],
        nodeStepsRequestedAt=now(), probeRequestedAt=now(),
    )  # fmt: skip
    admin = world.cp.request("POST", rems(TENANT_NS), body)
    path = f"{rems(TENANT_NS)}/{admin['metadata']['name']}"
    try:
        status = _agent_answer(
            world, tmp_path, path, "nodeStepsDoneAt",
            namespace_scope=(SCOPED_NS,), admission_policy=ADMISSION,
        )  # fmt: skip
    finally:
        world.cp.request("DELETE", path)
    (action,) = status["nodeActions"]
    assert action["action"] == "rmdir-stale" and action["result"] == "refused"
    assert f"'{TENANT_NS}' is outside the controller's namespace scope" in action["message"]
    (probe,) = status["nodeRefusals"]
    assert probe["action"] == "probe" and probe["reason"] == "forged"
    assert "probe" not in status
    assert stale.is_dir()  # nothing ran


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        # in force: the request reaches the agent's own checks (its pod does not exist)
        (ADMISSION, "does not exist in this namespace"),
        # not in force (here: another name, as if the policy had been deleted)
        ("boundary-deleted", "ValidatingAdmissionPolicy 'boundary-deleted' does not exist: "
         "without it a request cannot be told from one the controller made"),
    ],
)  # fmt: skip
def test_the_agent_acts_only_while_the_admission_policy_is_in_force(
    world: World, tmp_path: Path, policy: str, words: str
) -> None:
    rem = world.by_controller()
    path = f"{rems(SCOPED_NS)}/{rem['metadata']['name']}"
    answer = world.controller.patch(path, {"spec": {"probeRequestedAt": now()}})
    assert answer.status == 200, answer
    status = _agent_answer(
        world, tmp_path, path, "nodeRefusals",
        namespace_scope=(SCOPED_NS,), admission_policy=policy,
    )  # fmt: skip
    (refusal,) = status["nodeRefusals"]
    assert words in refusal["message"], refusal
    assert "probe" not in status


# -- finding 5: records stay -----------------------------------------------------------------


def test_a_tenant_cannot_delete_a_remediation(world: World) -> None:
    rem = world.by_controller()
    name = rem["metadata"]["name"]
    answer = world.tenant.request("DELETE", f"{rems(SCOPED_NS)}/{name}")
    _refused(
        answer,
        "only the unstick controller",
        "and the exempt groups may delete a Remediation",
        f"system:serviceaccount:{TENANT_NS}:tenant may not",
    )
    answer = world.tenant.request("DELETE", rems(SCOPED_NS))  # deletecollection
    assert answer.status == 403, answer
    assert world.cp.request("GET", f"{rems(SCOPED_NS)}/{name}")["metadata"]["name"] == name
    # the agent has no RBAC for it in the first place
    assert world.agent_a.request("DELETE", f"{rems(SCOPED_NS)}/{name}").status == 403


def test_a_cluster_admin_may_delete_a_remediation(world: World) -> None:
    """Break-glass: the exempt group (system:masters) deletes records it no longer wants."""
    rem = world.by_controller()
    proc = world.cp.kubectl(
        "delete", "remediation.unstick.dev", rem["metadata"]["name"], "-n", SCOPED_NS
    )
    assert proc.returncode == 0, proc.stderr


def test_a_tenant_cannot_give_a_remediation_an_owner(world: World) -> None:
    rem = world.by_controller()
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "web-0",
             "uid": world.pod["metadata"]["uid"]}  # fmt: skip
    answer = world.tenant.patch(
        f"{rems(SCOPED_NS)}/{rem['metadata']['name']}",
        {"metadata": {"ownerReferences": [owner]}},
    )
    _refused(answer, "may change the owner references of a Remediation")


def test_records_go_with_their_namespace(world: World) -> None:
    """A namespace being deleted is emptied by the namespace controller (not running here:
    the namespace stays Terminating); the policy lets that delete through."""
    ns = f"boundary-gone-{uuid.uuid4().hex[:6]}"
    world.cp.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    answer = world.remediation(world.controller, ns)
    assert answer.status == 201, answer
    name = answer.body["metadata"]["name"]
    apply_objects(world.cp, [_tenant_binding(ns)])
    try:
        _refused(world.tenant.request("DELETE", f"{rems(ns)}/{name}"), "may delete")
        world.cp.request("DELETE", f"/api/v1/namespaces/{ns}")
        assert world.tenant.request("DELETE", f"{rems(ns)}/{name}").status == 200
    finally:
        world.cp.kubectl("delete", "remediations", "--all", "-n", ns, check=False)
        namespace = world.cp.request("GET", f"/api/v1/namespaces/{ns}")
        namespace["spec"]["finalizers"] = []
        world.cp.request("PUT", f"/api/v1/namespaces/{ns}/finalize", namespace)


# -- finding 6: the agent's reach ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "key"),
    [
        ({"actions": [{"action": "force-delete", "target": "x", "result": "succeeded",
                       "time": "2026-01-01T00:00:00Z", "by": "controller"}]}, "actions"),
        ({"pods": [{"name": "x", "uid": "u", "result": "succeeded"}]}, "pods"),
        ({"podCount": 3, "podsGone": 3}, "podCount"),
        ({"phase": "Resolved"}, "phase"),
        ({"refusals": []}, "refusals"),
    ],
)  # fmt: skip
def test_the_agent_cannot_write_the_controllers_status_keys(
    world: World, status: JSON, key: str
) -> None:
    rem = world.by_controller()
    path = f"{rems(SCOPED_NS)}/{rem['metadata']['name']}/status"
    answer = world.agent_a.patch(path, {"status": status})
    _refused(
        answer, f"may write status.{key}", "may write only nodeActions, nodePlan, nodeRefusals"
    )
    assert "status" not in world.cp.request("GET", path)


def test_the_agent_writes_its_own_status_keys(world: World) -> None:
    rem = world.by_controller()
    path = f"{rems(SCOPED_NS)}/{rem['metadata']['name']}/status"
    assert world.controller.patch(path, {"status": {"phase": "Remediating"}}).status == 200
    answer = world.agent_a.patch(
        path,
        {"status": {
            "nodeActions": [{"action": "rmdir-stale", "target": "", "result": "refused",
                             "message": "m", "time": "2026-01-01T00:00:00Z"}],
            "nodeStepsDoneAt": "2026-01-01T00:00:00Z",
            "nodeRefusals": [],
        }},
    )  # fmt: skip
    assert answer.status == 200, answer
    assert answer.body["status"]["phase"] == "Remediating"


@pytest.mark.parametrize(
    ("verb", "resource", "namespace", "allowed"),
    [
        ("watch", "pods", TENANT_NS, "no"),
        ("get", "nodes", "", "no"),
        ("create", "events", TENANT_NS, "no"),
        ("create", "events", "default", "yes"),
        ("get", "pods", TENANT_NS, "yes"),
        # what RBAC cannot narrow: the agent lists with spec.nodeName=<node> (docs/install.md)
        ("list", "pods", TENANT_NS, "yes"),
        # is the admission policy in force? (agent/authority/admission.py): that one, no other
        ("get", f"validatingadmissionpolicies.admissionregistration.k8s.io/{ADMISSION}", "", "yes"),
        ("get", "validatingadmissionpolicybindings.admissionregistration.k8s.io/x", "", "no"),
        ("list", "validatingadmissionpolicies.admissionregistration.k8s.io", "", "no"),
    ],
)
def test_the_agents_rbac(
    world: World, verb: str, resource: str, namespace: str, allowed: str
) -> None:
    proc = world.cp.kubectl(
        "auth", "can-i", verb, resource, *(["-n", namespace] if namespace else []),
        f"--as=system:serviceaccount:{SYSTEM_NS}:{AGENT_SA}", check=False,
    )  # fmt: skip
    assert proc.stdout.strip() == allowed, (verb, resource, namespace, proc.stdout, proc.stderr)


@pytest.mark.parametrize(
    ("verb", "subresource", "allowed"),
    [
        # the kubelet's /metrics, its own pod-worker counts (agent/probe/kubelet_metrics.py)
        ("get", "metrics", "yes"),
        # never the kubelet's proxy (exec, logs, every other kubelet API), nor its stats
        ("get", "proxy", "no"),
        ("create", "proxy", "no"),
        ("get", "stats", "no"),
        ("get", "log", "no"),
    ],
)
def test_the_agent_reads_its_kubelets_metrics_and_nothing_else_of_it(
    world: World, verb: str, subresource: str, allowed: str
) -> None:
    proc = world.cp.kubectl(
        "auth", "can-i", verb, "nodes", f"--subresource={subresource}",
        f"--as=system:serviceaccount:{SYSTEM_NS}:{AGENT_SA}", check=False,
    )  # fmt: skip
    assert proc.stdout.strip() == allowed, (verb, subresource, proc.stdout, proc.stderr)
