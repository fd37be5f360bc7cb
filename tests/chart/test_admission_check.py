"""The agent's check that the admission policy is in force (`agent/authority/admission.py`),
against the policy and binding exactly as the chart renders them, and against the ways they
can stop protecting every namespace the agent listens in."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from unstick.agent.authority.admission import API, RECHECK_S, AdmissionGate, admission_problem

from .render import one, template

NAME = "unstick-remediation-writers"


@pytest.fixture(scope="module")
def rendered(helm: str) -> dict[str, Any]:
    objects = template(helm)
    return {
        f"{API}/validatingadmissionpolicies/{NAME}": one(
            objects, "ValidatingAdmissionPolicy", NAME
        ),
        f"{API}/validatingadmissionpolicybindings/{NAME}": one(
            objects, "ValidatingAdmissionPolicyBinding", NAME
        ),
    }


def _problem(objects: dict[str, Any]) -> str | None:
    return admission_problem(NAME, objects.get)


def test_the_charts_policy_is_in_force(rendered: dict[str, Any]) -> None:
    assert _problem(rendered) is None


def test_also_with_a_namespace_scope(helm: str) -> None:
    objects = template(helm, "--set", "controller.namespaceScope={a}")
    binding = one(objects, "ValidatingAdmissionPolicyBinding", NAME)
    policy = one(objects, "ValidatingAdmissionPolicy", NAME)
    got = {
        f"{API}/validatingadmissionpolicies/{NAME}": policy,
        f"{API}/validatingadmissionpolicybindings/{NAME}": binding,
    }
    assert _problem(got) is None


def _changed(rendered: dict[str, Any], kind: str, change: Any) -> dict[str, Any]:
    objects = copy.deepcopy(rendered)
    key = f"{API}/{kind}/{NAME}"
    if change is None:
        del objects[key]
    else:
        change(objects[key]["spec"])
    return objects


@pytest.mark.parametrize(
    ("kind", "change", "words"),
    [
        ("validatingadmissionpolicies", None, "ValidatingAdmissionPolicy 'unstick-remediation-"
         "writers' does not exist"),
        ("validatingadmissionpolicybindings", None, "Binding 'unstick-remediation-writers' "
         "does not exist"),
        # the binding of the chart before #22 with controller.namespaceScope set
        ("validatingadmissionpolicybindings",
         lambda s: s.update(matchResources={"namespaceSelector": {"matchExpressions": [
             {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a"]}]}}),
         "narrowed by matchResources.namespaceSelector"),
        ("validatingadmissionpolicybindings",
         lambda s: s.update(validationActions=["Audit"]), "without Deny"),
        ("validatingadmissionpolicybindings",
         lambda s: s.update(policyName="other"), "binds policy 'other'"),
        ("validatingadmissionpolicies",
         lambda s: s.update(failurePolicy="Ignore"), "failurePolicy 'Ignore'"),
        # the policy of the chart before #22: deletes were not guarded
        ("validatingadmissionpolicies",
         lambda s: s["matchConstraints"]["resourceRules"][0].update(
             operations=["CREATE", "UPDATE"]),
         "does not guard DELETE"),
    ],
)  # fmt: skip
def test_what_is_not_in_force(rendered: dict[str, Any], kind: str, change: Any, words: str) -> None:
    problem = _problem(_changed(rendered, kind, change))
    assert problem is not None and words in problem, problem


def test_a_policy_that_cannot_be_read_is_not_in_force() -> None:
    class Forbidden(Exception):
        status, reason = 403, "Forbidden"

    def get(_path: str) -> dict[str, Any] | None:
        raise Forbidden

    assert admission_problem(NAME, get) == (
        f"cannot read ValidatingAdmissionPolicy '{NAME}' or its binding: 403 Forbidden"
    )


def test_a_refusing_verdict_is_read_again_when_a_request_needs_it(
    rendered: dict[str, Any],
) -> None:
    """An agent that started before `helm install` made the policy (the DaemonSet comes
    first) refused every request until its next watch cycle (found on kind): a refusing
    verdict is read again for a request once it is RECHECK_S old; an "in force" one is not."""
    objects: dict[str, Any] = {}
    reads: list[str] = []

    def get(path: str) -> Any:
        reads.append(path)
        return objects.get(path)

    gate = AdmissionGate(NAME)
    gate.check(get, now=0.0)
    assert gate.problem is not None and "does not exist" in gate.problem
    objects.update(rendered)  # the policy and its binding arrive
    assert gate.problem_now(get, now=RECHECK_S / 2) is not None  # not read again so soon
    assert gate.problem_now(get, now=RECHECK_S) is None
    read = len(reads)
    assert gate.problem_now(get, now=RECHECK_S * 10) is None
    assert len(reads) == read  # in force: not re-read per request
    objects.clear()  # removed: seen at the next check (relist, watch cycle), not per request
    gate.check(get, now=RECHECK_S * 11)
    assert gate.problem_now(get, now=RECHECK_S * 11) is not None
