"""The agent's loop (unstick.agent.loop.Agent) running in the test's own process, for the
envtests that watch it answer Remediations on a real API server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from devcluster.process import free_port
from unstick.agent.loop import Agent, LoopSettings
from unstick.agent.settings import AgentSettings


def node_under(
    tmp: Path,
    node: str = "node-1",
    *,
    pods: tuple[str, ...] = (),
    mountinfo: str = "",
    **settings: Any,
) -> AgentSettings:
    """The settings of an agent of `node` whose kubelet root (`tmp/kubelet`, with a pod dir
    per UID of `pods`), host mount table (the file `tmp/mountinfo`, holding `mountinfo`),
    plugin registry and state dir live under `tmp`; the real /proc (a complete cgroup
    scan); a kubelet /healthz that nothing answers. `settings` override any of them."""
    (tmp / "kubelet" / "pods").mkdir(parents=True, exist_ok=True)
    for uid in pods:
        (tmp / "kubelet" / "pods" / uid).mkdir(exist_ok=True)
    (tmp / "mountinfo").write_text(mountinfo)
    values: dict[str, Any] = {
        "node_name": node,
        "kubelet_root": str(tmp / "kubelet"),
        "host_proc": "/proc",
        "mountinfo_path": str(tmp / "mountinfo"),
        "kubelet_healthz": "http://127.0.0.1:9/healthz",
        "plugins_registry": str(tmp / "registry"),
        "state_dir": str(tmp / "state"),
    }
    return AgentSettings(**{**values, **settings})


def watching(kubeconfig: Path | str, metrics_port: int | None = None, **loop: Any) -> LoopSettings:
    """The loop of an agent that watches the API server of `kubeconfig` (5 s watches) and
    serves its metrics on 127.0.0.1:`metrics_port` (a free port unless given)."""
    port = free_port() if metrics_port is None else metrics_port
    return LoopSettings(
        kubeconfig=str(kubeconfig),
        metrics_port=port,
        metrics_host="127.0.0.1",
        watch_timeout_s=5,
        **loop,
    )


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
