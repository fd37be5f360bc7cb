"""The chart's ValidatingAdmissionPolicy (who may write a Remediation, docs/admission.md)
and the agent's metrics address, as rendered. What the API server does with the policy is
tests/envtest/test_remediation_integrity.py."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from .render import CHART, by_kind, one, refused, template

POLICY = "unstick-remediation-writers"
CONTROLLER = "system:serviceaccount:unstick:unstick-controller"
AGENT = "system:serviceaccount:unstick:unstick-agent"


@pytest.fixture(scope="module")
def defaults(helm: str) -> list[dict[str, Any]]:
    return template(helm)


def _policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "ValidatingAdmissionPolicy", POLICY)["spec"]  # type: ignore[no-any-return]


def test_policy_guards_creates_and_updates_of_remediations_and_status(
    defaults: list[dict[str, Any]],
) -> None:
    spec = _policy(defaults)
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["unstick.dev"]
    assert rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
    assert rule["resources"] == ["remediations", "remediations/status"]
    binding = one(defaults, "ValidatingAdmissionPolicyBinding", POLICY)["spec"]
    assert binding["policyName"] == POLICY
    assert binding["validationActions"] == ["Deny"]
    assert "matchResources" not in binding  # every namespace


def test_policy_names_this_release_service_accounts(defaults: list[dict[str, Any]]) -> None:
    spec = _policy(defaults)
    conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    assert conditions["not-the-controller"] == f"request.userInfo.username != '{CONTROLLER}'"
    assert "['system:masters']" in conditions["not-exempt"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["controller"] == f"'{CONTROLLER}'"
    assert variables["agent"] == f"'{AGENT}'"
    assert "authentication.kubernetes.io/node-name" in variables["tokenNode"]


def test_policy_follows_renamed_service_accounts(helm: str) -> None:
    objects = template(
        helm,
        "--set", "controller.serviceAccount.create=false",
        "--set", "controller.serviceAccount.name=ctl",
        "--set", "agent.serviceAccount.name=ag",
    )  # fmt: skip
    variables = {v["name"]: v["expression"] for v in _policy(objects)["variables"]}
    assert variables["controller"] == "'system:serviceaccount:unstick:ctl'"
    assert variables["agent"] == "'system:serviceaccount:unstick:ag'"


def test_every_validation_says_who_may(defaults: list[dict[str, Any]]) -> None:
    for v in _policy(defaults)["validations"]:
        assert v["reason"] == "Forbidden"
        assert "only the unstick controller" in v["message"]
        assert "docs/admission.md" in v["message"]
        assert "variables.controller" in v["messageExpression"]


def test_policy_can_be_left_out(helm: str) -> None:
    objects = template(helm, "--set", "admission.enabled=false")
    assert not by_kind(objects, "ValidatingAdmissionPolicy")
    assert not by_kind(objects, "ValidatingAdmissionPolicyBinding")


def test_nobody_exempt_when_asked(helm: str) -> None:
    spec = _policy(template(helm, "--set", "admission.exemptGroups=null"))
    assert [c["name"] for c in spec["matchConditions"]] == ["not-the-controller"]


def test_binding_covers_every_namespace_whatever_the_scope(helm: str) -> None:
    """#22 finding 1: the agent listens in every namespace, so the policy is bound in every
    namespace too; the agent learns the scope and refuses requests outside it."""
    objects = template(helm, "--set", "controller.namespaceScope={a,b}")
    binding = one(objects, "ValidatingAdmissionPolicyBinding", POLICY)["spec"]
    assert "matchResources" not in binding
    args, _ = _agent(objects)
    assert [a for a in args if a.startswith("--namespace-scope")] == [
        "--namespace-scope=a",
        "--namespace-scope=b",
    ]
    assert not any(a.startswith("--namespace-scope") for a in _agent(template(helm))[0])


def test_the_agent_checks_the_policy_is_in_force(defaults: list[dict[str, Any]], helm: str) -> None:
    """The agent is told the policy's name and may read it and its binding, nothing else."""
    args, _ = _agent(defaults)
    assert f"--admission-policy={POLICY}" in args
    rules = one(defaults, "ClusterRole", "unstick-agent")["rules"]
    (rule,) = [r for r in rules if r["apiGroups"] == ["admissionregistration.k8s.io"]]
    assert rule == {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
        "resourceNames": [POLICY],
        "verbs": ["get"],
    }
    off = template(helm, "--set", "admission.enabled=false")
    assert not any(a.startswith("--admission-policy") for a in _agent(off)[0])
    off_rules = one(off, "ClusterRole", "unstick-agent")["rules"]
    assert not [r for r in off_rules if r["apiGroups"] == ["admissionregistration.k8s.io"]]


