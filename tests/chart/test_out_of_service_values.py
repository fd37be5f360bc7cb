"""The chart's values of the out-of-service taint (docs/fencing.md): `maxFencedNodes`,
`maxNotReadyPercent` and `fencedTaintMaxSeconds` reach the policy as unstick reads it; the
chart's default policy does not list taint-out-of-service / untaint-out-of-service, and the
controller may patch Nodes only when the policy lists one of them."""

from __future__ import annotations

from unstick.core.policy.out_of_service import OutOfServiceGuards
from unstick.core.policy.remediation_policy import parse_policy
from unstick.core.vocabulary import Action

from .render import by_kind, one, refused, rule_allows, template


def _controller_rules(objects: list[dict]) -> list[dict]:
    [role] = [
        r for r in by_kind(objects, "ClusterRole") if r["metadata"]["name"].endswith("controller")
    ]
    return role["rules"]


def test_by_default_no_taint_and_no_node_patch(helm: str) -> None:
    objects = template(helm)
    policy = parse_policy(one(objects, "RemediationPolicy", "default"))
    assert not policy.permits(Action.TAINT_OUT_OF_SERVICE)
    assert not policy.permits(Action.UNTAINT_OUT_OF_SERVICE)
    assert policy.out_of_service == OutOfServiceGuards(1, 49, 3600.0)
    rules = _controller_rules(objects)
    assert rule_allows(rules, "", "nodes", "get") and not rule_allows(rules, "", "nodes", "patch")
    assert rule_allows(rules, "storage.k8s.io", "volumeattachments", "list")


def test_listed_the_guards_reach_the_policy_and_nodes_may_be_patched(helm: str) -> None:
    objects = template(
        helm,
        "--set-json",
        'policy.actions=["observe","taint-out-of-service","untaint-out-of-service"]',
        "--set",
        "policy.maxFencedNodes=2,policy.maxNotReadyPercent=30,policy.fencedTaintMaxSeconds=600",
    )
    policy = parse_policy(one(objects, "RemediationPolicy", "default"))
    assert policy.permits(Action.TAINT_OUT_OF_SERVICE)
    assert policy.out_of_service == OutOfServiceGuards(2, 30, 600.0)
    rules = _controller_rules(objects)
    assert rule_allows(rules, "", "nodes", "patch")
    for verb in ("update", "delete", "create"):
        assert not rule_allows(rules, "", "nodes", verb)


def test_a_share_above_100_is_refused_by_the_schema(helm: str) -> None:
    message = refused(helm, "--set", "policy.maxNotReadyPercent=101")
    assert "/policy/maxNotReadyPercent" in message, message
