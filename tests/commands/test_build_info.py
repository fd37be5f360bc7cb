"""`unstick_build_info{version}` is 1 on both components' /metrics (the agent's own
registry, the controller's default one)."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest

from unstick import __version__
from unstick.agent.serving import AgentMetrics
from unstick.commands.agent import build_info


def test_the_agent_serves_its_version() -> None:
    metrics = AgentMetrics("n1")
    build_info(metrics.registry)
    text = generate_latest(metrics.registry).decode()
    assert f'unstick_build_info{{version="{__version__}"}} 1.0' in text


def test_the_controller_serves_its_version_and_leadership() -> None:
    from unstick.controller import metrics  # noqa: F401 (registers them)

    text = generate_latest(REGISTRY).decode()
    assert f'unstick_build_info{{version="{__version__}"}} 1.0' in text
    assert "unstick_controller_leader " in text
