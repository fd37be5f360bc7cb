"""The agent's "admission policy in force" check (`agent/authority/admission.py`) against
narrowed policies and bindings on the real API server, with the chart's ServiceAccounts,
RBAC, ValidatingAdmissionPolicy and binding applied as `helm template` renders them.

Each variant below narrows the chart's policy or binding so that it no longer guards a
tenant's write of a Remediation: the test first shows that on the API server (the tenant's
forged Remediation is admitted), then reads the pair with the agent's own token, as the
agent does, and the check must not accept it as the policy in force. The chart's own pair
is in force (and refuses the tenant)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.chart.render import CHART, release_objects
from tests.support.integrity import JSON, TokenClient, apply_objects, delete_objects, token_for
from unstick.agent.authority.admission import judge

pytestmark = pytest.mark.envtest

RELEASE = "narrow"
SYSTEM_NS = "unstick-narrow"
TENANT_NS = "narrow-tenant"
AGENT_SA = f"{RELEASE}-unstick-agent"
NAME = f"{RELEASE}-unstick-remediation-writers"
KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
VAP, VAPB = "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"
REMS = f"/apis/unstick.dev/v1alpha1/namespaces/{TENANT_NS}/remediations"


def _render() -> list[JSON]:
    return release_objects(
        RELEASE, SYSTEM_NS, KINDS | {VAP, VAPB},
        f"controller.peeringName={RELEASE}", f"policy.name={RELEASE}",
    )  # fmt: skip


def _tenant() -> list[JSON]:
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "tenant", "namespace": TENANT_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "remediation-editor", "namespace": TENANT_NS},
         "rules": [{"apiGroups": ["unstick.dev"], "resources": ["remediations"],
                    "verbs": ["create", "delete"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "remediation-editor", "namespace": TENANT_NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "remediation-editor"},
         "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": TENANT_NS}]},
    ]  # fmt: skip


def _forged_admitted(cp: ControlPlane, tenant: TokenClient) -> bool:
    """A tenant's Remediation (a request to the node agent the controller never made) is
    written; it is taken away again."""
    body = {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "Remediation",
        "metadata": {"generateName": "forged-"},
        "spec": {"podName": "p", "podUID": str(uuid.uuid4()), "nodeName": "narrow-node"},
    }
    answer = tenant.request("POST", REMS, body)
    if answer.status == 201:
        cp.request("DELETE", f"{REMS}/{answer.body['metadata']['name']}")
        return True
    assert answer.status == 403, answer
    return False


def _agent_get(agent: TokenClient) -> Callable[[str], JSON | None]:
    def get(path: str) -> JSON | None:
        answer = agent.request("GET", path)
        if answer.status == 404:
            return None
        assert answer.status == 200, answer
        return answer.body

    return get


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    cp = control_plane
    cp.install_crds(CHART / "crds")
    chart = _render()
    namespaces = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
        for n in (SYSTEM_NS, TENANT_NS)
    ]
    mine = namespaces + chart + _tenant()
    try:
        apply_objects(cp, mine)
        tenant = token_for(cp, TENANT_NS, "tenant")
        wait_until(lambda: not _forged_admitted(cp, tenant), timeout=60, what="the chart's policy")
        yield {
            "cp": cp,
            "tenant": tenant,
            "get": _agent_get(token_for(cp, SYSTEM_NS, AGENT_SA)),
            "policy": next(o for o in chart if o["kind"] == VAP),
            "binding": next(o for o in chart if o["kind"] == VAPB),
        }
    finally:
        cp.kubectl("delete", "remediations", "--all", "-n", TENANT_NS, check=False)
        delete_objects(cp, mine)


def test_the_charts_policy_is_in_force(world: dict[str, Any]) -> None:
    assert judge(NAME, world["get"]) is None
    assert not _forged_admitted(world["cp"], world["tenant"])


def _rules(spec: JSON) -> list[JSON]:
    return spec["matchConstraints"]["resourceRules"]  # type: ignore[no-any-return]


NEVER = {"matchLabels": {"unstick.test/never": "true"}}
EVERYONE = (
    "!has(request.userInfo.groups) || "
    "!request.userInfo.groups.exists(g, g in ['system:masters', 'system:authenticated'])"
)

NARROWED: list[tuple[str, str, Callable[[JSON], Any], str]] = [
    ("binding resourceRules: DELETE only", VAPB,
     lambda s: s.update(matchResources={"resourceRules": [
         {"apiGroups": ["unstick.dev"], "apiVersions": ["*"], "operations": ["DELETE"],
          "resources": ["remediations", "remediations/status"]}]}),
     "matchResources.resourceRules"),
    ("policy namespaceSelector", VAP,
     lambda s: s["matchConstraints"].update(namespaceSelector=NEVER),
     "matchConstraints.namespaceSelector"),
    ("policy objectSelector", VAP,
     lambda s: s["matchConstraints"].update(objectSelector=NEVER),
     "matchConstraints.objectSelector"),
    ("policy excludeResourceRules", VAP,
     lambda s: s["matchConstraints"].update(excludeResourceRules=[
         {"apiGroups": ["unstick.dev"], "apiVersions": ["*"], "operations": ["*"],
          "resources": ["remediations"]}]),
     "matchConstraints.excludeResourceRules"),
    ("policy apiVersions", VAP, lambda s: _rules(s)[0].update(apiVersions=["v1"]), "apiVersions"),
    ("policy resourceNames", VAP,
     lambda s: _rules(s)[0].update(resourceNames=["nothing"]), "resourceNames"),
    ("policy scope", VAP, lambda s: _rules(s)[0].update(scope="Cluster"), "scope"),
    ("policy matchConditions: one more", VAP,
     lambda s: s["matchConditions"].append({"name": "never", "expression": "false"}),
     "matchConditions"),
    ("policy matchConditions: every user exempt", VAP,
     lambda s: s["matchConditions"][1].update(expression=EVERYONE),
     "matchConditions"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "change", "words"), [n[1:] for n in NARROWED], ids=[n[0] for n in NARROWED]
)
def test_a_narrowed_policy_is_not_in_force(
    world: dict[str, Any], kind: str, change: Callable[[JSON], Any], words: str
) -> None:
    cp, tenant = world["cp"], world["tenant"]
    original = world["policy" if kind == VAP else "binding"]
    narrowed = copy.deepcopy(original)
    change(narrowed["spec"])
    try:
        apply_objects(cp, [narrowed])
        # the API server guards nothing of this write any more
        wait_until(lambda: _forged_admitted(cp, tenant), timeout=60, what="the narrowing")
        problem = judge(NAME, world["get"])
        assert problem is not None and words in problem, problem
    finally:
        apply_objects(cp, [original])
        wait_until(lambda: not _forged_admitted(cp, tenant), timeout=60, what="the policy back")
