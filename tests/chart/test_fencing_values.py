"""The chart's fencing values (docs/fencing.md): `policy.fencingEvidence` and
`policy.fenceAgentsRemediationNamespaces` reach the policy as unstick reads it; the
controller may get/list SelfNodeRemediations cluster-wide and FenceAgentsRemediations only
in the namespaces named (a Role each), nothing more."""

from __future__ import annotations

import json

from unstick.core.policy.remediation_policy import parse_policy
from unstick.core.rules.fencing import FencingSource

from .render import by_kind, one, refused, rule_allows, template

FAR_GROUP, FAR = "fence-agents-remediation.medik8s.io", "fenceagentsremediations"
SNR_GROUP, SNR = "self-node-remediation.medik8s.io", "selfnoderemediations"


def _cluster_rules(objects: list[dict]) -> list[dict]:
    role = [
        r for r in by_kind(objects, "ClusterRole") if r["metadata"]["name"].endswith("controller")
    ]
    return role[0]["rules"]


def _fencing_roles(objects: list[dict]) -> list[dict]:
    return [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("-fencing")]


def test_by_default_only_the_out_of_service_taint_and_no_far_is_readable(helm: str) -> None:
    objects = template(helm)
    policy = parse_policy(one(objects, "RemediationPolicy", "default"))
    assert policy.fencing.sources == {FencingSource.OUT_OF_SERVICE_TAINT}
    assert policy.fencing.far_namespaces == ()
    assert _fencing_roles(objects) == []
    rules = _cluster_rules(objects)
    assert not rule_allows(rules, FAR_GROUP, FAR, "get")
    for verb in ("get", "list"):
        assert rule_allows(rules, SNR_GROUP, SNR, verb)
    assert not rule_allows(rules, SNR_GROUP, SNR, "watch")


def test_the_sources_reach_the_policy_and_fars_are_readable_exactly_where_named(
    helm: str,
) -> None:
    objects = template(
        helm,
        "--set-json",
        'policy.fencingEvidence=["cloudShutdown","fenceAgentsRemediation"]',
        "--set-json",
        'policy.fenceAgentsRemediationNamespaces=["medik8s","ops"]',
    )
    policy = parse_policy(one(objects, "RemediationPolicy", "default"))
    assert policy.fencing.sources == {
        FencingSource.CLOUD_SHUTDOWN,
        FencingSource.FENCE_AGENTS_REMEDIATION,
    }
    assert policy.fencing.far_namespaces == ("medik8s", "ops")
    roles = {(r["metadata"]["namespace"], json.dumps(r["rules"])) for r in _fencing_roles(objects)}
    rule = json.dumps([{"apiGroups": [FAR_GROUP], "resources": [FAR], "verbs": ["get", "list"]}])
    assert roles == {("medik8s", rule), ("ops", rule)}
    bindings = [
        b for b in by_kind(objects, "RoleBinding") if b["metadata"]["name"].endswith("-fencing")
    ]
    assert {b["metadata"]["namespace"] for b in bindings} == {"medik8s", "ops"}
    assert {s["name"] for b in bindings for s in b["subjects"]} == {"unstick-controller"}


def test_an_unknown_source_is_refused_by_the_schema(helm: str) -> None:
    message = refused(helm, "--set-json", 'policy.fencingEvidence=["heartbeat"]')
    assert "/policy/fencingEvidence/0" in message, message
