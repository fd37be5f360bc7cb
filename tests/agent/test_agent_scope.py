"""The agent's namespace scope (`agent/scope.py`): a Remediation outside the controller's
scope gets its requests refused on record, each request once, and nothing else; the real
agent against the real API server is tests/envtest/test_remediation_boundary.py."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from unstick.agent.scope import ScopeGate
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