def test_agent_may_change_only_its_own_status_keys(defaults: list[dict[str, Any]]) -> None:
    """#22 finding 6: every status key of the CRD that the agent does not write is named in
    the policy's check, so a key the controller adds later is the controller's by default."""
    crd = yaml.safe_load((CHART / "crds" / "remediations.yaml").read_text())
    keys = set(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"][
            "properties"
        ]
    )
    agent_keys = {"nodeActions", "nodePlan", "nodeRefusals", "nodeStepsDoneAt", "probe"}
    assert agent_keys < keys
    variables = {v["name"]: v["expression"] for v in _policy(defaults)["variables"]}
    checked = variables["controllerKeysChanged"]
    for key in keys - agent_keys:
        assert f"object.status.{key} == oldObject.status.{key}" in checked, key
    for key in agent_keys:
        assert f"status.{key}" not in checked, key


def test_deletes_are_for_nobody_but_the_exempt_and_a_dying_namespace(
    defaults: list[dict[str, Any]],
) -> None:
    """#22 finding 5."""
    spec = _policy(defaults)
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "namespaceObject.metadata.deletionTimestamp" in variables["namespaceDeleting"]
    (first, *_) = spec["validations"]
    assert first["expression"] == "!variables.deleting || variables.namespaceDeleting"
    assert "may delete a Remediation" in first["messageExpression"]


# -- the controller kept off the agents' nodes (#22 finding 6) ------------------------------


def _affinity(objects: list[dict[str, Any]], kind: str, name: str) -> Any:
    return one(objects, kind, name)["spec"]["template"]["spec"].get("affinity")


def test_controller_and_agents_share_nodes_unless_asked(defaults: list[dict[str, Any]]) -> None:
    # the controller's own affinity is only its replicas' anti-affinity (#31)
    assert set(_affinity(defaults, "Deployment", "unstick-controller")) == {"podAntiAffinity"}
    assert _affinity(defaults, "DaemonSet", "unstick-agent") is None


def test_separate_from_agents_puts_them_on_disjoint_nodes(helm: str) -> None:
    objects = template(
        helm,
        "--set", "controller.separateFromAgents.enabled=true",
        "--set", "controller.separateFromAgents.nodeLabel=example.com/unstick-controller",
    )  # fmt: skip

    def term(kind: str, name: str) -> Any:
        node = _affinity(objects, kind, name)["nodeAffinity"]
        (t,) = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        return t["matchExpressions"]

    key = "example.com/unstick-controller"
    assert term("Deployment", "unstick-controller") == [{"key": key, "operator": "Exists"}]
    assert term("DaemonSet", "unstick-agent") == [{"key": key, "operator": "DoesNotExist"}]


def test_separate_from_agents_keeps_other_affinity_and_refuses_a_node_affinity(
    helm: str,
) -> None:
    anti = "controller.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    objects = template(
        helm,
        "--set", "controller.separateFromAgents.enabled=true",
        "--set", f"{anti}[0].weight=1",
        "--set", f"{anti}[0].podAffinityTerm.topologyKey=kubernetes.io/hostname",
    )  # fmt: skip
    affinity = _affinity(objects, "Deployment", "unstick-controller")
    assert set(affinity) == {"nodeAffinity", "podAntiAffinity"}
    message = refused(
        helm,
        "--set", "controller.separateFromAgents.enabled=true",
        "--set", "agent.affinity.nodeAffinity.x=1",
    )  # fmt: skip
    assert "agent.affinity.nodeAffinity cannot be combined" in message


# -- the agent's metrics address ------------------------------------------------------------


def _agent(objects: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    (c,) = one(objects, "DaemonSet", "unstick-agent")["spec"]["template"]["spec"]["containers"]
    return c["args"], {e["name"]: e for e in c["env"]}


def test_agent_metrics_listen_on_the_node_ip_by_default(defaults: list[dict[str, Any]]) -> None:
    args, env = _agent(defaults)
    assert "--metrics-address=$(NODE_IP)" in args
    assert env["NODE_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert not any(a.startswith("--metrics-address=0.0.0.0") for a in args)


def test_agent_metrics_address_from_values(helm: str) -> None:
    args, env = _agent(template(helm, "--set", "agent.metrics.bindAddress=10.1.2.3"))
    assert [a for a in args if a.startswith("--metrics-address")] == ["--metrics-address=10.1.2.3"]
    assert "NODE_IP" not in env


def test_agent_metrics_on_the_pod_network_without_host_network(helm: str) -> None:
    args, env = _agent(template(helm, "--set", "agent.hostNetwork=false"))
    assert "--metrics-address=0.0.0.0" in args  # the pod's own network namespace
    assert "NODE_IP" not in env


@pytest.mark.parametrize(
    "args",
    [(), ("--set", "agent.metrics.bindAddress=10.1.2.3"), ("--set", "agent.hostNetwork=false")],
)
def test_agent_args_are_what_unstick_agent_accepts(helm: str, args: tuple[str, ...]) -> None:
    """The rendered command line parses with `unstick agent`'s own parser (env vars as the
    kubelet would expand them), so a flag the agent does not know cannot ship."""
    from unstick.cli import build_parser

    argv, _ = _agent(template(helm, *args))
    expanded = [a.replace("$(NODE_NAME)", "node-1").replace("$(NODE_IP)", "10.0.0.7") for a in argv]
    parsed = build_parser().parse_args(expanded)
    assert parsed.metrics_address in ("10.0.0.7", "10.1.2.3", "0.0.0.0")
