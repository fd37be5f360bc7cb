"""The agent's namespace and RemediationPolicy GETs (rule 3, read right before node steps)
are shared by the checks that ask at the same moment, and only by them: a check gets a GET
that started after it asked — never one already running, never one that ended — so its
answer is as fresh as a GET of its own (docs/agent.md, "Namespace and policy reads")."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from devcluster.process import wait_until
from unstick.agent.loop import Agent
from unstick.core.remediation import POLICIES


class Api:
    """Answers GETs with a new version each (`gets` counts them); the first GET waits
    until `release` is set (at most 20 s)."""

    def __init__(self) -> None:
        self.gets: list[str] = []
        self.first_started, self.release = threading.Event(), threading.Event()
        self._lock = threading.Lock()

    def get(self, path: str, *_args: Any, **_kw: Any) -> dict[str, Any]:
        with self._lock:
            self.gets.append(path)
            n = len(self.gets)
        if n == 1:
            self.first_started.set()
            self.release.wait(20)
        return {"metadata": {"name": path.rsplit("/", 1)[-1], "resourceVersion": str(n)}}


def _in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    return thread, out


def test_checks_asking_while_a_get_runs_share_the_next_get_not_the_running_one(
    offline_agent: Callable[..., Agent],
) -> None:
    agent, api = offline_agent(), Api()
    agent.kube.get = api.get  # type: ignore[method-assign]
    try:
        first, first_out = _in_thread(agent.get_namespace, "team-a")
        wait_until(api.first_started.is_set, timeout=10, what="the first GET running")
        later = [_in_thread(agent.get_namespace, "team-a") for _ in range(3)]
        path = "/api/v1/namespaces/team-a"
        wait_until(
            lambda: (p := agent._reads._next.get(path)) is not None and p.callers == 3,
            timeout=10,
            what="three checks waiting for the next GET",
        )
        api.release.set()
        for thread, _ in [(first, first_out), *later]:
            thread.join(20)
        assert first_out[0]["metadata"]["resourceVersion"] == "1"
        # the three asked while GET 1 ran: they got GET 2, started after they asked
        assert [out[0]["metadata"]["resourceVersion"] for _, out in later] == ["2"] * 3
        assert api.gets == [path, path]
        # a check after that gets a GET of its own (a GET that ended answers nobody new)
        assert agent.get_namespace("team-a")["metadata"]["resourceVersion"] == "3"  # type: ignore[index]
    finally:
        api.release.set()
        agent.kube.close()


def test_different_objects_are_never_shared(offline_agent: Callable[..., Agent]) -> None:
    agent, api = offline_agent(), Api()
    api.release.set()
    agent.kube.get = api.get  # type: ignore[method-assign]
    try:
        agent.get_policy("default")
        agent.get_policy("strict")
        agent.get_namespace("default")
        assert api.gets == [
            f"{POLICIES}/default",
            f"{POLICIES}/strict",
            "/api/v1/namespaces/default",
        ]
    finally:
        agent.kube.close()
