"""A node-step request's age is judged when the agent received it, not after its own queue
(docs/agent.md, "Request age"): a request that waited in the agent's backlog still runs;
one that arrived old — missed while the agent was down, or an old time written again — is
refused `stale`, and the refusal of the request as a whole is on record in
`status.nodeRefusals` (action `node-steps`, time = the answer's nodeStepsDoneAt), which is
what the controller reads to ask again."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.agent.policy_sources import opted_in
from tests.agent.test_agent_trust import NOW, Node, pod, stamp
from unstick.agent.handler import NODE_STEPS


def request(node: Node, requested_ago_s: float, received_ago_s: float | None) -> dict[str, Any]:
    node.requests += 1
    node.handler.handle(
        {
            "metadata": {"namespace": "team-a", "name": "web-0-dddd", "uid": f"r{node.requests}"},
            "spec": {
                "podName": "web-0",
                "podUID": "dddddddd-4444-4444-8444-dddddddddddd",
                "nodeName": "node-1",
                "nodeSteps": [{"action": "rmdir-stale", "target": "", "reason": "x"}],
                "nodeStepsRequestedAt": stamp(NOW - timedelta(seconds=requested_ago_s)),
            },
            "status": {"nodeRefusals": [{"action": "probe", "reason": "forged"}]},
        },
        None if received_ago_s is None else NOW - timedelta(seconds=received_ago_s),
    )
    patch: dict[str, Any] = node.patches[-1]
    return patch


def test_a_request_fresh_when_received_runs_after_a_long_queue(tmp_path: Path) -> None:
    node = Node(tmp_path, pod())
    node.handler.policies = opted_in()
    age = node.settings.max_request_age_s
    # written 2 s before the agent got it, handled 10 minutes of backlog later
    patch = request(node, requested_ago_s=600 + 2, received_ago_s=600)
    (action,) = patch["nodeActions"]
    assert action["result"] == "succeeded", action
    assert not node.stale.exists()
    assert "nodeRefusals" not in patch
    assert age < 600  # the queue wait alone is beyond --max-request-age


def test_a_request_old_when_received_is_refused_stale_on_record(tmp_path: Path) -> None:
    node = Node(tmp_path, pod())
    node.handler.policies = opted_in()
    age = node.settings.max_request_age_s
    # a replay: the old time arrives now (received None: judged at handling, as the
    # loop's relist and watch events are when they arrive)
    for received in (None, 0.0):
        patch = request(node, requested_ago_s=age + 30, received_ago_s=received)
        (action,) = patch["nodeActions"]
        assert action["result"] == "refused" and "older than --max-request-age" in action["message"]
        assert node.stale.is_dir(), "a stale request changed the node"
        kept, entry = patch["nodeRefusals"]
        assert kept == {"action": "probe", "reason": "forged"}, "older refusals are kept"
        assert entry["action"] == NODE_STEPS and entry["reason"] == "stale"
        assert entry["time"] == patch["nodeStepsDoneAt"] and entry["by"] == "agent"
    assert node.refusals == {"stale": 2}


def test_a_request_from_the_future_of_its_arrival_is_refused(tmp_path: Path) -> None:
    node = Node(tmp_path, pod())
    node.handler.policies = opted_in()
    skew = node.settings.max_request_skew_s
    patch = request(node, requested_ago_s=-(skew + 60), received_ago_s=0.0)
    (action,) = patch["nodeActions"]
    assert action["result"] == "refused" and "in the future" in action["message"]
    assert patch["nodeRefusals"][-1]["reason"] == "stale"


def test_a_refusal_for_safety_is_on_record_with_its_reason(tmp_path: Path) -> None:
    node = Node(tmp_path, pod())  # never opted in
    node.policies["default"] = {"metadata": {"name": "default"}, "spec": {}}
    patch = request(node, requested_ago_s=2, received_ago_s=0.0)
    assert patch["nodeActions"][0]["result"] == "refused"
    assert patch["nodeRefusals"][-1]["reason"] == "not_opted_in"
    assert node.stale.is_dir()
