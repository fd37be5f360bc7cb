"""The node steps' dispatch (agent/steps/executor.py): one step for each node action of the
vocabulary (core/vocabulary.py), and an action it does not know is refused, not run."""

from __future__ import annotations

from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import REFUSED, STEPS, Executor
from unstick.core.vocabulary import NODE_ACTIONS


def test_every_node_action_has_one_step_and_there_is_no_other() -> None:
    assert set(STEPS) == {str(a) for a in NODE_ACTIONS}


def test_an_action_that_is_not_a_node_action_is_refused() -> None:
    ex = Executor(AgentSettings(node_name="n", kubelet_root="/nonexistent/kubelet"))
    for action in ("force-delete", "observe", "rm -rf", ""):
        result = ex.run_step(
            "11111111-1111-4111-8111-111111111111", action, dry_run=False, lazy_unmount=False
        )
        assert (result.result, result.message) == (REFUSED, f"{action!r} is not a node action")
