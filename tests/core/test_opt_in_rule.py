"""One opt-in rule (design.md §4, issue #22 finding 7): every caller that decides whether a pod
opted in — the core's `mandate` (the agent's `read_mandate` before every probe and node
step), the controller's `opt_in`, policy book and scheduler timing, and
`core.policy.mandate.opted_in` (`unstick diagnose`) — agrees with the rule as written in the docs,
for any annotation and any namespace label. An explicit pod "false" opts out even in a
labelled namespace."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from unstick.agent.authority.rederive import PolicySources, read_mandate
from unstick.controller.deciding.policies import PolicyBook, opt_in
from unstick.controller.runtime import _policy_name as timing_policy
from unstick.core.policy.mandate import PolicyLookup, mandate, opted_in, policy_name
from unstick.core.policy.remediation_policy import parse_policy
from unstick.core.vocabulary import Refusal

KEY = "unstick.dev/remediate"
NAMESPACE = "team-a"

VALUES = st.one_of(
    st.none(),
    st.sampled_from(["true", "false", "TRUE", "False", " true", "", "gold", "default", "yes"]),
    st.text(max_size=12),
)


def expected(annotation: str | None, label: str | None) -> str | None:
    """docs/diagnosis.md "Opt-in", written out independently of the code."""
    if annotation == "false":
        return None  # the pod's own explicit opt-out wins over its namespace's label
    if annotation == "true":
        return "default"
    if annotation:
        return annotation
    return "default" if label == "true" else None


def policy_object(name: str) -> dict[str, Any]:
    """A valid policy of that name serving every namespace."""
    return {"metadata": {"name": name}, "spec": {"namespaceSelector": {}, "actions": ["observe"]}}


def labels_of(label: str | None) -> dict[str, str]:
    return {} if label is None else {KEY: label}


@settings(max_examples=400, deadline=None)
@given(annotation=VALUES, label=VALUES)
def test_every_caller_agrees_with_the_rule(annotation: str | None, label: str | None) -> None:
    want = expected(annotation, label)
    labels = labels_of(label)
    annotations = {} if annotation is None else {KEY: annotation}
    asked = want or "default"

    # the core rule
    assert policy_name(annotation, labels) == want
    # the agent: the API's answers for the namespace and any policy name
    sources = PolicySources(
        namespace=lambda ns: {"metadata": {"name": ns, "labels": labels}},
        policy=policy_object,
    )
    agent = read_mandate(sources, NAMESPACE, {"metadata": {"annotations": annotations}})
    assert (agent.refusal is not Refusal.NOT_OPTED_IN) == (want is not None), agent
    if want is not None:
        assert agent.policy is not None and agent.policy.name == want, agent
    # the pure mandate with the lookup of the policy the pod asks for
    lookup = PolicyLookup(asked, parse_policy(policy_object(asked)))
    core = mandate(NAMESPACE, annotation, labels, lookup)
    assert bool(core) == (want is not None), core
    # the controller: opt-in, then its policy book
    choice = opt_in(annotation, labels)
    assert (choice.opted_in, choice.policy_name) == (want is not None, asked), choice
    book = PolicyBook()
    assert book.update(asked, policy_object(asked)) is None
    found, _ = book.lookup(choice.policy_name)
    assert found is not None and found.serves(NAMESPACE, labels)
    # the controller's scheduler: whose timing (slack) decides when the pod is due
    assert timing_policy(annotation) == asked
    # the safety predicate `unstick diagnose` uses, under the policy the pod asks for
    assert bool(opted_in(annotations, labels, asked)) == (want is not None)


def test_an_explicit_false_in_a_labelled_namespace_is_out_for_every_caller() -> None:
    labels = {KEY: "true"}
    assert policy_name("false", labels) is None
    assert not opt_in("false", labels).opted_in
    verdict = opted_in({KEY: "false"}, labels, "default")
    assert not verdict and "false" in verdict.reason, verdict
    refused = mandate(NAMESPACE, "false", labels, None)
    assert refused.refusal is Refusal.NOT_OPTED_IN


def test_a_pod_naming_another_policy_is_not_opted_into_this_one() -> None:
    assert not opted_in({KEY: "gold"}, None, "default")
    assert opted_in({KEY: "gold"}, None, "gold")
    assert opted_in({KEY: "true"}, None, "default")
    assert opted_in({}, {KEY: "true"}, "default")
    assert not opted_in({}, {KEY: "True"}, "default")
