"""The agent handles Remediations on a few worker threads: one whose handling waits (API
round trips, a probe) does not hold up another's, while the events of one Remediation are
still handled one at a time, in the order they came."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from devcluster.process import wait_until
from unstick.agent.loop import KeyedWorkers


class Recorder:
    """A handler that records what it handled; `hold` makes a key's handling wait until
    `release` is set (at most 20 s, then it records that it timed out)."""

    def __init__(self) -> None:
        self.handled: list[tuple[str, int]] = []
        self.release = threading.Event()
        self.hold: str | None = None
        self.served_probes: dict[str, str] = {}
        self.served_steps: dict[str, str] = {}

    def handle(self, obj: dict[str, Any], _received: object = None) -> None:
        key, n = obj["metadata"]["uid"], obj["n"]
        if key == self.hold and not self.release.wait(20):
            self.handled.append((key, -1))
            return
        self.handled.append((key, n))


def two_shards(workers: KeyedWorkers) -> tuple[str, str]:
    keys = [f"uid-{i}" for i in range(64)]
    first = keys[0]
    return first, next(k for k in keys if workers.shard(k) != workers.shard(first))


@pytest.fixture
def agent(offline_agent: Callable[..., Any]) -> Any:
    agent = offline_agent(workers=4)
    recorder = Recorder()
    agent.handler = recorder  # type: ignore[assignment]
    yield agent
    recorder.release.set()
    agent.workers().stop()
    agent.kube.close()


def obj(key: str, n: int) -> dict[str, Any]:
    return {"metadata": {"uid": key, "namespace": "ns", "name": key}, "spec": {}, "n": n}


def test_a_remediation_that_waits_does_not_hold_up_another(agent: Any) -> None:
    slow, other = two_shards(agent.workers())
    agent.handler.hold = slow
    agent._dispatch(obj(slow, 1))
    agent._dispatch(obj(other, 1))
    wait_until(lambda: (other, 1) in agent.handler.handled, timeout=10, what="the other one")
    assert agent.handler.handled == [(other, 1)]  # the slow one still waits
    agent.handler.release.set()
    wait_until(lambda: len(agent.handler.handled) == 2, timeout=10, what="the slow one")
    assert agent.handler.handled[1] == (slow, 1)


def test_the_events_of_one_remediation_are_handled_in_order(agent: Any) -> None:
    slow, other = two_shards(agent.workers())
    agent.handler.hold = slow
    for n in range(1, 4):
        agent._dispatch(obj(slow, n))
    agent._dispatch(obj(other, 1))
    wait_until(lambda: (other, 1) in agent.handler.handled, timeout=10, what="the other one")
    agent.handler.release.set()
    wait_until(lambda: len(agent.handler.handled) == 4, timeout=10, what="all events")
    assert [n for k, n in agent.handler.handled if k == slow] == [1, 2, 3]


def test_a_deleted_remediation_is_forgotten_after_its_events(agent: Any) -> None:
    agent.handler.served_steps["gone"] = "t"
    agent._dispatch(obj("gone", 1))
    agent._dispatch(obj("gone", 0), deleted=True)
    wait_until(lambda: "gone" not in agent.handler.served_steps, timeout=10, what="forgotten")
    assert agent.handler.handled == [("gone", 1)]
    assert "gone" not in agent.stuck_uids


def test_stop_lets_the_running_job_finish_and_drops_the_rest() -> None:
    workers = KeyedWorkers(1)
    started, release, ran = threading.Event(), threading.Event(), []

    def first() -> None:
        started.set()
        if release.wait(20):
            ran.append("first")

    workers.submit("a", first)
    workers.submit("a", lambda: ran.append("second"))
    wait_until(started.is_set, timeout=10, what="the first job")
    stopper = threading.Thread(target=workers.stop)
    stopper.start()
    wait_until(workers._stopping.is_set, timeout=10, what="stopping")
    release.set()
    stopper.join(20)
    assert ran == ["first"]
