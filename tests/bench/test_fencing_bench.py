"""bench/fencing_timeline.py: the steps one read of the cluster shows, and the timeline of
a power-off and a power-on assembled from a sequence of reads (no cluster: the reads are
written here as `kubectl get pods,volumeattachments,nodes -o json` returns them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.fencing_timeline import (
    DOWN,
    OUT_OF_SERVICE,
    SHUTDOWN,
    UP,
    Subject,
    Timeline,
    down_facts,
    follow,
    up_facts,
)

S = Subject(node="w1", pv="pv-1", old_uid="old")


def node(ready: bool = True, taints: tuple[str, ...] = (), cordoned: bool = False) -> Any:
    status = "True" if ready else "Unknown"
    return {
        "kind": "Node",
        "metadata": {"name": "w1"},
        "spec": {
            "unschedulable": cordoned,
            "taints": [{"key": k, "effect": "NoExecute"} for k in taints],
        },
        "status": {"conditions": [{"type": "Ready", "status": status}]},
    }


def pod(uid: str, on: str | None, ready: bool = False, deleting: bool = False) -> Any:
    meta: dict[str, Any] = {"name": "db-0", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T07:00:00Z"
    return {
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": on} if on else {},
        "status": {"conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def attachment(on: str, attached: bool) -> Any:
    return {
        "kind": "VolumeAttachment",
        "spec": {"nodeName": on, "source": {"persistentVolumeName": "pv-1"}},
        "status": {"attached": attached},
    }


OTHER_PV = {
    "kind": "VolumeAttachment",
    "spec": {"nodeName": "w1", "source": {"persistentVolumeName": "pv-2"}},
}

#: a power-off with unstick: each read one step further
READS: list[list[Mapping[str, Any]]] = [
    [node(), pod("old", "w1", ready=True), attachment("w1", True), OTHER_PV],
    [node(ready=False), pod("old", "w1", ready=True), attachment("w1", True)],
    [node(False, (SHUTDOWN,)), pod("old", "w1", ready=True), attachment("w1", True)],
    [
        node(False, (SHUTDOWN, OUT_OF_SERVICE)),
        pod("old", "w1", deleting=True),
        attachment("w1", True),
    ],
    [node(False, (SHUTDOWN, OUT_OF_SERVICE)), attachment("w1", True)],
    [node(False, (SHUTDOWN, OUT_OF_SERVICE)), pod("new", None), OTHER_PV],
    [node(False, (SHUTDOWN, OUT_OF_SERVICE)), pod("new", "w2")],
    [node(False, (SHUTDOWN, OUT_OF_SERVICE)), pod("new", "w2"), attachment("w2", True)],
    [node(False, (SHUTDOWN, OUT_OF_SERVICE)), pod("new", "w2", True), attachment("w2", True)],
]


def replay(reads: list[list[Mapping[str, Any]]], steps: tuple[str, ...], last: str, facts: Any,
           cap_s: float = 100.0) -> Timeline:  # fmt: skip
    """`follow` over `reads`, one read a second (the clock advanced by each read)."""
    now = [0.0]
    queue = iter(reads)

    def read() -> list[Mapping[str, Any]]:
        now[0] += 1.0
        return next(queue)

    return follow(read, facts, Timeline.of(steps), last=last, cap_s=cap_s,
                  clock=lambda: now[0], load=lambda: 2.5)  # fmt: skip


def test_power_off_timeline_step_by_step() -> None:
    timeline = replay(READS, DOWN, "ready", lambda items: down_facts(items, S))
    assert {step: seen["s"] for step, seen in timeline.seen.items()} == {
        "not_ready": 2.0,
        "proof": 3.0,
        "out_of_service": 4.0,
        "old_pod_deleting": 4.0,
        "old_pod_gone": 5.0,
        "detached": 6.0,  # (another PV's attachment to w1 is not this volume's)
        "scheduled": 7.0,  # (a pod without a node is not scheduled)
        "attached": 8.0,
        "ready": 9.0,
    }
    assert all(seen["load_1min"] == 2.5 for seen in timeline.seen.values())
    assert timeline.reads == 9


def test_steps_not_seen_within_the_cap_say_so() -> None:
    """Kubernetes alone: the old pod stays (Terminating), nothing after it happens."""
    stuck = [node(False, (SHUTDOWN,)), pod("old", "w1", deleting=True), attachment("w1", True)]
    timeline = replay([stuck] * 10, DOWN, "ready", lambda items: down_facts(items, S), cap_s=5)
    report = timeline.report(5)
    assert list(report) == list(DOWN)
    assert report["not_ready"] == {"s": 1.0, "load_1min": 2.5}
    assert report["old_pod_deleting"] == {"s": 1.0, "load_1min": 2.5}
    for step in ("out_of_service", "old_pod_gone", "detached", "scheduled", "attached", "ready"):
        assert report[step] == "not within 5 s", step
    assert timeline.reads == 5  # stopped at the cap


def test_power_on_timeline() -> None:
    reads: list[list[Mapping[str, Any]]] = [
        [node(False, (SHUTDOWN, OUT_OF_SERVICE))],
        [node(True, (SHUTDOWN, OUT_OF_SERVICE))],
        [node(True, (OUT_OF_SERVICE,))],
        [node(True, (), cordoned=True)],
        [node(True)],
    ]
    timeline = replay(reads, UP, "schedulable", lambda items: up_facts(items, S))
    assert {step: seen["s"] for step, seen in timeline.seen.items()} == {
        "node_ready": 2.0,
        "shutdown_taint_removed": 3.0,
        "out_of_service_removed": 4.0,
        "schedulable": 5.0,
    }


def test_a_read_without_the_node_is_refused() -> None:
    try:
        down_facts([pod("old", "w1")], S)
    except ValueError as e:
        assert "node w1 is not in the read" in str(e)
    else:
        raise AssertionError("no error")
