"""The agent's loop (unstick.agent.loop.Agent) running in the test's own process, for the
envtests that watch it answer Remediations on a real API server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from unstick.agent.loop import Agent, LoopSettings
from unstick.agent.settings import AgentSettings


@contextmanager
def agent_running(
    settings: AgentSettings, loop: LoopSettings, stop_within_s: float = 60
) -> Iterator[Agent]:
    """The agent running in a thread; shut down and joined at the end, and (when the block
    ended without an error of its own) checked to have stopped."""
    agent = Agent(settings, loop)
    thread = threading.Thread(target=agent.run, name="agent", daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        agent.shutdown()
        thread.join(timeout=stop_within_s)
    assert not thread.is_alive(), "the agent did not stop"
