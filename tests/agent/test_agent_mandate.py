"""One round trip (design.md §11): the agent serves the controller's mandate — it probes,
runs the core's diagnosis and planner on its own fresh probe, keeps the steps that both
the mandate and the policy in force (re-derived from the API) permit, writes probe and
plan in one status write before it acts, and the results with a probe taken after them in
one more. A mandate that cannot be the controller's is refused on record, nothing run: an
action the policy does not permit, slots it did not grant, another pod or node, a request
replayed old. An agent killed between its record and its act, or between its act and its
results, leaves a plan on record that the next agent settles by looking, never by acting.
(The API is callables here, as in test_agent_trust.py.)"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_agent_trust import NOW, UID, Node, pod, policy, stamp
from unstick.agent.handler import Handler
from unstick.agent.round_trip import SETTLED_DONE, SETTLED_LEFT
from unstick.core.remediation import node_results


class Killed(BaseException):
    """The agent process dies here (nothing after this line runs)."""


class Agent(Node):
    """test_agent_trust's node (one stale volume dir of the pod), the pod opted in under
    `default` (resourceVersion 5, permitting `actions`)."""

    def __init__(self, tmp_path: Path, actions: list[str] | None = None, **spec: Any) -> None:
        super().__init__(tmp_path, pod("true"))
        body = policy("default", **spec)
        if actions is not None:
            body["spec"]["actions"] = actions
        self.policies["default"] = {**body, "metadata": {"name": "default", "resourceVersion": "5"}}

    def remediation(self, status: dict[str, Any] | None = None, **mandate: Any) -> dict[str, Any]:
        granted = {
            "podUID": UID,
            "nodeName": "node-1",
            "actions": ["unmount", "rmdir-stale"],
            "policy": "default",
            "policyResourceVersion": "5",
            "dryRun": False,
            "slots": 1,
            **mandate,
        }
        at = mandate.pop("at", NOW - timedelta(seconds=2))
        granted.pop("at", None)
        return {
            "metadata": {"namespace": "team-a", "name": "web-0-dddd", "uid": "r1"},
            "spec": {
                "podName": "web-0",
                "podUID": UID,
                "nodeName": "node-1",
                "mandate": granted,
                "nodeStepsRequestedAt": stamp(at),
            },
            "status": status or {},
        }

    def serve(self, obj: dict[str, Any], handler: Handler | None = None) -> list[dict[str, Any]]:
        (handler or self.handler).handle(obj)
        return self.patches


def test_one_round_trip_is_two_status_writes_plan_first(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    intent, answer = agent.serve(agent.remediation())
    assert set(intent) == {"probe", "nodePlan"}  # record before act
    plan = intent["nodePlan"]
    assert plan["cause"] == "StaleVolumeDirs" and plan["slotsUsed"] == 1
    assert plan["for"] == stamp(NOW - timedelta(seconds=2))
    assert [s["action"] for s in plan["steps"]] == ["rmdir-stale", "rmdir-stale"]
    assert {"nodeActions", "nodeStepsDoneAt", "probe"} <= set(answer)
    assert [a["result"] for a in answer["nodeActions"]] == ["succeeded", "succeeded"]
    assert not agent.stale.exists()
    assert answer["probe"]["probedAt"] >= intent["probe"]["probedAt"]


def test_a_step_the_mandate_does_not_grant_is_not_run(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    (answer,) = agent.serve(agent.remediation(actions=["unmount"]))
    assert answer["nodePlan"]["steps"] == [] and answer["nodePlan"]["slotsUsed"] == 0
    assert {a["result"] for a in answer["nodeActions"]} == {"refused"}
    assert "spec.mandate.actions does not grant rmdir-stale" in answer["nodeActions"][0]["message"]
    assert agent.stale.exists()


@pytest.mark.parametrize(
    ("mandate", "reason", "field"),
    [
        ({"actions": ["rmdir-stale", "restart-kubelet"]}, "forged", "spec.mandate.actions"),
        ({"slots": 101}, "forged", "spec.mandate.slots"),
        ({"nodeName": "node-2"}, "forged", "spec.mandate.nodeName"),
        ({"podUID": "eeeeeeee-4444-4444-8444-eeeeeeeeeeee"}, "forged", "spec.mandate.podUID"),
        ({"policy": "lenient"}, "stale", "spec.mandate.policy"),
        ({"at": NOW - timedelta(minutes=30)}, "stale", "spec.nodeStepsRequestedAt"),
        ({"actions": ["format-disk"]}, "forged", "spec.mandate.actions[0]"),
    ],
)
def test_a_forged_or_replayed_mandate_is_refused_and_nothing_runs(
    tmp_path: Path, mandate: dict[str, Any], reason: str, field: str
) -> None:
    agent = Agent(tmp_path, actions=["unmount", "rmdir-stale"])
    (answer,) = agent.serve(agent.remediation(**mandate))
    assert "nodePlan" not in answer and "probe" not in answer  # nothing probed or planned
    (entry,) = answer["nodeRefusals"]
    assert entry["action"] == "node-steps" and entry["reason"] == reason
    assert entry["message"].startswith(field)
    assert [a["result"] for a in answer["nodeActions"]] == ["refused"]
    assert agent.stale.exists() and agent.refusals[reason] == 1


def test_a_changed_policy_is_intersected_not_refused(tmp_path: Path) -> None:
    agent = Agent(tmp_path, actions=["unmount"])  # no rmdir-stale any more, resourceVersion 6
    agent.policies["default"]["metadata"]["resourceVersion"] = "6"
    (answer,) = agent.serve(agent.remediation())
    # the planner itself leaves out what the policy in force does not permit: nothing to do
    assert answer["nodePlan"]["steps"] == [] and answer["nodeActions"] == []
    assert "nodeRefusals" not in answer and agent.stale.exists()


def test_dry_run_and_not_opted_in_change_nothing(tmp_path: Path) -> None:
    dry = Agent(tmp_path / "dry", dryRun=True)
    (answer,) = dry.serve(dry.remediation())
    assert {a["result"] for a in answer["nodeActions"]} == {"dry_run"} and dry.stale.exists()
    granted_dry = Agent(tmp_path / "granted-dry")
    (answer,) = granted_dry.serve(granted_dry.remediation(dryRun=True))
    assert {a["result"] for a in answer["nodeActions"]} == {"dry_run"}
    assert granted_dry.stale.exists()
    out = Agent(tmp_path / "out")
    out.pod = pod()  # no annotation, namespace not labelled
    (answer,) = out.serve(out.remediation())
    assert answer["nodeRefusals"][0]["reason"] == "not_opted_in" and out.stale.exists()


def test_no_slot_granted_means_no_act(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    (answer,) = agent.serve(agent.remediation(slots=0))
    assert {a["result"] for a in answer["nodeActions"]} == {"refused"}
    assert answer["nodeRefusals"][0]["reason"] == "policy_forbids" and agent.stale.exists()


def _killed_at(agent: Agent, key: str) -> dict[str, Any]:
    """Serve a mandate with an agent that dies right after the status write carrying
    `key` (nodePlan: after its record, before its act; nodeActions: the results write
    never made it); the Remediation's status as the API server then holds it."""
    patch_before = agent.handler.patch_status

    def patch(ns: str, name: str, body: dict[str, Any]) -> None:
        if key == "nodeActions" and key in body:
            raise Killed  # the results never reach the API server
        patch_before(ns, name, body)
        if key in body:
            raise Killed

    agent.handler.patch_status = patch
    obj = agent.remediation()
    with pytest.raises(Killed):
        agent.handler.handle(obj)
    (intent,) = agent.patches
    return {**obj, "status": intent}


