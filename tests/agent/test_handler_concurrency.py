"""Node steps on the agent's worker threads: one batch per pod at a time, one kubelet
restart at a time on the node, CSI calls one at a time per volume (the executor's
`volume_lock`), and other pods' steps meanwhile (each step re-checks its own
preconditions right before it acts)."""

from __future__ import annotations

import threading
from typing import Any

from devcluster.process import wait_until
from unstick.agent.handler import Handler, KeyLocks
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import SUCCEEDED, Executor, StepResult


class GatedExecutor:
    """Records which steps run; a step of `gated` pods waits in the executor until released."""

    def __init__(self) -> None:
        self.running: list[tuple[str, str]] = []
        self.started: list[tuple[str, str]] = []
        self.gate = threading.Event()
        self.gated: set[str] = set()
        self.lock = threading.Lock()

    def run_step(self, uid: str, action: str, target: str, **_kw: Any) -> StepResult:
        with self.lock:
            self.running.append((uid, action))
            self.started.append((uid, action))
        if uid in self.gated:
            self.gate.wait(20)
        with self.lock:
            self.running.remove((uid, action))
        return StepResult(action, target, SUCCEEDED, "ok", "t")


def handler(ex: GatedExecutor) -> Handler:
    settings = AgentSettings(node_name="n", kubelet_root="/nonexistent/kubelet")
    return Handler(settings, ex, lambda *_a: None, lambda *_a: None)  # type: ignore[arg-type]


def run(h: Handler, uid: str, steps: list[tuple[str, str]]) -> threading.Thread:
    t = threading.Thread(target=h.act, args=(uid, steps), kwargs={"lazy": False}, daemon=True)
    t.start()
    return t


def test_another_pods_unmount_runs_while_a_csi_call_waits() -> None:
    ex = GatedExecutor()
    h = handler(ex)
    ex.gated = {"a"}
    a = run(h, "a", [("replay-unpublish", ""), ("unmount", "")])
    wait_until(lambda: ("a", "replay-unpublish") in ex.running, timeout=10, what="a's replay")
    b = run(h, "b", [("unmount", ""), ("rmdir-stale", "")])
    wait_until(lambda: ("b", "rmdir-stale") in ex.started, timeout=10, what="b's steps")
    b.join(10)
    assert ex.running == [("a", "replay-unpublish")]  # a still waits on its driver
    ex.gate.set()
    a.join(10)
    assert ex.started[-1] == ("a", "unmount")


def test_two_batches_of_one_pod_or_two_restarts_never_overlap() -> None:
    ex = GatedExecutor()
    h = handler(ex)
    ex.gated = {"a"}
    a = run(h, "a", [("replay-unpublish", ""), ("restart-kubelet", "")])
    wait_until(lambda: ("a", "replay-unpublish") in ex.running, timeout=10, what="a's replay")
    b = run(h, "b", [("replay-unpublish", "")])  # another pod's (volume's) CSI call: runs
    wait_until(lambda: ("b", "replay-unpublish") in ex.started, timeout=10, what="b's replay")
    b.join(10)
    a2 = run(h, "a", [("rmdir-stale", "")])  # a second batch of the same pod: waits
    a2.join(0.5)  # (what must not happen cannot be awaited: a short look)
    assert ("a", "rmdir-stale") not in ex.started
    ex.gate.set()
    for t in (a, a2):
        t.join(10)
    assert ex.started[2:] == [("a", "restart-kubelet"), ("a", "rmdir-stale")]
    assert len(h.pod_locks) == 0  # no lock kept for a pod nobody acts on


def test_a_restart_waits_for_another_restart() -> None:
    ex = GatedExecutor()
    h = handler(ex)
    ex.gated = {"a"}
    a = run(h, "a", [("restart-kubelet", "")])
    wait_until(lambda: ("a", "restart-kubelet") in ex.running, timeout=10, what="a's restart")
    b = run(h, "b", [("restart-kubelet", "")])
    b.join(0.5)  # (what must not happen cannot be awaited: a short look)
    assert ex.started == [("a", "restart-kubelet")]
    ex.gate.set()
    for t in (a, b):
        t.join(10)
    assert ex.started == [("a", "restart-kubelet"), ("b", "restart-kubelet")]


def test_csi_calls_are_one_at_a_time_per_volume() -> None:
    ex = Executor(AgentSettings(node_name="n", kubelet_root="/nonexistent/kubelet"))
    order: list[str] = []

    def other(handle: str) -> None:
        with ex.checks.volume_lock("drv", handle):
            order.append(handle)

    with ex.checks.volume_lock("drv", "vol-1"):
        same, different = (threading.Thread(target=other, args=(h,)) for h in ("vol-1", "vol-2"))
        same.start()
        different.start()
        different.join(10)  # another volume's call is not held up
        same.join(0.5)  # the same volume's waits (a short look)
        assert order == ["vol-2"]
    same.join(10)
    assert order == ["vol-2", "vol-1"] and len(ex.checks.volume_locks) == 0


def test_key_locks_are_per_key() -> None:
    locks = KeyLocks()
    got = threading.Event()

    def take_b() -> None:
        with locks.held("b"):
            got.set()

    with locks.held("a"):
        t = threading.Thread(target=take_b)
        t.start()
        t.join(10)
        assert got.is_set()
    assert len(locks) == 0
