"""The agent's queue order (agent/workers.py): node steps due go before queued probes — a
pod's steps finish it, a probe only starts one — and one Remediation's jobs still run one
at a time in the order they came, also when its later job is the urgent one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devcluster.process import wait_until
from unstick.agent.loop import Agent, KeyedWorkers


class Gate:
    """A first job that holds the one thread until released (at most 20 s)."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def job(self) -> None:
        self.started.set()
        self.release.wait(20)


@pytest.fixture
def one_thread() -> Iterator[tuple[KeyedWorkers, Gate]]:
    workers, gate = KeyedWorkers(1), Gate()
    workers.submit("gate", gate.job)
    wait_until(gate.started.is_set, timeout=10, what="the gate job")
    yield workers, gate
    gate.release.set()
    workers.stop()


def _record(ran: list[str], name: str) -> Callable[[], None]:
    return lambda: ran.append(name)


def test_urgent_jobs_go_before_queued_ones_and_each_key_keeps_its_order(
    one_thread: tuple[KeyedWorkers, Gate],
) -> None:
    workers, gate = one_thread
    ran: list[str] = []
    workers.submit("b", _record(ran, "b probe"))
    workers.submit("c", _record(ran, "c probe"))
    workers.submit("e", _record(ran, "e probe"))
    workers.submit("c", _record(ran, "c steps"), urgent=True)
    workers.submit("d", _record(ran, "d steps"), urgent=True)
    workers.submit("d", _record(ran, "d forget"))
    gate.release.set()
    wait_until(lambda: len(ran) == 6, timeout=10, what="every job")
    # c's probe came before its steps: it runs first, then c's steps, then d's (the next
    # urgent), then the rest in the order they came (d's later job after its steps)
    assert ran == ["c probe", "c steps", "d steps", "b probe", "e probe", "d forget"]


def test_without_urgent_jobs_the_order_is_the_order_they_came(
    one_thread: tuple[KeyedWorkers, Gate],
) -> None:
    workers, gate = one_thread
    ran: list[str] = []
    for name in ("x", "y", "x", "z"):
        workers.submit(name, _record(ran, name))
    gate.release.set()
    wait_until(lambda: len(ran) == 4, timeout=10, what="every job")
    assert ran == ["x", "y", "x", "z"]


class Recorder:
    """A handler that records the Remediations it handled (the first one waits for `release`)."""

    def __init__(self) -> None:
        self.handled: list[str] = []
        self.started, self.release = threading.Event(), threading.Event()
        self.served_probes: dict[str, str] = {}
        self.served_steps: dict[str, str] = {}

    def handle(self, obj: dict[str, Any], _received: object = None) -> None:
        if not self.started.is_set():
            self.started.set()
            self.release.wait(20)
        self.handled.append(obj["metadata"]["uid"])


def _rem(uid: str, spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    meta = {"uid": uid, "namespace": "ns", "name": uid}
    return {"metadata": meta, "spec": {"podUID": "p-" + uid, **spec}, "status": status}


def test_the_agent_runs_due_node_steps_before_the_probes_queued_before_them(
    offline_agent: Callable[..., Agent],
) -> None:
    agent = offline_agent(workers=1)
    recorder = Recorder()
    agent.handler = recorder  # type: ignore[assignment]
    try:
        probe = {"probeRequestedAt": "2026-11-25T10:00:00Z"}
        steps = {**probe, "nodeStepsRequestedAt": "2026-11-25T10:00:05Z"}
        agent._dispatch(_rem("first", probe, {}))  # holds the thread
        wait_until(recorder.started.is_set, timeout=10, what="the first job started")
        agent._dispatch(_rem("probe-1", probe, {}))
        agent._dispatch(_rem("answered", steps, {"nodeStepsDoneAt": "2026-11-25T10:00:06Z"}))
        agent._dispatch(_rem("steps", steps, {"nodeStepsDoneAt": "2026-11-25T10:00:01Z"}))
        agent._dispatch(_rem("probe-2", probe, {}))
        recorder.release.set()
        wait_until(lambda: len(recorder.handled) == 5, timeout=10, what="every Remediation")
        # the unanswered request first; an answered one is no more urgent than a probe
        assert recorder.handled == ["first", "steps", "probe-1", "answered", "probe-2"]
    finally:
        recorder.release.set()
        agent.workers().stop()
        agent.kube.close()