def _restarted(agent: Agent) -> Handler:
    h = agent.handler
    return Handler(
        h.settings,
        h.executor,
        lambda ns, n, p: agent.patches.append(p),
        h.lookup_pod,
        policies=h.policies,
        budget=h.budget,
        clock=h.clock,
    )


def test_killed_between_its_record_and_its_act_is_settled_by_looking(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    obj = _killed_at(agent, "nodePlan")
    assert agent.stale.exists()  # the act never happened
    (_, answer) = agent.serve(obj, _restarted(agent))
    assert agent.stale.exists()  # and the next agent does not act on an old record
    assert {a["result"] for a in answer["nodeActions"]} == {"failed"}
    assert {a["message"] for a in answer["nodeActions"]} == {SETTLED_LEFT}
    assert "probe" in answer and "nodeStepsDoneAt" in answer


def test_killed_between_its_act_and_its_results_is_settled_by_looking(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    obj = _killed_at(agent, "nodeActions")
    assert not agent.stale.exists()  # acted, results lost
    (_, answer) = agent.serve(obj, _restarted(agent))
    assert {a["result"] for a in answer["nodeActions"]} == {"succeeded"}
    assert {a["message"] for a in answer["nodeActions"]} == {SETTLED_DONE}


def test_each_result_names_its_plan_step_and_the_target_is_on_record_once(
    tmp_path: Path,
) -> None:
    """A result of a plan step names the step (its index) instead of repeating its target
    (issue 34, a lean record); read back with it by `node_results`. A new plan is never
    written under results that name the old one's steps: they go with it."""
    agent = Agent(tmp_path)
    intent, answer = agent.serve(agent.remediation())
    assert [set(a) for a in answer["nodeActions"]] == [
        {"action", "step", "result", "message", "time"}
    ] * 2
    assert [a["step"] for a in answer["nodeActions"]] == [0, 1]
    status = {**intent, **answer}
    targets = [s["target"] for s in intent["nodePlan"]["steps"]]
    assert [r["target"] for r in node_results(status)] == targets
    assert json.dumps(status).count(targets[0]) == 1  # the plan only (the probe: none left)
    # asked again (a later request) over that answer: the new plan clears those results
    agent.patches.clear()
    agent.stale.mkdir(parents=True)
    status["nodeStepsDoneAt"] = stamp(NOW - timedelta(seconds=1.5))  # answered, then ...
    again = agent.remediation(status, at=NOW - timedelta(seconds=1))  # ... asked again
    intent, _ = agent.serve(again)
    assert "nodeActions" in intent and intent["nodeActions"] is None
