"""The agent's namespace scope (`agent/authority/scope.py`): a Remediation outside the controller's
scope gets its requests refused on record, each request once, and nothing else; and its
check that the admission policy is in force (`AdmissionGate`, as the agent holds it). The real agent
against the real API server: tests/envtest/test_remediation_boundary.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from unstick.agent.authority import admission as admission_check
from unstick.agent.authority.scope import ScopeGate
from unstick.agent.loop import Agent, LoopSettings
from unstick.agent.settings import AgentSettings
from unstick.core.vocabulary import Refusal

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


class Recorder:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.refusals: Counter[str] = Counter()
        self.gate = ScopeGate(
            ("team-a",),
            lambda ns, name, patch: self.patches.append((ns, name, patch)),
            lambda r: self.refusals.update([str(r)]),
            lambda: NOW,
        )


def rem(ns: str = "team-x", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": "web-0-1", "uid": "r1"},
        "spec": {"podName": "web-0", "podUID": "u1", "nodeName": "node-1", **spec},
        "status": {},
    }


def test_no_scope_allows_every_namespace() -> None:
    gate = ScopeGate((), lambda *_: None, lambda _r: None, lambda: NOW)
    assert gate.allows("anything")
    assert Recorder().gate.allows("team-a") and not Recorder().gate.allows("team-x")


def test_node_steps_and_probe_outside_the_scope_are_refused_once() -> None:
    r = Recorder()
    obj = rem(
        nodeSteps=[{"action": "rmdir-stale"}, {"action": "unmount", "target": "/x"}],
        nodeStepsRequestedAt="2026-03-01T11:59:58Z",
        probeRequestedAt="2026-03-01T11:59:58Z",
    )
    r.gate.refuse(obj)
    r.gate.refuse(obj)  # its own patch comes back as MODIFIED: no second record
    ((ns, name, patch),) = r.patches
    assert (ns, name) == ("team-x", "web-0-1")
    assert [(a["action"], a["result"]) for a in patch["nodeActions"]] == [
        ("rmdir-stale", "refused"),
        ("unmount", "refused"),
    ]
    assert (
        "'team-x' is outside the controller's namespace scope (team-a"
        in (patch["nodeActions"][0]["message"])
    )
    assert patch["nodeStepsDoneAt"] == "2026-03-01T12:00:00.000000Z"
    (probe,) = patch["nodeRefusals"]
    assert probe["action"] == "probe" and probe["reason"] == "forged"
    assert r.refusals == Counter({"forged": 1})
    # a new request in the same record is refused again
    r.gate.refuse({**obj, "spec": {**obj["spec"], "probeRequestedAt": "2026-03-01T12:00:00Z"}})
    assert len(r.patches) == 2


def test_requests_already_answered_and_incidents_get_nothing() -> None:
    r = Recorder()
    answered = rem(nodeStepsRequestedAt="2026-03-01T11:00:00Z")
    answered["status"] = {"nodeStepsDoneAt": "2026-03-01T11:00:01Z"}
    r.gate.refuse(answered)
    r.gate.refuse({"metadata": {"namespace": "team-x", "name": "i", "uid": "r2"},
                   "spec": {"incident": {"node": "node-1"}}})  # fmt: skip
    assert r.patches == [] and not r.refusals


def test_another_reason_is_recorded_as_given() -> None:
    r = Recorder()
    r.gate.refuse(rem("team-a", probeRequestedAt="2026-03-01T11:59:58Z"), "policy gone",
                  Refusal.UNSAFE)  # fmt: skip
    ((_, _, patch),) = r.patches
    assert patch["nodeRefusals"][0]["message"] == "policy gone"
    assert patch["nodeRefusals"][0]["reason"] == "unsafe"
    assert r.refusals == Counter({"unsafe": 1})


# -- the admission policy check of the agent (agent/admission_check.AdmissionGate)

API = "/apis/admissionregistration.k8s.io/v1"
IN_FORCE = {
    f"{API}/validatingadmissionpolicies/p": {
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": ["unstick.dev"], "apiVersions": ["*"],
                     "resources": ["remediations", "remediations/status"],
                     "operations": ["CREATE", "UPDATE", "DELETE"]}
                ]
            },
        }
    },
    f"{API}/validatingadmissionpolicybindings/p": {
        "spec": {"policyName": "p", "validationActions": ["Deny"]}
    },
}  # fmt: skip


class FakeKube:
    """What the API answers: `objects`, or an error while `down`."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = dict(IN_FORCE)
        self.down = False

    def get(self, path: str) -> Any:
        if self.down:
            raise ConnectionError("API server restarting")
        return self.objects.get(path)

    def close(self) -> None:
        pass


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Agent, FakeKube]]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
    )
    a = Agent(
        AgentSettings(node_name="node-1", state_dir=str(tmp_path / "s"), admission_policy="p"),
        LoopSettings(kubeconfig=str(kubeconfig)),
    )
    a.kube.close()
    fake = FakeKube()
    a.kube = fake  # type: ignore[assignment]
    yield a, fake


def test_an_agent_that_never_read_the_policy_refuses(agent: tuple[Agent, FakeKube]) -> None:
    a, kube = agent
    kube.down = True
    a.admission.check(kube.get)
    assert a.admission.problem is not None
    assert a.admission.problem.startswith("cannot read ValidatingAdmissionPolicy 'p'")
    kube.down = False
    a.admission.check(kube.get)
    assert a.admission.problem is None


def test_a_read_error_keeps_the_verdict_in_force_for_a_while(
    agent: tuple[Agent, FakeKube], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, kube = agent
    a.admission.check(kube.get)
    assert a.admission.problem is None
    kube.down = True
    a.admission.check(kube.get)  # an API server restart does not refuse the node's requests
    assert a.admission.problem is None
    monkeypatch.setattr(admission_check, "READ_GRACE_S", 0.0)  # ... for READ_GRACE_S only
    a.admission.check(kube.get)
    assert a.admission.problem is not None and "cannot read" in a.admission.problem


def test_a_policy_removed_or_narrowed_is_not_in_force_at_once(
    agent: tuple[Agent, FakeKube],
) -> None:
    a, kube = agent
    a.admission.check(kube.get)
    binding = f"{API}/validatingadmissionpolicybindings/p"
    kube.objects[binding] = {
        "spec": {"policyName": "p", "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"a": "b"}}}}
    }  # fmt: skip
    a.admission.check(kube.get)
    assert a.admission.problem is not None and "narrowed" in a.admission.problem
    del kube.objects[binding]
    a.admission.check(kube.get)
    assert a.admission.problem is not None and "does not exist" in a.admission.problem
    kube.down = True  # while not in force, a read error changes nothing
    a.admission.check(kube.get)
    assert a.admission.problem is not None
