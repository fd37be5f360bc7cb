"""Which namespaces may use a RemediationPolicy (design.md §4 `namespaceSelector`), and the
controller's refusal of a pod annotation naming a policy that does not serve its namespace."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unstick.core.policy.remediation_policy import LabelSelector, PolicyError, parse_policy


def _policy(name: str, selector: Any = None, **spec: Any) -> Any:
    if selector is not None:
        spec["namespaceSelector"] = selector
    return parse_policy({"metadata": {"name": name}, "spec": spec})


def test_default_serves_every_namespace() -> None:
    assert _policy("default").serves("team-a", {})
    assert _policy("default", {"matchLabels": {"x": "y"}}).serves("team-a", {})


def test_a_named_policy_without_selector_serves_no_namespace() -> None:
    fast = _policy("fast", dryRun=False, actions=["force-delete"])
    assert fast.namespace_selector is None
    assert not fast.serves("team-a", {"unstick.dev/remediate": "true"})


def test_empty_selector_serves_all() -> None:
    assert _policy("fast", {}).namespace_selector == LabelSelector()
    assert _policy("fast", {}).serves("anything", {})


def test_match_labels_and_expressions() -> None:
    fast = _policy(
        "fast",
        {
            "matchLabels": {"tier": "batch"},
            "matchExpressions": [
                {"key": "env", "operator": "In", "values": ["dev", "test"]},
                {"key": "frozen", "operator": "DoesNotExist"},
                {"key": "owner", "operator": "NotIn", "values": ["payments"]},
                {"key": "team", "operator": "Exists"},
            ],
        },
    )
    ok = {"tier": "batch", "env": "dev", "team": "a"}
    assert fast.serves("ns", ok)
    assert not fast.serves("ns", {**ok, "tier": "web"})
    assert not fast.serves("ns", {**ok, "env": "prod"})
    assert not fast.serves("ns", {**ok, "frozen": ""})
    assert not fast.serves("ns", {**ok, "owner": "payments"})
    assert fast.serves("ns", {**ok, "owner": "search"})
    assert not fast.serves("ns", {k: v for k, v in ok.items() if k != "team"})


def test_namespace_name_label_is_always_known() -> None:
    by_name = _policy(
        "fast",
        {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-b"]}
            ]
        },
    )
    assert by_name.serves("team-b", {})
    assert not by_name.serves("team-a", {"kubernetes.io/metadata.name": "team-b"})


@pytest.mark.parametrize(
    ("selector", "field"),
    [
        ("all", "spec.namespaceSelector"),
        ({"matchLabel": {}}, "spec.namespaceSelector.matchLabel"),
        ({"matchLabels": {"a": 1}}, "spec.namespaceSelector.matchLabels.a"),
        ({"matchExpressions": {}}, "spec.namespaceSelector.matchExpressions"),
        (
            {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]},
            "spec.namespaceSelector.matchExpressions[0].operator",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists"}, {"operator": "Exists"}]},
            "spec.namespaceSelector.matchExpressions[1].key",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "In"}]},
            "spec.namespaceSelector.matchExpressions[0].values",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
            "spec.namespaceSelector.matchExpressions[0].values",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": [3]}]},
            "spec.namespaceSelector.matchExpressions[0].values[0]",
        ),
    ],
)
def test_bad_selector_names_the_field(selector: Any, field: str) -> None:
    with pytest.raises(PolicyError) as err:
        _policy("fast", selector)
    assert err.value.field == field, str(err.value)


labels = st.dictionaries(st.sampled_from("abcd"), st.sampled_from(["1", "2", "3"]), max_size=4)


@given(wanted=labels, have=labels)
def test_match_labels_is_a_subset_test(wanted: dict[str, str], have: dict[str, str]) -> None:
    fast = _policy("fast", {"matchLabels": wanted})
    assert fast.serves("ns", have) == (wanted.items() <= have.items())


# -- the controller's decision -------------------------------------------------------


def _detector(namespace_labels: dict[str, str]) -> Any:
    from tests.support.detectors import node_gone_detector

    spec = {"dryRun": False, "actions": ["force-delete"], "nodeLostAfterSeconds": 1}
    batch = {**spec, "namespaceSelector": {"matchLabels": {"tier": "batch"}}}
    # `fast` has no namespaceSelector: it serves none
    return node_gone_detector({"default": spec, "fast": spec, "batch": batch}, namespace_labels)


def _refusals() -> float:
    from unstick.controller import metrics

    return metrics.REFUSALS.labels("policy_forbids")._value.get()


def test_pod_naming_a_policy_that_does_not_serve_its_namespace_is_observed_only() -> None:
    from tests.support import bundles

    detector = _detector({"tier": "web"})
    now = 1795168800.0  # 10:00, deleted at 09:45
    before = _refusals()
    for _ in range(3):  # one pod, three passes: counted once
        d = detector.decide(bundles.pod(namespace="team-a", opt_in="fast"), None, now, None)
        assert str(d.diagnosis.cause) == "NodeGone"
        assert not d.opted_in and [str(s.action) for s in d.steps] == ["observe"]
        assert "policy 'fast' does not serve namespace 'team-a'" in d.why
    assert _refusals() == before + 1
    d = detector.decide(bundles.pod(namespace="team-a", opt_in="batch"), None, now, None)
    assert not d.opted_in and "its namespaceSelector does not match" in d.why
    # `default` serves every namespace, by annotation "true" or by its name.
    for value in ("true", "default"):
        d = detector.decide(bundles.pod(namespace="team-a", opt_in=value), None, now, None)
        assert d.opted_in and [str(s.action) for s in d.steps] == ["force-delete"]


def test_pod_naming_a_policy_that_serves_its_namespace_uses_it() -> None:
    from tests.support import bundles

    detector = _detector({"tier": "batch"})
    d = detector.decide(bundles.pod(namespace="team-b", opt_in="batch"), None, 1795168800.0, None)
    assert d.opted_in and d.policy.name == "batch"
    assert [str(s.action) for s in d.steps] == ["force-delete"]
