"""Issue #25, the controller's in-memory inputs: which pods need their finalizer owner's
lease (controller/deciding/owner_leases.py), and the FailedKillPod Events kept per pod
(controller/deciding/kill_events.py; the watch itself is exercised by
tests/envtest/test_cni_teardown.py)."""

from __future__ import annotations

from typing import Any

from unstick.controller.deciding.kill_events import PER_POD, KillPodEvents
from unstick.controller.deciding.owner_leases import needed

KCM = ("kube-system", "kube-controller-manager")
JOB = "batch.kubernetes.io/job-tracking"


def _pod(finalizers: list[str], grace: int | None = 30, node: str | None = "n1") -> dict:
    meta: dict[str, Any] = {"finalizers": finalizers, "deletionGracePeriodSeconds": grace}
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}}


def test_a_lease_is_needed_only_where_rule_1_may_hold_a_built_in_finalizer() -> None:
    assert needed(_pod([JOB], grace=0)) == [KCM]
    assert needed(_pod([JOB, "foregroundDeletion"], node=None)) == [KCM]
    assert needed(_pod([JOB])) == []  # on a node, final delete not issued: not rule 1
    assert needed(_pod(["example.com/x"], grace=0)) == []


def _event(uid: str, name: str, last: str) -> dict:
    return {
        "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "uid": uid},
        "reason": "FailedKillPod",
        "lastTimestamp": last,
    }


def test_the_latest_events_of_each_pod_are_kept_and_old_ones_dropped() -> None:
    now = [1_800_000_000.0]  # 2027-01-15T08:00:00Z
    kept = KillPodEvents(None, clock=lambda: now[0])  # type: ignore[arg-type]  (never started)
    for i in range(PER_POD + 2):
        kept.on_event(_event("u1", f"e{i}", f"2027-01-15T07:5{i}:00Z"))
    kept.on_event(_event("u1", "e4", "2027-01-15T07:59:30Z"))  # the same Event, updated
    kept.on_event({"involvedObject": {"kind": "Node", "uid": "n"}, "lastTimestamp": "x"})
    names = [e["metadata"]["name"] for e in kept.events_of("u1")]
    assert names == ["e2", "e3", "e4"]
    assert kept.events_of("other") == []
    now[0] += 7200  # two hours later: history
    assert kept.events_of("u1") == []
