"""How the controller reads the agent's refusal of a whole node-step request
(controller/agent_channel/node_steps.py): which answers are a refusal of the latest request,
how many in a row, and the backoff before the re-ask of a `stale` one."""

from __future__ import annotations

from typing import Any

from unstick.controller.agent_channel.node_steps import (
    NODE_STEPS,
    RETRIED_REFUSALS,
    RETRY_FIRST_S,
    refused_request,
    retry_backoff_s,
)

ASKED = "2026-03-01T12:00:00Z"
DONE = "2026-03-01T12:00:05.250000Z"


def rem(results: list[str], refusals: list[dict[str, Any]], done: str = DONE) -> dict[str, Any]:
    return {
        "spec": {"nodeStepsRequestedAt": ASKED, "nodeSteps": [{"action": "unmount"}]},
        "status": {
            "nodeStepsDoneAt": done,
            "nodeActions": [{"action": "unmount", "target": "/m", "result": r} for r in results],
            "nodeRefusals": refusals,
        },
    }


def refusal(reason: str, time: str = DONE, action: str = NODE_STEPS) -> dict[str, Any]:
    return {"action": action, "reason": reason, "time": time, "by": "agent"}


def test_a_stale_refusal_of_the_latest_answer_is_read_with_its_count() -> None:
    assert refused_request(rem(["refused"], [refusal("stale")])) == ("stale", 1)
    older = [refusal("stale", "2026-03-01T11:59:00Z"), refusal("stale", "2026-03-01T11:59:30Z")]
    assert refused_request(rem(["refused"], [*older, refusal("stale")])) == ("stale", 3)
    broken = [refusal("stale", "2026-03-01T11:58:00Z"), refusal("forged", "2026-03-01T11:59:00Z")]
    assert refused_request(rem(["refused"], [*broken, refusal("stale")])) == ("stale", 1)
    # the same instant in another spelling is the same answer
    assert refused_request(rem(["refused"], [refusal("stale", "2026-03-01T12:00:05.25+00:00")]))


def test_what_is_not_a_refusal_of_the_latest_request() -> None:
    assert refused_request(rem(["succeeded"], [refusal("stale")])) is None
    assert refused_request(rem(["succeeded", "refused"], [refusal("stale")])) is None
    assert refused_request(rem(["refused"], [])) is None  # a step's own precondition
    assert refused_request(rem(["refused"], [refusal("stale", "2026-03-01T11:00:00Z")])) is None
    assert refused_request(rem(["refused"], [refusal("stale", action="probe")])) is None
    assert refused_request(rem(["refused"], [refusal("stale", time="yesterday")])) is None
    # an answer older than the request is not its answer
    assert (
        refused_request(rem(["refused"], [refusal("stale")], done="2026-03-01T11:00:00Z")) is None
    )


def test_only_stale_and_the_agents_budget_are_retried() -> None:
    assert frozenset({"stale", "busy"}) == RETRIED_REFUSALS
    for reason in ("forged", "unsafe", "not_opted_in", "policy_forbids", "dry_run"):
        assert reason not in RETRIED_REFUSALS


def test_the_agents_node_budget_is_busy_a_policy_that_forbids_is_not() -> None:
    # the agent marks it with retryAfterSeconds, whatever the message says
    marked = {**refusal("policy_forbids"), "message": "any words", "retryAfterSeconds": 12}
    assert refused_request(rem(["refused"], [marked])) == ("busy", 1)
    not_a_number = {**marked, "retryAfterSeconds": "12"}
    assert refused_request(rem(["refused"], [not_a_number])) == ("policy_forbids", 1)
    # an agent from before the marker: the message's beginning
    busy = {**refusal("policy_forbids"), "message": "rate limit: this node's budget (10 ..."}
    assert refused_request(rem(["refused"], [busy])) == ("busy", 1)
    forbids = {**refusal("policy_forbids"), "message": "RemediationPolicy 'x' does not permit"}
    assert refused_request(rem(["refused"], [forbids])) == ("policy_forbids", 1)
    before = {**busy, "time": "2026-03-01T11:59:00Z"}
    assert refused_request(rem(["refused"], [before, refusal("stale")])) == ("stale", 1)


def test_the_backoff_doubles_up_to_the_recheck_period() -> None:
    waits = [retry_backoff_s(n, 300.0) for n in range(1, 10)]
    assert waits[:4] == [RETRY_FIRST_S, RETRY_FIRST_S * 2, RETRY_FIRST_S * 4, RETRY_FIRST_S * 8]
    assert waits[-1] == 300.0 and waits == sorted(waits)
    assert retry_backoff_s(10_000, 300.0) == 300.0
