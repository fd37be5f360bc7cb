"""`status.nodeActions` read with their targets (core/remediation.py `node_results`): a
mandate's result names the step of `status.nodePlan` it is the result of; a result that
says its target itself (the older request, a refusal) is read as it is."""

from __future__ import annotations

from typing import Any

from unstick.core.remediation import node_results

PLAN = {"for": "2026-11-28T10:00:00Z", "cause": "OrphanedMount", "slotsUsed": 1, "steps": [
    {"action": "unmount", "target": "/k/pods/u/volumes/a/mount", "reason": "r"},
    {"action": "rmdir-stale", "target": "/k/pods/u/volumes/a", "reason": "r"},
]}  # fmt: skip


def _result(**fields: Any) -> dict[str, Any]:
    return {"result": "succeeded", "message": "m", "time": "2026-11-28T10:00:01Z", **fields}


def test_a_result_naming_a_plan_step_gets_its_action_and_target() -> None:
    status = {"nodePlan": PLAN, "nodeActions": [
        _result(action="unmount", step=0), _result(step=1),
        _result(action="rmdir-stale", target="/k/pods/u/volumes/b", result="refused"),
    ]}  # fmt: skip
    got = [(r["action"], r["target"], r["result"]) for r in node_results(status)]
    assert got == [
        ("unmount", "/k/pods/u/volumes/a/mount", "succeeded"),
        ("rmdir-stale", "/k/pods/u/volumes/a", "succeeded"),
        ("rmdir-stale", "/k/pods/u/volumes/b", "refused"),
    ]


def test_a_step_that_does_not_resolve_keeps_what_it_says() -> None:
    """No plan, an index out of range, a step that is not an index: no target invented."""
    for status in (
        {"nodeActions": [_result(action="unmount", step=0)]},
        {"nodePlan": PLAN, "nodeActions": [_result(action="unmount", step=7)]},
        {"nodePlan": PLAN, "nodeActions": [_result(action="unmount", step=True)]},
        {"nodePlan": {"steps": "x"}, "nodeActions": [_result(action="unmount", step=0)]},
    ):
        (got,) = node_results(status)
        assert got["action"] == "unmount" and got.get("target", "") == "", status
    assert node_results({"nodeActions": ["not an object", None]}) == []
    assert node_results({}) == []
