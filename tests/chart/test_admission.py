"""The chart's ValidatingAdmissionPolicy (who may write a Remediation, docs/admission.md)
and the agent's metrics address, as rendered. What the API server does with the policy is
tests/envtest/test_remediation_integrity.py."""

from __future__ import annotations

from typing import Any

import pytest

from .render import by_kind, one, template

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
    assert rule["operations"] == ["CREATE", "UPDATE"]
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


def test_binding_follows_the_controller_namespace_scope(helm: str) -> None:
    objects = template(helm, "--set", "controller.namespaceScope={a,b}")
    binding = one(objects, "ValidatingAdmissionPolicyBinding", POLICY)["spec"]
    assert binding["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}
    ]


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
