"""The chart's RemediationPolicy values reach the policy as unstick reads it: the
orphaned-dir mode, and the namespaceSelector a policy not named default needs to serve any
namespace (DESIGN §4)."""

from __future__ import annotations

from unstick.core.policy.remediation_policy import parse_policy

from .render import one, template


def test_default_policy_serves_all_and_observes_orphaned_dirs(helm: str) -> None:
    obj = one(template(helm), "RemediationPolicy", "default")
    policy = parse_policy(obj)
    assert "namespaceSelector" not in obj["spec"]
    assert policy.serves("any-namespace", {})
    assert obj["spec"]["orphanedPodDirs"] == "observe"


def test_a_renamed_policy_serves_only_what_its_selector_selects(helm: str) -> None:
    objects = template(
        helm,
        "--set",
        "policy.name=strict",
        "--set",
        "policy.orphanedPodDirs=clean",
        "--set-json",
        'policy.namespaceSelector={"matchLabels":{"team":"a"}}',
    )
    obj = one(objects, "RemediationPolicy", "strict")
    policy = parse_policy(obj)
    assert policy.serves("shop", {"team": "a"})
    assert not policy.serves("other", {"team": "b"})
    assert obj["spec"]["orphanedPodDirs"] == "clean"


def test_a_renamed_policy_with_the_empty_selector_serves_all(helm: str) -> None:
    obj = one(template(helm, "--set", "policy.name=strict"), "RemediationPolicy", "strict")
    assert obj["spec"]["namespaceSelector"] == {}
    assert parse_policy(obj).serves("any", {})
